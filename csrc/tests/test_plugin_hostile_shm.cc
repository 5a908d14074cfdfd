// The tuner plugin against hostile shared memory: a garbled header (the
// capacity and length beyond the mapping), a segment truncated before or after it was
// mapped, a foreign segment, a seqlock left odd by a writer killed mid-publish, and seeded
// random garbage in every header field and the payload. In each case: no crash, every
// getCollInfo returns well inside a generous bound (100 ms; the real figure, microseconds, is
// printed by bench_policy_core), the last good table stays in force, the event is counted in
// the plugin's statistics and a repeated warning is logged once.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"
#include "plugin_util.h"

namespace {

namespace shm = heroserve::shm;
using plugin_test::Doc;
using plugin_test::Logger;
using plugin_test::LogLinesWith;
using plugin_test::Plugin;
using plugin_test::Table;

constexpr int64_t kGenerousBoundNs = 100000000;  // 100 ms: cannot flake, catches any spin
const size_t kDataOffset = (sizeof(shm::Header) + 63) & ~size_t{63};

class HostileShm : public plugin_test::PluginTest {
 protected:
  HostileShm() : PluginTest("hostile") {}
  // n AllReduces on ctx; fails the test if any one takes longer than the generous bound.
  std::vector<Plugin::Call> Run(void* ctx, int n, size_t bytes = 1 << 20) {
    std::vector<Plugin::Call> calls;
    for (int i = 0; i < n; ++i) {
      calls.push_back(plugin_->AllReduce(ctx, bytes));
      EXPECT_LT(calls.back().ns, kGenerousBoundNs) << "collective " << i << " stalled";
    }
    return calls;
  }
  char* Payload(shm::Segment& w) { return reinterpret_cast<char*>(w.header()) + kDataOffset; }
};

// The SIGSEGV: the header's capacity and length garbled to far beyond the mapping.
TEST_F(HostileShm, GarbledCapacityAndLengthNeverReadOutsideTheMapping) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 4096, &err)) << err;
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0)}), 1, &err)) << err;
  void* ctx = Init();
  Run(ctx, 3);
  EXPECT_EQ(plugin_->Stats(ctx).table_version, 1u);
  // Length beyond the mapping with the right capacity: garbled.
  __atomic_store_n(&w.header()->length, uint64_t{1} << 40, __ATOMIC_RELEASE);
  __atomic_fetch_add(&w.header()->seq, 2, __ATOMIC_RELEASE);
  auto calls = Run(ctx, 3);
  EXPECT_EQ(plugin_->Stats(ctx).refused, 1u);
  // Capacity and length both claim 64 MiB in a 4 KiB segment: the header is refused.
  __atomic_store_n(&w.header()->capacity, uint64_t{64} << 20, __ATOMIC_RELEASE);
  __atomic_store_n(&w.header()->length, uint64_t{64} << 20, __ATOMIC_RELEASE);
  __atomic_fetch_add(&w.header()->seq, 2, __ATOMIC_RELEASE);
  for (const auto& c : Run(ctx, 3)) calls.push_back(c);
  hsTunerStats st = plugin_->Stats(ctx);
  EXPECT_EQ(st.refused, 2u);        // once per garbling, not per collective
  EXPECT_EQ(st.table_version, 1u);  // the last good table stays in force
  EXPECT_EQ(st.fallbacks, 0u);
  EXPECT_EQ(st.selections, 9u);
  for (const auto& c : calls) EXPECT_FALSE(c.untouched);
  EXPECT_EQ(LogLinesWith(shm_name_ + " refused"), 1u);  // logged once, not per collective
}

