// NCCL CollNet plugin: all-reduce aggregated in the P4 switch (docs/dataplane.md), exported
// as ncclCollNetPlugin_v8 ... _v12 (csrc/README.md, "CollNet network plugin", says what
// NCCL's loader requires and how versions are picked). One implementation with the v12
// shapes; older versions are thin adapters.
#include <arpa/inet.h>

#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "client.h"
#include "common.h"
#include "group_config.h"

namespace hs = heroserve::ina;
using heroserve::netplugin::Info;
using heroserve::netplugin::Warn;

namespace {

struct LogName {  // the logger name, as a type for HostMemory
  static constexpr const char* kLog = "heroserve.collnet";
};
constexpr const char* kLog = LogName::kLog;
constexpr const char* kName = "HeroServe-INA";
constexpr uint32_t kHandleMagic = 0x48534e41;  // "HSNA"
constexpr uint32_t kHandleVersion = 2;
// At most this many all-reduces queued per communicator; more answer request == NULL
// (NCCL posts again later).
constexpr size_t kMaxPending = 64;

struct Handle {  // exchanged by NCCL among the CollNet ranks (<= NCCL_NET_HANDLE_MAXSIZE)
  uint32_t magic;
  uint32_t version;
  uint32_t group_id;
  uint32_t worker_id;
  uint32_t num_workers;
  uint32_t window;
  uint32_t switch_ip;  // network order
  uint32_t switch_port;
  uint32_t session;
  uint32_t first_generation;
  uint32_t lane_kind;
  uint32_t float_sums;
};
static_assert(sizeof(Handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large");

struct Context {
  uint64_t comm_id = 0;
};

struct ListenComm {
  hs::GroupPolicy policy;
  bool transferred = false;  // a CollComm owns the claim now
};

struct CollComm {
  hs::GroupPolicy policy;
  std::unique_ptr<hs::Engine> engine;
};

struct Request {
  CollComm* comm = nullptr;
  hs::Engine::Op* op = nullptr;  // nullptr: complete at once (a flush)
  size_t bytes = 0;
};

std::mutex g_mu;
std::unique_ptr<hs::GroupConfigSource> g_source;  // guarded by g_mu
heroserve::netplugin::Nic g_nic;
bool g_have_nic = false;
bool g_float_sums = false;  // every entry of the config opts in (reduceSupport is global)
// What reduceSupport offers: int32's types, or only bfp16's (floats) when an entry is bfp16.
const hs::LaneFormat* g_reduce_lanes = &hs::kInt32Lanes;

hs::ElemType ElemOf(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return hs::ElemType::kInt8;
    case ncclUint8:
      return hs::ElemType::kUint8;
    case ncclInt32:
      return hs::ElemType::kInt32;
    case ncclUint32:
      return hs::ElemType::kUint32;
    case ncclFloat32:
      return hs::ElemType::kFloat32;
    case ncclFloat16:
      return hs::ElemType::kFloat16;
    case ncclBfloat16:
      return hs::ElemType::kBfloat16;
    default:
      return hs::ElemType::kOther;
  }
}

// The NIC of the first configured group's local address (this GPU's rail).
void DiscoverNic() {
  if (g_have_nic) return;
  in_addr_t ip = INADDR_ANY;
  std::vector<hs::GroupEntry> e;
  std::string err;
  if (hs::LoadConfiguredGroups(&e, &err) && !e.empty()) {
    ip = e[0].policy.bind_ip;
    g_float_sums = true;
    for (const auto& x : e) g_float_sums = g_float_sums && x.policy.float_sums;
    for (const auto& x : e)
      if (x.policy.spec.lanes.kind == hs::LaneKind::kBfp16) g_reduce_lanes = &hs::kBfp16Lanes;
  }
  if (ip != INADDR_ANY && heroserve::netplugin::FindNic(ip, &g_nic)) {
    g_have_nic = true;
  } else if (heroserve::netplugin::FirstNic(&g_nic, &ip)) {
    g_have_nic = true;
  }
}

ncclResult_t Init(void** ctx, uint64_t comm_id, ncclDebugLogger_t logger) {
  heroserve::netplugin::SetLogger(logger);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_source) {
    std::string err;
    g_source = hs::MakeGroupConfigSource(&err);
    if (!g_source) {
      // NCCL then disables the CollNet (not the library): its own algorithms serve.
      Info(kLog, err + "; CollNet disabled");
      return ncclInvalidUsage;
    }
  }
  DiscoverNic();
  if (ctx != nullptr) *ctx = new Context{comm_id};
  return ncclSuccess;
}

ncclResult_t Devices(int* ndev) {
  *ndev = 1;  // one INA device: the rail NIC of the configured group
  return ncclSuccess;
}

ncclResult_t GetProperties(int dev, ncclNetProperties_v12_t* p) {
  if (dev != 0) return ncclInvalidArgument;
  std::memset(p, 0, sizeof *p);
  heroserve::netplugin::FillCommonProps(
      p, kName, g_have_nic && !g_nic.pci_path.empty() ? const_cast<char*>(g_nic.pci_path.c_str())
                                                      : nullptr,
      g_nic.guid, g_have_nic ? g_nic.speed_mbps : 10000);
  p->forceFlush = 0;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = dev;
  p->maxP2pBytes = 1L << 30;
  p->maxCollBytes = 1L << 30;
  p->maxMultiRequestSize = 1;
  p->railId = -1;  // NCCL_NET_ID_UNDEF
  p->planeId = -1;
  return ncclSuccess;
}

ncclResult_t Listen(void* ctx, int dev, void* handle, void** listen_comm) {
  *listen_comm = nullptr;
  if (dev != 0) return ncclInvalidArgument;
  hs::GroupRequest req;
  req.comm_id = ctx != nullptr ? static_cast<Context*>(ctx)->comm_id : 0;
  req.dev = dev;
  auto l = std::make_unique<ListenComm>();
  std::string err;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_source) return ncclInvalidUsage;
    if (!g_source->Claim(req, &l->policy, &err)) {
      Warn(kLog, "listen: " + err);
      return ncclInvalidUsage;
    }
  }
  const hs::GroupSpec& g = l->policy.spec;
  Handle h{kHandleMagic,   kHandleVersion, g.group_id,   g.worker_id,
           g.num_workers,  g.window,       g.switch_ip,  g.switch_port,
           g.session,      g.first_generation, static_cast<uint32_t>(g.lanes.kind),
           l->policy.float_sums ? 1u : 0u};
  std::memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  std::memcpy(handle, &h, sizeof h);
  *listen_comm = l.release();
  return ncclSuccess;
}

