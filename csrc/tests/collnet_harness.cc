// One CollNet rank, driven as NCCL's proxy drives a CollNet plugin (src/transport/coll_net.cc):
// dlopen the library, take ncclCollNetPlugin_v<N>, init, devices, getProperties,
// reduceSupport, listen, exchange handles (through files in --dir, as NCCL's bootstrap
// allgather would), connect, closeListen, regMr, iallreduce in slices with several
// outstanding, test, iflush, deregMr, closeColl, finalize. Every rank computes every rank's
// data, so it checks its result bit for bit against a host reference.
//
// Prints one JSON object per line: {"event": "props", ...}, {"event": "support", ...},
// {"event": "result", "type": ..., "bytes": ..., "exact": ..., "seconds": ...},
// {"event": "error", "stage": "connect"|"allreduce", "rc": ..., "seconds": ...},
// {"event": "stats", ...}. Exit status 0 when every result was exact, 1 when one was not,
// 3 on a plugin error, 2 on a usage or environment error.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "lanes.h"  // ToDouble / FromDouble only: the quantized reference below is the harness's own
#include "harness_util.h"
#include "nccl_net_abi.h"

namespace {

using harness::Mix;
using harness::Now;

struct TypeInfo {
  const char* name;
  ncclDataType_t type;
  size_t size;
};
const TypeInfo kTypes[] = {
    {"int8", ncclInt8, 1},       {"uint8", ncclUint8, 1},     {"int32", ncclInt32, 4},
    {"uint32", ncclUint32, 4},   {"int64", ncclInt64, 8},     {"uint64", ncclUint64, 8},
    {"float16", ncclFloat16, 2}, {"float32", ncclFloat32, 4}, {"float64", ncclFloat64, 8},
    {"bfloat16", ncclBfloat16, 2}};
const char* kOps[] = {"sum", "prod", "max", "min", "avg"};

const TypeInfo* FindType(const std::string& n) {
  for (const auto& t : kTypes) {
    if (n == t.name) return &t;
  }
  return nullptr;
}

namespace ina = heroserve::ina;

bool IsFloat(const TypeInfo& t) {
  return t.type == ncclFloat32 || t.type == ncclFloat16 || t.type == ncclBfloat16;
}
ina::ElemType ElemOf(const TypeInfo& t) {
  return t.type == ncclFloat32   ? ina::ElemType::kFloat32
         : t.type == ncclFloat16 ? ina::ElemType::kFloat16
                                 : ina::ElemType::kBfloat16;
}

// Float data as an engine's activations: normal(0, scale), and every element whose hash
// hits `outlier_rate` times `outlier_mag` (a few large outliers).
struct FloatData {
  double scale = 1.0;
  double outlier_rate = 0.001;
  double outlier_mag = 50.0;
};
FloatData g_float;

double Uniform(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }

// Member `rank`'s bytes for one (type, size) case: reproducible at every rank.
void MemberData(uint64_t seed, int rank, const TypeInfo& t, size_t bytes, uint8_t* out) {
  uint64_t base = Mix(seed ^ (static_cast<uint64_t>(rank) << 40) ^
                      (static_cast<uint64_t>(t.type) << 56) ^ bytes);
  if (IsFloat(t)) {
    for (size_t i = 0; i < bytes / t.size; i++) {
      double u1 = Uniform(Mix(base + 3 * i)), u2 = Uniform(Mix(base + 3 * i + 1));
      double x = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2) * g_float.scale;
      if (Uniform(Mix(base + 3 * i + 2)) < g_float.outlier_rate) x *= g_float.outlier_mag;
      ina::FromDouble(ElemOf(t), x, out, i);
    }
    return;
  }
  for (size_t i = 0; i < bytes; i++) out[i] = static_cast<uint8_t>(Mix(base + i / 8) >> (8 * (i % 8)));
}