// A segment cut below its header, or below what its header claims, is never mapped.
TEST_F(HostileShm, TruncatedSegmentIsRefusedAtAttach) {
  {
    shm::Segment w;
    std::string err;
    ASSERT_TRUE(w.Create(shm_name_, 4096, &err)) << err;
    ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0)}), 1, &err)) << err;
  }
  int fd = shm_open(shm_name_.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kDataOffset + 1024)), 0);  // header says 4096
  void* ctx = Init();
  auto calls = Run(ctx, 3);
  hsTunerStats st = plugin_->Stats(ctx);
  EXPECT_EQ(st.selections, 0u);
  EXPECT_EQ(st.fallbacks, 3u);
  EXPECT_GE(st.refused, 1u);
  for (const auto& c : calls) EXPECT_TRUE(c.untouched);  // NCCL's defaults
  ASSERT_EQ(ftruncate(fd, 100), 0);  // not even a header
  close(fd);
  void* ctx2 = Init();
  Run(ctx2, 2);
  EXPECT_EQ(plugin_->Stats(ctx2).selections, 0u);
  EXPECT_GE(LogLinesWith("is truncated"), 1u);
}

// The file cut under a live mapping (payload pages gone, header kept): the plugin notices
// before copying from the lost pages (which would be SIGBUS) and keeps its table.
TEST_F(HostileShm, SegmentTruncatedWhileMappedIsNotRead) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  // 8 KiB of trailing blanks: the payload reaches pages past the header's last one.
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0)}) + std::string(8192, ' '), 1, &err));
  void* ctx = Init();
  Run(ctx, 2);
  int fd = shm_open(shm_name_.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>((kDataOffset + page - 1) / page * page)), 0);
  close(fd);
  __atomic_fetch_add(&w.header()->seq, 2, __ATOMIC_RELEASE);
  Run(ctx, 4);
  hsTunerStats st = plugin_->Stats(ctx);
  EXPECT_EQ(st.table_version, 1u);
  EXPECT_EQ(st.selections, 6u);
  EXPECT_GE(st.refused, 1u);
  EXPECT_GE(LogLinesWith("truncated under the mapping"), 1u);
}

TEST_F(HostileShm, ForeignSegmentIsRefused) {
  int fd = shm_open(shm_name_.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  std::vector<char> junk(kDataOffset + 8192);
  std::mt19937_64 rng(7);
  for (char& c : junk) c = static_cast<char>(rng());
  ASSERT_EQ(write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  close(fd);
  void* ctx = Init();
  auto calls = Run(ctx, 3);
  hsTunerStats st = plugin_->Stats(ctx);
  EXPECT_EQ(st.selections, 0u);
  EXPECT_GE(st.refused, 1u);
  for (const auto& c : calls) EXPECT_TRUE(c.untouched);
  EXPECT_GE(LogLinesWith("bad header"), 1u);
}

// The stall: a writer killed mid-publish leaves the seqlock odd. Every collective is
// still decided at once from the table in force, counted as stalled, warned about once; a
// restarted writer (which starts from the next even value) ends the stall.
TEST_F(HostileShm, SeqlockLeftOddNeverStallsACollective) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0)}), 1, &err)) << err;
  void* r0 = Init();
  void* r1 = Init();
  Run(r0, 5);
  Run(r1, 5);
  __atomic_fetch_add(&w.header()->seq, 1, __ATOMIC_RELEASE);  // killed after "seq = odd"
  std::memset(Payload(w), 'x', 100);                          // ...and half a copy
  int64_t worst = 0;
  for (int i = 0; i < 500; ++i) {
    auto a = plugin_->AllReduce(r0, 1 << 20);
    auto b = plugin_->AllReduce(r1, 1 << 20);
    EXPECT_EQ(a.algo, b.algo) << "ranks disagree at collective " << i;
    worst = std::max({worst, a.ns, b.ns});
  }
  EXPECT_LT(worst, kGenerousBoundNs);
  hsTunerStats s0 = plugin_->Stats(r0), s1 = plugin_->Stats(r1);
  EXPECT_EQ(s0.selections, 505u);  // the table in force kept deciding
  EXPECT_EQ(s0.table_version, 1u);
  EXPECT_EQ(s0.stalled + s1.stalled, 1000u);
  EXPECT_EQ(LogLinesWith("held the seqlock"), 1u);
  // The agent restarts and publishes version 2, applying from collective 510.
  shm::Segment restarted;
  ASSERT_TRUE(restarted.Create(shm_name_, 1 << 16, &err)) << err;
  ASSERT_TRUE(restarted.Publish(
      Doc({Table(group_, 1, 0, 0.0), Table(group_, 2, 510, 9.0)}), 2, &err)) << err;
  Run(r0, 10);
  Run(r1, 10);
  s0 = plugin_->Stats(r0);
  s1 = plugin_->Stats(r1);
  EXPECT_EQ(s0.stalled + s1.stalled, 1000u);  // no more stalls
  EXPECT_EQ(s0.table_version, 2u);
  EXPECT_EQ(s1.table_version, 2u);
  EXPECT_EQ(s0.seq, 515u);
}

