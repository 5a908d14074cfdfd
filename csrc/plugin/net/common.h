// Shared by the CollNet and the point-to-point halves of libnccl-net-heroserve.so.
#pragma once

#include <netinet/in.h>

#include <cstdint>
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

}  // namespace heroserve::netplugin