// Errors of a float result against the float64 sum of the members' values. bfp16:
// `bound_ok` says every element is within the format's documented bound, w 2^(-s-1) for its
// block's s (docs/dataplane.md "bfp16 numbers"), plus the result type's own rounding;
// `bound` is the largest of those bounds.
struct FloatErr {
  double max_err = 0, rms_err = 0, best_max = 0, best_rms = 0, max_abs = 0, bound = 0;
  int scale_exp = 0;
  bool bound_ok = true;
};

// --lanes: the group's lane format (the group config's "lane_format"), which the reference
// follows.
bool g_bfp16 = false;

// The float sum every rank must get, computed here on its own: the agreed exponent (the
// largest of any member, lanes.py), each member's values rounded half to even at 2^s, the
// int64 sum of those (it must fit int32), scaled back and rounded to the type once.
void FloatReference(uint64_t seed, int nranks, const TypeInfo& t, size_t bytes, uint8_t* out,
                    FloatErr* err) {
  size_t n = bytes / t.size;
  std::vector<std::vector<uint8_t>> m(nranks, std::vector<uint8_t>(bytes));
  int e = -32;
  for (int r = 0; r < nranks; r++) {
    MemberData(seed, r, t, bytes, m[r].data());
    for (size_t i = 0; i < n; i++) {
      int x = -32;
      double a = std::fabs(ina::ToDouble(ElemOf(t), m[r].data(), i));
      if (!std::isfinite(a)) {  // (--outlier-mag inf) no reference: the plugin must refuse
        err->scale_exp = -1000;
        return;
      }
      if (a > 0) std::frexp(a, &x);
      e = std::max(e, x);
    }
  }
  int lw = 0;
  while ((1 << lw) < nranks) lw++;
  int s = 30 - lw - e;
  err->scale_exp = s;
  double se = 0, sb = 0;
  std::vector<uint8_t> best(t.size);
  for (size_t i = 0; i < n; i++) {
    int64_t q = 0;
    double exact = 0;
    for (int r = 0; r < nranks; r++) {
      double x = ina::ToDouble(ElemOf(t), m[r].data(), i);
      q += static_cast<int64_t>(std::nearbyint(std::ldexp(x, s)));
      exact += x;  // float64: exact enough as the reference (errors are far larger)
    }
    if (q >= (int64_t{1} << 31) || q < -(int64_t{1} << 31)) {
      fprintf(stderr, "reference: a sum overflows int32 (the exponent rule is broken)\n");
      std::abort();
    }
    ina::FromDouble(ElemOf(t), std::ldexp(static_cast<double>(q), -s), out, i);
    double got = ina::ToDouble(ElemOf(t), out, i);
    ina::FromDouble(ElemOf(t), exact, best.data(), 0);
    double b = ina::ToDouble(ElemOf(t), best.data(), 0);
    err->max_err = std::max(err->max_err, std::fabs(got - exact));
    err->best_max = std::max(err->best_max, std::fabs(b - exact));
    err->max_abs = std::max(err->max_abs, std::fabs(exact));
    se += (got - exact) * (got - exact);
    sb += (b - exact) * (b - exact);
  }
  err->rms_err = n ? std::sqrt(se / n) : 0;
  err->best_rms = n ? std::sqrt(sb / n) : 0;
}

