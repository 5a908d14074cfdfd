// Policy tables and the online scheduler core (docs/design.md §8, paper Eqs. 16-18).
//
// Mirrors controller/scheduler/online.py operation for operation, in IEEE double, so both
// produce the same choices and costs on tests/vectors/online_scheduler.json. Costs b_c are
// fractions of one window T_u (dimensionless); sizes are bytes; capacities and policy
// bandwidths bytes/s; latencies and T_u seconds.
//
// Eq. 16: delta_c = (latency_s + D / bandwidth) / T_u, the policy's uncontended time for D
// bytes as a fraction of the window, computed as latency_s / T_u + D / (T_u * bandwidth) in
// that order (as online.py does). With the defaults (latency_s 0, bandwidth = bottleneck)
// the first term is +0.0 and the second the original D / (T_u * bottleneck), bit for bit.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "heroserve/json.h"

namespace heroserve {

// kIna: flat INA, every member streams its whole vector to one switch. kHier: hierarchical
// INA (reduce-scatter inside each server over NVLink, INA of one shard per rail, all-gather
// over NVLink; docs/design.md §5), whose switches are listed per rail.
enum class Scheme : uint8_t { kIna = 0, kRing = 1, kNvls = 2, kHier = 3 };

const char* SchemeName(Scheme s);
// "ina", "ring", "nvls" or "hier" -> the scheme; false for anything else.
bool ParseScheme(std::string_view name, Scheme* out);

// One rail of a hierarchical policy: the switch that aggregates shard `shard`.
struct Rail {
  uint32_t shard = 0;
  std::string switch_name;
};

// Bounds on what a table may hold, so a hostile or corrupt table (shared memory is written
// by another process) costs a bounded parse: more policies than the plugin's per-policy
// counters (shm::kMaxPolicies), links, members or route lengths beyond any real group.
constexpr size_t kMaxTablePolicies = 256;
constexpr size_t kMaxTableLinks = 4096;
constexpr size_t kMaxPathMembers = 4096;
constexpr size_t kMaxPathHops = 64;
constexpr size_t kMaxRails = 64;

struct Policy {
  uint32_t id = 0;
  Scheme scheme = Scheme::kRing;
  std::string switch_name;  // kIna: the aggregation switch; empty otherwise
  std::vector<Rail> rails;  // kHier: one per shard, shard k at index k; empty otherwise
  std::vector<uint32_t> links;  // indices into PolicyTable::link_ids, in table order
  std::map<std::string, std::vector<std::string>> paths;  // GPU id -> route (informational)
  double bottleneck = 0.0;  // bytes/s: min capacity over links
  double cost = 0.0;        // b_c when the table takes effect
  double latency_s = 0.0;   // s: the policy's time for 0 bytes (Eq. 16), >= 0
  // bytes/s: effective bandwidth of Eq. 16, > 0. ParseTable sets it to `bottleneck` when the
  // table omits it; code that builds a Policy by hand must set it.
  double bandwidth = 0.0;
};

// A validated table (docs/policy-table.md). Immutable once built; shared between threads
// through std::shared_ptr<const PolicyTable>.
struct PolicyTable {
  std::string group_id;
  uint64_t version = 0;
  // Not a table field: the reader's count of writer generations before the one that
  // published this table (docs/policy-table.md, "Versions and writer generations"). Tables
  // order by (writer_epoch, version), so a restarted writer's versions, which start again
  // low, outrank everything its predecessor published. 0 wherever one writer feeds a store.
  uint64_t writer_epoch = 0;
  uint64_t apply_from_seq = 0;
  double window_s = 0.0;  // T_u, seconds
  double gamma = 0.0;     // Eq. 18 smoothing
  std::vector<std::string> link_ids;
  std::vector<double> capacities;  // bytes/s, aligned with link_ids
  std::vector<Policy> policies;    // increasing id
  std::vector<double> utilisation; // aligned with link_ids; absent in the source = 0

