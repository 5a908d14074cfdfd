// heroserve-nvml-probe: prints what the GPU agent would learn from NVML (devices, NVLink
// speed, utilisation over one interval). Exit 0 with "no NVML" when there is no GPU.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "nvml.h"

int main(int argc, char** argv) {
  double secs = argc > 1 ? std::atof(argv[1]) : 0.5;
  heroserve::agent::Nvml nvml;
  std::string why;
  if (!nvml.Load(&why)) {
    std::printf("no NVML: %s\n", why.c_str());
    return 0;
  }
  for (const auto& d : nvml.devices()) {
    std::printf("gpu %u name=%s memory_bytes=%llu nvlinks_active=%u link_speed_bytes_s=%.0f\n",
                d.index, d.name.c_str(), static_cast<unsigned long long>(d.memory_bytes),
                d.active_links, d.link_speed_bytes_s);
  }
  nvml.Sample();
  std::this_thread::sleep_for(std::chrono::duration<double>(secs));
  for (const auto& s : nvml.Sample()) {
    std::printf("gpu %u nvlink_tx_bytes_s=%.0f rx_bytes_s=%.0f utilisation=%.4f\n", s.index,
                s.tx_bytes_s, s.rx_bytes_s, s.utilisation);
  }
  return 0;
}
