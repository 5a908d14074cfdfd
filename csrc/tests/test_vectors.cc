// The shared test vectors: the C++ core must reproduce the Python reference's choices
// exactly and its costs within 1e-9 relative, on every tests/vectors/online_scheduler*.json
// (online_scheduler.json; online_scheduler_hier.json adds hierarchical-INA tables).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
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

std::vector<std::string> VectorFiles() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(HEROSERVE_VECTORS_DIR)) {
    std::string name = e.path().filename().string();
    if (name.rfind("online_scheduler", 0) == 0 && e.path().extension() == ".json") {
      files.push_back(e.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Replays one file; returns the number of selections checked.
size_t Replay(const std::string& path, size_t* hier_policies) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  json::Value doc;
  std::string err;
  EXPECT_TRUE(json::Parse(ss.str(), &doc, &err)) << path << ": " << err;
  const json::Value* cases = doc.find("cases");
  EXPECT_NE(cases, nullptr) << path;
  if (!cases) return 0;
  size_t selects = 0;
  for (const auto& c : cases->items()) {
    const std::string name = c.find("name")->as_string();
    const auto& events = c.find("events")->items();
    const auto& expect = c.find("expect")->items();
    EXPECT_EQ(events.size(), expect.size()) << name;
    if (events.size() != expect.size()) continue;
    Scheduler s;
    for (size_t k = 0; k < events.size(); ++k) {
      const json::Value& ev = events[k];
      const json::Value& ex = expect[k];
      SCOPED_TRACE(path + ": " + name + " event " + std::to_string(k));
      if (const json::Value* t = ev.find("install")) {
        auto table = std::make_shared<PolicyTable>();
        EXPECT_TRUE(ParseTable(*t, table.get(), &err)) << err;
        for (const auto& p : table->policies) *hier_policies += p.scheme == Scheme::kHier;
        EXPECT_EQ(s.Install(table), ex.find("accepted")->as_bool());
        continue;
      }
      if (const json::Value* d = ev.find("select")) {
        Selection sel;
        if (!s.Select(d->as_double(), &sel)) {
          ADD_FAILURE() << "no table in force";
          return selects;
        }
        uint64_t want = 0;
        EXPECT_TRUE(ex.find("choice")->as_uint64(&want));
        if (sel.policy_id != want) {
          ADD_FAILURE() << "chose " << sel.policy_id << ", the reference " << want;
          return selects;  // later costs would only repeat the divergence
        }
        EXPECT_TRUE(Close(sel.cost, ex.find("cost")->as_double()))
            << sel.cost << " vs " << ex.find("cost")->as_double();
        uint64_t version = 0;
        EXPECT_TRUE(ex.find("version")->as_uint64(&version));
        EXPECT_EQ(sel.version, version);
        ++selects;
      } else {
        std::vector<std::pair<std::string, double>> u;
        for (const auto& kv : ev.find("observe")->members()) {
          u.emplace_back(kv.first, kv.second.as_double());
        }
        EXPECT_TRUE(s.ObserveUtilisation(u, &err)) << err;
      }
      const auto& costs = ex.find("costs")->items();
      EXPECT_EQ(costs.size(), s.costs().size());
      for (size_t i = 0; i < costs.size() && i < s.costs().size(); ++i) {
        EXPECT_TRUE(Close(s.costs()[i], costs[i].as_double()))
            << "b[" << i << "] " << s.costs()[i] << " vs " << costs[i].as_double();
      }
    }
  }
  return selects;
}

TEST(SharedVectors, CoreMatchesPythonReference) {
  std::vector<std::string> files = VectorFiles();
  ASSERT_FALSE(files.empty()) << "no online_scheduler*.json in " << HEROSERVE_VECTORS_DIR;
  for (const auto& f : files) {
    size_t hier = 0;
    size_t selects = Replay(f, &hier);
    EXPECT_GT(selects, 100u) << f;
    // A file named for hier must exercise hier policies.
    if (f.find("hier") != std::string::npos) {
      EXPECT_GT(hier, 0u) << f;
    }
  }
}

}  // namespace
}  // namespace heroserve
