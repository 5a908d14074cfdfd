// The tuner plugin as the plugin tests load it (dlopen, as NCCL does), with an NCCL-shaped
// logger that keeps every line, the table and payload texts they publish, and a fixture
// giving each test a group of its own. Each test program names its segments apart
// (HEROSERVE_SHM_PREFIX = <name><pid>.).
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"

namespace plugin_test {

inline std::mutex g_log_mu;
inline std::vector<std::string> g_log;

// One logger call's line, formatted as NCCL's loggers do (at most 1023 characters).
inline std::string FormatLine(const char* fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  return buf;
}

// An NCCL-shaped logger that keeps every line the plugin writes.
inline void Logger(int /*level*/, unsigned long /*flags*/, const char* /*file*/, int /*line*/,
            const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string line = FormatLine(fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_log.push_back(std::move(line));
}

inline size_t LogLinesWith(const std::string& needle) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  size_t n = 0;
  for (const auto& l : g_log) n += l.find(needle) != std::string::npos;
  return n;
}

inline std::string Table(const std::string& group, uint64_t version, uint64_t apply_from,
                         double ina_cost) {
  return "{\"group_id\": \"" + group + "\", \"version\": " + std::to_string(version) +
         ", \"apply_from_seq\": " + std::to_string(apply_from) +
         ", \"window_s\": 0.001, \"gamma\": 0.5,"
         " \"links\": [{\"id\": \"a|s\", \"capacity\": 5e10}, {\"id\": \"a|b\", \"capacity\": 2.5e10}],"
         " \"policies\": [{\"id\": 0, \"scheme\": \"ina\", \"switch\": \"s\", \"links\": [\"a|s\"],"
         " \"cost\": " + std::to_string(ina_cost) +
         "}, {\"id\": 1, \"scheme\": \"ring\", \"links\": [\"a|b\"], \"cost\": 0.0}]}";
}

// A payload as the daemon writes it; `writer_generation` left out when empty (a writer that
// predates generations, or a test's).
inline std::string Doc(const std::vector<std::string>& tables,
                       const std::string& writer_generation = "") {
  std::string d = "{";
  if (!writer_generation.empty()) d += "\"writer_generation\": \"" + writer_generation + "\", ";
  d += "\"tables\": [";
  for (size_t i = 0; i < tables.size(); ++i) d += (i ? ", " : "") + tables[i];
  return d + "]}";
}

struct Plugin {
  const hsTunerV6* v6 = nullptr;
  int (*stats)(void*, hsTunerStats*) = nullptr;

  static Plugin& Get(const std::string& name) {
    static Plugin p;
    if (!p.v6) {
      std::string prefix = name + std::to_string(getpid()) + ".";
      setenv("HEROSERVE_SHM_PREFIX", prefix.c_str(), 1);
      void* lib = dlopen(HEROSERVE_PLUGIN, RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        p.v6 = static_cast<const hsTunerV6*>(dlsym(lib, HS_TUNER_SYMBOL_V6));
        p.stats = reinterpret_cast<int (*)(void*, hsTunerStats*)>(
            dlsym(lib, "heroserveTunerStats"));
      }
    }
    return p;
  }

  void* Init(const std::string& group, size_t nranks = 2) {
    setenv("HEROSERVE_GROUP", group.c_str(), 1);
    void* ctx = nullptr;
    EXPECT_EQ(v6->init(&ctx, 1, nranks, 1, Logger, nullptr, nullptr), 0);
    return ctx;
  }

  // One AllReduce: the algorithm the cost table ends up favouring (-1 when NCCL's own
  // favourite, Ring/LL at cost 5, still wins because the plugin left the table alone).
  struct Call {
    int algo;
    bool untouched;
    int64_t ns;
  };
  Call AllReduce(void* ctx, size_t bytes) {
    float t[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
    for (int a = 0; a < HS_NUM_ALGORITHMS; ++a)
      for (int p = 0; p < HS_NUM_PROTOCOLS; ++p) t[a][p] = 10.0f + static_cast<float>(a * 3 + p);
    t[HS_ALGO_RING][HS_PROTO_LL] = 5.0f;
    float ref[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
    std::memcpy(ref, t, sizeof t);
    int nch = 0;
    auto t0 = std::chrono::steady_clock::now();
    int rc = v6->getCollInfo(ctx, HS_NCCL_FUNC_ALLREDUCE, bytes, 1, reinterpret_cast<float**>(t),
                             HS_NUM_ALGORITHMS, HS_NUM_PROTOCOLS, 0, &nch);
    int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count();
    EXPECT_EQ(rc, 0);
    int best = -1;
    float bc = 0;
    for (int a = 0; a < HS_NUM_ALGORITHMS; ++a)
      for (int p = 0; p < HS_NUM_PROTOCOLS; ++p)
        if (best < 0 || t[a][p] < bc) {
          best = a;
          bc = t[a][p];
        }
    return Call{best, std::memcmp(t, ref, sizeof t) == 0, ns};
  }

  hsTunerStats Stats(void* ctx) {
    hsTunerStats st{};
    stats(ctx, &st);
    return st;
  }
};

// A test on a group of its own, "<name>/<test name>/0", whose contexts are finalized and
// whose segment is removed after it.
class PluginTest : public ::testing::Test {
 protected:
  explicit PluginTest(std::string name) : name_(std::move(name)) {}
  void SetUp() override {
    plugin_ = &Plugin::Get(name_);
    ASSERT_NE(plugin_->v6, nullptr) << dlerror();
    ASSERT_NE(plugin_->stats, nullptr);
    group_ = name_ + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/0";
    shm_name_ = heroserve::shm::SegmentName(group_);
  }
  void TearDown() override {
    for (void* c : ctxs_) plugin_->v6->finalize(c);
    shm_unlink(shm_name_.c_str());
  }
  void* Init(size_t nranks = 2) {
    ctxs_.push_back(plugin_->Init(group_, nranks));
    return ctxs_.back();
  }

  std::string name_;
  Plugin* plugin_ = nullptr;
  std::string group_, shm_name_;
  std::vector<void*> ctxs_;
};

}  // namespace plugin_test
