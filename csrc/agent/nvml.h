// NVLink utilisation through NVML, loaded at run time (dlopen libnvidia-ml.so.1): a machine
// without a GPU or driver simply reports nothing (not an error).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace heroserve::agent {

struct GpuDevice {
  unsigned index = 0;
  std::string name;
  uint64_t memory_bytes = 0;
  unsigned active_links = 0;
  double link_speed_bytes_s = 0.0;  // per link
};

struct NvlinkSample {
  unsigned index = 0;
  double tx_bytes_s = 0.0;     // NVLink data throughput over the interval
  double rx_bytes_s = 0.0;
  double utilisation = 0.0;    // max(tx, rx) / (active links * link speed), in [0, 1]
};

class Nvml {
 public:
  Nvml() = default;
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // False (with a reason) when NVML or a GPU is absent.
  bool Load(std::string* why);
  bool loaded() const { return lib_ != nullptr; }
  const std::vector<GpuDevice>& devices() const { return devices_; }
  // Utilisation since the previous call (the first call primes the counters: empty result).
  std::vector<NvlinkSample> Sample();

 private:
  bool ReadCounters(unsigned index, uint64_t* tx_kib, uint64_t* rx_kib);

  void* lib_ = nullptr;
  std::vector<void*> handles_;
  std::vector<GpuDevice> devices_;
  std::vector<uint64_t> last_tx_, last_rx_;
  int64_t last_ns_ = 0;
  void* fn_field_values_ = nullptr;
  void* fn_shutdown_ = nullptr;
};

}  // namespace heroserve::agent
