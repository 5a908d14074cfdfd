#include "heroserve/shm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace heroserve::shm {

namespace {

constexpr char kMagic[8] = {'H', 'S', 'R', 'V', 'P', 'O', 'L', '1'};

uint64_t Load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void Store(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

size_t DataOffset() { return (sizeof(Header) + 63) & ~size_t{63}; }

// A reader's wait up to this long only spins.
constexpr int64_t kSpinOnlyNs = 100000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

bool Fail(std::string* error, std::string msg) {
  if (error) *error = std::move(msg);
  return false;
}

// Word-wise atomic copies keep the seqlock free of data races (and TSAN-clean, which rules
// out stand-alone fences). Release stores order the writer's "odd" counter before the data;
// acquire loads order the reader's data reads before its second look at the counter. Both
// are plain moves on x86-64.
void CopyIn(char* dst, const char* src, size_t n) {
  size_t words = (n + 7) / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w = 0;
    size_t take = (i * 8 + 8 <= n) ? 8 : n - i * 8;
    std::memcpy(&w, src + i * 8, take);
    __atomic_store_n(reinterpret_cast<uint64_t*>(dst) + i, w, __ATOMIC_RELEASE);
  }
}

void CopyOut(char* dst, const char* src, size_t n) {
  size_t words = (n + 7) / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w = __atomic_load_n(reinterpret_cast<const uint64_t*>(src) + i, __ATOMIC_ACQUIRE);
    size_t take = (i * 8 + 8 <= n) ? 8 : n - i * 8;
    std::memcpy(dst + i * 8, &w, take);
  }
}

}  // namespace

std::string SegmentName(const std::string& group_id) {
  std::string name = "/heroserve-";
  if (const char* p = std::getenv("HEROSERVE_SHM_PREFIX")) {
    for (const char* c = p; *c; ++c) name.push_back(*c == '/' ? '.' : *c);
  }
  for (char c : group_id) name.push_back(c == '/' ? '.' : c);
  return name;
}

uint64_t Checksum(const char* data, size_t n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

Segment::~Segment() { Close(); }

void Segment::Close() {
  if (hdr_) munmap(hdr_, map_size_);
  if (fd_ >= 0) close(fd_);
  hdr_ = nullptr;
  data_ = nullptr;
  map_size_ = 0;
  capacity_ = 0;
  fd_ = -1;
}

bool Segment::Create(const std::string& name, size_t capacity, std::string* error) {
  Close();
  capacity = (capacity + 7) & ~size_t{7};
  if (capacity == 0 || capacity > kMaxCapacity) {
    return Fail(error, "shm capacity must be between 8 bytes and " +
                           std::to_string(kMaxCapacity) + " bytes");
  }
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0660);
  if (fd < 0) return Fail(error, "shm_open(" + name + "): " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    std::string msg = "fstat(" + name + "): " + std::strerror(errno);
    close(fd);
    return Fail(error, msg);
  }
  // Never shrink: a serving process may have the whole file mapped. Round odd sizes (not
  // ours) up to whole 8-byte words so the word-wise copies stay inside the file.
  size_t existing = static_cast<size_t>(st.st_size);
  size_t size = std::max(DataOffset() + capacity, (existing + 7) & ~size_t{7});
  if (size > DataOffset() + kMaxCapacity) {
    close(fd);
    return Fail(error, "shm segment " + name + " is larger than any HeroServe table segment");
  }
  if (size != existing && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    std::string msg = "ftruncate(" + name + "): " + std::strerror(errno);
    close(fd);
    return Fail(error, msg);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    std::string msg = "mmap(" + name + "): " + std::strerror(errno);
    close(fd);
    return Fail(error, msg);
  }
  hdr_ = static_cast<Header*>(p);
  data_ = static_cast<char*>(p) + DataOffset();
  map_size_ = size;
  capacity_ = size - DataOffset();
  fd_ = fd;
  name_ = name;
  bool ours = existing >= DataOffset() && std::memcmp(hdr_->magic, kMagic, 8) == 0 &&
              hdr_->layout == kLayoutVersion;
  if (!ours) {
    std::memset(p, 0, DataOffset());
    hdr_->layout = kLayoutVersion;
    std::memcpy(hdr_->magic, kMagic, 8);
  }
  // Readers mapped before a growth see the new capacity and remap (ReadStatus::kResized).
  Store(&hdr_->capacity, capacity_);
  Store(&hdr_->writer_pid, static_cast<uint64_t>(getpid()));
  return true;
}

