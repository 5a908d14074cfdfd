#include "heroserve/shm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace heroserve::shm {

namespace {

constexpr char kMagic[8] = {'H', 'S', 'R', 'V', 'P', 'O', 'L', '1'};

uint64_t Load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void Store(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

size_t DataOffset() { return (sizeof(Header) + 63) & ~size_t{63}; }

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
  hdr_ = nullptr;
  data_ = nullptr;
  map_size_ = 0;
}

bool Segment::Create(const std::string& name, size_t capacity, std::string* error) {
  Close();
  capacity = (capacity + 7) & ~size_t{7};
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0660);
  if (fd < 0) return Fail(error, "shm_open(" + name + "): " + std::strerror(errno));
  size_t size = DataOffset() + capacity;
  struct stat st {};
  bool fresh = fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != size;
  if (fresh && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    std::string msg = "ftruncate(" + name + "): " + std::strerror(errno);
    close(fd);
    return Fail(error, msg);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Fail(error, "mmap(" + name + "): " + std::strerror(errno));
  hdr_ = static_cast<Header*>(p);
  data_ = static_cast<char*>(p) + DataOffset();
  map_size_ = size;
  name_ = name;
  if (fresh || std::memcmp(hdr_->magic, kMagic, 8) != 0 || hdr_->layout != kLayoutVersion) {
    std::memset(p, 0, DataOffset());
    hdr_->layout = kLayoutVersion;
    Store(&hdr_->capacity, capacity);
    std::memcpy(hdr_->magic, kMagic, 8);
  }
  Store(&hdr_->writer_pid, static_cast<uint64_t>(getpid()));
  return true;
}

bool Segment::Open(const std::string& name, std::string* error) {
  Close();
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return Fail(error, "shm segment " + name + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < DataOffset()) {
    close(fd);
    return Fail(error, "shm segment " + name + " is too small to be a HeroServe table");
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Fail(error, "mmap(" + name + "): " + std::strerror(errno));
  auto* h = static_cast<Header*>(p);
  uint64_t cap = Load(&h->capacity);
  if (std::memcmp(h->magic, kMagic, 8) != 0 || h->layout != kLayoutVersion ||
      cap > size - DataOffset()) {
    munmap(p, size);
    return Fail(error, "shm segment " + name + " has a bad header (not a HeroServe table)");
  }
  hdr_ = h;
  data_ = static_cast<char*>(p) + DataOffset();
  map_size_ = size;
  name_ = name;
  return true;
}

bool Segment::Publish(const std::string& payload, uint64_t newest_version, std::string* error) {
  if (!hdr_) return Fail(error, "segment not open");
  uint64_t cap = Load(&hdr_->capacity);
  if (payload.size() > cap) {
    return Fail(error, "policy tables (" + std::to_string(payload.size()) +
                           " bytes) exceed the shm capacity (" + std::to_string(cap) + ")");
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

Segment::ReadStatus Segment::Read(uint64_t* last_seq, std::string* payload) const {
  if (!hdr_) return ReadStatus::kEmpty;
  uint64_t cap = Load(&hdr_->capacity);
  for (int attempt = 0; attempt < 64; ++attempt) {
    uint64_t s1 = Load(&hdr_->seq);
    if (s1 == 0) return ReadStatus::kEmpty;
    if (s1 == *last_seq) return ReadStatus::kUnchanged;
    if (s1 & 1) continue;
    uint64_t len = __atomic_load_n(&hdr_->length, __ATOMIC_ACQUIRE);
    uint64_t sum = __atomic_load_n(&hdr_->checksum, __ATOMIC_ACQUIRE);
    bool len_ok = len <= cap;
    if (len_ok) {
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
    if (!len_ok || Checksum(payload->data(), payload->size()) != sum) {
      if (attempt + 1 < 64) continue;  // a copy racing a writer looks garbled too: retry
      *last_seq = s1;
      return ReadStatus::kGarbled;
    }
    *last_seq = s1;
    return ReadStatus::kOk;
  }
  return ReadStatus::kBusy;
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