void ReleaseClaim(const hs::GroupPolicy& p) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_source) g_source->Release(p);
}

ncclResult_t Connect(void* handles[], int nranks, int rank, void* listen_comm,
                     void** coll_comm) {
  *coll_comm = nullptr;
  auto* l = static_cast<ListenComm*>(listen_comm);
  const hs::GroupSpec& g = l->policy.spec;
  std::string err;
  // NCCL drops the listen comm when connect fails (it does not call closeListen): so does
  // this function, releasing the claim.
  auto fail = [&](const std::string& why, ncclResult_t rc) {
    Warn(kLog, "connect (group " + std::to_string(g.group_id) + ", rank " +
                   std::to_string(rank) + " of " + std::to_string(nranks) + "): " + why);
    ReleaseClaim(l->policy);
    delete l;
    return rc;
  };
  if (nranks != g.num_workers)
    return fail("the group has " + std::to_string(g.num_workers) + " workers, NCCL's CollNet " +
                    std::to_string(nranks) + " ranks",
                ncclInvalidUsage);
  uint32_t seen = 0;
  for (int r = 0; r < nranks; r++) {
    Handle h;
    std::memcpy(&h, handles[r], sizeof h);
    if (h.magic != kHandleMagic || h.version != kHandleVersion)
      return fail("rank " + std::to_string(r) + " sent a foreign handle", ncclInvalidUsage);
    if (h.group_id != g.group_id || h.num_workers != g.num_workers || h.window != g.window ||
        h.switch_ip != g.switch_ip || h.switch_port != g.switch_port ||
        h.session != g.session || h.first_generation != g.first_generation ||
        h.lane_kind != static_cast<uint32_t>(g.lanes.kind) ||
        h.float_sums != (l->policy.float_sums ? 1u : 0u))
      return fail("rank " + std::to_string(r) + " holds another group or session (group " +
                      std::to_string(h.group_id) + ", session " + std::to_string(h.session) +
                      "): the members' policies disagree",
                  ncclInvalidUsage);
    if (h.worker_id >= g.num_workers || (seen & (1u << h.worker_id)) != 0)
      return fail("worker id " + std::to_string(h.worker_id) + " of rank " + std::to_string(r) +
                      " is out of range or held twice",
                  ncclInvalidUsage);
    seen |= 1u << h.worker_id;
    if (r == rank && h.worker_id != g.worker_id)
      return fail("handles[rank] is not this rank's handle", ncclInvalidUsage);
  }
  auto ep = hs::Endpoint::Open(l->policy.bind_ip, l->policy.bind_port, &err);
  if (!ep) return fail(err, ncclSystemError);
  auto c = std::make_unique<CollComm>();
  c->policy = l->policy;
  c->engine = hs::Engine::Create(g, l->policy.timeouts, ep, &err);
  if (!c->engine) return fail(err, ncclInvalidUsage);
  // Every member and the switch must be there: one bounded round (give_up_s).
  if (!c->engine->Join(&err)) return fail("join: " + err, ncclRemoteError);
  l->transferred = true;
  Info(kLog, "group " + std::to_string(g.group_id) + " session " + std::to_string(g.session) +
                 ": worker " + std::to_string(g.worker_id) + " of " +
                 std::to_string(g.num_workers) + ", window " + std::to_string(g.window) +
                 ", local port " + std::to_string(ep->port()));
  *coll_comm = c.release();
  return ncclSuccess;
}

