// Shared by the CollNet and the point-to-point halves of libnccl-net-heroserve.so.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "nccl_net_abi.h"

namespace heroserve::netplugin {

// NCCL's logger once an init gave it, else the shared log format on stderr
// (heroserve.collnet / heroserve.net).
void SetLogger(ncclDebugLogger_t logger);
void Warn(const char* logger_name, const std::string& msg);
void Info(const char* logger_name, const std::string& msg);

// The local NIC that holds `ip` (network order): its name, its PCI path in /sys (the
// device's realpath; for a virtual interface the interface's own /sys path) and speed in
// Mbps (10000 when the kernel does not say). False when no interface holds the address.
struct Nic {
  std::string name;
  std::string pci_path;
  int speed_mbps = 10000;
  uint64_t guid = 0;
};
bool FindNic(in_addr_t ip, Nic* out);
// The first interface that is up, not loopback, with an IPv4 address (INADDR_ANY binds).
bool FirstNic(Nic* out, in_addr_t* ip);
// Every interface that is up with an IPv4 address (the first address of each), loopback
// interfaces only when `loopback`.
struct NicAddr {
  Nic nic;
  in_addr_t ip;
};
std::vector<NicAddr> AllNics(bool loopback);

// Fills the fields every properties version shares.
template <typename P>
void FillCommonProps(P* p, const char* name, char* pci_path, uint64_t guid, int speed) {
  p->name = const_cast<char*>(name);
  p->pciPath = pci_path;
  p->guid = guid;
  p->ptrSupport = NCCL_PTR_HOST;  // host memory only: NCCL stages GPU data through host
  p->regIsGlobal = 0;
  p->speed = speed;
  p->port = 0;
  p->latency = 0;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  p->netDeviceType = NCCL_NET_DEVICE_HOST;
  p->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
}

// The older properties shapes (v8 ... v11), each derived from the v12 properties `Get`
// fills, so each half of the library states its properties once. v8 has no virtual
// devices nor size limits; v9 and v10 add them; v11 adds maxMultiRequestSize.
template <ncclResult_t (*Get)(int, ncclNetProperties_v12_t*)>
struct OlderProps {
  template <typename P>
  static ncclResult_t Common(int dev, P* out, ncclNetProperties_v12_t* p) {
    ncclResult_t rc = Get(dev, p);
    if (rc != ncclSuccess) return rc;
    std::memset(out, 0, sizeof *out);
    FillCommonProps(out, p->name, p->pciPath, p->guid, p->speed);
    return ncclSuccess;
  }
  static ncclResult_t V8(int dev, ncclNetProperties_v8_t* out) {
    ncclNetProperties_v12_t p;
    return Common(dev, out, &p);
  }
  template <typename P>
  static ncclResult_t V9To11(int dev, P* out) {
    ncclNetProperties_v12_t p;
    ncclResult_t rc = Common(dev, out, &p);
    if (rc != ncclSuccess) return rc;
    out->vProps.ndevs = 1;
    out->vProps.devs[0] = dev;
    out->maxP2pBytes = p.maxP2pBytes;
    out->maxCollBytes = p.maxCollBytes;
    return ncclSuccess;
  }
  static ncclResult_t V11(int dev, ncclNetProperties_v11_t* out) {
    ncclResult_t rc = V9To11(dev, out);
    if (rc == ncclSuccess) out->maxMultiRequestSize = 1;
    return rc;
  }
};

// Memory registration of both halves: host memory only (NCCL stages GPU data through host
// memory, ptrSupport = NCCL_PTR_HOST); CUDA pointers and DMA-BUF are refused with
// ncclInternalError, said through `Say` (Warn or Info) under the logger name `Log::kLog`.
struct MemHandle {
  void* data;
  size_t size;
};
template <typename Log, void (*Say)(const char*, const std::string&)>
struct HostMemory {
  static ncclResult_t RegMr(void*, void* data, size_t size, int type, void** mhandle) {
    *mhandle = nullptr;
    if (type != NCCL_PTR_HOST) {
      Say(Log::kLog, "regMr: only host memory can be registered (type " +
                         std::to_string(type) + ")");
      return ncclInternalError;
    }
    *mhandle = new MemHandle{data, size};
    return ncclSuccess;
  }
  static ncclResult_t RegMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void** mhandle) {
    *mhandle = nullptr;
    Say(Log::kLog, "regMrDmaBuf: DMA-BUF registration is not supported (host memory only)");
    return ncclInternalError;
  }
  static ncclResult_t DeregMr(void*, void* mhandle) {
    delete static_cast<MemHandle*>(mhandle);
    return ncclSuccess;
  }
};

}  // namespace heroserve::netplugin
