// The tuner plugin's view of one group's shared-memory segment (csrc/README.md, "The
// plugin"): GroupFeed maps the segment, reads it under the seqlock within a wait bound,
// refuses what is not a bounded table list, orders versions by writer generation
// (docs/policy-table.md, "Versions and writer generations") and feeds the tables to the
// in-process TableStore every communicator context of the group selects from. Also the
// plugin's bounds, its logger and the rate limit of repeated warnings.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "heroserve/policy.h"
#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"

namespace heroserve::tuner {

// Bounds (csrc/README.md, "The plugin"). The budget is 10 us per collective from the
// segment read to the decision; a 2 us wait on a seqlock that a live daemon holds for one
// copy of a typical table (bench_policy_core: publish_ns) leaves the rest to the decision.
constexpr int64_t kCollectiveWaitNs = 2000;
// At communicator init the tables already published must reach the store before the first
// collective: wait up to 10 ms, more than one publish of the largest default payload (1 MiB)
// takes (bench_policy_core: publish_ns for 1 MiB).
constexpr int64_t kAttachWaitNs = 10000000;
constexpr int64_t kRetryOpenNs = 100000000;      // segment absent: look again every 100 ms
constexpr int64_t kWarnEveryNs = 60000000000;    // a repeated warning: at most once a minute
constexpr size_t kMaxMappings = 8;               // mappings of a group's segment (never unmapped)
constexpr size_t kMaxTablesPerSegment = 16;      // the daemon keeps 4 versions
// A payload longer than this is never copied or parsed on a collective: the group's reader
// thread reads it, and collectives decide from the tables held meanwhile (as they do while
// another context reads). 64 KiB holds 4 versions of a typical table (8-GPU group, 3
// policies, ids of 20 characters, 6- to 8-node routes: 31-38 KiB) and parses in about 0.4 ms
// on the shared 2-core machine (bench_tuner_table: about 6 ms per MiB), so a collective pays
// at most that; longer payloads (up to the limit, shm::kMaxPayloadBytes, 4 MiB) cost it none.
constexpr size_t kInlineReadBytes = size_t{64} << 10;

// A line through NCCL's logger, or the shared log format on stderr without one.
void LogTo(hsNcclLogger fn, int level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A warning that repeats (a stalled or garbled segment is seen by every collective): the
// first occurrence is logged, later ones at most once per kWarnEveryNs with their count.
struct WarnLimiter {
  std::atomic<int64_t> next_ns{0};
  std::atomic<uint64_t> skipped{0};

  bool Due(int64_t now, uint64_t* skipped_since) {
    int64_t next = next_ns.load(std::memory_order_relaxed);
    if (now < next || !next_ns.compare_exchange_strong(next, now + kWarnEveryNs)) {
      skipped.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    *skipped_since = skipped.exchange(0, std::memory_order_relaxed);
    return true;
  }
};

// What a collective learns about its group's segment.
enum class SegState {
  kCurrent,  // the store reflects the segment (or its content was refused: last good tables)
  kStalled,  // the writer holds the seqlock past the wait bound: tables already held decide
  kMissing,  // no segment (yet): NCCL's defaults until one appears
};

// One per group per process: the shm segment and the in-process table store fed from it.
// Any context may refresh it (under refresh_mu); all read the store lock-free.
class GroupFeed {
 public:
  std::string group;
  std::string shm_name;
  TableStore store;
  std::mutex refresh_mu;
  // Every mapping of the segment made by this process (a remap follows a growth). None is
  // ever unmapped: other threads use the current one without the lock.
  std::vector<std::unique_ptr<shm::Segment>> mappings;  // guarded by refresh_mu
  std::atomic<shm::Segment*> seg{nullptr};
  uint64_t seq_read = 0;                  // guarded by refresh_mu: counter last read or refused
  std::atomic<uint64_t> seq_done{0};      // counter whose content the store reflects
  std::atomic<uint64_t> seq_stalled{0};   // odd counter a read gave up on (0: none)
  std::atomic<uint64_t> seq_deferred{0};  // counter handed to the reader thread (0: none)
  // What the reader thread parsed and refused; every context's statistics include them.
  std::atomic<uint64_t> async_parsed{0}, async_refused{0};
  std::atomic<int64_t> next_open_ns{0};
  std::atomic<int> slot{-1};
  // One context per group per process counts selections (all members choose alike, and
  // several communicators of one group in one process must not be counted twice).
  std::atomic<void*> counter_owner{nullptr};
  WarnLimiter warn_missing, warn_stalled, warn_refused;

  void Warn(hsNcclLogger log, WarnLimiter* w, int64_t now, const std::string& msg);

  // Brings the store up to date with the segment. Cheap when nothing changed: one load of
  // the seqlock counter. `block`: wait for another context's read in progress (init) rather
  // than decide without it; a collective never waits for one (the tables it holds are those
  // every rank uses until the new version's apply_from_seq). Counts refusals and parses in
  // *stats. A parse happens only for a new counter value whose header names a payload within
  // shm::kMaxPayloadBytes and other than the one last parsed (length and checksum); on a
  // collective (!block) only when it is at most kInlineReadBytes long, a longer one being
  // handed to the group's reader thread. So a writer republishing before every decision
  // costs each collective at most one parse of kInlineReadBytes.
  SegState Refresh(hsNcclLogger log, int64_t wait_ns, bool block, hsTunerStats* stats);

  // fork() (pthread_atfork handlers, registered when the library loads): before it, take this
  // feed's locks, so no other thread holds one mid-update when the child's copy is made
  // (the child has no such thread to release it); after it, release them, and in the child
  // also forget the parent's reader thread: a fresh wake-up (the parent's thread stays a
  // waiter in the copied one for ever, and glibc's signal then waits on it), no thread (the
  // next long table starts one) and no payload handed over (the child reads it again).
  void LockForFork();
  void UnlockAfterFork(bool child);

 private:
  // Writer generations (docs/policy-table.md): the generation named by the last payload read
  // and the epoch its tables are stamped with; both guarded by refresh_mu.
  std::string writer_gen;
  bool have_writer_gen = false;
  uint64_t writer_epoch = 0;
  // Length and checksum of the payload last parsed (guarded by refresh_mu; reset when a
  // mapping is made): a republish of the same bytes is not copied or parsed again.
  shm::Segment::Stamp parsed_stamp;

  // Refused content is not read again until the writer moves the counter (seq_done).
  void Refuse(hsNcclLogger log, int64_t now, uint64_t* refused, const std::string& why);

  // Maps the segment (first attach, again after a growth, or a retired segment's
  // successor). False when absent or refused.
  bool Attach(hsNcclLogger log, int64_t now, uint64_t* refused, bool remap);

  SegState RefreshLocked(hsNcclLogger log, int64_t wait_ns, hsTunerStats* stats,
                         size_t max_copy);

  // The reader thread (started on first use, again in a forked child): reads what a
  // collective deferred, under refresh_mu, with the init wait and the whole payload limit.
  // Lock order: refresh_mu before reader_mu (Defer runs under refresh_mu).
  std::mutex reader_mu;
  std::condition_variable reader_cv;
  bool reader_wanted = false;        // guarded by reader_mu
  int64_t reader_pid = 0;            // guarded by reader_mu: the process that started it
  hsNcclLogger reader_log = nullptr; // guarded by reader_mu
  void Defer(hsNcclLogger log, uint64_t seq);
  void ReaderLoop();

  // Starts a new writer epoch when the payload comes from another writer generation, or
  // when its versions went back below the newest held of the current epoch (only a group
  // removed and published again, or a third party's write, does that within a generation):
  // the writer's tables must then outrank what it no longer lists, or they would be stale
  // for ever. `newest`: the payload's newest valid version (0 when it has none).
  void NoteWriter(hsNcclLogger log, const std::string& gen, uint64_t newest);

  // Takes a payload's tables into the store; true when the payload retires the segment.
  bool Install(hsNcclLogger log, int64_t now, const std::string& payload, uint64_t* refused);
};

// The feed of a group, made on first use; never freed (NCCL may unload the plugin late).
GroupFeed* FeedFor(const std::string& group);

}  // namespace heroserve::tuner
