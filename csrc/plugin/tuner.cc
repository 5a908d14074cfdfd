// libnccl-tuner-heroserve.so: HeroServe's online scheduler as an NCCL tuner plugin.
//
// Every AllReduce of a communicator gets the policy the online scheduler (Eqs. 16-17) picks
// from the group's table, which the GPU agent publishes in shared memory. The policy's scheme
// maps to NCCL's algorithms: hier -> CollNet Direct (NCCL's hierarchical CollNet: all-to-all
// reduce-scatter inside the node, the network reduces one shard per NIC, all-gather), flat
// INA -> CollNet Chain (chain inside the node, one network reduction), NVLS -> NVLS, ring ->
// Ring, each with the other CollNet / NVLS Tree as second choice. The plugin makes that
// algorithm's best protocol cost 0 so NCCL picks it. Other collectives are left to NCCL and
// do not advance the sequence.
//
// Determinism: a choice depends only on (table version in force, collective sequence number,
// nBytes); tables switch at the sequence number the controller names (apply_from_seq). No
// rank-local input (timing, rank, local utilisation) enters the decision, so all ranks of a
// communicator agree. A rank that cannot read its segment decides exactly as a rank whose
// daemon has not published yet: from the tables it holds (csrc/README.md, "Determinism").
//
// Safety: the plugin never fails NCCL and never waits on the daemon beyond a bound. The
// segment (read by GroupFeed, feed.h) is untrusted: sizes come from the mapping, a seqlock
// held odd is waited on for at most kCollectiveWaitNs per collective (then the tables
// already held decide; counted as `stalled` and logged at most once a minute), a garbled,
// truncated or foreign segment is refused (counted as `refused`, logged likewise) and the
// last good table stays in force. A payload is parsed once per publish of new bytes, never
// when its header declares more than shm::kMaxPayloadBytes, and on a collective only when it
// is at most kInlineReadBytes long: a longer one is read by the group's reader thread.
//
// A single-rank communicator (a TP=1 group) has no all-reduce on the network, and the
// controller publishes no table for it (docs/policy-table.md): its context attaches to no
// group, so it never claims the group's telemetry counters, and NCCL decides everything.
//
// Environment: HEROSERVE_GROUP (group id, "<role>/<instance>/<stage>"; required),
// HEROSERVE_SHM_PREFIX (segment name prefix, tests), NCCL_ALGO / NCCL_PROTO (override us:
// logged at init).
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "feed.h"
#include "heroserve/policy.h"
#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"

namespace {

using heroserve::Scheduler;
using heroserve::Scheme;
using heroserve::Selection;
using heroserve::tuner::FeedFor;
using heroserve::tuner::GroupFeed;
using heroserve::tuner::kAttachWaitNs;
using heroserve::tuner::kCollectiveWaitNs;
using heroserve::tuner::LogTo;
using heroserve::tuner::SegState;
namespace shm = heroserve::shm;

constexpr const char* kName = "HeroServe";

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
      // The tables already published may govern this communicator's first collectives: read
      // them now, waiting (boundedly) for a publish in progress or another context's read.
      if (ctx->feed->Refresh(log, kAttachWaitNs, true, &ctx->stats) ==
          SegState::kStalled) {
        ++ctx->stats.stalled;
      }
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

// NCCL's algorithms for a scheme, first choice first. CollNet Direct is NCCL's hierarchical
// CollNet (reduce-scatter across the node's GPUs, each GPU's NIC reduces its shard in the
// network, all-gather): hier. CollNet Chain reduces along a chain inside the node and sends
// one vector to the network: the flat INA of one aggregation per group. Each falls back to
// the other, still an in-network reduction, when NCCL offers only that one.
void CandidatesFor(Scheme s, int out[2]) {
  switch (s) {
    case Scheme::kHier: out[0] = HS_ALGO_COLLNET_DIRECT; out[1] = HS_ALGO_COLLNET_CHAIN; return;
    case Scheme::kIna: out[0] = HS_ALGO_COLLNET_CHAIN; out[1] = HS_ALGO_COLLNET_DIRECT; return;
    case Scheme::kNvls: out[0] = HS_ALGO_NVLS; out[1] = HS_ALGO_NVLS_TREE; return;
    case Scheme::kRing: break;
  }
  out[0] = out[1] = HS_ALGO_RING;
}

int AlgorithmFor(Scheme s, const float* table, int numAlgo, int numProto, int* proto) {
  int candidates[2];
  CandidatesFor(s, candidates);
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
  if (ctx->feed->Refresh(ctx->log, kCollectiveWaitNs, false, &ctx->stats) ==
      SegState::kStalled) {
    ++ctx->stats.stalled;
  }
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
  shm::Segment* seg = ctx->feed->seg.load(std::memory_order_acquire);
  if (seg && slot >= 0 && ctx->feed->counter_owner.load(std::memory_order_relaxed) == ctx) {
    // Counters live in the header, inside every mapping (slot < kMaxProcs, index checked).
    if (sel->version != ctx->counted_version) {
      seg->ResetSlot(slot, sel->version);
      ctx->counted_version = sel->version;
    }
    seg->Count(slot, sel->index, nbytes, sel->seq);
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
    int candidates[2];
    CandidatesFor(sel.scheme, candidates);
    int algo = candidates[0];
    if (sel.scheme == Scheme::kHier || sel.scheme == Scheme::kIna) {
      algo = collNetSupport ? algo : -1;
    } else if (sel.scheme == Scheme::kNvls) {
      algo = nvlsSupport ? algo : -1;
    }
    if (algo < 0) {
      NoteUnsupported(ctx, sel);
      return HS_NCCL_SUCCESS;
    }
    *algorithm = algo;
    *protocol = HS_PROTO_SIMPLE;  // v2 must set both; Simple is valid for every one of them
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
  const auto* ctx = static_cast<Context*>(context);
  *out = ctx->stats;
  if (ctx->feed) {  // what the group's reader thread did for every context
    out->reader_parsed = ctx->feed->async_parsed.load(std::memory_order_relaxed);
    out->refused += ctx->feed->async_refused.load(std::memory_order_relaxed);
  }
  return 0;
}

}  // extern "C"
