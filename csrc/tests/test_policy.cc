#include <gtest/gtest.h>

#include <limits>

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

// A hierarchical-INA policy (docs/policy-table.md): an empty switch, one rail per shard.
std::string HierJson(const std::string& rails =
                         R"([{"shard": 0, "switch": "s1"}, {"shard": 1, "switch": "s2"}])",
                     const std::string& sw = "") {
  return R"({"group_id": "decode/0/0", "version": 1, "apply_from_seq": 0, "window_s": 0.001,
  "gamma": 0.5, "links": [{"id": "g0|s1", "capacity": 1e10}, {"id": "g1|s2", "capacity": 1e10}],
  "policies": [
    {"id": 0, "scheme": "hier", "switch": ")" + sw + R"(", "links": ["g0|s1", "g1|s2"],
     "cost": 0.0, "rails": )" + rails + R"(},
    {"id": 1, "scheme": "ring", "links": ["g0|s1"], "cost": 0.0}]})";
}

TEST(ParseTable, HierPolicyKeepsItsRailsThroughJson) {
  PolicyTable t;
  std::string err;
  ASSERT_TRUE(ParseTableJson(HierJson(), &t, &err)) << err;
  ASSERT_EQ(t.policies[0].scheme, Scheme::kHier);
  ASSERT_EQ(t.policies[0].rails.size(), 2u);
  EXPECT_EQ(t.policies[0].rails[1].shard, 1u);
  EXPECT_EQ(t.policies[0].rails[1].switch_name, "s2");
  EXPECT_TRUE(t.policies[1].rails.empty());
  PolicyTable back;
  ASSERT_TRUE(ParseTableJson(TableToJson(t), &back, &err)) << err;
  EXPECT_EQ(std::string(SchemeName(back.policies[0].scheme)), "hier");
  ASSERT_EQ(back.policies[0].rails.size(), 2u);
  EXPECT_EQ(back.policies[0].rails[0].switch_name, "s1");
  EXPECT_EQ(TableToJson(back).find("rails", TableToJson(back).find("\"ring\"")),
            std::string::npos);  // no rails written for the ring policy
}

TEST(ParseTable, RejectsMalformedRails) {
  struct Case {
    std::string json, word;
  } cases[] = {
      {HierJson("[]"), "non-empty rails"},
      {HierJson("{}"), "rails must be a list"},
      {HierJson(R"([{"shard": 1, "switch": "s1"}])"), "in order"},
      {HierJson(R"([{"shard": 0, "switch": ""}])"), "switch must be a non-empty"},
      {HierJson(R"([{"shard": -1, "switch": "s1"}])"), "shard must be a uint32"},
      {HierJson(R"([{"shard": 0, "switch": "s1"}])", "s1"), "switch must be empty"},
  };
  for (const auto& c : cases) {
    PolicyTable t;
    std::string err;
    EXPECT_FALSE(ParseTableJson(c.json, &t, &err));
    EXPECT_NE(err.find(c.word), std::string::npos) << err;
    EXPECT_NE(err.find("policy 0"), std::string::npos) << err;
  }
  std::string ina = TwoPolicyJson();
  ina.replace(ina.find("\"cost\""), 0, R"("rails": [{"shard": 0, "switch": "s1"}], )");
  PolicyTable t;
  std::string err;
  EXPECT_FALSE(ParseTableJson(ina, &t, &err));
  EXPECT_NE(err.find("hier policies only"), std::string::npos) << err;
}