// The bfp16 float sum every rank must get, worked here from docs/dataplane.md ("bfp16
// numbers") alone: each iallreduce of `slice_elems` is cut into blocks of BFP16_LANES from
// its start; a block's exponent E is the largest over the members (every |x| < 2^E, E in
// [EXP_MIN, EXP_MAX]); each member's values rounded half to even at 2^s, s = BFP16_SUM_BITS -
// ceil(log2 w) - E; the int64 sum of those (it must fit int16: honest members never
// saturate), scaled back and rounded to the type once.
void Bfp16Reference(uint64_t seed, int nranks, const TypeInfo& t, size_t bytes,
                    size_t slice_elems, uint8_t* out, FloatErr* err) {
  size_t n = bytes / t.size;
  std::vector<std::vector<uint8_t>> m(nranks, std::vector<uint8_t>(bytes));
  for (int r = 0; r < nranks; r++) MemberData(seed, r, t, bytes, m[r].data());
  int lw = 0;
  while ((1 << lw) < nranks) lw++;
  double se = 0, sb = 0;
  std::vector<uint8_t> best(t.size);
  err->scale_exp = 1 << 20;
  for (size_t start = 0; start < n; start += slice_elems) {
    size_t end = std::min(n, start + slice_elems);
    for (size_t b = start; b < end; b += ina::BFP16_LANES) {
      size_t e_end = std::min(end, b + ina::BFP16_LANES);
      int e = ina::EXP_MIN;
      for (int r = 0; r < nranks; r++) {
        for (size_t i = b; i < e_end; i++) {
          double a = std::fabs(ina::ToDouble(ElemOf(t), m[r].data(), i));
          int x = ina::EXP_MIN;
          if (!std::isfinite(a)) {  // no reference: the plugin must refuse
            err->scale_exp = -1000;
            return;
          }
          if (a > 0) std::frexp(a, &x);
          e = std::max(e, x);
        }
      }
      int s = static_cast<int>(ina::BFP16_SUM_BITS) - lw - e;
      err->scale_exp = std::min(err->scale_exp, s);
      double bound = nranks * std::ldexp(1.0, -s - 1);
      err->bound = std::max(err->bound, bound);
      for (size_t i = b; i < e_end; i++) {
        int64_t q = 0;
        double exact = 0;
        for (int r = 0; r < nranks; r++) {
          double x = ina::ToDouble(ElemOf(t), m[r].data(), i);
          q += static_cast<int64_t>(std::nearbyint(std::ldexp(x, s)));
          exact += x;
        }
        if (q > INT16_MAX || q < INT16_MIN) {
          fprintf(stderr, "reference: a bfp16 sum leaves int16 (the exponent rule is broken)\n");
          std::abort();
        }
        double r = std::ldexp(static_cast<double>(q), -s);
        ina::FromDouble(ElemOf(t), r, out, i);
        double got = ina::ToDouble(ElemOf(t), out, i);
        ina::FromDouble(ElemOf(t), exact, best.data(), 0);
        double bst = ina::ToDouble(ElemOf(t), best.data(), 0);
        // The format's bound holds for r; the type's rounding of r comes on top.
        if (std::fabs(r - exact) > bound || std::fabs(got - exact) > bound + std::fabs(got - r))
          err->bound_ok = false;
        err->max_err = std::max(err->max_err, std::fabs(got - exact));
        err->best_max = std::max(err->best_max, std::fabs(bst - exact));
        err->max_abs = std::max(err->max_abs, std::fabs(exact));
        se += (got - exact) * (got - exact);
        sb += (bst - exact) * (bst - exact);
      }
    }
  }
  err->rms_err = n ? std::sqrt(se / n) : 0;
  err->best_rms = n ? std::sqrt(sb / n) : 0;
}

// The sum every rank must get: integer sums wrap in the type's width (as NCCL's do).
void Reference(uint64_t seed, int nranks, const TypeInfo& t, size_t bytes, uint8_t* out) {
  std::vector<uint8_t> m(bytes);
  std::memset(out, 0, bytes);
  for (int r = 0; r < nranks; r++) {
    MemberData(seed, r, t, bytes, m.data());
    size_t n = bytes / t.size;
    for (size_t i = 0; i < n; i++) {
      if (t.size == 1) {
        out[i] = static_cast<uint8_t>(out[i] + m[i]);
      } else {
        uint32_t a, b;
        std::memcpy(&a, out + 4 * i, 4);
        std::memcpy(&b, m.data() + 4 * i, 4);
        a += b;
        std::memcpy(out + 4 * i, &a, 4);
      }
    }
  }
}

