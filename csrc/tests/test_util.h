// Shared fixtures for the policy-core tests.
#pragma once

#include <memory>
#include <string>

#include "heroserve/policy.h"

namespace heroserve::testing {

// The hand-sized table of tests/vectors/gen_online_scheduler.py (two_policy_table): INA over
// 100 and 50 Gb/s links vs ring over two 50 Gb/s links, sharing g1|s1. T_u = 1 ms.
inline std::string TwoPolicyJson(uint64_t version = 1, uint64_t apply_from_seq = 0,
                                 double cost0 = 0.0, double cost1 = 0.0) {
  return R"({"group_id": "decode/0/0", "version": )" + std::to_string(version) +
         R"(, "apply_from_seq": )" + std::to_string(apply_from_seq) +
         R"(, "window_s": 0.001, "gamma": 0.5,
  "links": [{"id": "g0|s1", "capacity": 12500000000.0}, {"id": "g1|s1", "capacity": 6250000000.0},
            {"id": "g0|g1", "capacity": 6250000000.0}],
  "policies": [
    {"id": 0, "scheme": "ina", "switch": "s1", "links": ["g0|s1", "g1|s1"], "cost": )" +
         std::to_string(cost0) + R"(,
     "paths": {"g0": ["g0", "s1"], "g1": ["g1", "s1"]}},
    {"id": 1, "scheme": "ring", "switch": "", "links": ["g0|g1", "g1|s1"], "cost": )" +
         std::to_string(cost1) + R"(}],
  "utilisation": {"g0|s1": 0.2, "g1|s1": 0.4, "g0|g1": 0.1}})";
}

inline std::shared_ptr<const PolicyTable> TwoPolicy(uint64_t version = 1,
                                                    uint64_t apply_from_seq = 0,
                                                    double cost0 = 0.0, double cost1 = 0.0) {
  auto t = std::make_shared<PolicyTable>();
  std::string err;
  if (!ParseTableJson(TwoPolicyJson(version, apply_from_seq, cost0, cost1), t.get(), &err)) {
    return nullptr;
  }
  return t;
}

// n policies over n+1 links, policy i on links i and i+1, all 100 Gb/s.
inline std::shared_ptr<const PolicyTable> Chain(size_t n, uint64_t version = 1) {
  auto t = std::make_shared<PolicyTable>();
  t->group_id = "bench/0/0";
  t->version = version;
  t->window_s = 0.001;
  t->gamma = 0.5;
  for (size_t i = 0; i <= n; ++i) {
    t->link_ids.push_back("n" + std::to_string(i) + "|n" + std::to_string(i + 1));
    t->capacities.push_back(12.5e9);
    t->utilisation.push_back(0.1 * static_cast<double>(i % 7));
  }
  for (size_t i = 0; i < n; ++i) {
    Policy p;
    p.id = static_cast<uint32_t>(i);
    p.scheme = static_cast<Scheme>(i % 3);
    p.links = {static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1)};
    p.bottleneck = 12.5e9;
    p.bandwidth = 12.5e9;
    p.cost = 0.001 * static_cast<double>(i % 5);
    t->policies.push_back(p);
  }
  return t;
}

}  // namespace heroserve::testing