// Shared memory is written by another process: a table's counts are bounded before the
// parse can cost more than a real table does.
TEST(ParseTable, RejectsTablesBeyondTheBounds) {
  auto table = [](size_t links, size_t policies) {
    std::string j = R"({"group_id": "g/0/0", "version": 1, "apply_from_seq": 0, "window_s": 1,
                        "gamma": 0, "links": [)";
    for (size_t i = 0; i < links; ++i) {
      j += (i ? "," : "") + std::string(R"({"id": "l)") + std::to_string(i) +
           R"(", "capacity": 1})";
    }
    j += R"(], "policies": [)";
    for (size_t i = 0; i < policies; ++i) {
      j += (i ? "," : "") + std::string(R"({"id": )") + std::to_string(i) +
           R"(, "scheme": "ring", "links": ["l0"], "cost": 0})";
    }
    return j + "]}";
  };
  PolicyTable t;
  std::string err;
  EXPECT_TRUE(ParseTableJson(table(kMaxTableLinks, kMaxTablePolicies), &t, &err)) << err;
  EXPECT_FALSE(ParseTableJson(table(kMaxTableLinks + 1, 1), &t, &err));
  EXPECT_NE(err.find("more than 4096"), std::string::npos) << err;
  EXPECT_FALSE(ParseTableJson(table(1, kMaxTablePolicies + 1), &t, &err));
  EXPECT_NE(err.find("more than 256"), std::string::npos) << err;
}

