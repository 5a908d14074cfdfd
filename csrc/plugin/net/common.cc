#include "common.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <stdlib.h>

#include <atomic>
#include <fstream>
#include <functional>

#include "heroserve/log.h"

namespace heroserve::netplugin {
namespace {
std::atomic<ncclDebugLogger_t> g_logger{nullptr};

void Log(ncclDebugLogLevel level, const char* name, const std::string& msg) {
  ncclDebugLogger_t l = g_logger.load();
  if (l != nullptr) {
    l(level, NCCL_NET, __FILE__, __LINE__, "%s: %s", name, msg.c_str());
    return;
  }
  heroserve::log::Write(level == NCCL_LOG_WARN ? heroserve::log::Level::kWarning
                                               : heroserve::log::Level::kInfo,
                        name, msg);
}

bool Describe(const char* ifname, Nic* out) {
  out->name = ifname;
  std::string sys = std::string("/sys/class/net/") + ifname;
  char real[PATH_MAX];
  if (realpath((sys + "/device").c_str(), real) != nullptr) {
    out->pci_path = real;
  } else if (realpath(sys.c_str(), real) != nullptr) {
    out->pci_path = real;
  } else {
    out->pci_path.clear();
  }
  std::ifstream f(sys + "/speed");
  int s = 0;
  if (f >> s && s > 0) out->speed_mbps = s;
  out->guid = std::hash<std::string>()(out->name);
  return true;
}
}  // namespace

void SetLogger(ncclDebugLogger_t logger) {
  if (logger != nullptr) g_logger.store(logger);
}
void Warn(const char* name, const std::string& msg) { Log(NCCL_LOG_WARN, name, msg); }
void Info(const char* name, const std::string& msg) { Log(NCCL_LOG_INFO, name, msg); }

bool FindNic(in_addr_t ip, Nic* out) {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return false;
  bool found = false;
  for (ifaddrs* i = all; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    auto* a = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (a->sin_addr.s_addr == ip) found = Describe(i->ifa_name, out);
  }
  freeifaddrs(all);
  return found;
}

bool FirstNic(Nic* out, in_addr_t* ip) {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return false;
  bool found = false;
  for (ifaddrs* i = all; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    *ip = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    found = Describe(i->ifa_name, out);
  }
  freeifaddrs(all);
  return found;
}

std::vector<NicAddr> AllNics(bool loopback) {
  std::vector<NicAddr> out;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0) continue;
    if (((i->ifa_flags & IFF_LOOPBACK) != 0) != loopback) continue;
    bool seen = false;
    for (const auto& n : out) seen |= n.nic.name == i->ifa_name;
    if (seen) continue;
    NicAddr n;
    n.ip = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    Describe(i->ifa_name, &n.nic);
    out.push_back(n);
  }
  freeifaddrs(all);
  return out;
}

}  // namespace heroserve::netplugin