// Whether this communicator's all-reduce of `t` goes through the switch.
bool Carries(const hs::LaneFormat& f, bool float_sums, hs::ElemType t) {
  return hs::Exact(f, t) || (float_sums && hs::Quantized(f, t));
}

ncclResult_t ReduceSupport(ncclDataType_t type, ncclRedOp_t op, int* supported) {
  // The lane format carries integer sums exactly (csrc/ina/lanes.h); float sums as fixed
  // point only when the config opts in (float_sums); NCCL serves the rest.
  bool fs;
  const hs::LaneFormat* lanes;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    fs = g_float_sums;
    lanes = g_reduce_lanes;
  }
  *supported = op == ncclSum && Carries(*lanes, fs, ElemOf(type)) ? 1 : 0;
  return ncclSuccess;
}

using Memory = heroserve::netplugin::HostMemory<LogName, Warn>;  // refusals are warnings

ncclResult_t Iallreduce(void* coll_comm, void* send, void* recv, size_t count,
                        ncclDataType_t type, ncclRedOp_t op, void*, void*, void** request) {
  *request = nullptr;
  auto* c = static_cast<CollComm*>(coll_comm);
  hs::ElemType t = ElemOf(type);
  if (op != ncclSum || !Carries(c->policy.spec.lanes, c->policy.float_sums, t)) {
    Warn(kLog, "iallreduce: type " + std::to_string(type) + " op " + std::to_string(op) +
                   " is not supported (reduceSupport said so)");
    return ncclInvalidArgument;
  }
  if (!c->engine->error().empty()) {
    Warn(kLog, "iallreduce: " + c->engine->error());
    return ncclRemoteError;
  }
  if (c->engine->pending() >= kMaxPending) return ncclSuccess;  // NCCL posts again
  hs::Engine::Op* o = c->engine->Submit(send, recv, count, t);
  if (o == nullptr) {
    Warn(kLog, "iallreduce: " + c->engine->error());
    return ncclRemoteError;
  }
  *request = new Request{c, o, c->engine->BytesOf(o)};
  c->engine->Progress(0);
  return ncclSuccess;
}

ncclResult_t Iflush(void* coll_comm, void*, int, void*, void** request) {
  // Host memory: results are in place when test() reports them; nothing to flush.
  *request = new Request{static_cast<CollComm*>(coll_comm), nullptr, 0};
  return ncclSuccess;
}

ncclResult_t Test(void* request, int* done, int* size) {
  auto* r = static_cast<Request*>(request);
  *done = 0;
  if (r->op == nullptr) {
    *done = 1;
    if (size != nullptr) *size = 0;
    delete r;
    return ncclSuccess;
  }
  hs::Engine& e = *r->comm->engine;
  e.Progress(0);
  switch (e.StateOf(r->op)) {
    case hs::Engine::State::kPending:
      return ncclSuccess;
    case hs::Engine::State::kDone:
      *done = 1;
      if (size != nullptr) *size = r->bytes > INT_MAX ? INT_MAX : static_cast<int>(r->bytes);
      e.Release(r->op);
      delete r;
      return ncclSuccess;
    case hs::Engine::State::kFailed:
      break;
  }
  std::string why = e.ErrorOf(r->op);
  bool session_ok = e.error().empty();  // only this all-reduce failed (float data)
  Warn(kLog, "all-reduce failed: " + why);
  e.Release(r->op);
  delete r;
  return session_ok ? ncclInvalidArgument : ncclRemoteError;
}

ncclResult_t CloseColl(void* coll_comm) {
  auto* c = static_cast<CollComm*>(coll_comm);
  c->engine.reset();
  ReleaseClaim(c->policy);
  delete c;
  return ncclSuccess;
}

ncclResult_t CloseListen(void* listen_comm) {
  auto* l = static_cast<ListenComm*>(listen_comm);
  if (!l->transferred) ReleaseClaim(l->policy);
  delete l;
  return ncclSuccess;
}

