// Shared-memory channel between the GPU agent daemon (writer) and the NCCL tuner plugin
// (readers in the serving processes). POSIX shm, one segment per group.
//
// Layout (all 64-bit fields accessed with atomic builtins, so it works across processes):
//   header   magic "HSRVPOL1", layout version, table capacity, seqlock counter, payload
//            length, FNV-1a checksum, newest table version, writer pid
//   counters kMaxProcs slots, one per serving process: pid, table version, last sequence,
//            and per policy index {selections, bytes}; the plugin adds, the daemon reads
//   payload  JSON {"tables": [table, ...]} (docs/policy-table.md form), newest last
// The payload is guarded by a seqlock (odd = write in progress) plus the checksum, so a
// reader never parses a torn or garbled table: it keeps its last good one.
//
// Readers treat the segment as hostile: every size comes from the mapping (fstat of the
// segment at Open), never from the header alone; lengths and offsets are checked against it
// before use; a reader waits for an odd seqlock only up to a deadline it is given. The writer
// never shrinks a segment (readers of a shrunk mapping would fault), it only grows one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace heroserve::shm {

constexpr uint32_t kLayoutVersion = 1;
constexpr size_t kMaxProcs = 32;
constexpr size_t kMaxPolicies = 256;
constexpr size_t kDefaultCapacity = 1 << 20;
// Largest payload capacity a reader maps (the daemon's --shm-capacity limit): a bigger
// segment is not one of ours.
constexpr size_t kMaxCapacity = size_t{1} << 30;
// Largest payload a writer publishes and a reader copies or parses, whatever the segment's
// capacity: the header's declared length is checked against it before anything is copied,
// so a hostile writer's padded table costs a reader one comparison, not a parse
// (csrc/README.md, "Shared memory"). Source: the largest payload the controller can produce
// is 4 versions (the daemon's kKeepVersions) of a table with 3 policies
// (controller/service/tables.py build_tables) for a 128-GPU group (above the largest TP the
// model catalog allows, 96 heads) with 8-node routes and every id at its 64-character limit
// (controller/inputs/limits.py MAX_ID_CHARS): 1.27 MiB (benchmarks/bench_tuner_table.py
// prints it); 4 MiB leaves a 3x margin.
constexpr size_t kMaxPayloadBytes = size_t{4} << 20;

struct PolicyCounter {
  uint64_t selections;
  uint64_t bytes;
};

struct ProcSlot {
  uint64_t pid;  // 0: free
  uint64_t version;
  uint64_t last_seq;
  uint64_t reserved;
  PolicyCounter counters[kMaxPolicies];  // by policy index in `version`
};

struct Header {
  char magic[8];
  uint32_t layout;
  uint32_t reserved;
  uint64_t capacity;
  uint64_t seq;
  uint64_t length;
  uint64_t checksum;
  uint64_t version;
  uint64_t writer_pid;
  ProcSlot procs[kMaxProcs];
};

// "/heroserve-<prefix><group>" with '/' in the group replaced by '.'; prefix from
// HEROSERVE_SHM_PREFIX (tests use it to keep segments apart).
std::string SegmentName(const std::string& group_id);

uint64_t Checksum(const char* data, size_t n);

class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Writer side: create (or reuse) the segment with room for at least `capacity` bytes of
  // payload. An existing segment of ours is reused as it is when it is large enough and
  // grown otherwise, never shrunk (a reader's mapping of the lost pages would fault).
  bool Create(const std::string& name, size_t capacity, std::string* error);
  // Reader side: open an existing segment read-write (the counters are written by readers).
  // Refuses a segment smaller than its header, larger than kMaxCapacity, with a foreign
  // magic or layout, or whose header claims more capacity than the file holds (truncated).
  // *absent (when given) tells a segment that does not exist (yet) from a refused one.
  bool Open(const std::string& name, std::string* error, bool* absent = nullptr);
  void Close();
  bool is_open() const { return hdr_ != nullptr; }
  // Payload bytes this mapping holds; every read and write is bounded by it.
  size_t capacity() const { return capacity_; }

  // Writer: removes the segment's name (shm_unlink); mappings, this one included, stay valid.
  bool Unlink(std::string* error);

  // Writer: publish a payload under the seqlock. Refuses one above kMaxPayloadBytes (no
  // reader would take it) or above the capacity.
  bool Publish(const std::string& payload, uint64_t newest_version, std::string* error);

  enum class ReadStatus {
    kOk,         // *payload holds a whole payload whose checksum matches
    kUnchanged,  // the counter equals *last_seq: nothing new
    kBusy,       // a write is in progress (odd counter, or the copy was torn) past the wait
    kGarbled,    // stable counter but a length beyond the mapping or a bad checksum
    kEmpty,      // nothing published yet
    kResized,    // the header's capacity differs from this mapping's: reopen the segment
    kTruncated,  // the file is now smaller than this mapping: refuse it
    kOversized,  // the header declares more than kMaxPayloadBytes: refused, nothing copied
    kSame,       // the header names the payload the caller holds (*held): nothing copied
    kDeferred,   // the declared length is above the caller's max_copy: nothing copied, and
                 // *last_seq unchanged (the caller reads it later, elsewhere)
  };
  // What identifies a payload without reading it: its declared length and checksum.
  struct Stamp {
    uint64_t length = 0;
    uint64_t checksum = 0;
    bool valid = false;
  };
  // Reader: cheap check of the seqlock counter (even and != last seen means new data).
  uint64_t seq() const;
  // Copies the payload when the counter differs from *last_seq, waiting at most wait_ns for
  // an odd counter to turn even (0: not at all). Updates *last_seq on kOk, kSame, kOversized
  // and kGarbled (so a refused payload is reported once, not on every call). Never reads
  // outside the mapping whatever the header says, and copies nothing when the declared
  // length is above kMaxPayloadBytes. With `held` (the stamp of the payload the caller last
  // took), a republish of the same length and checksum is kSame, not copied; *held is set
  // on kOk. A forged checksum that matches *held keeps the caller's payload: safe.
  // `max_copy`: a payload within the limit but longer than this is kDeferred.
  ReadStatus Read(uint64_t* last_seq, std::string* payload, int64_t wait_ns = 0,
                  Stamp* held = nullptr, size_t max_copy = kMaxPayloadBytes) const;

  // Counters (plugin side). Claims a slot for this process; -1 when none is free.
  int ClaimSlot();
  void ResetSlot(int slot, uint64_t version);
  void Count(int slot, uint32_t policy_index, uint64_t bytes, uint64_t seq);
  // Daemon side: snapshot of every slot in use.
  struct SlotView {
    uint64_t pid, version, last_seq;
    std::vector<PolicyCounter> counters;
  };
  std::vector<SlotView> ReadSlots() const;

  Header* header() { return hdr_; }  // tests only (to garble a segment)

 private:
  Header* hdr_ = nullptr;
  char* data_ = nullptr;
  size_t map_size_ = 0;
  size_t capacity_ = 0;  // payload bytes, from the mapping (<= map_size_ - header)
  int fd_ = -1;          // kept open so a reader can notice a truncated file (fstat)
  std::string name_;
};

}  // namespace heroserve::shm
