// One rank of a ring over libnccl-net-heroserve.so's point-to-point net, driven as NCCL's
// proxy drives a net plugin (src/transport/net.cc, src/plugin/net.cc): dlopen, take
// ncclNetPlugin_v<N> (8..12), init, devices (> 0, or NCCL disables the library),
// getProperties of every device, listen on device 0, the handle exchanged out of band
// (files in --dir, as NCCL's bootstrap would), then connect (to the next rank) and accept
// (from the previous one) called in turn until both return a comm, as NCCL's proxy and its
// GDR probe do; regMr (host; CUDA and DMA-BUF must be refused), for each size K isends to
// the next rank and K irecvs from the previous one into buffers larger than the message,
// test until done, exact bytes and the received size checked; closeSend, closeRecv,
// closeListen, finalize.
//
// Prints one JSON object per line: props, connected, result {bytes, messages, exact,
// seconds, mib_per_s}, error {stage, rc, seconds}. Exit 0 when every result was exact, 1
// when one was not, 3 on a plugin error, 2 on a usage or environment error.
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "harness_util.h"
#include "nccl_net_abi.h"

namespace {

using harness::Mix;
using harness::Now;

void Fill(uint64_t seed, int rank, size_t bytes, int msg, uint8_t* out) {
  uint64_t base = Mix(seed ^ (static_cast<uint64_t>(rank) << 40) ^ bytes ^
                      (static_cast<uint64_t>(msg) << 56));
  for (size_t i = 0; i < bytes; i++) out[i] = static_cast<uint8_t>(Mix(base + i / 8) >> (8 * (i % 8)));
}

// The calls the harness makes, whatever the version (the adapters NCCL's net_v*.cc apply).
struct Api {
  std::function<ncclResult_t(void**)> init;
  std::function<ncclResult_t(int*)> devices;
  std::function<ncclResult_t(int, std::string*, std::string*, int*, int*, int*)> props;
  std::function<ncclResult_t(void*, int, void*, void**)> listen;
  std::function<ncclResult_t(void*, int, void*, void**)> connect;
  std::function<ncclResult_t(void*, void**)> accept;
  std::function<ncclResult_t(void*, void*, size_t, int, void**)> regMr;
  std::function<ncclResult_t(void*, void*, size_t, void**)> regDmaBuf;
  std::function<ncclResult_t(void*, void*)> deregMr;
  std::function<ncclResult_t(void*, void*, size_t, void*, void**)> isend;
  std::function<ncclResult_t(void*, void*, size_t, void*, void**)> irecv;
  std::function<ncclResult_t(void*, int*, int*)> test;
  std::function<ncclResult_t(void*)> closeSend, closeRecv, closeListen, finalize;
};

template <typename N, typename P>
void BindCommon(N* n, Api* a) {
  a->devices = n->devices;
  a->props = [n](int dev, std::string* name, std::string* pci, int* speed, int* ptr,
                 int* maxRecvs) {
    P p;
    std::memset(&p, 0, sizeof p);
    ncclResult_t rc = n->getProperties(dev, &p);
    if (rc != ncclSuccess) return rc;
    *name = p.name ? p.name : "";
    *pci = p.pciPath ? p.pciPath : "";
    *speed = p.speed;
    *ptr = p.ptrSupport;
    *maxRecvs = p.maxRecvs;
    return rc;
  };
  a->accept = [n](void* l, void** r) { return n->accept(l, r, nullptr); };
  a->regMr = n->regMr;
  a->regDmaBuf = [n](void* c, void* d, size_t s, void** m) {
    return n->regMrDmaBuf ? n->regMrDmaBuf(c, d, s, NCCL_PTR_CUDA, 0, -1, m) : ncclInternalError;
  };
  a->deregMr = n->deregMr;
  a->test = n->test;
  a->closeSend = n->closeSend;
  a->closeRecv = n->closeRecv;
  a->closeListen = n->closeListen;
}

// One buffer per isend / irecv (maxRecvs = 1). `Size` is the sizes' type (int before v9);
// `extra` the phandle arguments of v10 and later, before the request.
template <typename Size, typename N, typename... Extra>
ncclResult_t Send1(N* n, void* c, void* d, size_t s, void* m, void** r, Extra... extra) {
  return n->isend(c, d, static_cast<Size>(s), 0, m, extra..., r);
}
template <typename Size, typename N, typename... Extra>
ncclResult_t Recv1(N* n, void* c, void* d, size_t s, void* m, void** r, Extra... extra) {
  void* ds[1] = {d};
  Size ss[1] = {static_cast<Size>(s)};
  int tags[1] = {0};
  void* ms[1] = {m};
  return n->irecv(c, 1, ds, ss, tags, ms, extra..., r);
}

// Before v11: no context (listen takes none, there is no finalize).
template <typename N>
void BindNoCtx(N* n, Api* a) {
  a->listen = [n](void*, int dev, void* h, void** l) { return n->listen(dev, h, l); };
  a->finalize = [](void*) { return ncclSuccess; };
}

bool Bind(void* sym, int v, Api* a) {
  void** none = nullptr;  // the phandle of v10+ (no profiler)
  switch (v) {
    case 12:
    case 11: {
      auto bind = [&](auto* n, auto* props_tag) {
        using P = std::remove_pointer_t<decltype(props_tag)>;
        BindCommon<std::remove_pointer_t<decltype(n)>, P>(n, a);
        a->init = [n](void** ctx) {
          return n->init(ctx, 0x1234, nullptr, harness::Logger, nullptr);
        };
        a->listen = n->listen;
        a->connect = [n](void* ctx, int dev, void* h, void** s) {
          return n->connect(ctx, dev, h, s, nullptr);
        };
        a->isend = [n, none](void* c, void* d, size_t s, void* m, void** r) {
          return Send1<size_t>(n, c, d, s, m, r, static_cast<void*>(none));
        };
        a->irecv = [n, none](void* c, void* d, size_t s, void* m, void** r) {
          return Recv1<size_t>(n, c, d, s, m, r, none);
        };
        a->finalize = n->finalize;
      };
      if (v == 12) bind(static_cast<ncclNet_v12_t*>(sym), static_cast<ncclNetProperties_v12_t*>(nullptr));
      else bind(static_cast<ncclNet_v11_t*>(sym), static_cast<ncclNetProperties_v11_t*>(nullptr));
      return true;
    }
    case 10: {
      auto* n = static_cast<ncclNet_v10_t*>(sym);
      BindCommon<ncclNet_v10_t, ncclNetProperties_v10_t>(n, a);
      BindNoCtx(n, a);
      a->init = [n](void** ctx) { *ctx = nullptr; return n->init(harness::Logger, nullptr); };
      a->connect = [n](void*, int dev, void* h, void** s) {
        ncclNetCommConfig_v10_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
        return n->connect(dev, &cfg, h, s, nullptr);
      };
      a->isend = [n, none](void* c, void* d, size_t s, void* m, void** r) {
        return Send1<size_t>(n, c, d, s, m, r, static_cast<void*>(none));
      };
      a->irecv = [n, none](void* c, void* d, size_t s, void* m, void** r) {
        return Recv1<size_t>(n, c, d, s, m, r, none);
      };
      return true;
    }
    case 9:
    case 8: {
      auto bind = [&](auto* n, auto* props_tag, auto size_tag) {
        using P = std::remove_pointer_t<decltype(props_tag)>;
        using Size = decltype(size_tag);
        BindCommon<std::remove_pointer_t<decltype(n)>, P>(n, a);
        BindNoCtx(n, a);
        a->init = [n](void** ctx) { *ctx = nullptr; return n->init(harness::Logger); };
        a->connect = [n](void*, int dev, void* h, void** s) { return n->connect(dev, h, s, nullptr); };
        a->isend = [n](void* c, void* d, size_t s, void* m, void** r) {
          return Send1<Size>(n, c, d, s, m, r);
        };
        a->irecv = [n](void* c, void* d, size_t s, void* m, void** r) {
          return Recv1<Size>(n, c, d, s, m, r);
        };
      };
      if (v == 9) bind(static_cast<ncclNet_v9_t*>(sym), static_cast<ncclNetProperties_v9_t*>(nullptr), size_t{0});
      else bind(static_cast<ncclNet_v8_t*>(sym), static_cast<ncclNetProperties_v8_t*>(nullptr), int{0});
      return true;
    }
  }
  return false;
}

struct Args : harness::CommonArgs {
  int messages = 4;     // posted at once per size (NCCL keeps up to NCCL_STEPS in flight)
  size_t extra = 4096;  // receive buffers are this much larger than the message
  bool close_after_connect = false;  // this rank closes its comms and leaves at once
  bool accept_only = false;          // listen and accept only (no peer will come)
};

bool Parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; i++) {
    if (harness::ParseCommon(argc, argv, &i, a)) continue;
    std::string k = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--messages") a->messages = std::atoi(val().c_str());
    else if (k == "--extra") a->extra = std::strtoull(val().c_str(), nullptr, 10);
    else if (k == "--close-after-connect") a->close_after_connect = true;
    else if (k == "--accept-only") a->accept_only = true;
    else return false;
  }
  return harness::CommonValid(*a) && a->nranks > 1 && a->version >= 8 && a->version <= 12 && a->messages > 0 &&
         a->messages <= 32;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!Parse(argc, argv, &a)) {
    fprintf(stderr,
            "usage: net_harness --lib SO --dir DIR --rank R --nranks N (>= 2) [--version 8..12] "
            "[--sizes BYTES,...] [--seed S] [--messages K (<= 32)] [--extra B] "
            "[--exchange-timeout S] [--close-after-connect] [--accept-only]\n");
    return 2;
  }
  void* lib = dlopen(a.lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  std::string sym = "ncclNetPlugin_v" + std::to_string(a.version);
  void* s = dlsym(lib, sym.c_str());
  Api api;
  if (s == nullptr || !Bind(s, a.version, &api)) {
    fprintf(stderr, "%s not exported\n", sym.c_str());
    return 2;
  }
  auto fail = harness::Fail;
  double t0 = Now();
  void* ctx = nullptr;
  ncclResult_t rc = api.init(&ctx);
  if (rc != ncclSuccess) return fail("init", rc, t0);
  int ndev = 0;
  if ((rc = api.devices(&ndev)) != ncclSuccess || ndev < 1) return fail("devices", rc, t0);
  for (int d = 0; d < ndev; d++) {
    std::string name, pci;
    int speed = 0, ptr = 0, maxRecvs = 0;
    if ((rc = api.props(d, &name, &pci, &speed, &ptr, &maxRecvs)) != ncclSuccess)
      return fail("getProperties", rc, t0);
    printf("{\"event\": \"props\", \"dev\": %d, \"ndev\": %d, \"name\": \"%s\", \"pciPath\": "
           "\"%s\", \"speed\": %d, \"ptrSupport\": %d, \"maxRecvs\": %d}\n",
           d, ndev, name.c_str(), pci.c_str(), speed, ptr, maxRecvs);
  }
  fflush(stdout);

  char handle[NCCL_NET_HANDLE_MAXSIZE];
  void* lcomm = nullptr;
  if ((rc = api.listen(ctx, 0, handle, &lcomm)) != ncclSuccess) return fail("listen", rc, t0);
  if (!harness::WriteHandle(a, "net.handle", handle)) return 2;
  if (a.accept_only) {  // nobody connects: accept must give up within its bound
    void* r = nullptr;
    t0 = Now();
    while (r == nullptr) {
      if ((rc = api.accept(lcomm, &r)) != ncclSuccess) return fail("accept", rc, t0);
      if (r == nullptr) usleep(1000);
    }
    return 2;
  }
  char peer[NCCL_NET_HANDLE_MAXSIZE];
  int next = (a.rank + 1) % a.nranks;
  if (!harness::ReadHandle(a, "net.handle", next, Now() + a.exchange_timeout_s, peer)) {
    fprintf(stderr, "handle exchange timed out\n");
    return 2;
  }
  void *scomm = nullptr, *rcomm = nullptr;
  t0 = Now();
  int calls = 0;
  while (scomm == nullptr || rcomm == nullptr) {
    if (scomm == nullptr && (rc = api.connect(ctx, 0, peer, &scomm)) != ncclSuccess)
      return fail("connect", rc, t0);
    if (rcomm == nullptr && (rc = api.accept(lcomm, &rcomm)) != ncclSuccess)
      return fail("accept", rc, t0);
    calls++;
    if (scomm == nullptr || rcomm == nullptr) usleep(100);
  }
  printf("{\"event\": \"connected\", \"calls\": %d, \"seconds\": %.3f}\n", calls, Now() - t0);
  fflush(stdout);
  if (a.close_after_connect) {
    api.closeSend(scomm);
    api.closeRecv(rcomm);
    api.closeListen(lcomm);
    printf("{\"event\": \"left\"}\n");
    return 0;
  }

  void* mh = nullptr;
  char probe[64];
  bool refuses = api.regMr(scomm, probe, sizeof probe, NCCL_PTR_CUDA, &mh) != ncclSuccess &&
                 api.regDmaBuf(scomm, probe, sizeof probe, &mh) != ncclSuccess;
  printf("{\"event\": \"refuses_device_memory\", \"ok\": %s}\n", refuses ? "true" : "false");

  int prev = (a.rank + a.nranks - 1) % a.nranks;
  int status = 0;
  for (size_t bytes : a.sizes) {
    int k = a.messages;
    std::vector<std::vector<uint8_t>> send(k, std::vector<uint8_t>(bytes));
    std::vector<std::vector<uint8_t>> recv(k, std::vector<uint8_t>(bytes + a.extra, 0xA5));
    std::vector<void*> smh(k), rmh(k), sreq(k, nullptr), rreq(k, nullptr);
    for (int m = 0; m < k; m++) {
      Fill(a.seed, a.rank, bytes, m, send[m].data());
      if ((rc = api.regMr(scomm, send[m].data(), bytes ? bytes : 1, NCCL_PTR_HOST, &smh[m])) !=
              ncclSuccess ||
          (rc = api.regMr(rcomm, recv[m].data(), bytes + a.extra, NCCL_PTR_HOST, &rmh[m])) !=
              ncclSuccess)
        return fail("regMr", rc, t0);
    }
    double start = Now();
    std::vector<int> sdone(k, 0), rdone(k, 0), rsize(k, -1);
    int posted_s = 0, posted_r = 0, left = 2 * k;
    while (left > 0) {
      bool progressed = false;
      // Post in order (one stream per comm): a NULL request means "again later".
      while (posted_r < k) {
        if ((rc = api.irecv(rcomm, recv[posted_r].data(), bytes + a.extra, rmh[posted_r],
                            &rreq[posted_r])) != ncclSuccess)
          return fail("irecv", rc, start);
        if (rreq[posted_r] == nullptr) break;
        posted_r++;
      }
      while (posted_s < k) {
        if ((rc = api.isend(scomm, send[posted_s].data(), bytes, smh[posted_s],
                            &sreq[posted_s])) != ncclSuccess)
          return fail("isend", rc, start);
        if (sreq[posted_s] == nullptr) break;
        posted_s++;
      }
      // Test the posted requests of one side; false on a plugin error.
      auto drain = [&](std::vector<void*>& req, int posted, std::vector<int>& done, int* sizes) {
        for (int m = 0; m < posted; m++) {
          if (done[m]) continue;
          int sz = -1;
          if ((rc = api.test(req[m], &done[m], sizes ? &sizes[m] : &sz)) != ncclSuccess)
            return false;
          if (done[m]) left--, progressed = true;
        }
        return true;
      };
      if (!drain(sreq, posted_s, sdone, nullptr) || !drain(rreq, posted_r, rdone, rsize.data()))
        return fail("data", rc, start);
      if (!progressed && left > 0) usleep(50);
    }
    double secs = Now() - start;
    bool exact = true;
    std::vector<uint8_t> want(bytes);
    for (int m = 0; m < k; m++) {
      Fill(a.seed, prev, bytes, m, want.data());
      exact &= rsize[m] == static_cast<int>(bytes);
      exact &= std::memcmp(recv[m].data(), want.data(), bytes) == 0;
      for (size_t i = bytes; i < bytes + a.extra; i++) exact &= recv[m][i] == 0xA5;
      api.deregMr(scomm, smh[m]);
      api.deregMr(rcomm, rmh[m]);
    }
    if (!exact) status = 1;
    printf("{\"event\": \"result\", \"bytes\": %zu, \"messages\": %d, \"exact\": %s, "
           "\"seconds\": %.4f, \"mib_per_s\": %.1f}\n",
           bytes, k, exact ? "true" : "false", secs,
           secs > 0 ? static_cast<double>(bytes) * k / secs / (1 << 20) : 0.0);
    fflush(stdout);
  }
  // The peer may still be reading: closing first would cut its last message. The ring's
  // last step is symmetric, so each rank's receives done means its sends were taken.
  api.closeSend(scomm);
  api.closeRecv(rcomm);
  api.closeListen(lcomm);
  api.finalize(ctx);
  return status;
}
