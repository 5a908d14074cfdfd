#include <gtest/gtest.h>

#include "heroserve/policy.h"
#include "test_util.h"

namespace heroserve {
namespace {

using testing::TwoPolicy;
using testing::TwoPolicyJson;

TEST(ParseTable, ComputesBottlenecksAndIndices) {
  auto t = TwoPolicy();
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->policies.size(), 2u);
  EXPECT_EQ(t->policies[0].bottleneck, 6.25e9);  // min(100, 50) Gb/s in bytes/s
  EXPECT_EQ(t->policies[1].bottleneck, 6.25e9);
  EXPECT_EQ(t->policies[0].scheme, Scheme::kIna);
  EXPECT_EQ(t->policies[0].switch_name, "s1");
  EXPECT_EQ(t->policies[0].paths.at("g1").back(), "s1");
  EXPECT_EQ(t->utilisation[2], 0.1);
}

TEST(ParseTable, RejectsBadTablesWithNamedField) {
  struct Case {
    std::string from, to, word;
  } cases[] = {
      {"\"gamma\": 0.5", "\"gamma\": 1.5", "gamma"},
      {"\"window_s\": 0.001", "\"window_s\": 0", "window_s"},
      {"\"scheme\": \"ring\"", "\"scheme\": \"tree\"", "scheme"},
      {"\"links\": [\"g0|g1\", \"g1|s1\"]", "\"links\": [\"g0|g1\", \"zz\"]", "unknown link"},
      {"\"links\": [\"g0|g1\", \"g1|s1\"]", "\"links\": [\"g0|g1\", \"g0|g1\"]", "twice"},
      {"\"id\": 1,", "\"id\": 0,", "increasing id"},
      {"\"g0|g1\": 0.1", "\"g0|g1\": 1.1", "outside"},
      {"\"version\": 1", "\"version\": -1", "version"},
      {"\"capacity\": 12500000000.0", "\"capacity\": 0", "capacity"},
  };
  for (const auto& c : cases) {
    std::string text = TwoPolicyJson();
    auto pos = text.find(c.from);
    ASSERT_NE(pos, std::string::npos) << c.from;
    text.replace(pos, c.from.size(), c.to);
    PolicyTable t;
    std::string err;
    EXPECT_FALSE(ParseTableJson(text, &t, &err)) << c.to;
    EXPECT_NE(err.find(c.word), std::string::npos) << err;
  }
  PolicyTable t;
  std::string err;
  EXPECT_FALSE(ParseTableJson("{\"group_id\": \"x\"}", &t, &err));
  EXPECT_NE(err.find("lacks"), std::string::npos);
  EXPECT_FALSE(ParseTableJson("not json", &t, &err));
}

TEST(ParseTable, JsonRoundTrip) {
  auto t = TwoPolicy(7, 3, 0.25, 0.5);
  PolicyTable back;
  std::string err;
  ASSERT_TRUE(ParseTableJson(TableToJson(*t), &back, &err)) << err;
  EXPECT_EQ(back.version, 7u);
  EXPECT_EQ(back.apply_from_seq, 3u);
  EXPECT_EQ(back.policies[1].cost, 0.5);
  EXPECT_EQ(back.policies[0].paths, t->policies[0].paths);
  EXPECT_EQ(back.utilisation, t->utilisation);
}

TEST(SharingRatio, HandWorked) {
  auto t = TwoPolicy();
  // W(0, 1): c1's links g0|g1 (0.1) and g1|s1 (0.4, shared) -> 0.4 / 0.5.
  EXPECT_DOUBLE_EQ(SharingRatio(*t, t->utilisation, 0, 1), 0.8);
  // W(1, 0): c0's links g0|s1 (0.2) and g1|s1 (0.4, shared) -> 0.4 / 0.6.
  EXPECT_DOUBLE_EQ(SharingRatio(*t, t->utilisation, 1, 0), 0.4 / 0.6);
  std::vector<double> idle(3, 0.0);
  EXPECT_EQ(SharingRatio(*t, idle, 0, 1), 0.0);  // 0/0 read as 0
}

TEST(Scheduler, HandWorkedSelections) {
  Scheduler s;
  ASSERT_TRUE(s.Install(TwoPolicy()));
  Selection sel;
  // D = 1 MiB: delta = 2^20 / (1e-3 * 6.25e9) = 0.16777216 for both; tie -> lowest id.
  ASSERT_TRUE(s.Select(1 << 20, &sel));
  EXPECT_EQ(sel.policy_id, 0u);
  EXPECT_DOUBLE_EQ(sel.cost, 0.16777216);
  EXPECT_DOUBLE_EQ(s.costs()[0], 0.16777216);
  EXPECT_DOUBLE_EQ(s.costs()[1], 0.16777216 * 0.8);  // f(0, 1) = W(0, 1) = 0.8
  ASSERT_TRUE(s.Select(1 << 20, &sel));
  EXPECT_EQ(sel.policy_id, 1u);
  EXPECT_DOUBLE_EQ(sel.cost, 0.16777216 * 1.8);
  EXPECT_DOUBLE_EQ(s.costs()[0], 0.16777216 * (1.0 + 0.4 / 0.6));
  EXPECT_EQ(s.seq(), 2u);
}

TEST(Scheduler, ObserveAppliesEq18AndDecay) {
  Scheduler s;
  ASSERT_TRUE(s.Install(TwoPolicy(1, 0, 1.0, 2.0)));
  Selection sel;
  ASSERT_TRUE(s.Select(0, &sel));  // activates the table, costs unchanged
  std::string err;
  ASSERT_TRUE(s.ObserveUtilisation({{"g0|s1", 0.5}, {"g1|s1", 0.3}, {"elsewhere", 0.9}}, &err));
  // b0 = 0.5 * 1 + 0.5 * max(0.5, 0.3); b1 = 0.5 * 2 + 0.5 * max(0, 0.3).
  EXPECT_DOUBLE_EQ(s.costs()[0], 0.75);
  EXPECT_DOUBLE_EQ(s.costs()[1], 1.15);
  // f(0, 1) = 0.5 * 0.8 + 0.5 * (0.3 / 0.3); f(1, 0) = 0.5 * (0.4/0.6) + 0.5 * (0.3 / 0.8).
  EXPECT_DOUBLE_EQ(s.penalty(0, 1), 0.9);
  EXPECT_DOUBLE_EQ(s.penalty(1, 0), 0.5 * (0.4 / 0.6) + 0.5 * (0.3 / 0.8));
  EXPECT_FALSE(s.ObserveUtilisation({{"g0|s1", 1.5}}, &err));
  EXPECT_NE(err.find("outside"), std::string::npos);
  EXPECT_DOUBLE_EQ(s.costs()[0], 0.75);  // untouched by the rejected window
}

TEST(Scheduler, VersionsSwitchAtAgreedSequence) {
  Scheduler s;
  Selection sel;
  EXPECT_FALSE(s.Select(100, &sel));  // no table yet
  ASSERT_TRUE(s.Install(TwoPolicy(1, 0)));
  ASSERT_TRUE(s.Install(TwoPolicy(2, 3, 5.0, 0.0)));
  EXPECT_FALSE(s.Install(TwoPolicy(2, 9)));  // stale: same version
  EXPECT_FALSE(s.Install(TwoPolicy(1, 0)));
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(s.Select(1000, &sel));
    EXPECT_EQ(sel.version, 1u) << i;
  }
  ASSERT_TRUE(s.Select(1000, &sel));
  EXPECT_EQ(sel.version, 2u);
  EXPECT_EQ(sel.seq, 3u);
  EXPECT_EQ(sel.policy_id, 1u);  // version 2 made policy 0 expensive
  EXPECT_EQ(s.late_tables(), 0u);
  ASSERT_TRUE(s.Install(TwoPolicy(3, 1)));  // arrives after its boundary
  EXPECT_EQ(s.late_tables(), 1u);
}

TEST(Scheduler, SkipsSupersededPendingVersions) {
  Scheduler s;
  ASSERT_TRUE(s.Install(TwoPolicy(1, 0)));
  ASSERT_TRUE(s.Install(TwoPolicy(2, 5)));
  ASSERT_TRUE(s.Install(TwoPolicy(3, 2)));  // overtakes version 2
  Selection sel;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(s.Select(10, &sel));
  EXPECT_EQ(sel.version, 3u);  // version 2 applies from 5 but is older than 3 in force
}

TEST(Scheduler, SameInputsSameChoicesAcrossInstances) {
  // Two ranks of one communicator: identical tables and sizes give identical choices.
  Scheduler a, b;
  auto t = testing::Chain(16);
  a.Install(t);
  b.Install(t);
  Selection sa, sb;
  for (int i = 0; i < 1000; ++i) {
    double d = static_cast<double>((i * 7919) % 65536) * 1024.0;
    ASSERT_TRUE(a.Select(d, &sa));
    ASSERT_TRUE(b.Select(d, &sb));
    ASSERT_EQ(sa.policy_id, sb.policy_id);
    ASSERT_EQ(sa.cost, sb.cost);
  }
}

}  // namespace
}  // namespace heroserve
