#include "nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>

namespace heroserve::agent {

namespace {

// Our own declarations of the few NVML entry points and structs we use (NVML's public API).
using nvmlReturn = int;
using nvmlDevice = void*;
constexpr unsigned kFieldNvlinkSpeedMBps = 90;     // NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
constexpr unsigned kFieldNvlinkTxKiB = 138;        // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
constexpr unsigned kFieldNvlinkRxKiB = 139;        // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
constexpr unsigned kMaxLinks = 18;                 // NVML_NVLINK_MAX_LINKS

struct FieldValue {
  unsigned fieldId;
  unsigned scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;
  nvmlReturn nvmlReturn_;
  union {
    double d;
    unsigned ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
  } value;
};

struct Memory {
  unsigned long long total, free, used;
};

template <typename F>
F Sym(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Nvml::~Nvml() {
  if (lib_) {
    if (fn_shutdown_) reinterpret_cast<nvmlReturn (*)()>(fn_shutdown_)();
    dlclose(lib_);
  }
}

bool Nvml::Load(std::string* why) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    *why = "NVML not available (libnvidia-ml.so.1 not found): NVLink utilisation not reported";
    return false;
  }
  auto init = Sym<nvmlReturn (*)()>(lib, "nvmlInit_v2");
  auto count = Sym<nvmlReturn (*)(unsigned*)>(lib, "nvmlDeviceGetCount_v2");
  auto handle = Sym<nvmlReturn (*)(unsigned, nvmlDevice*)>(lib, "nvmlDeviceGetHandleByIndex_v2");
  auto name = Sym<nvmlReturn (*)(nvmlDevice, char*, unsigned)>(lib, "nvmlDeviceGetName");
  auto mem = Sym<nvmlReturn (*)(nvmlDevice, Memory*)>(lib, "nvmlDeviceGetMemoryInfo");
  auto link_state = Sym<nvmlReturn (*)(nvmlDevice, unsigned, int*)>(lib, "nvmlDeviceGetNvLinkState");
  fn_field_values_ = reinterpret_cast<void*>(dlsym(lib, "nvmlDeviceGetFieldValues"));
  fn_shutdown_ = reinterpret_cast<void*>(dlsym(lib, "nvmlShutdown"));
  unsigned n = 0;
  if (!init || !count || !handle || init() != 0 || count(&n) != 0 || n == 0) {
    *why = "NVML present but no GPU usable: NVLink utilisation not reported";
    if (init && fn_shutdown_) reinterpret_cast<nvmlReturn (*)()>(fn_shutdown_)();
    dlclose(lib);
    fn_shutdown_ = nullptr;
    return false;
  }
  lib_ = lib;
  auto fields = reinterpret_cast<nvmlReturn (*)(nvmlDevice, int, FieldValue*)>(fn_field_values_);
  for (unsigned i = 0; i < n; ++i) {
    nvmlDevice h = nullptr;
    if (handle(i, &h) != 0) continue;
    GpuDevice d;
    d.index = i;
    char buf[96] = {0};
    if (name && name(h, buf, sizeof buf) == 0) d.name = buf;
    Memory m{};
    if (mem && mem(h, &m) == 0) d.memory_bytes = m.total;
    for (unsigned l = 0; l < kMaxLinks && link_state; ++l) {
      int active = 0;
      if (link_state(h, l, &active) == 0 && active) ++d.active_links;
    }
    if (fields) {
      FieldValue f{};
      f.fieldId = kFieldNvlinkSpeedMBps;
      if (fields(h, 1, &f) == 0 && f.nvmlReturn_ == 0) {
        d.link_speed_bytes_s = static_cast<double>(f.value.ui) * 1e6;
      }
    }
    handles_.push_back(h);
    devices_.push_back(d);
  }
  last_tx_.assign(devices_.size(), 0);
  last_rx_.assign(devices_.size(), 0);
  return true;
}

bool Nvml::ReadCounters(unsigned k, uint64_t* tx_kib, uint64_t* rx_kib) {
  auto fields = reinterpret_cast<nvmlReturn (*)(nvmlDevice, int, FieldValue*)>(fn_field_values_);
  if (!fields) return false;
  FieldValue f[2 * kMaxLinks] = {};
  for (unsigned l = 0; l < kMaxLinks; ++l) {
    f[2 * l].fieldId = kFieldNvlinkTxKiB;
    f[2 * l].scopeId = l;
    f[2 * l + 1].fieldId = kFieldNvlinkRxKiB;
    f[2 * l + 1].scopeId = l;
  }
  if (fields(handles_[k], 2 * kMaxLinks, f) != 0) return false;
  uint64_t tx = 0, rx = 0;
  bool any = false;
  for (unsigned l = 0; l < kMaxLinks; ++l) {
    if (f[2 * l].nvmlReturn_ == 0) {
      tx += f[2 * l].value.ull;
      any = true;
    }
    if (f[2 * l + 1].nvmlReturn_ == 0) rx += f[2 * l + 1].value.ull;
  }
  *tx_kib = tx;
  *rx_kib = rx;
  return any;
}

std::vector<NvlinkSample> Nvml::Sample() {
  std::vector<NvlinkSample> out;
  if (!lib_) return out;
  int64_t now = NowNs();
  double dt = last_ns_ ? static_cast<double>(now - last_ns_) * 1e-9 : 0.0;
  for (size_t k = 0; k < devices_.size(); ++k) {
    uint64_t tx = 0, rx = 0;
    if (!ReadCounters(static_cast<unsigned>(k), &tx, &rx)) continue;
    if (dt > 0.0 && tx >= last_tx_[k] && rx >= last_rx_[k]) {
      NvlinkSample s;
      s.index = devices_[k].index;
      s.tx_bytes_s = static_cast<double>(tx - last_tx_[k]) * 1024.0 / dt;
      s.rx_bytes_s = static_cast<double>(rx - last_rx_[k]) * 1024.0 / dt;
      double cap = devices_[k].link_speed_bytes_s * devices_[k].active_links;
      s.utilisation = cap > 0.0 ? std::min(1.0, std::max(s.tx_bytes_s, s.rx_bytes_s) / cap) : 0.0;
      out.push_back(s);
    }
    last_tx_[k] = tx;
    last_rx_[k] = rx;
  }
  last_ns_ = now;
  return out;
}

}  // namespace heroserve::agent
