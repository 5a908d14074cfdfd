// The shared test vectors: the C++ core must reproduce the Python reference's choices
// exactly and its costs within 1e-9 relative (tests/vectors/online_scheduler.json).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "heroserve/json.h"
#include "heroserve/policy.h"

namespace heroserve {
namespace {

bool Close(double a, double b) {
  double scale = std::max(std::fabs(a), std::fabs(b));
  return std::fabs(a - b) <= 1e-9 * scale || a == b;
}

TEST(SharedVectors, CoreMatchesPythonReference) {
  std::ifstream in(HEROSERVE_VECTORS);
  ASSERT_TRUE(in) << "cannot read " << HEROSERVE_VECTORS;
  std::stringstream ss;
  ss << in.rdbuf();
  json::Value doc;
  std::string err;
  ASSERT_TRUE(json::Parse(ss.str(), &doc, &err)) << err;
  const json::Value* cases = doc.find("cases");
  ASSERT_NE(cases, nullptr);
  ASSERT_GE(cases->items().size(), 5u);
  size_t selects = 0;
  for (const auto& c : cases->items()) {
    const std::string name = c.find("name")->as_string();
    const auto& events = c.find("events")->items();
    const auto& expect = c.find("expect")->items();
    ASSERT_EQ(events.size(), expect.size()) << name;
    Scheduler s;
    for (size_t k = 0; k < events.size(); ++k) {
      const json::Value& ev = events[k];
      const json::Value& ex = expect[k];
      SCOPED_TRACE(name + " event " + std::to_string(k));
      if (const json::Value* t = ev.find("install")) {
        auto table = std::make_shared<PolicyTable>();
        ASSERT_TRUE(ParseTable(*t, table.get(), &err)) << err;
        EXPECT_EQ(s.Install(table), ex.find("accepted")->as_bool());
        continue;
      }
      if (const json::Value* d = ev.find("select")) {
        Selection sel;
        ASSERT_TRUE(s.Select(d->as_double(), &sel));
        uint64_t want = 0;
        ASSERT_TRUE(ex.find("choice")->as_uint64(&want));
        ASSERT_EQ(sel.policy_id, want);
        EXPECT_TRUE(Close(sel.cost, ex.find("cost")->as_double()))
            << sel.cost << " vs " << ex.find("cost")->as_double();
        uint64_t version = 0;
        ASSERT_TRUE(ex.find("version")->as_uint64(&version));
        EXPECT_EQ(sel.version, version);
        ++selects;
      } else {
        std::vector<std::pair<std::string, double>> u;
        for (const auto& kv : ev.find("observe")->members()) {
          u.emplace_back(kv.first, kv.second.as_double());
        }
        ASSERT_TRUE(s.ObserveUtilisation(u, &err)) << err;
      }
      const auto& costs = ex.find("costs")->items();
      ASSERT_EQ(costs.size(), s.costs().size());
      for (size_t i = 0; i < costs.size(); ++i) {
        ASSERT_TRUE(Close(s.costs()[i], costs[i].as_double()))
            << "b[" << i << "] " << s.costs()[i] << " vs " << costs[i].as_double();
      }
    }
  }
  EXPECT_GT(selects, 400u);
}

}  // namespace
}  // namespace heroserve
