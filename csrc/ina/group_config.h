// Where a CollNet communicator learns its INA group: the switch to send to, the aggregator
// indices (window) the switch holds for it, its worker id and the group's session. The GPU
// agent owns that policy (docs/design.md §8); this interface is the plugin's one view of it,
// so that moving from the interim file below to the agent's shared-memory policy table
// (csrc/include/heroserve/shm.h, as the tuner's csrc/plugin/feed.cc reads it) is one new
// implementation of GroupConfigSource and one line in MakeGroupConfigSource.
//
// Interim source: a JSON file named by HEROSERVE_INA_CONFIG (the GPU agent, or a test,
// writes it; it is read again at every claim, so a rewrite applies to the next
// communicator):
//
//   {"groups": [{"group_id": 7, "num_workers": 4, "worker_id": 0, "window": 64,
//                "switch_ip": "10.77.0.254", "switch_port": 48879,
//                "session": 3735928559, "first_generation": 12345,
//                "bind_ip": "10.77.0.1", "bind_port": 48879,
//                "comm_id": "0x1234abcd",            (optional)
//                "give_up_s": 10, "initial_rto_s": 0.2, "min_rto_s": 0.02,
//                "max_rto_s": 2,                     (optional timeouts)
//                "float_sums": false,                (optional, default false)
//                "lane_format": "int32",             (optional: int32 | bfp16, which needs
//                                                     float_sums; lanes.h)
//                "gpu": "srv0-gpu0",                 (optional, informational:
//                "group_name": "prefill/0/0/rail0"}]}  which GPU and group an entry is)
//
// The GPU agent writes this file from the controller's InaAssignment (csrc/agent/
// ina_config.h; csrc/README.md, "INA group configuration"), replacing it by rename, so a
// reader sees the old or the new document whole. The plugin treats it as hostile: only a
// regular file of at most kMaxConfigBytes is read (a FIFO or device named by the variable
// is refused, never waited on), every field is checked against the wire's limits, and an
// error names the entry and field, never the file's content.
//
// A communicator takes the entry whose comm_id equals NCCL's communicator hash (CollNet v11+
// passes it to init) when one does, else the first entry without comm_id that no open
// communicator of this process holds. switch_port and bind_port default to 48879 (results
// come back to 48879, docs/dataplane.md), bind_ip to 0.0.0.0.
//
// float_sums: true lets the CollNet sum float32, float16 and bfloat16 as fixed point with
// an agreed exponent (lanes.h; not bit-identical to NCCL's float sum, error in
// csrc/README.md). Off by default: exact integer sums only. The plugin offers floats to
// NCCL only when every entry of the file opts in (reduceSupport is per process), and every
// member of a group must agree (connect checks). lanes: the group's lane format
// (docs/dataplane.md, "Lane formats"); bfp16 carries floats only, so it needs float_sums,
// and with one bfp16 entry the plugin offers NCCL float sums only.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client.h"

namespace heroserve::ina {

// The largest document read or written: 4096 entries (the parser's bound) of ~420 bytes.
inline constexpr size_t kMaxConfigBytes = 2u << 20;
inline constexpr size_t kMaxConfigNameChars = 256;  // "gpu", "group_name"

struct GroupRequest {
  uint64_t comm_id = 0;  // NCCL's communicator hash (0: not known, CollNet before v11)
  int dev = 0;
};

struct GroupPolicy {
  GroupSpec spec;
  in_addr_t bind_ip = 0;  // network order
  uint16_t bind_port = INA_UDP_PORT;
  Timeouts timeouts;
  bool float_sums = false;
  int entry = -1;  // which entry of the source (for Release)
};

class GroupConfigSource {
 public:
  virtual ~GroupConfigSource() = default;
  // The group of a new communicator; false and *err when there is none.
  virtual bool Claim(const GroupRequest& req, GroupPolicy* out, std::string* err) = 0;
  // The communicator is gone; its entry may be claimed again.
  virtual void Release(const GroupPolicy& p) = 0;
};

// From the environment: HEROSERVE_INA_CONFIG (a file as above). nullptr and *err when
// unset: then this process has no INA groups.
std::unique_ptr<GroupConfigSource> MakeGroupConfigSource(std::string* err);
std::unique_ptr<GroupConfigSource> MakeFileGroupConfigSource(const std::string& path);

// Reads `path` as the plugin does: a regular file of at most kMaxConfigBytes (opened
// without blocking, so a FIFO is refused rather than waited on). false and *err otherwise.
bool ReadConfigFile(const std::string& path, std::string* out, std::string* err);

struct GroupEntry {
  GroupPolicy policy;
  uint64_t comm_id = 0;
  bool has_comm_id = false;
};
// Parses a document of the format above (exposed for tests and for the GPU agent, which
// checks what it writes with it); false and *err naming the entry and field when any entry
// is invalid.
bool ParseGroupConfig(const std::string& json_text, std::vector<GroupEntry>* out,
                      std::string* err);

// The entries of the file HEROSERVE_INA_CONFIG names, read and checked as a Claim does
// (both nets use it to find their NICs); false and *err when unset, unreadable or invalid.
bool LoadConfiguredGroups(std::vector<GroupEntry>* out, std::string* err);

}  // namespace heroserve::ina
