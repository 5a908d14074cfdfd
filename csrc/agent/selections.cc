// SelectionCounter (selections.h): per-report deltas of the tuner plugin's counters.
#include "selections.h"

#include <algorithm>

namespace heroserve::agent {

std::map<SelectionCounter::Key, SelectionDelta> SelectionCounter::Update(
    const std::vector<shm::Segment::SlotView>& slots) {
  std::map<Key, SelectionDelta> out;
  decltype(reported_) seen;  // replaces reported_: what is not in this snapshot is gone
  for (const auto& slot : slots) {
    for (uint32_t i = 0; i < slot.counters.size(); ++i) {
      const shm::PolicyCounter& c = slot.counters[i];
      if (c.selections == 0) continue;
      auto key = std::make_tuple(slot.pid, slot.version, i);
      shm::PolicyCounter prev{0, 0};
      auto it = reported_.find(key);
      // A smaller count than last time is a new process under a reused pid: all of it is new.
      if (it != reported_.end() && it->second.selections <= c.selections) prev = it->second;
      seen[key] = c;
      SelectionDelta& d = out[{slot.version, i}];
      d.selections = std::max(d.selections, c.selections - prev.selections);
      d.bytes = std::max(d.bytes, c.bytes >= prev.bytes ? c.bytes - prev.bytes : c.bytes);
      d.last_seq = std::max(d.last_seq, slot.last_seq);
    }
  }
  reported_ = std::move(seen);
  return out;
}

}  // namespace heroserve::agent