  // Index of a link id, or -1.
  int LinkIndex(std::string_view id) const;
};

// True when `a` comes before `b` in version order: by (writer_epoch, version).
inline bool Precedes(const PolicyTable& a, const PolicyTable& b) {
  if (a.writer_epoch != b.writer_epoch) return a.writer_epoch < b.writer_epoch;
  return a.version < b.version;
}

// Largest step a table's version may take above the newest one a store holds from the same
// writer epoch. The controller raises a group's version by one per content change (or to one
// above a floor its members reported), and a reader sees every publish it lives through, so
// a real step is a handful; one far above it (a hostile or corrupt write of 2^62) would make
// every later table stale. 2^20 steps are a million plan changes between two reads.
constexpr uint64_t kMaxVersionJump = uint64_t{1} << 20;

// Validates a table in the JSON form of docs/policy-table.md. On failure returns false with a
// message naming the field (same rules as online.py's parse_table).
bool ParseTable(const json::Value& v, PolicyTable* out, std::string* error);
bool ParseTableJson(std::string_view text, PolicyTable* out, std::string* error);
json::Value TableToJsonValue(const PolicyTable& t);
std::string TableToJson(const PolicyTable& t);

// W(c_i, c_j) of Eq. 18: utilisation on the links c_i and c_j share, over the utilisation on
// c_j's links, summed in c_j's link order; 0/0 = 0.
double SharingRatio(const PolicyTable& t, const std::vector<double>& util, size_t i, size_t j);

// Versioned table store: one writer publishes, many threads read without locks.
//
// Two slots ("versioned double buffer"): readers pin the active slot with a per-slot reader
// count and re-check that it is still active; the writer fills the inactive slot once its
// reader count is zero, then flips. Readers never wait on the writer; the writer waits only
// for readers still inside the slot it is about to reuse (a few hundred nanoseconds).
class TableStore {
 public:
  static constexpr size_t kKeep = 8;  // most recent versions kept (pending + in force)

  struct Snapshot {
    uint64_t generation = 0;
    std::vector<std::shared_ptr<const PolicyTable>> tables;  // increasing version
  };

  // Adds a table; false when it does not come after the newest one held (stale, Precedes)
  // or when its version is more than kMaxVersionJump above the newest one of its writer
  // epoch (*too_far, when given, tells the two apart).
  bool Publish(std::shared_ptr<const PolicyTable> table, bool* too_far = nullptr);
  // Increases on every successful Publish; one acquire load, safe from any thread.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  // Copies the current snapshot (lock-free for the reader).
  Snapshot Read() const;
  uint64_t newest_version() const;

 private:
  Snapshot slots_[2];
  mutable std::atomic<int> readers_[2] = {{0}, {0}};
  std::atomic<int> active_{0};
  std::atomic<uint64_t> generation_{0};
  std::mutex writer_;  // serialises writers only
};

struct Selection {
  uint32_t policy_id = 0;
  uint32_t index = 0;   // position in the table's policy list
  Scheme scheme = Scheme::kRing;
  double cost = 0.0;    // J(c*, D)
  uint64_t seq = 0;     // collective sequence number this selection was for
  uint64_t version = 0; // table version in force
};

// Per-group scheduler state (one object per group member, used by one thread at a time).
// Tables come from Install() and/or from a TableStore polled at each Select().
class Scheduler {
 public:
  explicit Scheduler(const TableStore* store = nullptr) : store_(store) {}

  // Queues a table; false when stale (not after every table seen, in Precedes order).
  bool Install(std::shared_ptr<const PolicyTable> table);
  // Eqs. 16-17 for a transfer of nbytes; false when no table is in force.
  bool Select(double nbytes, Selection* out);
  // Window boundary: Eq. 18 and the cost decay. Unknown link ids are ignored; a value outside
  // [0, 1] is an error (state untouched).
  bool ObserveUtilisation(const std::vector<std::pair<std::string, double>>& util,
                          std::string* error);

  uint64_t seq() const { return seq_; }
  uint64_t version() const { return table_ ? table_->version : 0; }
  bool has_table() const { return table_ != nullptr; }
  const PolicyTable* table() const { return table_.get(); }
  const std::vector<double>& costs() const { return costs_; }
  double penalty(size_t i, size_t j) const { return penalty_[i * costs_.size() + j]; }
  uint64_t late_tables() const { return late_tables_; }

 private:
  void PollStore();
  void ActivateDue();

  const TableStore* store_;
  uint64_t store_generation_ = 0;
  std::shared_ptr<const PolicyTable> table_;
  std::vector<std::shared_ptr<const PolicyTable>> pending_;  // by apply_from_seq, then Precedes
  bool seen_any_ = false;
  uint64_t max_epoch_ = 0;    // (max_epoch_, max_version_): the newest table seen
  uint64_t max_version_ = 0;
  uint64_t seq_ = 0;
  uint64_t late_tables_ = 0;
  std::vector<double> costs_;    // b_c
  std::vector<double> lat_;      // latency_s_c / T_u, fraction of the window
  std::vector<double> wb_;       // T_u * bandwidth_c, bytes
  std::vector<double> penalty_;  // f, row-major n x n
  std::vector<double> util_;
};

}  // namespace heroserve
