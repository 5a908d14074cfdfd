// heroserve-gpu-agent: gRPC client of the controller (docs/design.md §9, §11).
//
// Registers the server's GPUs, follows the policy stream (full state on connect, then
// increments with increasing epochs; stale epochs ignored and never acknowledged, applied
// ones acknowledged; a new controller generation, i.e. a controller that lost its database,
// restarts the epoch count, docs/control-plane.md),
// publishes each group's tables into its shm segment for the tuner plugin, and reports the
// plugin's selections and bytes plus NVLink utilisation (NVML, when present) as telemetry,
// and writes its GPUs' INA groups for the CollNet plugin (ina_config.h).
// Failures (controller unreachable, TLS files or handshake bad, malformed tables) are logged
// and retried with backoff; the last good tables stay published meanwhile.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "heroserve/policy.h"
#include "heroserve/shm.h"
#include "ina_config.h"
#include "nvml.h"
#include "selections.h"

namespace grpc {
class ClientContext;
}

namespace heroserve::v1 {
class PolicyUpdate;
class PolicyTable;
class TelemetryReport;
}  // namespace heroserve::v1

namespace heroserve::agent {

struct GpuSpec {
  std::string gpu_id;
  int local_index = -1;
};

// Groups (and so shm segments) one agent holds at once. Every GPU of a plan is in one group
// (docs/inputs.md: every GPU used once) and an agent registers at most 256 GPUs
// (docs/control-plane.md, bounds), so a correct controller never sends more; tables of
// further groups are refused, named in the ack and logged.
constexpr size_t kMaxGroups = 256;

struct Options {
  std::string controller;  // HOST:PORT
  std::string node_id;
  std::vector<GpuSpec> gpus;
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  bool insecure = false;           // allow no TLS to a non-loopback controller
  std::string nvlink_peer;         // node name at the far end of each GPU's NVLink
  bool nvlink_mesh = false;        // GPUs joined pairwise: one link per pair of --gpu GPUs
  double telemetry_interval_s = 0; // 0: the controller's value
  size_t shm_capacity = shm::kDefaultCapacity;
  double max_backoff_s = 10.0;
  InaConfigOptions ina;  // --ina-config, --ina-switch, --ina-bind
};

void Log(const char* level, const std::string& msg);

class Daemon {
 public:
  explicit Daemon(Options opts);
  ~Daemon();
  int Run();   // until Stop(); returns the exit status
  void Stop(); // async-signal-unsafe: call from a normal thread

 private:
  struct Group {
    std::vector<std::shared_ptr<const PolicyTable>> tables;  // increasing version
    std::unique_ptr<shm::Segment> seg;
    SelectionCounter counted;  // the plugin's counters as last reported
  };

  enum class Outcome { kApplied, kIgnored, kFailed };
  // kIgnored (stale: an increment of another generation or of an old epoch) is never acked.
  Outcome ApplyUpdate(const heroserve::v1::PolicyUpdate& u, std::string* error);
  bool InstallTable(const heroserve::v1::PolicyTable& t, Group* g, std::string* error);
  bool Publish(const std::string& group_id, Group* g, std::string* error);
  // Removes a group: its segment is marked retired (readers let go of it) and unlinked.
  void Drop(std::map<std::string, Group>::iterator it);
  void FillTelemetry(heroserve::v1::TelemetryReport* r);
  // The NVLink links of this server's board, one record each (--nvlink-peer/--nvlink-mesh).
  void AddNvlinkLinks(const std::vector<NvlinkSample>& samples,
                      heroserve::v1::TelemetryReport* report) const;
  void TelemetryLoop();
  bool Sleep(double seconds);  // false when stopping

  Options opts_;
  // Names this daemon's run in every payload it publishes (docs/policy-table.md): a restarted
  // daemon is a new writer generation, whose versions the plugin orders above the old ones.
  const std::string writer_generation_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  grpc::ClientContext* stream_ctx_ = nullptr;
  std::map<std::string, Group> groups_;
  uint64_t last_epoch_ = 0;
  std::string generation_;  // controller generation last_epoch_ belongs to ("" before any)
  std::string session_;
  double telemetry_interval_s_ = 1.0;
  void* stub_ = nullptr;  // heroserve::v1::Control::Stub*, valid while session_ is set
  Nvml nvml_;
  InaConfigWriter ina_;  // guarded by mu_
};

}  // namespace heroserve::agent