// A stall before any table was read: NCCL's defaults, counted, and a bounded init.
TEST_F(HostileShm, SeqlockOddBeforeTheFirstReadLeavesNcclDefaults) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0)}), 1, &err)) << err;
  __atomic_fetch_add(&w.header()->seq, 1, __ATOMIC_RELEASE);
  auto t0 = std::chrono::steady_clock::now();
  void* ctx = Init();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::nanoseconds(kGenerousBoundNs));
  auto calls = Run(ctx, 20);
  hsTunerStats st = plugin_->Stats(ctx);
  EXPECT_EQ(st.selections, 0u);
  EXPECT_EQ(st.fallbacks, 20u);
  EXPECT_EQ(st.stalled, 21u);  // init and every collective
  for (const auto& c : calls) EXPECT_TRUE(c.untouched);
}

// Seeded random garbage in every header field and in the payload (with and without a
// matching checksum, so hostile JSON reaches the parser): never a crash, never a slow
// collective, and two ranks of one process always agree.
TEST_F(HostileShm, RandomGarbageNeverCrashesOrStalls) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  const std::string good = Doc({Table(group_, 1, 0, 0.0)});
  ASSERT_TRUE(w.Publish(good, 1, &err)) << err;
  void* r0 = Init();
  void* r1 = Init();
  const std::vector<std::string> hostile = {
      std::string(60, '[') + std::string(60, ']'),
      std::string(5000, '['),
      "{\"tables\": [" + std::string(3000, '1') + "]}",
      "{\"tables\": [1e999999]}",
      "{\"tables\": [\"\\ud800\\u0000\"]}",
      Doc(std::vector<std::string>(40, Table(group_, 9, 0, 0.0))),
      Doc({Table("another/group/0", 5, 0, 0.0)}),
      Doc({Table(group_, 7, 0, -1.0)}),
      "{\"tables\": [{\"group_id\": \"" + group_ + "\", \"version\": 99999999999999999999}]}",
  };
  std::mt19937_64 rng(20261123);
  shm::Header* h = w.header();
  int64_t worst = 0;
  for (int iter = 0; iter < 400; ++iter) {
    switch (rng() % 7) {
      case 0: __atomic_store_n(&h->length, rng() % (1 << 17), __ATOMIC_RELEASE); break;
      case 1: __atomic_store_n(&h->checksum, rng(), __ATOMIC_RELEASE); break;
      case 2: __atomic_store_n(&h->capacity, rng() % 3 ? rng() : 1 << 16, __ATOMIC_RELEASE); break;
      case 3: h->magic[rng() % 8] ^= static_cast<char>(1 + rng() % 255); break;
      case 4:
        for (int k = 0; k < 64; ++k) Payload(w)[rng() % (1 << 16)] = static_cast<char>(rng());
        break;
      default: {
        // Hostile but well-checksummed content, as a malicious writer would leave it.
        const std::string& p = hostile[rng() % hostile.size()];
        std::memcpy(Payload(w), p.data(), p.size());
        __atomic_store_n(&h->length, p.size(), __ATOMIC_RELEASE);
        __atomic_store_n(&h->checksum, shm::Checksum(p.data(), p.size()), __ATOMIC_RELEASE);
        __atomic_store_n(&h->capacity, 1 << 16, __ATOMIC_RELEASE);
        break;
      }
    }
    uint64_t bump = rng() % 4;  // odd bumps leave the seqlock held
    __atomic_fetch_add(&h->seq, bump, __ATOMIC_RELEASE);
    if (iter % 50 == 49) {  // now and then the real writer repairs everything
      std::memcpy(h->magic, "HSRVPOL1", 8);
      ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
      h = w.header();
      ASSERT_TRUE(w.Publish(good, 1, &err)) << err;
    }
    auto a = plugin_->AllReduce(r0, 4096u << (iter % 12));
    auto b = plugin_->AllReduce(r1, 4096u << (iter % 12));
    EXPECT_EQ(a.algo, b.algo) << "ranks disagree at iteration " << iter;
    worst = std::max({worst, a.ns, b.ns});
  }
  EXPECT_LT(worst, kGenerousBoundNs);
  hsTunerStats st = plugin_->Stats(r0);
  EXPECT_EQ(st.table_version, 1u);  // no garbage ever became a table
  EXPECT_EQ(st.selections, 400u);
  EXPECT_GT(st.refused + plugin_->Stats(r1).refused, 0u);
}