// Two policies on disjoint links (no penalties), T_u = 1 ms: INA over 100 Gb/s (12.5e9 B/s)
// with 100 us of latency, ring over 50 Gb/s (6.25e9 B/s) with none. Same numbers as
// test_latency_makes_the_faster_link_lose_small_transfers in
// tests/controller/scheduler/test_online_scheduler.py.
std::string AffineJson(const std::string& extra0 = "\"latency_s\": 0.0001",
                       const std::string& extra1 = "") {
  return R"({"group_id": "decode/0/1", "version": 1, "apply_from_seq": 0, "window_s": 0.001,
  "gamma": 0.5, "links": [{"id": "g0|s1", "capacity": 12500000000.0},
                          {"id": "g0|g1", "capacity": 6250000000.0}],
  "policies": [
    {"id": 0, "scheme": "ina", "switch": "s1", "links": ["g0|s1"], "cost": 0)" +
         (extra0.empty() ? "" : ", " + extra0) + R"(},
    {"id": 1, "scheme": "ring", "links": ["g0|g1"], "cost": 0)" +
         (extra1.empty() ? "" : ", " + extra1) + "}]}";
}

// `table` with policies[i][key] = x appended (the policy must not have the key yet).
json::Value WithPolicyField(const json::Value& table, size_t i, const char* key, double x) {
  json::Value out = json::Value::Object();
  for (const auto& kv : table.members()) {
    if (kv.first != "policies") {
      out.set(kv.first, kv.second);
      continue;
    }
    json::Value list = json::Value::Array();
    for (size_t k = 0; k < kv.second.items().size(); ++k) {
      json::Value p = kv.second.items()[k];
      if (k == i) p.set(key, json::Value::Number(x));
      list.push_back(std::move(p));
    }
    out.set("policies", std::move(list));
  }
  return out;
}

std::shared_ptr<const PolicyTable> Affine(const std::string& extra0 = "\"latency_s\": 0.0001",
                                          const std::string& extra1 = "") {
  auto t = std::make_shared<PolicyTable>();
  std::string err;
  EXPECT_TRUE(ParseTableJson(AffineJson(extra0, extra1), t.get(), &err)) << err;
  return t;
}

TEST(ParseTable, TimeModelFieldsAndDefaults) {
  auto t = Affine("\"latency_s\": 0.0001", "\"bandwidth\": 3125000000.0");
  EXPECT_EQ(t->policies[0].latency_s, 1e-4);
  EXPECT_EQ(t->policies[0].bandwidth, 12.5e9);  // absent: the bottleneck
  EXPECT_EQ(t->policies[1].latency_s, 0.0);     // absent: no latency
  EXPECT_EQ(t->policies[1].bandwidth, 3.125e9);
  EXPECT_EQ(t->policies[1].bottleneck, 6.25e9);  // unchanged by an explicit bandwidth
  PolicyTable back;
  std::string err;
  ASSERT_TRUE(ParseTableJson(TableToJson(*t), &back, &err)) << err;
  EXPECT_EQ(back.policies[0].latency_s, 1e-4);
  EXPECT_EQ(back.policies[1].bandwidth, 3.125e9);
}

TEST(ParseTable, RejectsBadTimeModelFields) {
  struct Case {
    std::string field, word;
  } cases[] = {
      {"\"latency_s\": -0.000001", "policy 1: latency_s must be >= 0"},
      {"\"latency_s\": \"1e-6\"", "policy 1: latency_s must be a number"},
      {"\"latency_s\": 1e999", "latency_s"},  // overflows to inf: not finite (or not JSON)
      {"\"bandwidth\": 0", "policy 1: bandwidth must be > 0"},
      {"\"bandwidth\": -5e9", "policy 1: bandwidth must be > 0"},
      {"\"bandwidth\": null", "policy 1: bandwidth must be a number"},
  };
  for (const auto& c : cases) {
    PolicyTable t;
    std::string err;
    EXPECT_FALSE(ParseTableJson(AffineJson("", c.field), &t, &err)) << c.field;
    if (c.field.find("1e999") != std::string::npos) continue;  // parser-dependent message
    EXPECT_NE(err.find(c.word), std::string::npos) << c.field << ": " << err;
  }
  // Non-finite values cannot be written in JSON; through the in-memory form (the daemon's
  // proto conversion) they are rejected by name.
  json::Value base;
  std::string perr;
  ASSERT_TRUE(json::Parse(AffineJson("", ""), &base, &perr)) << perr;
  for (const char* field : {"latency_s", "bandwidth"}) {
    for (double bad : {std::numeric_limits<double>::infinity(),
                       -std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()}) {
      PolicyTable t;
      std::string err;
      EXPECT_FALSE(ParseTable(WithPolicyField(base, 1, field, bad), &t, &err)) << field;
      EXPECT_NE(err.find(std::string("policy 1: ") + field + " must be finite"),
                std::string::npos)
          << err;
    }
  }
}

TEST(Scheduler, LatencyMakesTheFasterLinkLoseSmallTransfers) {
  // delta_0 = 0.1 + D / 12.5e6, delta_1 = D / 6.25e6: equal at D* = 0.1 * 12.5e6 = 1.25e6 B.
  struct Case {
    double d;
    uint32_t want;
    double delta;
  } cases[] = {
      {65536, 1, 0.01048576},  {1e6, 1, 0.16},    {1.2e6, 1, 0.192},
      {1.3e6, 0, 0.204},       {1.5e6, 0, 0.22},  {16.0 * (1 << 20), 0, 0.1 + 16.0 * (1 << 20) / 12.5e6},
  };
  for (const auto& c : cases) {
    Scheduler s;
    ASSERT_TRUE(s.Install(Affine()));
    Selection sel;
    ASSERT_TRUE(s.Select(c.d, &sel));
    EXPECT_EQ(sel.policy_id, c.want) << c.d;
    EXPECT_NEAR(sel.cost, c.delta, 1e-12 * c.delta) << c.d;
    EXPECT_EQ(s.costs()[1 - c.want], 0.0);  // disjoint links: f = W = 0
  }
}

TEST(Scheduler, DefaultTimeModelIsTheBottleneckDeltaBitForBit) {
  // Absent fields, explicit defaults, and the original expression b + D / (T_u * bottleneck)
  // agree exactly (==, not within a tolerance).
  Scheduler plain, expl;
  ASSERT_TRUE(plain.Install(TwoPolicy()));
  auto t = std::make_shared<PolicyTable>(*TwoPolicy());
  for (auto& p : t->policies) {
    p.latency_s = 0.0;
    p.bandwidth = p.bottleneck;
  }
  ASSERT_TRUE(expl.Install(t));
  const double bottleneck = 6.25e9;  // both policies: min(100, 50) and min(50, 50) Gb/s
  std::vector<double> before = {0.0, 0.0};
  for (double d : {0.0, 1.0, 4096.0, 1048576.0, 3333333.0, 268435456.0}) {
    Selection a, b;
    ASSERT_TRUE(plain.Select(d, &a));
    ASSERT_TRUE(expl.Select(d, &b));
    ASSERT_EQ(a.policy_id, b.policy_id);
    ASSERT_EQ(a.cost, b.cost);
    ASSERT_EQ(plain.costs(), expl.costs());
    EXPECT_EQ(a.cost, before[a.index] + d / (0.001 * bottleneck)) << d;
    before = plain.costs();
  }
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
