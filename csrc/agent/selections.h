// The GPU agent's telemetry of the tuner plugin's counters (csrc/README.md, "Telemetry
// semantics"): SelectionCounter turns the cumulative per-process counters of one group's
// segment into what happened since the previous report, per (table version, policy index).
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "heroserve/shm.h"

namespace heroserve::agent {

struct SelectionDelta {
  uint64_t selections = 0;
  uint64_t bytes = 0;
  uint64_t last_seq = 0;  // the largest sequence number any member process reached
};

class SelectionCounter {
 public:
  using Key = std::pair<uint64_t, uint32_t>;  // (table version, policy index)

  // Deltas since the previous call. Every member process makes the same choices, so a
  // group's count is one member's: the largest per-process delta, not the sum. Only the
  // counters of this snapshot are remembered: a process that left (its slot freed, or taken
  // by another pid) or moved to another version is forgotten, so what is remembered never
  // exceeds shm::kMaxProcs x shm::kMaxPolicies entries however many processes come and go.
  std::map<Key, SelectionDelta> Update(const std::vector<shm::Segment::SlotView>& slots);

  size_t remembered() const { return reported_.size(); }

 private:
  // (pid, version, policy index) -> cumulative {selections, bytes} last reported
  std::map<std::tuple<uint64_t, uint64_t, uint32_t>, shm::PolicyCounter> reported_;
};

}  // namespace heroserve::agent
