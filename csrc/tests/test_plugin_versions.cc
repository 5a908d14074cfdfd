// The tuner plugin's version order against the two freezes of a plugin that pinned the
// highest version it had seen (docs/policy-table.md, "Versions and writer generations"):
// a restarted agent whose controller counts versions from 1 again, and one write of a huge
// version into the segment. Also a segment the agent retires (its group removed) and a new
// one under the same name. Every context of a group must switch at the same collective.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"
#include "plugin_util.h"

namespace {

namespace shm = heroserve::shm;
using plugin_test::Doc;
using plugin_test::LogLinesWith;
using plugin_test::Table;

constexpr uint64_t kHuge = uint64_t{1} << 62;

class PluginVersions : public plugin_test::PluginTest {
 protected:
  PluginVersions() : PluginTest("versions") {}
  // The table version in force for each of n AllReduces of ctx.
  std::vector<uint64_t> Versions(void* ctx, int n) {
    std::vector<uint64_t> out;
    for (int i = 0; i < n; ++i) {
      plugin_->AllReduce(ctx, 1 << 20);
      out.push_back(plugin_->Stats(ctx).table_version);
    }
    return out;
  }
  static std::vector<uint64_t> Expect(int from, int to, int switch_at, uint64_t before,
                                      uint64_t after) {
    std::vector<uint64_t> out;
    for (int s = from; s < to; ++s) out.push_back(s < switch_at ? before : after);
    return out;
  }
  void Publish(shm::Segment& w, const std::string& doc) {
    std::string err;
    ASSERT_TRUE(w.Publish(doc, 0, &err)) << err;
  }
};

// The agent restarts (a new writer generation) while the serving process keeps running, and
// its controller, on a fresh database, counts versions from 1 again: version 1 takes over at
// its apply_from_seq on both ranks instead of being stale below version 7 for ever.
TEST_F(PluginVersions, ARestartedWriterCountingFromOneTakesOver) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  Publish(w, Doc({Table(group_, 7, 0, 0.0)}, "00000000000000aa"));
  void* r0 = Init();
  void* r1 = Init();
  EXPECT_EQ(Versions(r0, 3), Expect(0, 3, 0, 7, 7));
  EXPECT_EQ(Versions(r1, 3), Expect(0, 3, 0, 7, 7));
  shm::Segment restarted;  // the new daemon reuses the segment
  ASSERT_TRUE(restarted.Create(shm_name_, 1 << 16, &err)) << err;
  Publish(restarted, Doc({Table(group_, 1, 10, 9.0)}, "00000000000000bb"));
  EXPECT_EQ(Versions(r0, 12), Expect(3, 15, 10, 7, 1));
  EXPECT_EQ(Versions(r1, 12), Expect(3, 15, 10, 7, 1));
  // Its next version follows in the new order.
  Publish(restarted, Doc({Table(group_, 1, 10, 9.0), Table(group_, 2, 20, 0.0)},
                         "00000000000000bb"));
  EXPECT_EQ(Versions(r0, 10), Expect(15, 25, 20, 1, 2));
  EXPECT_EQ(LogLinesWith("a new writer generation"), 1u);  // once per process, not per rank
  EXPECT_EQ(plugin_->Stats(r0).refused, 0u);
}

// One write of version 2^62 (by any process that can write the segment) is refused: it is
// more than kMaxVersionJump above the version held, so the agent's next version still counts.
TEST_F(PluginVersions, OneWriteOfAHugeVersionIsRefused) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  const std::string gen = "00000000000000aa";
  Publish(w, Doc({Table(group_, 7, 0, 0.0)}, gen));
  void* ctx = Init();
  EXPECT_EQ(Versions(ctx, 2), Expect(0, 2, 0, 7, 7));
  Publish(w, Doc({Table(group_, 7, 0, 0.0), Table(group_, kHuge, 3, 9.0)}, gen));
  EXPECT_EQ(Versions(ctx, 4), Expect(2, 6, 6, 7, 7));
  EXPECT_EQ(plugin_->Stats(ctx).refused, 1u);
  EXPECT_EQ(LogLinesWith("jumps more than"), 1u);
  Publish(w, Doc({Table(group_, 7, 0, 0.0), Table(group_, 8, 10, 9.0)}, gen));
  EXPECT_EQ(Versions(ctx, 8), Expect(6, 14, 10, 7, 8));
}

