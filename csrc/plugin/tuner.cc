// libnccl-tuner-heroserve.so: HeroServe's online scheduler as an NCCL tuner plugin.
//
// Every AllReduce of a communicator gets the policy the online scheduler (Eqs. 16-17) picks
// from the group's table, which the GPU agent publishes in shared memory. The policy's scheme
// maps to NCCL's algorithms (INA -> CollNet Direct, else Chain; NVLS -> NVLS, else NVLS Tree;
// ring -> Ring) and the plugin makes that algorithm's best protocol cost 0 so NCCL picks it.
// Other collectives are left to NCCL and do not advance the sequence.
//
// Determinism: a choice depends only on (table version in force, collective sequence number,
// nBytes); tables switch at the sequence number the controller names (apply_from_seq). No
// rank-local input (timing, rank, local utilisation) enters the decision, so all ranks of a
// communicator agree.
//
// Safety: the plugin never fails NCCL. No segment, a garbled segment or a bad table mean
// "leave NCCL's defaults" (logged once); the last good table stays in force.
//
// A single-rank communicator (a TP=1 group) has no all-reduce on the network, and the
// controller publishes no table for it (docs/policy-table.md): its context attaches to no
// group, so it never claims the group's telemetry counters, and NCCL decides everything.
//
// Environment: HEROSERVE_GROUP (group id, "<role>/<instance>/<stage>"; required),
// HEROSERVE_SHM_PREFIX (segment name prefix, tests), NCCL_ALGO / NCCL_PROTO (override us:
// logged at init).
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <new>
#include <string>

#include "heroserve/json.h"
#include "heroserve/policy.h"
#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"