struct Args : harness::CommonArgs {
  std::vector<std::string> types;
  uint64_t comm_id = 0;
  size_t slice = 128 << 10;  // bytes per iallreduce, as NCCL's chunks
  int outstanding = 4;
  bool leave_after_listen = false;  // publish a handle and never connect (a rank that never joins)
  // after connect: write DIR/connected.RANK and wait (at most exchange_timeout_s) for DIR/go
  // before the first all-reduce, so a test can act between the two on a condition, not a clock
  bool wait_for_go = false;
};

bool Parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; i++) {
    if (harness::ParseCommon(argc, argv, &i, a)) continue;
    std::string k = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--types") a->types = harness::Split(val());
    else if (k == "--comm-id") a->comm_id = std::strtoull(val().c_str(), nullptr, 0);
    else if (k == "--slice") a->slice = std::strtoull(val().c_str(), nullptr, 10);
    else if (k == "--outstanding") a->outstanding = std::atoi(val().c_str());
    else if (k == "--leave-after-listen") a->leave_after_listen = true;
    else if (k == "--wait-for-go") a->wait_for_go = true;
    else if (k == "--float-scale") g_float.scale = std::atof(val().c_str());
    else if (k == "--outlier-rate") g_float.outlier_rate = std::atof(val().c_str());
    else if (k == "--outlier-mag") g_float.outlier_mag = std::atof(val().c_str());
    else if (k == "--lanes") {
      std::string v = val();
      if (v != "int32" && v != "bfp16") return false;
      g_bfp16 = v == "bfp16";
    }
    else return false;
  }
  return harness::CommonValid(*a) && (a->version == 12 || a->version == 8) && a->slice > 0 &&
         a->outstanding > 0;
}

// The subset of the CollNet API the harness calls, whatever the version.
struct Api {
  const char* name = nullptr;
  ncclResult_t (*init)(void**, uint64_t, ncclDebugLogger_t) = nullptr;
  ncclResult_t (*devices)(int*) = nullptr;
  ncclCollNet_v12_t* v12 = nullptr;
  ncclCollNet_v8_t* v8 = nullptr;

