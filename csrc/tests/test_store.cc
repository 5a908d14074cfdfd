#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "heroserve/policy.h"
#include "test_util.h"

namespace heroserve {
namespace {

TEST(TableStore, PublishesNewerVersionsOnly) {
  TableStore store;
  EXPECT_EQ(store.generation(), 0u);
  EXPECT_TRUE(store.Publish(testing::TwoPolicy(1)));
  EXPECT_TRUE(store.Publish(testing::TwoPolicy(2)));
  EXPECT_FALSE(store.Publish(testing::TwoPolicy(2)));
  EXPECT_EQ(store.generation(), 2u);
  auto snap = store.Read();
  // both apply from sequence 0: version 1 can never be in force again, so it is dropped
  ASSERT_EQ(snap.tables.size(), 1u);
  EXPECT_EQ(snap.tables.back()->version, 2u);
  for (uint64_t v = 3; v < 20; ++v) store.Publish(testing::TwoPolicy(v, v * 10));
  EXPECT_EQ(store.Read().tables.size(), TableStore::kKeep);
  EXPECT_EQ(store.newest_version(), 19u);
}

TEST(TableStore, KeepsTheVersionsInForceWhenFarFutureOnesPileUp) {
  // v1 governs 0..399 and v2 400..1002; then many versions 1003, 1004, ... arrive. A
  // communicator starting at sequence 0 must still find v1 (this once dropped by age).
  TableStore store;
  store.Publish(testing::TwoPolicy(1, 0));
  store.Publish(testing::TwoPolicy(2, 400));
  for (uint64_t v = 3; v < 60; ++v) store.Publish(testing::TwoPolicy(v, 1000 + v));
  auto snap = store.Read();
  ASSERT_EQ(snap.tables.size(), TableStore::kKeep);
  EXPECT_EQ(snap.tables[0]->version, 1u);
  EXPECT_EQ(snap.tables[1]->version, 2u);
  EXPECT_EQ(snap.tables.back()->version, 59u);
  Scheduler s(&store);
  Selection sel;
  ASSERT_TRUE(s.Select(10, &sel));
  EXPECT_EQ(sel.version, 1u);
}

TEST(TableStore, SchedulerPicksUpPublishedTablesAtTheirBoundary) {
  TableStore store;
  Scheduler s(&store);
  Selection sel;
  EXPECT_FALSE(s.Select(10, &sel));
  store.Publish(testing::TwoPolicy(1, 0));
  ASSERT_TRUE(s.Select(10, &sel));
  EXPECT_EQ(sel.version, 1u);
  store.Publish(testing::TwoPolicy(2, 4));
  for (int i = 1; i < 4; ++i) {
    ASSERT_TRUE(s.Select(10, &sel));
    EXPECT_EQ(sel.version, 1u);
  }
  ASSERT_TRUE(s.Select(10, &sel));
  EXPECT_EQ(sel.version, 2u);
  EXPECT_EQ(sel.seq, 4u);
}

std::shared_ptr<const PolicyTable> Stamped(uint64_t version, uint64_t apply_from_seq,
                                           uint64_t writer_epoch) {
  auto t = std::make_shared<PolicyTable>(*testing::TwoPolicy(version, apply_from_seq));
  t->writer_epoch = writer_epoch;
  return t;
}

TEST(TableStore, RefusesAVersionFarAboveTheNewestOfItsWriterEpoch) {
  TableStore store;
  ASSERT_TRUE(store.Publish(testing::TwoPolicy(7)));
  bool too_far = false;
  // One write of 2^62 would make every later table stale: refused, and said to be too far.
  EXPECT_FALSE(store.Publish(testing::TwoPolicy(uint64_t{1} << 62), &too_far));
  EXPECT_TRUE(too_far);
  EXPECT_FALSE(store.Publish(testing::TwoPolicy(7 + kMaxVersionJump + 1), &too_far));
  EXPECT_TRUE(too_far);
  EXPECT_FALSE(store.Publish(testing::TwoPolicy(6), &too_far));  // stale, not too far
  EXPECT_FALSE(too_far);
  EXPECT_TRUE(store.Publish(testing::TwoPolicy(7 + kMaxVersionJump), &too_far));  // the bound
  EXPECT_TRUE(store.Publish(testing::TwoPolicy(7 + kMaxVersionJump + 1)));  // next one: fine
  EXPECT_EQ(store.newest_version(), 7 + kMaxVersionJump + 1);
}

TEST(TableStore, ANewWriterEpochOutranksHigherVersionsOfTheOldOne) {
  // The old writer's v7 is in force and its v8 pending from 50; a restarted writer's v1
  // (epoch 1) applies from 20. Versions 1.. of epoch 1 come after everything of epoch 0.
  TableStore store;
  ASSERT_TRUE(store.Publish(Stamped(7, 0, 0)));
  ASSERT_TRUE(store.Publish(Stamped(8, 50, 0)));
  Scheduler s(&store);
  Selection sel;
  ASSERT_TRUE(s.Select(10, &sel));
  EXPECT_EQ(sel.version, 7u);
  bool too_far = true;
  ASSERT_TRUE(store.Publish(Stamped(1, 20, 1), &too_far));  // no jump bound across epochs
  EXPECT_FALSE(too_far);
  EXPECT_FALSE(store.Publish(Stamped(1, 20, 1)));  // stale within its epoch
  EXPECT_FALSE(store.Publish(Stamped(9, 60, 0)));  // the old epoch can add nothing
  std::vector<uint64_t> versions;
  for (int i = 1; i < 60; ++i) {
    ASSERT_TRUE(s.Select(10, &sel));
    versions.push_back(sel.version);
  }
  // v7 up to 19, v1 from 20 on; v8 (older epoch, due at 50) was superseded by v1.
  for (int i = 1; i < 60; ++i) EXPECT_EQ(versions[i - 1], i < 20 ? 7u : 1u) << i;
  // A scheduler holding the same tables but started later agrees (no rank-local input).
  Scheduler late(&store);
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(late.Select(10, &sel));
    EXPECT_EQ(sel.version, i < 20 ? 7u : 1u) << i;
  }
}

// Many reader threads select while one writer publishes: every reader must see versions in
// increasing order, switch exactly at each table's boundary, and never crash (run under TSAN
// with HEROSERVE_SANITIZE=thread).
TEST(TableStore, ConcurrentReadersAndOneWriter) {
  TableStore store;
  store.Publish(testing::Chain(16, 1));
  constexpr int kReaders = 4;
  constexpr uint64_t kSelects = 20000;
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&] {
      Scheduler s(&store);
      Selection sel;
      uint64_t last = 0;
      while (!go.load()) std::this_thread::yield();
      if (!s.Select(4096.0, &sel)) failures.fetch_add(1);  // version 1 in force from seq 0
      ready.fetch_add(1);
      for (uint64_t i = 1; i < kSelects; ++i) {
        if (!s.Select(4096.0, &sel) || sel.version < last) failures.fetch_add(1);
        last = sel.version;
      }
    });
  }
  go.store(true);
  // Members join before the controller moves on (a table evicted from the store before a
  // member ever saw it cannot be recovered: the store keeps the newest kKeep versions).
  while (ready.load() < kReaders) std::this_thread::yield();
  for (uint64_t v = 2; v <= 200; ++v) {
    auto t = std::make_shared<PolicyTable>(*testing::Chain(16, v));
    t->apply_from_seq = v * 50;
    store.Publish(std::move(t));
  }
  for (auto& th : readers) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store.newest_version(), 200u);
}

}  // namespace
}  // namespace heroserve
