// Policy-core benchmark: ns per selection (16 and 256 policies, 1 and 2 threads, each thread
// its own Scheduler reading one shared TableStore) and updates per second (table publishes
// into the store while readers select; utilisation windows, Eq. 18, per scheduler); with the
// plugin's path, ns per getCollInfo with a healthy, republished, garbled and stalled segment.
// Prints one line per figure; benchmarks/bench_policy_core.py runs it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include "heroserve/policy.h"
#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"

using heroserve::Policy;
using heroserve::PolicyTable;
using heroserve::Scheduler;
using heroserve::Selection;
using heroserve::TableStore;
using Clock = std::chrono::steady_clock;

static std::shared_ptr<PolicyTable> MakeTable(size_t n, uint64_t version) {
  auto t = std::make_shared<PolicyTable>();
  t->group_id = "bench/0/0";
  t->version = version;
  t->window_s = 0.001;
  t->gamma = 0.5;
  for (size_t i = 0; i <= n; ++i) {
    t->link_ids.push_back("n" + std::to_string(i) + "|n" + std::to_string(i + 1));
    t->capacities.push_back(12.5e9 * static_cast<double>(1 + i % 4));
    t->utilisation.push_back(0.05 * static_cast<double>(i % 9));
  }
  for (size_t i = 0; i < n; ++i) {
    Policy p;
    p.id = static_cast<uint32_t>(i);
    p.scheme = static_cast<heroserve::Scheme>(i % 3);
    p.links = {static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1)};
    p.bottleneck = std::min(t->capacities[i], t->capacities[i + 1]);
    p.bandwidth = p.bottleneck;
    t->policies.push_back(p);
  }
  return t;
}

static double SelectNs(size_t n, int threads, uint64_t iters) {
  TableStore store;
  store.Publish(MakeTable(n, 1));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> ns(threads);
  std::vector<std::thread> pool;
  volatile uint32_t sink = 0;
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      Scheduler s(&store);
      Selection sel;
      s.Select(1, &sel);  // activate outside the timed loop
      ready.fetch_add(1);
      while (!go.load()) {
      }
      auto t0 = Clock::now();
      uint32_t acc = 0;
      for (uint64_t i = 0; i < iters; ++i) {
        s.Select(static_cast<double>(4096u << (i & 15)), &sel);
        acc += sel.policy_id;
      }
      auto t1 = Clock::now();
      sink = sink + acc;
      ns[k] = std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iters);
    });
  }
  while (ready.load() < threads) {
  }
  go.store(true);
  for (auto& th : pool) th.join();
  double mean = 0;
  for (double v : ns) mean += v;
  return mean / threads;
}

// Whole plugin path: ns per getCollInfo (shm check, table store poll, selection, counters,
// cost-table rewrite) with a 16-policy table published in a private segment; then the same
// call with the segment stalled (an agent killed mid-publish left the seqlock odd), garbled,
// and republished every call, and the writer's publish time. The target: a collective is
// decided within 10 us of the segment read, whatever the segment holds.
struct CallTimes {
  double mean, median, p99;  // ns per getCollInfo (each call timed alone)
};