namespace {

using heroserve::PolicyTable;
using heroserve::Scheduler;
using heroserve::Scheme;
using heroserve::Selection;
using heroserve::TableStore;
namespace shm = heroserve::shm;

constexpr const char* kName = "HeroServe";

void LogTo(hsNcclLogger fn, int level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

void LogTo(hsNcclLogger fn, int level, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (fn) {
    fn(level, HS_NCCL_TUNING, __FILE__, __LINE__, "HeroServe tuner: %s", buf);
  } else {
    std::fprintf(stderr, "[heroserve-tuner] %s: %s\n", level == HS_NCCL_LOG_WARN ? "WARN" : "INFO",
                 buf);
  }
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One per group per process: the shm segment and the in-process table store fed from it.
// Any context may refresh it (try-lock, so at most one parses); all read the store lock-free.
struct GroupFeed {
  std::string group;
  std::string shm_name;
  std::mutex refresh_mu;
  shm::Segment seg;          // guarded by refresh_mu
  uint64_t shm_seq_seen = 0; // guarded by refresh_mu
  std::atomic<uint64_t> shm_seq_hint{0};
  std::atomic<int64_t> next_open_ns{0};
  std::atomic<int> slot{-1};
  // One context per group per process counts selections (all members choose alike, and
  // several communicators of one group in one process must not be counted twice).
  std::atomic<void*> counter_owner{nullptr};
  TableStore store;
  std::atomic<bool> warned_missing{false};
  std::atomic<bool> warned_garbled{false};
  std::atomic<bool> warned_bad_table{false};

  // Cheap when nothing changed: one load of the shm seqlock counter.
  void MaybeRefresh(hsNcclLogger log) {
    const shm::Header* h = nullptr;
    {
      // Fast path without the lock: seg is only (re)opened under refresh_mu and never closed
      // while the process runs, so a non-null header stays valid.
      h = open_hdr.load(std::memory_order_acquire);
    }
    if (h) {
      uint64_t s = __atomic_load_n(&h->seq, __ATOMIC_ACQUIRE);
      if (s == shm_seq_hint.load(std::memory_order_acquire)) return;
    } else if (NowNs() < next_open_ns.load(std::memory_order_relaxed)) {
      return;  // segment missing: retry opening at most every 100 ms
    }
    // Block (not try-lock) while another context refreshes: a context must not choose before
    // the tables already in shm reach the store, or ranks could diverge. Only on a change.
    std::lock_guard<std::mutex> lock(refresh_mu);
    if (!seg.is_open()) {
      std::string err;
      if (!seg.Open(shm_name, &err)) {
        next_open_ns.store(NowNs() + 100000000, std::memory_order_relaxed);
        if (!warned_missing.exchange(true)) {
          LogTo(log, HS_NCCL_LOG_WARN, "%s; using NCCL's defaults until the agent publishes",
                err.c_str());
        }
        return;
      }
      slot.store(seg.ClaimSlot(), std::memory_order_relaxed);
      open_hdr.store(seg.header(), std::memory_order_release);
      LogTo(log, HS_NCCL_LOG_INFO, "attached to %s for group %s", shm_name.c_str(), group.c_str());
    }
    std::string payload;
    auto st = seg.Read(&shm_seq_seen, &payload);
    // The daemon holds the seqlock only for a copy: retry rather than choose without the
    // tables already published (ranks that did get them would choose differently).
    for (int tries = 0; st == shm::Segment::ReadStatus::kBusy && tries < 100000; ++tries) {
      std::this_thread::yield();
      st = seg.Read(&shm_seq_seen, &payload);
    }
    if (st == shm::Segment::ReadStatus::kBusy || st == shm::Segment::ReadStatus::kEmpty) return;
    // The hint moves only after the store holds the new tables (other contexts skip the lock
    // once they see it).
    struct HintOnExit {
      GroupFeed* f;
      ~HintOnExit() { f->shm_seq_hint.store(f->shm_seq_seen, std::memory_order_release); }
    } hint_on_exit{this};
    if (st == shm::Segment::ReadStatus::kUnchanged) return;
    if (st == shm::Segment::ReadStatus::kGarbled) {
      if (!warned_garbled.exchange(true)) {
        LogTo(log, HS_NCCL_LOG_WARN, "garbled policy segment %s ignored; keeping the last good table",
              shm_name.c_str());
      }
      return;
    }
    if (st != shm::Segment::ReadStatus::kOk) return;
    heroserve::json::Value doc;
    std::string err;
    const heroserve::json::Value* tables = nullptr;
    if (!heroserve::json::Parse(payload, &doc, &err) || !(tables = doc.find("tables")) ||
        !tables->is_array()) {
      if (!warned_bad_table.exchange(true)) {
        LogTo(log, HS_NCCL_LOG_WARN, "policy segment %s is not a table list (%s); ignored",
              shm_name.c_str(), err.c_str());
      }
      return;
    }
    for (const auto& tv : tables->items()) {
      auto t = std::make_shared<PolicyTable>();
      err.clear();
      if (!heroserve::ParseTable(tv, t.get(), &err) || t->group_id != group) {
        if (!warned_bad_table.exchange(true)) {
          LogTo(log, HS_NCCL_LOG_WARN, "bad table in %s ignored: %s", shm_name.c_str(),
                err.empty() ? "group mismatch" : err.c_str());
        }
        continue;
      }
      store.Publish(std::move(t));  // stale versions are refused by the store
    }
  }

  std::atomic<shm::Header*> open_hdr{nullptr};
};

std::mutex g_feeds_mu;
std::map<std::string, std::unique_ptr<GroupFeed>>* g_feeds = nullptr;  // never freed: NCCL
                                                                       // may unload us late

GroupFeed* FeedFor(const std::string& group) {
  std::lock_guard<std::mutex> lock(g_feeds_mu);
  if (!g_feeds) g_feeds = new std::map<std::string, std::unique_ptr<GroupFeed>>();
  auto& f = (*g_feeds)[group];
  if (!f) {
    f = std::make_unique<GroupFeed>();
    f->group = group;
    f->shm_name = shm::SegmentName(group);
  }
  return f.get();
}

struct Context {
  hsNcclLogger log = nullptr;
  size_t nranks = 0, nnodes = 0;
  GroupFeed* feed = nullptr;  // null: no group configured, NCCL defaults
  std::unique_ptr<Scheduler> sched;
  uint64_t counted_version = 0;
  hsTunerStats stats{};
  bool warned_no_table = false;
  uint64_t late_seen = 0;
  bool warned_unsupported = false;
};

hsNcclResult InitCommon(size_t nranks, size_t nnodes, hsNcclLogger log, void** context) {
  if (!context) return HS_NCCL_INVALID_ARGUMENT;
  auto* ctx = new (std::nothrow) Context();
  if (!ctx) return HS_NCCL_INTERNAL_ERROR;
  ctx->log = log;
  ctx->nranks = nranks;
  ctx->nnodes = nnodes;
  ctx->stats.last_algorithm = -1;
  try {
    const char* group = std::getenv("HEROSERVE_GROUP");
    if (nranks <= 1) {
      LogTo(log, HS_NCCL_LOG_INFO,
            "single-rank communicator: no all-reduce crosses the network and no policy table "
            "governs it; leaving all choices to NCCL");
    } else if (!group || !*group) {
      LogTo(log, HS_NCCL_LOG_WARN, "HEROSERVE_GROUP is not set; leaving all choices to NCCL");
    } else {
      ctx->feed = FeedFor(group);
      ctx->feed->next_open_ns.store(0, std::memory_order_relaxed);  // new communicator: look now
      ctx->sched = std::make_unique<Scheduler>(&ctx->feed->store);
      void* none = nullptr;
      ctx->feed->counter_owner.compare_exchange_strong(none, ctx);
    }
  } catch (...) {
    ctx->feed = nullptr;
    ctx->sched.reset();
  }
  for (const char* var : {"NCCL_ALGO", "NCCL_PROTO"}) {
    if (const char* v = std::getenv(var)) {
      LogTo(log, HS_NCCL_LOG_WARN,
            "%s=%s is set: NCCL restricts or overrides the tuner's choices; HeroServe's policy "
            "is applied only where that setting leaves it available",
            var, v);
    }
  }
  *context = ctx;
  return HS_NCCL_SUCCESS;
}

int AlgorithmFor(Scheme s, const float* table, int numAlgo, int numProto, int* proto) {
  int candidates[2];
  switch (s) {
    case Scheme::kIna: candidates[0] = HS_ALGO_COLLNET_DIRECT; candidates[1] = HS_ALGO_COLLNET_CHAIN; break;
    case Scheme::kNvls: candidates[0] = HS_ALGO_NVLS; candidates[1] = HS_ALGO_NVLS_TREE; break;
    default: candidates[0] = HS_ALGO_RING; candidates[1] = HS_ALGO_RING; break;
  }
  for (int a : candidates) {
    if (a >= numAlgo) continue;
    int best = -1;
    for (int p = 0; p < numProto; ++p) {
      float c = table[a * numProto + p];
      if (c < 0.0f) continue;  // NCCL_ALGO_PROTO_IGNORE: unsupported or disabled
      if (best < 0 || c < table[a * numProto + best]) best = p;
    }
    if (best >= 0) {
      *proto = best;
      return a;
    }
  }
  return -1;
}

// Runs the scheduler for one collective; false when NCCL's defaults must stand.
bool Decide(Context* ctx, hsNcclFunc coll, size_t nbytes, Selection* sel) {
  if (coll != HS_NCCL_FUNC_ALLREDUCE || !ctx->sched) return false;
  ctx->feed->MaybeRefresh(ctx->log);
  if (!ctx->sched->Select(static_cast<double>(nbytes), sel)) {
    ++ctx->stats.fallbacks;
    if (!ctx->warned_no_table) {
      ctx->warned_no_table = true;
      LogTo(ctx->log, HS_NCCL_LOG_WARN, "no policy table in force for group %s; NCCL decides",
            ctx->feed->group.c_str());
    }
    return false;
  }
  if (ctx->sched->late_tables() != ctx->late_seen) {
    ctx->late_seen = ctx->sched->late_tables();
    LogTo(ctx->log, HS_NCCL_LOG_WARN,
          "group %s: a table arrived after its apply_from_seq (now at collective %llu); ranks "
          "may disagree until the next version, the controller's margin is too small",
          ctx->feed->group.c_str(), static_cast<unsigned long long>(sel->seq));
  }
  ++ctx->stats.selections;
  ctx->stats.table_version = sel->version;
  ctx->stats.seq = sel->seq + 1;
  ctx->stats.last_policy_id = sel->policy_id;
  int slot = ctx->feed->slot.load(std::memory_order_relaxed);
  if (slot >= 0 && ctx->feed->counter_owner.load(std::memory_order_relaxed) == ctx) {
    shm::Segment& seg = ctx->feed->seg;  // counters only touch the mapped header
    if (sel->version != ctx->counted_version) {
      seg.ResetSlot(slot, sel->version);
      ctx->counted_version = sel->version;
    }
    seg.Count(slot, sel->index, nbytes, sel->seq);
  }
  return true;
}

void NoteUnsupported(Context* ctx, const Selection& sel) {
  ++ctx->stats.fallbacks;
  ctx->stats.last_algorithm = -1;
  if (!ctx->warned_unsupported) {
    ctx->warned_unsupported = true;
    LogTo(ctx->log, HS_NCCL_LOG_WARN,
          "policy %u (%s) needs an algorithm NCCL offers none of here; NCCL decides", sel.policy_id,
          heroserve::SchemeName(sel.scheme));
  }
}

hsNcclResult GetCollInfoTable(void* context, hsNcclFunc coll, size_t nbytes, float** cost_table,
                              int numAlgo, int numProto) {
  auto* ctx = static_cast<Context*>(context);
  if (!ctx || !cost_table || numAlgo <= 0 || numProto <= 0) return HS_NCCL_SUCCESS;
  try {
    Selection sel;
    if (!Decide(ctx, coll, nbytes, &sel)) return HS_NCCL_SUCCESS;
    float* table = reinterpret_cast<float*>(cost_table);
    int proto = -1;
    int algo = AlgorithmFor(sel.scheme, table, numAlgo, numProto, &proto);
    if (algo < 0) {
      NoteUnsupported(ctx, sel);
      return HS_NCCL_SUCCESS;
    }
    table[algo * numProto + proto] = 0.0f;  // lowest possible time: NCCL picks it
    ctx->stats.last_algorithm = algo;
  } catch (...) {
    // Never propagate into NCCL; the defaults stand for this collective.
  }
  return HS_NCCL_SUCCESS;
}

hsNcclResult Destroy(void* context) {
  auto* ctx = static_cast<Context*>(context);
  if (ctx && ctx->feed) {
    void* me = ctx;
    ctx->feed->counter_owner.compare_exchange_strong(me, nullptr);
  }
  delete ctx;
  return HS_NCCL_SUCCESS;
}

// --- v2: the plugin names the algorithm and protocol directly.
hsNcclResult GetCollInfoV2(void* context, hsNcclFunc coll, size_t nbytes, int collNetSupport,
                           int nvlsSupport, int /*numPipeOps*/, int* algorithm, int* protocol,
                           int* /*nChannels*/) {
  auto* ctx = static_cast<Context*>(context);
  if (!ctx || !algorithm || !protocol) return HS_NCCL_SUCCESS;
  try {
    Selection sel;
    if (!Decide(ctx, coll, nbytes, &sel)) return HS_NCCL_SUCCESS;
    int algo = -1;
    if (sel.scheme == Scheme::kIna) {
      algo = collNetSupport ? HS_ALGO_COLLNET_DIRECT : -1;
    } else if (sel.scheme == Scheme::kNvls) {
      algo = nvlsSupport ? HS_ALGO_NVLS : -1;
    } else {
      algo = HS_ALGO_RING;
    }
    if (algo < 0) {
      NoteUnsupported(ctx, sel);
      return HS_NCCL_SUCCESS;
    }
    *algorithm = algo;
    *protocol = HS_PROTO_SIMPLE;  // v2 must set both; Simple is valid for all three
    ctx->stats.last_algorithm = algo;
  } catch (...) {
  }
  return HS_NCCL_SUCCESS;
}

hsNcclResult InitV2(size_t nranks, size_t nnodes, hsNcclLogger log, void** context) {
  return InitCommon(nranks, nnodes, log, context);
}

hsNcclResult GetCollInfoV3(void* context, hsNcclFunc coll, size_t nbytes, int /*numPipeOps*/,
                           float** cost_table, int numAlgo, int numProto, int* /*nChannels*/) {
  return GetCollInfoTable(context, coll, nbytes, cost_table, numAlgo, numProto);
}

hsNcclResult GetCollInfoV4(void* context, hsNcclFunc coll, size_t nbytes, int /*numPipeOps*/,
                           float** cost_table, int numAlgo, int numProto, int /*regBuff*/,
                           int* /*nChannels*/) {
  return GetCollInfoTable(context, coll, nbytes, cost_table, numAlgo, numProto);
}

hsNcclResult InitV5(void** context, uint64_t /*commId*/, size_t nranks, size_t nnodes,
                    hsNcclLogger log, hsNvlDomainInfoV5* /*nvl*/, hsTunerConstantsV5* /*consts*/) {
  return InitCommon(nranks, nnodes, log, context);
}

hsNcclResult GetChunkSizeV6(void* /*context*/, hsNcclFunc /*coll*/, size_t /*nbytes*/,
                            int /*algo*/, int /*proto*/, int /*nChannels*/,
                            size_t* /*chunkSize*/) {
  return HS_NCCL_SUCCESS;  // leave NCCL's chunk size
}

}  // namespace

extern "C" {

// `extern` gives the const objects external linkage (C++ makes namespace-scope consts internal).
#define HS_EXPORT __attribute__((visibility("default")))
HS_EXPORT extern const hsTunerV6 ncclTunerPlugin_v6;
HS_EXPORT extern const hsTunerV5 ncclTunerPlugin_v5;
HS_EXPORT extern const hsTunerV4 ncclTunerPlugin_v4;
HS_EXPORT extern const hsTunerV3 ncclTunerPlugin_v3;
HS_EXPORT extern const hsTunerV2 ncclTunerPlugin_v2;

const hsTunerV6 ncclTunerPlugin_v6 = {
    kName, InitV5, GetCollInfoV4, Destroy, GetChunkSizeV6};
const hsTunerV5 ncclTunerPlugin_v5 = {
    kName, InitV5, GetCollInfoV4, Destroy};
const hsTunerV4 ncclTunerPlugin_v4 = {
    kName, InitV2, GetCollInfoV4, Destroy};
const hsTunerV3 ncclTunerPlugin_v3 = {
    kName, InitV2, GetCollInfoV3, Destroy};
const hsTunerV2 ncclTunerPlugin_v2 = {
    kName, InitV2, GetCollInfoV2, Destroy};

HS_EXPORT int heroserveTunerStats(void* context, hsTunerStats* out) {
  if (!context || !out) return -1;
  *out = static_cast<Context*>(context)->stats;
  return 0;
}

}  // extern "C"