ncclResult_t Finalize(void* ctx) {
  delete static_cast<Context*>(ctx);
  return ncclSuccess;
}

// ---- version adapters ------------------------------------------------------------------

using Older = heroserve::netplugin::OlderProps<GetProperties>;

ncclResult_t InitNoCtx(ncclDebugLogger_t logger) {
  // Before v11 there is no per-communicator context: the claim has no comm id.
  return Init(nullptr, 0, logger);
}
ncclResult_t ListenNoCtx(int dev, void* handle, void** listen_comm) {
  return Listen(nullptr, dev, handle, listen_comm);
}
ncclResult_t IallreduceV8(void* c, void* s, void* r, int count, ncclDataType_t t,
                          ncclRedOp_t op, void* sm, void* rm, void** req) {
  if (count < 0) return ncclInvalidArgument;
  return Iallreduce(c, s, r, static_cast<size_t>(count), t, op, sm, rm, req);
}
}  // namespace

// iallgather and ireducescatter are NULL: NCCL then never picks CollNet for AllGather or
// ReduceScatter (src/graph/tuning.cc, ncclTopoTuneModel: busBw = 0 when
// `!comm->ncclCollNet->iallgather` / `->ireducescatter`, since 2.20.3), whereas a function
// that returns an error would be picked and fail the collective. NCCL uses the newest
// version a library exports as its own ncclCollNet_t (2.20-2.23: v8, 2.24: v9, 2.26: v10,
// 2.28: v11, 2.30: v12), so the NULL reaches that check in each release. makeVDevice is
// NULL: NCCL then uses the physical device (src/graph/topo.cc), as with its socket net.
extern "C" {

__attribute__((visibility("default"))) ncclCollNet_v12_t ncclCollNetPlugin_v12 = {
    kName,        Init,         Devices,    GetProperties, Listen,
    Connect,      ReduceSupport, Memory::RegMr, Memory::RegMrDmaBuf, Memory::DeregMr,
    Iallreduce,   nullptr,      nullptr,    Iflush,        Test,
    CloseColl,    CloseListen,  nullptr, Finalize};

__attribute__((visibility("default"))) ncclCollNet_v11_t ncclCollNetPlugin_v11 = {
    kName,       Init,          Devices,  Older::V11, Listen,
    Connect,     ReduceSupport, Memory::RegMr, Memory::RegMrDmaBuf, Memory::DeregMr,
    Iallreduce,  nullptr, nullptr,
    Iflush,      Test,          CloseColl, CloseListen,
    nullptr, Finalize};

__attribute__((visibility("default"))) ncclCollNet_v10_t ncclCollNetPlugin_v10 = {
    kName,       InitNoCtx,     Devices,  Older::V9To11<ncclNetProperties_v10_t>,
    ListenNoCtx, Connect,       ReduceSupport, Memory::RegMr, Memory::RegMrDmaBuf, Memory::DeregMr,
    Iallreduce,  nullptr, nullptr,
    Iflush,      Test,          CloseColl, CloseListen,
    nullptr};

__attribute__((visibility("default"))) ncclCollNet_v9_t ncclCollNetPlugin_v9 = {
    kName,       InitNoCtx,     Devices,  Older::V9To11<ncclNetProperties_v9_t>,
    ListenNoCtx, Connect,       ReduceSupport, Memory::RegMr, Memory::RegMrDmaBuf, Memory::DeregMr,
    Iallreduce,  nullptr, nullptr,
    Iflush,      Test,          CloseColl, CloseListen,
    nullptr};

__attribute__((visibility("default"))) ncclCollNet_v8_t ncclCollNetPlugin_v8 = {
    kName,       InitNoCtx,     Devices,  Older::V8,
    ListenNoCtx, Connect,       ReduceSupport, Memory::RegMr, Memory::RegMrDmaBuf, Memory::DeregMr,
    IallreduceV8, nullptr, nullptr,
    Iflush,      Test,          CloseColl, CloseListen};

}  // extern "C"

// Counters of one CollNet communicator (tests and the harness; not part of NCCL's ABI):
// sent, retransmissions, results, stale, foreign, malformed. 0 on success.
extern "C" __attribute__((visibility("default"))) int heroserveCollNetStats(void* coll_comm,
                                                                          uint64_t out[6]) {
  auto* c = static_cast<CollComm*>(coll_comm);
  if (c == nullptr || !c->engine) return -1;
  hs::Stats s = c->engine->stats();
  out[0] = s.sent;
  out[1] = s.retransmissions;
  out[2] = s.results;
  out[3] = s.stale;
  out[4] = s.foreign;
  out[5] = s.malformed;
  return 0;
}
