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
