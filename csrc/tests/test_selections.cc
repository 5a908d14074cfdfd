// The GPU agent's per-report deltas of the plugin's counters (agent/selections.h): exact
// deltas worked by hand, the largest member's count rather than a sum, a reused pid, and a
// bounded memory however many processes come and go.
#include <gtest/gtest.h>

#include "selections.h"

namespace heroserve::agent {
namespace {

using Key = SelectionCounter::Key;

shm::Segment::SlotView Slot(uint64_t pid, uint64_t version, uint64_t last_seq,
                            std::vector<shm::PolicyCounter> counters) {
  counters.resize(shm::kMaxPolicies);
  return shm::Segment::SlotView{pid, version, last_seq, std::move(counters)};
}

TEST(SelectionCounter, DeltasSinceTheLastReportTakeTheLargestMember) {
  SelectionCounter c;
  // Two member processes of the group, version 3: policy 0 chosen 5 and 4 times, policy 1
  // twice by the first.
  auto d = c.Update({Slot(100, 3, 6, {{5, 500}, {2, 20}}), Slot(101, 3, 3, {{4, 400}})});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[Key(3, 0)].selections, 5u);  // max(5, 4), not 9
  EXPECT_EQ(d[Key(3, 0)].bytes, 500u);
  EXPECT_EQ(d[Key(3, 0)].last_seq, 6u);
  EXPECT_EQ(d[Key(3, 1)].selections, 2u);
  // Next report: 5 -> 9 and 4 -> 9 on policy 0 (deltas 4 and 5), policy 1 unchanged.
  d = c.Update({Slot(100, 3, 11, {{9, 900}, {2, 20}}), Slot(101, 3, 9, {{9, 900}})});
  EXPECT_EQ(d[Key(3, 0)].selections, 5u);
  EXPECT_EQ(d[Key(3, 0)].bytes, 500u);
  EXPECT_EQ(d[Key(3, 1)].selections, 0u);
  // pid 100 exits and a new process gets pid 100 with a smaller count: all of it is new.
  d = c.Update({Slot(100, 3, 2, {{2, 200}})});
  EXPECT_EQ(d[Key(3, 0)].selections, 2u);
  EXPECT_EQ(c.remembered(), 1u);  // pid 101 left: forgotten
}

TEST(SelectionCounter, MemoryStaysBoundedWhilePidsCycle) {
  // 100,000 short-lived processes pass through the 32 slots, each on its own version: the
  // counter remembers only the slots of the last snapshot (it grew without bound before).
  SelectionCounter c;
  std::vector<shm::PolicyCounter> four = {{1, 10}, {1, 10}, {1, 10}, {1, 10}};
  uint64_t pid = 1000;
  for (int round = 0; round < 100000 / static_cast<int>(shm::kMaxProcs); ++round) {
    std::vector<shm::Segment::SlotView> slots;
    for (size_t k = 0; k < shm::kMaxProcs; ++k, ++pid) slots.push_back(Slot(pid, pid % 7, 1, four));
    auto d = c.Update(slots);
    for (const auto& [key, delta] : d) EXPECT_EQ(delta.selections, 1u);
    ASSERT_LE(c.remembered(), shm::kMaxProcs * 4);
  }
  EXPECT_EQ(c.remembered(), shm::kMaxProcs * 4);
}

}  // namespace
}  // namespace heroserve::agent