// Each scheme's NCCL algorithm: hier -> CollNet Direct, flat INA -> CollNet Chain, NVLS ->
// NVLS, ring -> Ring (policies priced so that each wins in turn).
TEST_F(HostileShm, SchemesMapToNcclAlgorithms) {
  const std::string table =
      "{\"group_id\": \"" + group_ +
      "\", \"version\": 1, \"apply_from_seq\": 0, \"window_s\": 1.0, \"gamma\": 0.0,"
      " \"links\": [{\"id\": \"l\", \"capacity\": 1e9}],"
      " \"policies\": ["
      "  {\"id\": 0, \"scheme\": \"hier\", \"links\": [\"l\"], \"cost\": 0.0,"
      "   \"rails\": [{\"shard\": 0, \"switch\": \"s1\"}, {\"shard\": 1, \"switch\": \"s2\"}]},"
      "  {\"id\": 1, \"scheme\": \"ina\", \"switch\": \"s1\", \"links\": [\"l\"], \"cost\": 0.0},"
      "  {\"id\": 2, \"scheme\": \"nvls\", \"links\": [\"l\"], \"cost\": 0.0},"
      "  {\"id\": 3, \"scheme\": \"ring\", \"links\": [\"l\"], \"cost\": 0.0}]}";
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  ASSERT_TRUE(w.Publish(Doc({table}), 1, &err)) << err;
  void* ctx = Init();
  // gamma 0 and no shared utilisation: the winner alone pays 1e6 B / 1e9 B/s = 1e-3 of the
  // window, so the four policies win in id order, round after round.
  const int want[] = {HS_ALGO_COLLNET_DIRECT, HS_ALGO_COLLNET_CHAIN, HS_ALGO_NVLS, HS_ALGO_RING};
  for (int round = 0; round < 8; ++round) {
    auto c = plugin_->AllReduce(ctx, 1000000);
    hsTunerStats st = plugin_->Stats(ctx);
    EXPECT_EQ(st.last_policy_id, static_cast<uint32_t>(round % 4));
    EXPECT_EQ(c.algo, want[round % 4]) << "round " << round;
    EXPECT_EQ(st.last_algorithm, want[round % 4]);
  }
  // v2 names the algorithm itself, given NCCL's collNetSupport / nvlsSupport: the same
  // mapping where supported, NCCL's choice (outputs untouched) where not.
  void* lib = dlopen(HEROSERVE_PLUGIN, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto* v2 = static_cast<const hsTunerV2*>(dlsym(lib, HS_TUNER_SYMBOL_V2));
  ASSERT_NE(v2, nullptr);
  void* old = nullptr;
  ASSERT_EQ(v2->init(2, 1, Logger, &old), 0);
  for (int support = 1; support >= 0; --support) {
    for (int round = 0; round < 4; ++round) {
      int algo = -1, proto = -1, nch = 0;
      EXPECT_EQ(v2->getCollInfo(old, HS_NCCL_FUNC_ALLREDUCE, 1000000, support, support, 1, &algo,
                                &proto, &nch),
                0);
      bool offered = support || round == 3;  // ring needs no support flag
      EXPECT_EQ(algo, offered ? want[round] : -1) << "support " << support << " round " << round;
      EXPECT_EQ(proto, offered ? HS_PROTO_SIMPLE : -1);
    }
  }
  EXPECT_EQ(plugin_->Stats(old).fallbacks, 3u);
  v2->destroy(old);
  dlclose(lib);
}

}  // namespace
