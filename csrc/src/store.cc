// TableStore (policy.h): the versioned double buffer one writer publishes tables into and
// many threads read without locks.
#include <cstdint>
#include <mutex>
#include <thread>

#include "heroserve/policy.h"

namespace heroserve {

bool TableStore::Publish(std::shared_ptr<const PolicyTable> table, bool* too_far) {
  if (too_far) *too_far = false;
  std::lock_guard<std::mutex> lock(writer_);
  int cur = active_.load(std::memory_order_seq_cst);
  const Snapshot& now = slots_[cur];
  if (!now.tables.empty()) {
    const PolicyTable& newest = *now.tables.back();
    if (!Precedes(newest, *table)) return false;
    if (table->writer_epoch == newest.writer_epoch &&
        table->version - newest.version > kMaxVersionJump) {
      if (too_far) *too_far = true;
      return false;
    }
  }
  int next = 1 - cur;
  // Wait for readers that pinned the inactive slot before the previous flip.
  while (readers_[next].load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  Snapshot& s = slots_[next];
  s.tables = now.tables;
  s.tables.push_back(std::move(table));
  // A version is dead once a newer one applies no later: it can govern no sequence number.
  for (size_t k = 0; k + 1 < s.tables.size();) {
    bool dominated = false;
    for (size_t j = k + 1; j < s.tables.size() && !dominated; ++j)
      dominated = s.tables[j]->apply_from_seq <= s.tables[k]->apply_from_seq;
    if (dominated)
      s.tables.erase(s.tables.begin() + static_cast<std::ptrdiff_t>(k));
    else
      ++k;
  }
  // Over the cap, drop the version that governs the fewest sequence numbers (the shortest
  // window before its successor applies), never the newest: the oldest version may still be
  // the one in force for a communicator that has just started at sequence 0.
  while (s.tables.size() > kKeep) {
    size_t victim = 0;
    uint64_t shortest = UINT64_MAX;
    for (size_t k = 0; k + 1 < s.tables.size(); ++k) {
      uint64_t window = s.tables[k + 1]->apply_from_seq - s.tables[k]->apply_from_seq;
      if (window < shortest) {
        shortest = window;
        victim = k;
      }
    }
    s.tables.erase(s.tables.begin() + static_cast<std::ptrdiff_t>(victim));
  }
  s.generation = now.generation + 1;
  active_.store(next, std::memory_order_seq_cst);
  generation_.store(s.generation, std::memory_order_release);
  return true;
}

TableStore::Snapshot TableStore::Read() const {
  while (true) {
    int idx = active_.load(std::memory_order_seq_cst);
    readers_[idx].fetch_add(1, std::memory_order_seq_cst);
    if (active_.load(std::memory_order_seq_cst) == idx) {
      Snapshot copy = slots_[idx];
      readers_[idx].fetch_sub(1, std::memory_order_release);
      return copy;
    }
    readers_[idx].fetch_sub(1, std::memory_order_release);
  }
}

uint64_t TableStore::newest_version() const {
  Snapshot s = Read();
  return s.tables.empty() ? 0 : s.tables.back()->version;
}

}  // namespace heroserve