bool Segment::Open(const std::string& name, std::string* error, bool* absent) {
  Close();
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (absent) *absent = fd < 0 && errno == ENOENT;
  if (fd < 0) return Fail(error, "shm segment " + name + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < DataOffset() + 8) {
    close(fd);
    return Fail(error, "shm segment " + name + " is too small to be a HeroServe table");
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size > DataOffset() + kMaxCapacity) {
    close(fd);
    return Fail(error, "shm segment " + name + " is larger than any HeroServe table segment");
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    std::string msg = "mmap(" + name + "): " + std::strerror(errno);
    close(fd);
    return Fail(error, msg);
  }
  auto* h = static_cast<Header*>(p);
  // The header says how much payload there is room for; the file says how much there is.
  // A header claiming more than the file holds is truncated or garbled: refused. A header
  // claiming less is a writer growing the segment (it truncates the file up first).
  uint64_t cap = Load(&h->capacity);
  const char* why = nullptr;
  if (std::memcmp(h->magic, kMagic, 8) != 0 || h->layout != kLayoutVersion) {
    why = "has a bad header (not a HeroServe table)";
  } else if (cap == 0 || cap % 8 != 0 || cap > size - DataOffset()) {
    why = "is truncated (its header claims more than the file holds)";
  }
  if (why) {
    munmap(p, size);
    close(fd);
    return Fail(error, "shm segment " + name + " " + why);
  }
  hdr_ = h;
  data_ = static_cast<char*>(p) + DataOffset();
  map_size_ = size;
  capacity_ = static_cast<size_t>(cap);
  fd_ = fd;
  name_ = name;
  return true;
}

bool Segment::Unlink(std::string* error) {
  if (name_.empty()) return Fail(error, "segment not open");
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    return Fail(error, "shm_unlink(" + name_ + "): " + std::strerror(errno));
  }
  return true;
}

bool Segment::Publish(const std::string& payload, uint64_t newest_version, std::string* error) {
  if (!hdr_) return Fail(error, "segment not open");
  if (payload.size() > kMaxPayloadBytes) {
    return Fail(error, "policy tables (" + std::to_string(payload.size()) +
                           " bytes) exceed the shm payload limit (" +
                           std::to_string(kMaxPayloadBytes) + " bytes)");
  }
  if (payload.size() > capacity_) {
    return Fail(error, "policy tables (" + std::to_string(payload.size()) +
                           " bytes) exceed the shm capacity (" + std::to_string(capacity_) +
                           ")");
  }
  uint64_t s = Load(&hdr_->seq);
  if (s & 1) ++s;  // a previous writer died mid-write: start from an even value
  __atomic_store_n(&hdr_->seq, s + 1, __ATOMIC_RELAXED);
  CopyIn(data_, payload.data(), payload.size());
  __atomic_store_n(&hdr_->length, payload.size(), __ATOMIC_RELEASE);
  __atomic_store_n(&hdr_->checksum, Checksum(payload.data(), payload.size()), __ATOMIC_RELEASE);
  __atomic_store_n(&hdr_->version, newest_version, __ATOMIC_RELEASE);
  Store(&hdr_->seq, s + 2);
  return true;
}

uint64_t Segment::seq() const { return hdr_ ? Load(&hdr_->seq) : 0; }