static CallTimes CallNs(const hsTunerV6* v6, void* ctx, uint64_t iters,
                        const std::function<void(uint64_t)>& before_each) {
  float table[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
  int nch = 0;
  std::vector<double> ns(iters);
  for (uint64_t i = 0; i < iters; ++i) {
    for (auto& row : table)
      for (float& c : row) c = 1.0f;
    if (before_each) before_each(i);
    auto t0 = Clock::now();
    v6->getCollInfo(ctx, HS_NCCL_FUNC_ALLREDUCE, 4096u << (i & 15), 1,
                    reinterpret_cast<float**>(table), HS_NUM_ALGORITHMS, HS_NUM_PROTOCOLS, 0,
                    &nch);
    ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  double sum = 0;
  for (double v : ns) sum += v;
  std::sort(ns.begin(), ns.end());
  return CallTimes{sum / static_cast<double>(iters), ns[iters / 2], ns[iters * 99 / 100]};
}

static void PrintCall(const char* what, const CallTimes& t, const std::string& extra = "") {
  std::printf("%s ns_per_call=%.1f median_ns=%.1f p99_ns=%.1f%s\n", what, t.mean, t.median,
              t.p99, extra.c_str());
}

static void PluginNs(const char* path, uint64_t iters) {
  std::string prefix = "bench" + std::to_string(getpid()) + ".";
  setenv("HEROSERVE_SHM_PREFIX", prefix.c_str(), 1);
  setenv("HEROSERVE_GROUP", "bench/0/0", 1);
  heroserve::shm::Segment seg;
  std::string err;
  std::string name = heroserve::shm::SegmentName("bench/0/0");
  const std::string doc = "{\"tables\": [" + heroserve::TableToJson(*MakeTable(16, 1)) + "]}";
  if (!seg.Create(name, 1 << 20, &err) || !seg.Publish(doc, 1, &err)) {
    std::printf("plugin_ns skipped: %s\n", err.c_str());
    return;
  }
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  auto* v6 = lib ? static_cast<const hsTunerV6*>(dlsym(lib, HS_TUNER_SYMBOL_V6)) : nullptr;
  if (!v6) {
    std::printf("plugin_ns skipped: cannot load %s\n", path);
    shm_unlink(name.c_str());
    return;
  }
  // The plugin's fallback log lines (a stalled segment is warned about once) go to stderr.
  void* ctx = nullptr;
  v6->init(&ctx, 1, 8, 1, nullptr, nullptr, nullptr);
  PrintCall("plugin_getcollinfo policies=16", CallNs(v6, ctx, iters, nullptr));
  uint64_t* seq = &seg.header()->seq;
  // The segment a collective reads and parses anew every call (publish between calls).
  const uint64_t reads = std::max<uint64_t>(iters / 1000, 200);
  PrintCall("plugin_getcollinfo_new_table policies=16",
            // New bytes each time: a republish of the bytes held is not parsed again.
            CallNs(v6, ctx, reads,
                   [&](uint64_t i) { seg.Publish(i & 1 ? doc + " " : doc, 1, &err); }),
            " payload_bytes=" + std::to_string(doc.size()));
  // Garbled: the counter moves, the checksum does not match (read, checked, refused).
  PrintCall("plugin_getcollinfo_garbled", CallNs(v6, ctx, reads, [&](uint64_t) {
              __atomic_fetch_add(&seg.header()->checksum, 1, __ATOMIC_RELEASE);
              __atomic_fetch_add(seq, 2, __ATOMIC_RELEASE);
            }));
  // Stalled, first look at each odd value: the bounded wait, then the decision.
  __atomic_fetch_add(seq, 1, __ATOMIC_RELEASE);
  CallTimes first = CallNs(v6, ctx, reads, [&](uint64_t) {
    __atomic_fetch_add(seq, 2, __ATOMIC_RELEASE);  // a new odd value every call
  });
  // Stalled, steady state: the same odd value, already given up on.
  CallTimes steady = CallNs(v6, ctx, iters, nullptr);
  hsTunerStats st{};
  auto stats = reinterpret_cast<int (*)(void*, hsTunerStats*)>(dlsym(lib, "heroserveTunerStats"));
  if (stats) stats(ctx, &st);
  PrintCall("plugin_getcollinfo_stalled_first", first);
  PrintCall("plugin_getcollinfo_stalled", steady,
            " stalled_counted=" + std::to_string(st.stalled));
  // The bound, on the median (a busy shared machine preempts single calls).
  std::printf("stalled_decision_within_10us=%s\n",
              first.median < 10000 && steady.median < 10000 ? "yes" : "NO");
  v6->finalize(ctx);
  // The writer's side: one publish (copy + checksum under the seqlock).
  for (size_t bytes : {doc.size(), size_t{1} << 20}) {
    std::string payload = bytes == doc.size() ? doc : std::string(bytes, ' ');
    const uint64_t n = bytes == doc.size() ? 20000 : 200;
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) seg.Publish(payload, 1, &err);
    std::printf("publish payload_bytes=%zu ns_per_publish=%.0f\n", bytes,
                std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                    static_cast<double>(n));
  }
  shm_unlink(name.c_str());
}

int main(int argc, char** argv) {
  uint64_t iters = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2000000;
  for (size_t n : {16u, 256u}) {
    for (int threads : {1, 2}) {
      uint64_t it = n == 256 ? iters / 16 : iters;
      std::printf("select_ns policies=%zu threads=%d ns_per_selection=%.1f\n", n, threads,
                  SelectNs(n, threads, it));
    }
  }
  // Table publishes per second with one reader selecting concurrently.
  for (size_t n : {16u, 256u}) {
    TableStore store;
    store.Publish(MakeTable(n, 1));
    std::vector<std::shared_ptr<PolicyTable>> tables;
    const uint64_t updates = n == 16 ? 20000 : 2000;
    for (uint64_t v = 2; v < updates + 2; ++v) {
      auto t = MakeTable(n, v);
      t->apply_from_seq = v;
      tables.push_back(t);
    }
    std::atomic<bool> stop{false};
    uint64_t reader_selects = 0;
    std::thread reader([&] {
      Scheduler s(&store);
      Selection sel;
      while (!stop.load(std::memory_order_relaxed)) {
        s.Select(65536.0, &sel);
        ++reader_selects;
      }
    });
    auto t0 = Clock::now();
    for (auto& t : tables) store.Publish(t);
    auto t1 = Clock::now();
    stop.store(true);
    reader.join();
    double secs = std::chrono::duration<double>(t1 - t0).count();
    std::printf("table_updates policies=%zu updates_per_s=%.0f (reader made %llu selections)\n",
                n, static_cast<double>(updates) / secs,
                static_cast<unsigned long long>(reader_selects));
  }
  // Utilisation windows (Eq. 18 + decay) per second on one scheduler.
  for (size_t n : {16u, 256u}) {
    Scheduler s;
    auto t = MakeTable(n, 1);
    s.Install(t);
    Selection sel;
    s.Select(1, &sel);
    std::vector<std::pair<std::string, double>> u;
    for (size_t i = 0; i < t->link_ids.size(); i += 2) u.emplace_back(t->link_ids[i], 0.5);
    const uint64_t windows = n == 16 ? 100000 : 100;
    std::string err;
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < windows; ++i) s.ObserveUtilisation(u, &err);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("utilisation_windows policies=%zu updates_per_s=%.0f\n", n,
                static_cast<double>(windows) / secs);
  }
  if (argc > 2) PluginNs(argv[2], iters);
  return 0;
}