// The same write before any process attached (nothing held to bound the jump): the huge
// version is taken, and the agent's next publish, whose versions are below it, outranks it
// (a writer's versions going back start a new order) instead of being stale for ever.
TEST_F(PluginVersions, AHugeVersionTakenFirstIsOutrankedByTheWritersNextPublish) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  const std::string gen = "00000000000000aa";
  Publish(w, Doc({Table(group_, kHuge, 0, 0.0)}, gen));
  void* r0 = Init();
  void* r1 = Init();
  EXPECT_EQ(Versions(r0, 2), Expect(0, 2, 0, kHuge, kHuge));
  Publish(w, Doc({Table(group_, 7, 0, 0.0), Table(group_, 8, 10, 9.0)}, gen));
  // v7 applies from 0, so it is due at once; v8 from 10.
  EXPECT_EQ(Versions(r0, 12), Expect(2, 14, 10, 7, 8));
  EXPECT_EQ(Versions(r1, 14), Expect(0, 14, 10, 7, 8));
  EXPECT_EQ(LogLinesWith("versions that went back"), 1u);
}

// The agent removes the group: it marks the segment retired and unlinks it. The plugin lets
// go of it (keeping its tables) and finds the group's next segment under the same name.
TEST_F(PluginVersions, ARetiredSegmentIsLetGoAndTheNextOneFound) {
  const std::string gen = "00000000000000aa";
  std::string err;
  auto first = std::make_unique<shm::Segment>();
  ASSERT_TRUE(first->Create(shm_name_, 1 << 16, &err)) << err;
  Publish(*first, Doc({Table(group_, 3, 0, 0.0)}, gen));
  void* ctx = Init();
  EXPECT_EQ(Versions(ctx, 2), Expect(0, 2, 0, 3, 3));
  Publish(*first, "{\"writer_generation\": \"" + gen + "\", \"retired\": true, \"tables\": []}");
  ASSERT_TRUE(first->Unlink(&err)) << err;
  shm::Segment second;  // the group comes back: a new file under the same name
  ASSERT_TRUE(second.Create(shm_name_, 1 << 16, &err)) << err;
  Publish(second, Doc({Table(group_, 4, 10, 9.0)}, gen));
  // Collective 2 reads the retirement (the tables held stay in force), collective 3 maps
  // the new file; its version 4 applies from 10.
  EXPECT_EQ(Versions(ctx, 10), Expect(2, 12, 10, 3, 4));
  EXPECT_EQ(LogLinesWith("retired by its writer"), 1u);
}

// The payload's keys are checked like the rest of it: a writer_generation that is not a
// string or a retired flag that is not a bool refuses the whole payload (counted, logged)
// and the last good table stays in force.
TEST_F(PluginVersions, AMalformedGenerationOrRetiredFlagIsRefused) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 1 << 16, &err)) << err;
  Publish(w, Doc({Table(group_, 3, 0, 0.0)}, "00000000000000aa"));
  void* ctx = Init();
  EXPECT_EQ(Versions(ctx, 1), Expect(0, 1, 0, 3, 3));
  Publish(w, "{\"writer_generation\": 7, \"tables\": [" + Table(group_, 4, 0, 0.0) + "]}");
  EXPECT_EQ(Versions(ctx, 1), Expect(1, 2, 0, 3, 3));
  Publish(w, "{\"retired\": \"yes\", \"tables\": []}");
  EXPECT_EQ(Versions(ctx, 1), Expect(2, 3, 0, 3, 3));
  EXPECT_EQ(plugin_->Stats(ctx).refused, 2u);
  Publish(w, Doc({Table(group_, 3, 0, 0.0), Table(group_, 4, 4, 0.0)}, "00000000000000aa"));
  EXPECT_EQ(Versions(ctx, 3), Expect(3, 6, 4, 3, 4));  // still attached, still ordered
}

}  // namespace
