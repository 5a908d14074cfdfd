// The tuner plugin against a writer that pads its table (the payload limit,
// shm::kMaxPayloadBytes, csrc/README.md "Shared memory"): a header declaring more than the
// limit is refused before anything is copied or parsed (the `parsed` statistic does not
// move), counted and warned about once, and the last good table stays in force; a republish
// of the bytes already parsed is not parsed again, nor is an unchanged counter; a padded table
// within the limit is one parse per publish, by the reader thread, never by a collective.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"
#include "plugin_util.h"

namespace {

namespace shm = heroserve::shm;
using plugin_test::Doc;
using plugin_test::LogLinesWith;
using plugin_test::Table;

const size_t kDataOffset = (sizeof(shm::Header) + 63) & ~size_t{63};

class TableBound : public plugin_test::PluginTest {
 protected:
  TableBound() : PluginTest("bound") {}
  void Run(void* ctx, int n) {
    for (int i = 0; i < n; ++i) plugin_->AllReduce(ctx, 1 << 20);
  }
  // AllReduces until `done` holds (the reader thread took a payload), at most 10 s.
  template <typename Pred>
  bool RunUntil(void* ctx, Pred done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      plugin_->AllReduce(ctx, 1 << 20);
      if (done(plugin_->Stats(ctx))) return true;
      std::this_thread::yield();
    }
    return false;
  }
  // What a hostile writer does past Publish's refusal: writes `payload` itself, with its
  // true length and checksum, and moves the counter.
  static void Forge(shm::Segment& w, const std::string& payload) {
    char* data = reinterpret_cast<char*>(w.header()) + kDataOffset;
    std::memcpy(data, payload.data(), payload.size());
    __atomic_store_n(&w.header()->length, payload.size(), __ATOMIC_RELEASE);
    __atomic_store_n(&w.header()->checksum, shm::Checksum(payload.data(), payload.size()),
                     __ATOMIC_RELEASE);
    __atomic_fetch_add(&w.header()->seq, 2, __ATOMIC_RELEASE);
  }
  // A valid payload naming `version`, padded with blanks to `bytes` (the finding's attack).
  std::string Padded(uint64_t version, size_t bytes) {
    std::string d = Doc({Table(group_, version, 0, 0.0)});
    d.append(bytes - d.size(), ' ');
    return d;
  }
};

// The finding: a valid table padded past the limit and republished before every decision.
// Without the limit it would be parsed (valid JSON, version 2) and take effect.
TEST_F(TableBound, DeclaredLengthAboveTheLimitIsRefusedBeforeAnyParse) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, shm::kMaxPayloadBytes + (1 << 16), &err)) << err;
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0)}), 1, &err)) << err;
  void* ctx = Init();
  Run(ctx, 2);
  ASSERT_EQ(plugin_->Stats(ctx).parsed, 1u);
  const std::string hostile = Padded(2, shm::kMaxPayloadBytes + 8);
  EXPECT_FALSE(w.Publish(hostile, 2, &err));  // the writer's side of the limit
  for (int i = 0; i < 5; ++i) {
    Forge(w, hostile);  // republished before each decision
    Run(ctx, 1);
  }
  hsTunerStats st = plugin_->Stats(ctx);
  EXPECT_EQ(st.parsed, 1u);   // no parse after the first table
  EXPECT_EQ(st.refused, 5u);  // one per publish, none per decision in between
  EXPECT_EQ(st.table_version, 1u);  // the last good table stays in force
  EXPECT_EQ(st.selections, 7u);
  EXPECT_EQ(LogLinesWith("above the limit of " + std::to_string(shm::kMaxPayloadBytes)), 1u);
  // The writer's next good table is taken as usual.
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0), Table(group_, 3, 0, 0.0)}), 3, &err));
  Run(ctx, 1);
  st = plugin_->Stats(ctx);
  EXPECT_EQ(st.parsed, 2u);
  EXPECT_EQ(st.table_version, 3u);
}

// Version caching: an unchanged counter is one load, a republish of the same bytes (counter
// moved, same length and checksum) is not parsed, new bytes are parsed once.
TEST_F(TableBound, SamePayloadIsNotParsedAgain) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  const std::string v1 = Doc({Table(group_, 1, 0, 0.0)});
  ASSERT_TRUE(w.Publish(v1, 1, &err)) << err;
  void* ctx = Init();
  Run(ctx, 5);
  EXPECT_EQ(plugin_->Stats(ctx).parsed, 1u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(w.Publish(v1, 1, &err)) << err;
    Run(ctx, 2);
  }
  hsTunerStats st = plugin_->Stats(ctx);
  EXPECT_EQ(st.parsed, 1u);
  EXPECT_EQ(st.refused, 0u);
  EXPECT_EQ(st.table_version, 1u);
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0), Table(group_, 2, 0, 0.0)}), 2, &err));
  Run(ctx, 3);
  st = plugin_->Stats(ctx);
  EXPECT_EQ(st.parsed, 2u);
  EXPECT_EQ(st.table_version, 2u);
  EXPECT_EQ(st.selections, 16u);
}

// Within the limit a padded table is an ordinary table, but one longer than
// kInlineReadBytes is never parsed on a collective: the collective hands it to the group's
// reader thread and decides from the table held until the thread has taken it. A hostile one
// that is not a table list is refused there, the last good table kept.
TEST_F(TableBound, LongPayloadIsParsedOffTheCollectivePath) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 2 << 20, &err)) << err;
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0)}), 1, &err)) << err;
  void* ctx = Init();
  ASSERT_EQ(plugin_->Stats(ctx).parsed, 1u);  // init reads inline, whatever the length
  ASSERT_TRUE(w.Publish(Padded(2, 1 << 20), 2, &err)) << err;
  // The thread counts a parse once it is done with the payload, after installing its tables.
  ASSERT_TRUE(RunUntil(ctx, [](const hsTunerStats& s) {
    return s.table_version == 2 && s.reader_parsed == 1;
  }));
  hsTunerStats st = plugin_->Stats(ctx);
  EXPECT_EQ(st.parsed, 1u);  // no collective parsed it
  EXPECT_EQ(st.reader_parsed, 1u);
  std::string junk(1 << 20, ' ');
  junk[0] = '[';  // never closed: not JSON
  ASSERT_TRUE(w.Publish(junk, 3, &err)) << err;
  ASSERT_TRUE(RunUntil(ctx, [](const hsTunerStats& s) {
    return s.refused == 1 && s.reader_parsed == 2;
  }));
  st = plugin_->Stats(ctx);
  EXPECT_EQ(st.parsed, 1u);
  EXPECT_EQ(st.reader_parsed, 2u);
  EXPECT_EQ(st.table_version, 2u);
}

}  // namespace