Segment::ReadStatus Segment::Read(uint64_t* last_seq, std::string* payload, int64_t wait_ns,
                                  Stamp* held, size_t max_copy) const {
  if (!hdr_) return ReadStatus::kEmpty;
  if (Load(&hdr_->capacity) != capacity_) return ReadStatus::kResized;
  // A file cut below this mapping would fault on the next access to the lost pages: look
  // before copying (the one check a mapped reader can make; the daemon never shrinks).
  struct stat st {};
  if (fstat(fd_, &st) != 0 || static_cast<size_t>(st.st_size) < map_size_) {
    return ReadStatus::kTruncated;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns);
  for (uint32_t attempt = 0;; ++attempt) {
    if (attempt > 0) {
      // Waiting on the writer: give up at the deadline, so a writer that died mid-publish
      // (counter left odd) never holds a collective longer than wait_ns.
      if (std::chrono::steady_clock::now() >= deadline) return ReadStatus::kBusy;
      // Short waits spin (a yield on a busy machine can cost a whole time slice, far more
      // than the wait); long ones (communicator init) give the core away now and then.
      if (wait_ns > kSpinOnlyNs && attempt % 64 == 0) {
        std::this_thread::yield();
      } else {
        CpuRelax();
      }
    }
    uint64_t s1 = Load(&hdr_->seq);
    if (s1 == 0) return ReadStatus::kEmpty;
    if (s1 == *last_seq) return ReadStatus::kUnchanged;
    if (s1 & 1) continue;
    uint64_t len = __atomic_load_n(&hdr_->length, __ATOMIC_ACQUIRE);
    uint64_t sum = __atomic_load_n(&hdr_->checksum, __ATOMIC_ACQUIRE);
    // The limit first: a declared length above it is refused on the header alone, so a
    // padded table costs this comparison, not a copy, a checksum and a parse.
    const bool oversized = len > kMaxPayloadBytes;
    const bool same = !oversized && held && held->valid && held->length == len &&
                      held->checksum == sum;
    bool len_ok = !oversized && len <= capacity_;  // the mapping's size, not the header's
    if (len_ok && !same && len > max_copy) return ReadStatus::kDeferred;
    if (len_ok && !same) {
      payload->resize(len);
      CopyOut(payload->data(), data_, len);
    }
    // The copy must complete before seq is read again (seqlock read side). ThreadSanitizer
    // does not model fences; its builds use a sequentially consistent load instead.
#if defined(__SANITIZE_THREAD__)
    if (__atomic_load_n(&hdr_->seq, __ATOMIC_SEQ_CST) != s1) continue;  // torn: retry
#else
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&hdr_->seq, __ATOMIC_RELAXED) != s1) continue;  // torn: retry
#endif
    // The counter did not move during the copy, so no writer touched the payload: a bad
    // length or checksum is garbage in the segment, not a race. Report it once.
    *last_seq = s1;
    if (oversized) {
      payload->clear();
      return ReadStatus::kOversized;
    }
    if (same) return ReadStatus::kSame;
    if (!len_ok || Checksum(payload->data(), payload->size()) != sum) {
      payload->clear();
      return ReadStatus::kGarbled;
    }
    if (held) *held = Stamp{len, sum, true};
    return ReadStatus::kOk;
  }
}

int Segment::ClaimSlot() {
  if (!hdr_) return -1;
  uint64_t me = static_cast<uint64_t>(getpid());
  for (size_t i = 0; i < kMaxProcs; ++i) {
    if (Load(&hdr_->procs[i].pid) == me) return static_cast<int>(i);
  }
  for (size_t i = 0; i < kMaxProcs; ++i) {
    uint64_t owner = Load(&hdr_->procs[i].pid);
    bool dead = owner != 0 && kill(static_cast<pid_t>(owner), 0) != 0 && errno == ESRCH;
    if (owner != 0 && !dead) continue;
    if (__atomic_compare_exchange_n(&hdr_->procs[i].pid, &owner, me, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      ResetSlot(static_cast<int>(i), 0);
      return static_cast<int>(i);
    }
  }
  return -1;
}

void Segment::ResetSlot(int slot, uint64_t version) {
  if (!hdr_ || slot < 0) return;
  ProcSlot& p = hdr_->procs[slot];
  for (auto& c : p.counters) {
    __atomic_store_n(&c.selections, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&c.bytes, 0, __ATOMIC_RELAXED);
  }
  Store(&p.version, version);
}

void Segment::Count(int slot, uint32_t policy_index, uint64_t bytes, uint64_t seq) {
  if (!hdr_ || slot < 0 || policy_index >= kMaxPolicies) return;
  ProcSlot& p = hdr_->procs[slot];
  __atomic_fetch_add(&p.counters[policy_index].selections, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&p.counters[policy_index].bytes, bytes, __ATOMIC_RELAXED);
  __atomic_store_n(&p.last_seq, seq, __ATOMIC_RELAXED);
}

std::vector<Segment::SlotView> Segment::ReadSlots() const {
  std::vector<SlotView> out;
  if (!hdr_) return out;
  for (size_t i = 0; i < kMaxProcs; ++i) {
    const ProcSlot& p = hdr_->procs[i];
    uint64_t pid = Load(&p.pid);
    if (pid == 0) continue;
    SlotView v{pid, Load(&p.version), __atomic_load_n(&p.last_seq, __ATOMIC_RELAXED), {}};
    v.counters.resize(kMaxPolicies);
    for (size_t k = 0; k < kMaxPolicies; ++k) {
      v.counters[k].selections = __atomic_load_n(&p.counters[k].selections, __ATOMIC_RELAXED);
      v.counters[k].bytes = __atomic_load_n(&p.counters[k].bytes, __ATOMIC_RELAXED);
    }
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace heroserve::shm