  ncclResult_t Init(void** ctx, uint64_t id) {
    if (v12) return v12->init(ctx, id, harness::Logger);
    *ctx = nullptr;
    return v8->init(harness::Logger);
  }
  ncclResult_t Devices(int* n) { return v12 ? v12->devices(n) : v8->devices(n); }
  ncclResult_t Props(std::string* name, std::string* pci, int* speed, int* ptr) {
    if (v12) {
      ncclNetProperties_v12_t p;
      ncclResult_t rc = v12->getProperties(0, &p);
      if (rc != ncclSuccess) return rc;
      *name = p.name ? p.name : "";
      *pci = p.pciPath ? p.pciPath : "";
      *speed = p.speed;
      *ptr = p.ptrSupport;
      return rc;
    }
    ncclNetProperties_v8_t p;
    ncclResult_t rc = v8->getProperties(0, &p);
    if (rc != ncclSuccess) return rc;
    *name = p.name ? p.name : "";
    *pci = p.pciPath ? p.pciPath : "";
    *speed = p.speed;
    *ptr = p.ptrSupport;
    return rc;
  }
  ncclResult_t Support(ncclDataType_t t, ncclRedOp_t o, int* s) {
    return v12 ? v12->reduceSupport(t, o, s) : v8->reduceSupport(t, o, s);
  }
  ncclResult_t Listen(void* ctx, void* h, void** l) {
    return v12 ? v12->listen(ctx, 0, h, l) : v8->listen(0, h, l);
  }
  ncclResult_t Connect(void** hs, int n, int r, void* l, void** c) {
    return v12 ? v12->connect(hs, n, r, l, c) : v8->connect(hs, n, r, l, c);
  }
  ncclResult_t CloseListen(void* l) { return v12 ? v12->closeListen(l) : v8->closeListen(l); }
  ncclResult_t RegMr(void* c, void* d, size_t s, void** m) {
    return v12 ? v12->regMr(c, d, s, NCCL_PTR_HOST, m) : v8->regMr(c, d, s, NCCL_PTR_HOST, m);
  }
  ncclResult_t RegMrCuda(void* c, void* d, size_t s, void** m) {
    return v12 ? v12->regMr(c, d, s, NCCL_PTR_CUDA, m) : v8->regMr(c, d, s, NCCL_PTR_CUDA, m);
  }
  ncclResult_t RegDmaBuf(void* c, void* d, size_t s, void** m) {
    return v12 ? v12->regMrDmaBuf(c, d, s, NCCL_PTR_CUDA, 0, -1, m)
               : v8->regMrDmaBuf(c, d, s, NCCL_PTR_CUDA, 0, -1, m);
  }
  ncclResult_t DeregMr(void* c, void* m) { return v12 ? v12->deregMr(c, m) : v8->deregMr(c, m); }
  ncclResult_t Iallreduce(void* c, void* s, void* r, size_t n, ncclDataType_t t, void* sm,
                          void* rm, void** req) {
    if (v12) return v12->iallreduce(c, s, r, n, t, ncclSum, sm, rm, req);
    return v8->iallreduce(c, s, r, static_cast<int>(n), t, ncclSum, sm, rm, req);
  }
  ncclResult_t Iflush(void* c, void* d, int n, void* m, void** req) {
    return v12 ? v12->iflush(c, d, n, m, req) : v8->iflush(c, d, n, m, req);
  }
  ncclResult_t Test(void* req, int* done, int* size) {
    return v12 ? v12->test(req, done, size) : v8->test(req, done, size);
  }
  ncclResult_t CloseColl(void* c) { return v12 ? v12->closeColl(c) : v8->closeColl(c); }
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!Parse(argc, argv, &a)) {
    fprintf(stderr,
            "usage: collnet_harness --lib SO --dir DIR --rank R --nranks N [--version 12|8] "
            "[--types int32,...] [--sizes BYTES,...] [--seed S] [--comm-id ID] [--slice B] "
            "[--outstanding K] [--exchange-timeout S] [--leave-after-listen] "
            "[--wait-for-go] [--float-scale X] [--outlier-rate P] [--outlier-mag M] "
            "[--lanes int32|bfp16]\n");
    return 2;
  }
  void* lib = dlopen(a.lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  Api api;
  std::string sym = "ncclCollNetPlugin_v" + std::to_string(a.version);
  void* s = dlsym(lib, sym.c_str());
  if (s == nullptr) {
    fprintf(stderr, "%s not exported\n", sym.c_str());
    return 2;
  }
  if (a.version == 12) api.v12 = static_cast<ncclCollNet_v12_t*>(s);
  else api.v8 = static_cast<ncclCollNet_v8_t*>(s);

  auto fail = harness::Fail;
  double t0 = Now();
  void* ctx = nullptr;
  ncclResult_t rc = api.Init(&ctx, a.comm_id);
  if (rc != ncclSuccess) return fail("init", rc, t0);
  int ndev = 0;
  if ((rc = api.Devices(&ndev)) != ncclSuccess || ndev < 1) return fail("devices", rc, t0);
  std::string pname, pci;
  int speed = 0, ptr = 0;
  if ((rc = api.Props(&pname, &pci, &speed, &ptr)) != ncclSuccess)
    return fail("getProperties", rc, t0);
  printf("{\"event\": \"props\", \"name\": \"%s\", \"pciPath\": \"%s\", \"speed\": %d, "
         "\"ptrSupport\": %d, \"ndev\": %d}\n",
         pname.c_str(), pci.c_str(), speed, ptr, ndev);
  // NULL iallgather / ireducescatter keep NCCL from picking CollNet for those collectives.
  bool ag = api.v12 ? api.v12->iallgather != nullptr : api.v8->iallgather != nullptr;
  bool rs = api.v12 ? api.v12->ireducescatter != nullptr : api.v8->ireducescatter != nullptr;
  printf("{\"event\": \"optional\", \"iallgather\": %s, \"ireducescatter\": %s}\n",
         ag ? "true" : "false", rs ? "true" : "false");
  std::string support;
  for (const auto& t : kTypes) {
    for (int o = 0; o < 5; o++) {
      int yes = 0;
      if ((rc = api.Support(t.type, static_cast<ncclRedOp_t>(o), &yes)) != ncclSuccess)
        return fail("reduceSupport", rc, t0);
      if (yes) support += std::string(support.empty() ? "" : ", ") + "\"" + t.name + "/" + kOps[o] + "\"";
    }
  }
  printf("{\"event\": \"support\", \"supported\": [%s]}\n", support.c_str());
  fflush(stdout);

  char handle[NCCL_NET_HANDLE_MAXSIZE];
  void* lcomm = nullptr;
  if ((rc = api.Listen(ctx, handle, &lcomm)) != ncclSuccess) return fail("listen", rc, t0);
  if (!harness::WriteHandle(a, "handle", handle)) {
    fprintf(stderr, "cannot write the handle in %s\n", a.dir.c_str());
    return 2;
  }
  if (a.leave_after_listen) {
    printf("{\"event\": \"left\"}\n");
    return 0;  // never connects: the others must fail cleanly
  }
  std::vector<std::vector<char>> hs(a.nranks, std::vector<char>(NCCL_NET_HANDLE_MAXSIZE));
  double deadline = Now() + a.exchange_timeout_s;
  for (int r = 0; r < a.nranks; r++) {
    if (!harness::ReadHandle(a, "handle", r, deadline, hs[r].data())) {
      fprintf(stderr, "handle exchange timed out\n");
      return 2;
    }
  }
  std::vector<void*> hp(a.nranks);
  for (int r = 0; r < a.nranks; r++) hp[r] = hs[r].data();
  void* coll = nullptr;
  t0 = Now();
  rc = api.Connect(hp.data(), a.nranks, a.rank, lcomm, &coll);
  if (rc != ncclSuccess || coll == nullptr) return fail("connect", rc, t0);  // lcomm dropped
  api.CloseListen(lcomm);
  printf("{\"event\": \"connected\", \"seconds\": %.3f}\n", Now() - t0);
  fflush(stdout);
  if (a.wait_for_go) {
    std::ofstream(a.dir + "/connected." + std::to_string(a.rank)) << "1";
    const std::string go = a.dir + "/go";
    for (double start = Now(); access(go.c_str(), F_OK) != 0;) {
      if (Now() - start > a.exchange_timeout_s) {
        fprintf(stderr, "no go file within %.0f s\n", a.exchange_timeout_s);
        return 2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Device memory and DMA-BUF are refused (host memory only).
  void* mh = nullptr;
  char probe[64];
  bool refuses = api.RegMrCuda(coll, probe, sizeof probe, &mh) != ncclSuccess &&
                 api.RegDmaBuf(coll, probe, sizeof probe, &mh) != ncclSuccess;
  printf("{\"event\": \"refuses_device_memory\", \"ok\": %s}\n", refuses ? "true" : "false");

  int status = 0;
  for (const auto& tn : a.types) {
    const TypeInfo* t = FindType(tn);
    if (t == nullptr) {
      fprintf(stderr, "unknown type %s\n", tn.c_str());
      return 2;
    }
    for (size_t bytes : a.sizes) {
      bytes -= bytes % t->size;
      std::vector<uint8_t> send(bytes), recv(bytes, 0xA5), want(bytes);
      MemberData(a.seed, a.rank, *t, bytes, send.data());
      FloatErr ferr;
      size_t slice = a.slice - a.slice % t->size;
      if (IsFloat(*t) && g_bfp16)
        Bfp16Reference(a.seed, a.nranks, *t, bytes, std::max<size_t>(1, slice / t->size),
                       want.data(), &ferr);
      else if (IsFloat(*t)) FloatReference(a.seed, a.nranks, *t, bytes, want.data(), &ferr);
      else Reference(a.seed, a.nranks, *t, bytes, want.data());
      void *smh = nullptr, *rmh = nullptr;
      if ((rc = api.RegMr(coll, send.data(), bytes ? bytes : 1, &smh)) != ncclSuccess ||
          (rc = api.RegMr(coll, recv.data(), bytes ? bytes : 1, &rmh)) != ncclSuccess)
        return fail("regMr", rc, t0);
      double start = Now();
      size_t posted = 0, next = 0;
      std::map<size_t, void*> inflight;  // offset -> request
      bool first = true;
      while (first || next < bytes || !inflight.empty()) {
        first = false;
        while (next < bytes && static_cast<int>(inflight.size()) < a.outstanding) {
          size_t n = std::min(slice, bytes - next);
          void* req = nullptr;
          rc = api.Iallreduce(coll, send.data() + next, recv.data() + next, n / t->size, t->type,
                              smh, rmh, &req);
          if (rc != ncclSuccess) return fail("allreduce", rc, start);
          if (req == nullptr) break;  // busy: post again later
          inflight[next] = req;
          next += n;
          posted++;
        }
        bool progressed = false;
        for (auto it = inflight.begin(); it != inflight.end();) {
          int done = 0, size = 0;
          rc = api.Test(it->second, &done, &size);
          if (rc != ncclSuccess) return fail("allreduce", rc, start);
          progressed |= done != 0;
          it = done ? inflight.erase(it) : std::next(it);
        }
        // NCCL's proxy thread yields when a pass made no progress; so does the harness, or
        // several ranks spinning on two cores starve the switch process.
        if (!progressed && !inflight.empty()) usleep(200);
      }
      double secs = Now() - start;
      void* freq = nullptr;
      int fdone = 0;
      if ((rc = api.Iflush(coll, recv.data(), static_cast<int>(bytes), rmh, &freq)) !=
          ncclSuccess)
        return fail("iflush", rc, start);
      while (freq != nullptr && !fdone) {
        if ((rc = api.Test(freq, &fdone, nullptr)) != ncclSuccess) return fail("iflush", rc, start);
      }
      api.DeregMr(coll, smh);
      api.DeregMr(coll, rmh);
      bool exact = recv == want;
      if (!exact) status = 1;
      char extra[512] = "";
      if (IsFloat(*t))
        snprintf(extra, sizeof extra,
                 ", \"max_err\": %.6g, \"rms_err\": %.6g, \"best_max_err\": %.6g, "
                 "\"best_rms_err\": %.6g, \"max_abs_sum\": %.6g, \"scale_exp\": %d, "
                 "\"lanes\": \"%s\", \"bound\": %.6g, \"bound_ok\": %s",
                 ferr.max_err, ferr.rms_err, ferr.best_max, ferr.best_rms, ferr.max_abs,
                 ferr.scale_exp, g_bfp16 ? "bfp16" : "int32", ferr.bound,
                 ferr.bound_ok ? "true" : "false");
      printf("{\"event\": \"result\", \"type\": \"%s\", \"bytes\": %zu, \"posted\": %zu, "
             "\"exact\": %s, \"seconds\": %.4f%s}\n",
             t->name, bytes, posted, exact ? "true" : "false", secs, extra);
      fflush(stdout);
    }
  }
  using StatsFn = int (*)(void*, uint64_t*);
  if (auto stats = reinterpret_cast<StatsFn>(dlsym(lib, "heroserveCollNetStats"))) {
    uint64_t v[6] = {0};
    if (stats(coll, v) == 0)
      printf("{\"event\": \"stats\", \"sent\": %llu, \"retransmissions\": %llu, "
             "\"results\": %llu, \"stale\": %llu, \"foreign\": %llu, \"malformed\": %llu}\n",
             (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
             (unsigned long long)v[3], (unsigned long long)v[4], (unsigned long long)v[5]);
  }
  api.CloseColl(coll);
  if (api.v12) api.v12->finalize(ctx);
  fflush(stdout);
  return status;
}
