// getCollInfo's latency under a writer that pads its table (the payload limit,
// shm::kMaxPayloadBytes, csrc/README.md "Shared memory"). Loads the tuner plugin as NCCL does
// and times each AllReduce decision alone (median and p99, ns) with:
//   normal             a typical table (16 policies) published once: the baseline
//   normal_republished the same table with new bytes before every decision (one real parse)
//   hostile_1MiB       a valid table padded with blanks to 1 MiB, new bytes before every
//                      decision (within the limit: one parse per publish)
//   hostile_limit      the same at the limit itself: the worst a writer can make a decision
//                      cost
//   hostile_256MiB     the same padded to 256 MiB (the finding's size): refused on its header
// Each hostile writer bypasses Publish (which refuses past the limit): it writes the bytes,
// their length and checksum and moves the counter, as a third party with write access would.
// Prints one line per case with ratios against `normal` of the same run.
// Usage: bench_tuner_table PLUGIN.so [decisions]; benchmarks/bench_tuner_table.py runs it.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"

namespace shm = heroserve::shm;
using Clock = std::chrono::steady_clock;

namespace {

const char* kGroup = "benchtable/0/0";

// A table of n ring/ina policies over n + 1 links, in the JSON form the plugin reads.
std::string TableJson(size_t n, uint64_t version) {
  std::string links, pols;
  for (size_t i = 0; i <= n; ++i) {
    links += std::string(i ? ", " : "") + "{\"id\": \"n" + std::to_string(i) + "|n" +
             std::to_string(i + 1) + "\", \"capacity\": 1.25e10}";
  }
  for (size_t i = 0; i < n; ++i) {
    pols += std::string(i ? ", " : "") + "{\"id\": " + std::to_string(i) +
            ", \"scheme\": \"ring\", \"links\": [\"n" + std::to_string(i) + "|n" +
            std::to_string(i + 1) + "\"], \"cost\": 0.0}";
  }
  return "{\"tables\": [{\"group_id\": \"" + std::string(kGroup) +
         "\", \"version\": " + std::to_string(version) +
         ", \"apply_from_seq\": 0, \"window_s\": 0.001, \"gamma\": 0.5, \"links\": [" + links +
         "], \"policies\": [" + pols + "]}]}";
}

struct Times {
  double median, p99;
};

Times Decide(const hsTunerV6* v6, void* ctx, uint64_t n,
             const std::function<void(uint64_t)>& before) {
  std::vector<double> ns(n);
  float table[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
  int nch = 0;
  for (uint64_t i = 0; i < n; ++i) {
    for (auto& row : table)
      for (float& c : row) c = 1.0f;
    if (before) before(i);
    auto t0 = Clock::now();
    v6->getCollInfo(ctx, HS_NCCL_FUNC_ALLREDUCE, size_t{1} << 20, 1,
                    reinterpret_cast<float**>(table), HS_NUM_ALGORITHMS, HS_NUM_PROTOCOLS, 0,
                    &nch);
    ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  std::sort(ns.begin(), ns.end());
  return Times{ns[n / 2], ns[std::min<uint64_t>(n - 1, n * 99 / 100)]};
}

char* Data(shm::Segment& w) {
  return reinterpret_cast<char*>(w.header()) + ((sizeof(shm::Header) + 63) & ~size_t{63});
}

// A hostile publish of `len` bytes already in the segment: one padding byte changed so the
// bytes are new (the reader cannot take them for the ones it holds), then the true checksum,
// the length and a new counter value.
void Forge(shm::Segment& w, size_t body, size_t len, uint64_t i) {
  char* d = Data(w);
  size_t at = body + (i * 7919) % (len - body);
  d[at] = d[at] == ' ' ? '\n' : ' ';
  __atomic_fetch_add(&w.header()->seq, 1, __ATOMIC_RELEASE);  // odd: writing
  __atomic_store_n(&w.header()->length, len, __ATOMIC_RELEASE);
  __atomic_store_n(&w.header()->checksum, shm::Checksum(d, len), __ATOMIC_RELEASE);
  __atomic_fetch_add(&w.header()->seq, 1, __ATOMIC_RELEASE);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_tuner_table PLUGIN.so [decisions]\n");
    return 2;
  }
  const uint64_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 2000;
  if (n < 10) {
    std::fprintf(stderr, "decisions must be a whole number of at least 10\n");
    return 2;
  }
  std::string prefix = "benchtable" + std::to_string(getpid()) + ".";
  setenv("HEROSERVE_SHM_PREFIX", prefix.c_str(), 1);
  setenv("HEROSERVE_GROUP", kGroup, 1);
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  auto* v6 = lib ? static_cast<const hsTunerV6*>(dlsym(lib, HS_TUNER_SYMBOL_V6)) : nullptr;
  if (!v6) {
    std::fprintf(stderr, "cannot load the tuner plugin %s\n", argv[1]);
    return 2;
  }
  const size_t big = size_t{256} << 20;
  shm::Segment w;
  std::string err;
  const std::string name = shm::SegmentName(kGroup);
  const std::string doc = TableJson(16, 1);
  if (!w.Create(name, big + 4096, &err) || !w.Publish(doc, 1, &err)) {
    std::fprintf(stderr, "segment: %s\n", err.c_str());
    return 2;
  }
  void* ctx = nullptr;
  v6->init(&ctx, 1, 8, 1, nullptr, nullptr, nullptr);
  std::printf("payload_limit_bytes=%zu normal_payload_bytes=%zu\n", shm::kMaxPayloadBytes,
              doc.size());
  const Times base = Decide(v6, ctx, n, nullptr);
  auto print = [&](const char* what, size_t bytes, const Times& t) {
    std::printf("%s payload_bytes=%zu median_ns=%.0f p99_ns=%.0f median_ratio=%.1f "
                "p99_ratio=%.1f\n",
                what, bytes, t.median, t.p99, t.median / base.median, t.p99 / base.p99);
  };
  print("normal", doc.size(), base);
  print("normal_republished", doc.size(), Decide(v6, ctx, n, [&](uint64_t i) {
          w.Publish(i & 1 ? doc + " " : doc, 1, &err);
        }));
  // The hostile table: the normal one (a higher version, so it is valid and takes effect)
  // padded with blanks.
  const std::string body = TableJson(16, 2);
  struct Case {
    const char* what;
    size_t bytes;
    uint64_t decisions;
  };
  const Case cases[] = {
      {"hostile_1MiB", size_t{1} << 20, std::max<uint64_t>(n / 4, 10)},
      {"hostile_limit", shm::kMaxPayloadBytes, std::max<uint64_t>(n / 4, 10)},
      {"hostile_256MiB", big, std::max<uint64_t>(n / 100, 10)},
  };
  for (const Case& c : cases) {
    std::memcpy(Data(w), body.data(), body.size());
    std::memset(Data(w) + body.size(), ' ', c.bytes - body.size());
    print(c.what, c.bytes,
          Decide(v6, ctx, c.decisions, [&](uint64_t i) { Forge(w, body.size(), c.bytes, i); }));
  }
  hsTunerStats st{};
  if (auto stats = reinterpret_cast<int (*)(void*, hsTunerStats*)>(
          dlsym(lib, "heroserveTunerStats"))) {
    stats(ctx, &st);
  }
  // parsed: by the decisions themselves (init included); reader_parsed: by the reader thread.
  std::printf("tuner_stats selections=%llu refused=%llu parsed=%llu reader_parsed=%llu\n",
              static_cast<unsigned long long>(st.selections),
              static_cast<unsigned long long>(st.refused),
              static_cast<unsigned long long>(st.parsed),
              static_cast<unsigned long long>(st.reader_parsed));
  v6->finalize(ctx);
  shm_unlink(name.c_str());
  return 0;
}
