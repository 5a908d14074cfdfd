// GroupFeed (feed.h): one group's segment read into the in-process table store.
#include "feed.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <new>
#include <thread>

#include <pthread.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "heroserve/json.h"
#include "heroserve/log.h"

namespace heroserve::tuner {

void LogTo(hsNcclLogger fn, int level, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (fn) {
    fn(level, HS_NCCL_TUNING, __FILE__, __LINE__, "HeroServe tuner: %s", buf);
  } else {
    heroserve::log::Write(level == HS_NCCL_LOG_WARN ? heroserve::log::Level::kWarning
                                                    : heroserve::log::Level::kInfo,
                          "heroserve.tuner", buf);
  }
}

void GroupFeed::Warn(hsNcclLogger log, WarnLimiter* w, int64_t now, const std::string& msg) {
  uint64_t skipped = 0;
  if (!w->Due(now, &skipped)) return;
  if (skipped == 0) {
    LogTo(log, HS_NCCL_LOG_WARN, "%s", msg.c_str());
  } else {
    LogTo(log, HS_NCCL_LOG_WARN, "%s (%llu more since the last warning)", msg.c_str(),
          static_cast<unsigned long long>(skipped));
  }
}

SegState GroupFeed::Refresh(hsNcclLogger log, int64_t wait_ns, bool block,
                            hsTunerStats* stats) {
  shm::Segment* s = seg.load(std::memory_order_acquire);
  if (s) {
    uint64_t v = s->seq();
    if (v == seq_done.load(std::memory_order_acquire)) return SegState::kCurrent;
    if ((v & 1) && v == seq_stalled.load(std::memory_order_relaxed)) return SegState::kStalled;
    if (!block && v == seq_deferred.load(std::memory_order_relaxed)) return SegState::kCurrent;
  } else if (NowNs() < next_open_ns.load(std::memory_order_relaxed)) {
    return SegState::kMissing;
  }
  std::unique_lock<std::mutex> lock(refresh_mu, std::defer_lock);
  if (block) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return SegState::kCurrent;
  }
  return RefreshLocked(log, wait_ns, stats, block ? shm::kMaxPayloadBytes : kInlineReadBytes);
}

void GroupFeed::Defer(hsNcclLogger log, uint64_t seq) {
  // Never waits: the reader thread, at its lower priority, may be descheduled holding
  // reader_mu; then the counter is not marked handed over and the next collective tries again.
  std::unique_lock<std::mutex> lock(reader_mu, std::try_to_lock);
  if (!lock.owns_lock()) return;
  reader_wanted = true;
  reader_log = log;
  const int64_t pid = static_cast<int64_t>(getpid());
  if (reader_pid != pid) {  // first use, or a forked child (UnlockAfterFork reset it)
    try {
      std::thread([this] { ReaderLoop(); }).detach();
      reader_pid = pid;
    } catch (...) {
      return;  // no thread: the payload stays unread until init or a shorter publish
    }
  }
  seq_deferred.store(seq, std::memory_order_relaxed);
  reader_cv.notify_one();
}

void GroupFeed::ReaderLoop() {
  // Background work at nice 10 (about a tenth of a serving thread's share of a busy core):
  // a writer keeping it busy (a padded table republished before every decision) takes
  // little CPU time from the serving threads, and a legitimate long table is still read
  // within tens of milliseconds on a saturated core (0.6 MiB parses in about 4 ms).
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  for (;;) {
    hsNcclLogger log;
    {
      std::unique_lock<std::mutex> lock(reader_mu);
      reader_cv.wait(lock, [this] { return reader_wanted; });
      reader_wanted = false;
      log = reader_log;
    }
    hsTunerStats st{};
    {
      std::lock_guard<std::mutex> lock(refresh_mu);
      RefreshLocked(log, kAttachWaitNs, &st, shm::kMaxPayloadBytes);
    }
    async_parsed.fetch_add(st.parsed, std::memory_order_relaxed);
    async_refused.fetch_add(st.refused, std::memory_order_relaxed);
  }
}

void GroupFeed::Refuse(hsNcclLogger log, int64_t now, uint64_t* refused, const std::string& why) {
  ++*refused;
  Warn(log, &warn_refused, now,
       "policy segment " + shm_name + " refused: " + why + "; keeping the last good table");
}

bool GroupFeed::Attach(hsNcclLogger log, int64_t now, uint64_t* refused, bool remap) {
  if (mappings.size() >= kMaxMappings) {
    next_open_ns.store(now + kRetryOpenNs, std::memory_order_relaxed);
    Refuse(log, now, refused, "it was mapped " + std::to_string(kMaxMappings) +
                                  " times already (grown or replaced)");
    return false;
  }
  auto m = std::make_unique<shm::Segment>();
  std::string err;
  bool absent = false;
  if (!m->Open(shm_name, &err, &absent)) {
    next_open_ns.store(now + kRetryOpenNs, std::memory_order_relaxed);
    if (absent) {
      Warn(log, &warn_missing, now, err + "; using NCCL's defaults until the agent publishes");
    } else {
      Refuse(log, now, refused, err);
    }
    return false;
  }
  slot.store(m->ClaimSlot(), std::memory_order_relaxed);
  parsed_stamp = shm::Segment::Stamp{};  // another mapping: its payload is read in full
  if (!remap) {
    seq_read = 0;
    seq_done.store(0, std::memory_order_relaxed);
    LogTo(log, HS_NCCL_LOG_INFO, "attached to %s for group %s", shm_name.c_str(),
          group.c_str());
  }
  seg.store(m.get(), std::memory_order_release);
  mappings.push_back(std::move(m));
  return true;
}

SegState GroupFeed::RefreshLocked(hsNcclLogger log, int64_t wait_ns, hsTunerStats* stats,
                                  size_t max_copy) {
  const int64_t now = NowNs();
  uint64_t* refused = &stats->refused;
  shm::Segment* s = seg.load(std::memory_order_relaxed);
  if (!s) {
    if (now < next_open_ns.load(std::memory_order_relaxed)) return SegState::kMissing;
    if (!Attach(log, now, refused, false)) return SegState::kMissing;
    s = seg.load(std::memory_order_relaxed);
  }
  std::string payload;
  using RS = shm::Segment::ReadStatus;
  RS st = s->Read(&seq_read, &payload, wait_ns, &parsed_stamp, max_copy);
  for (int remaps = 0; st == RS::kResized && remaps < 2; ++remaps) {
    // The daemon grew the segment: map it again and read through the new mapping. When
    // that fails, keep the old mapping and wait for the writer's next publish.
    if (!Attach(log, now, refused, true)) {
      seq_done.store(s->seq(), std::memory_order_release);
      return SegState::kCurrent;
    }
    s = seg.load(std::memory_order_relaxed);
    st = s->Read(&seq_read, &payload, wait_ns, &parsed_stamp, max_copy);
  }
  switch (st) {
    case RS::kEmpty:
      return SegState::kCurrent;
    case RS::kDeferred:  // too long to read on a collective: the reader thread reads it
      Defer(log, s->seq());
      return SegState::kCurrent;
    case RS::kUnchanged:
    case RS::kSame:  // the bytes last parsed, published again: nothing to do
      seq_done.store(seq_read, std::memory_order_release);
      return SegState::kCurrent;
    case RS::kOversized:
      seq_done.store(seq_read, std::memory_order_release);
      Refuse(log, now, refused,
             "its header declares a payload above the limit of " +
                 std::to_string(shm::kMaxPayloadBytes) + " bytes (nothing read)");
      return SegState::kCurrent;
    case RS::kBusy: {
      uint64_t v = s->seq();
      if (v & 1) seq_stalled.store(v, std::memory_order_relaxed);
      Warn(log, &warn_stalled, now,
           "policy segment " + shm_name + ": its writer held the seqlock past " +
               std::to_string(wait_ns / 1000) +
               " us (an agent killed mid-publish?); deciding from the tables already held");
      return SegState::kStalled;
    }
    case RS::kResized:
      seq_done.store(s->seq(), std::memory_order_release);
      Refuse(log, now, refused, "its header's capacity keeps changing");
      return SegState::kCurrent;
    case RS::kTruncated:
      // The file was cut below the mapping: stop touching it; look for it again later.
      seg.store(nullptr, std::memory_order_release);
      slot.store(-1, std::memory_order_relaxed);
      next_open_ns.store(now + kRetryOpenNs, std::memory_order_relaxed);
      Refuse(log, now, refused, "the file was truncated under the mapping");
      return SegState::kCurrent;
    case RS::kGarbled:
      seq_done.store(seq_read, std::memory_order_release);
      Refuse(log, now, refused, "garbled payload (length or checksum)");
      return SegState::kCurrent;
    case RS::kOk:
      break;
  }
  // The store first, then the counter: a context that sees the counter current (and so
  // neither waits nor reads) must find the tables it stands for already in the store.
  ++stats->parsed;
  if (Install(log, now, payload, refused)) {
    // The writer removed the group and unlinks this segment: stop using it (the tables held
    // stay in force) and look for the segment under its name again from the next call.
    seg.store(nullptr, std::memory_order_release);
    slot.store(-1, std::memory_order_relaxed);
    next_open_ns.store(0, std::memory_order_relaxed);
    LogTo(log, HS_NCCL_LOG_INFO,
          "policy segment %s retired by its writer (group removed); keeping the tables held",
          shm_name.c_str());
    return SegState::kCurrent;
  }
  seq_done.store(seq_read, std::memory_order_release);
  return SegState::kCurrent;
}

void GroupFeed::NoteWriter(hsNcclLogger log, const std::string& gen, uint64_t newest) {
  const char* why = nullptr;
  if (have_writer_gen && gen != writer_gen) {
    why = "a new writer generation";
  } else if (newest > 0) {
    TableStore::Snapshot held = store.Read();
    if (!held.tables.empty() && held.tables.back()->writer_epoch == writer_epoch &&
        newest < held.tables.back()->version) {
      why = "versions that went back";
    }
  }
  writer_gen = gen;
  have_writer_gen = true;
  if (!why) return;
  ++writer_epoch;
  LogTo(log, HS_NCCL_LOG_WARN,
        "policy segment %s: %s (newest version %llu); its tables now outrank every table "
        "held before",
        shm_name.c_str(), why, static_cast<unsigned long long>(newest));
}

bool GroupFeed::Install(hsNcclLogger log, int64_t now, const std::string& payload,
                        uint64_t* refused) {
  heroserve::json::Value doc;
  std::string err;
  const heroserve::json::Value* tables = nullptr;
  const heroserve::json::Value* gen = nullptr;
  const heroserve::json::Value* retired = nullptr;
  if (!heroserve::json::Parse(payload, &doc, &err) || !doc.is_object() ||
      !(tables = doc.find("tables")) || !tables->is_array() ||
      tables->items().size() > kMaxTablesPerSegment ||
      ((gen = doc.find("writer_generation")) && !gen->is_string()) ||
      ((retired = doc.find("retired")) && !retired->is_bool())) {
    Refuse(log, now, refused,
           "not a list of at most " + std::to_string(kMaxTablesPerSegment) +
               " tables with an optional writer_generation string and retired flag" +
               (err.empty() ? std::string() : " (" + err + ")"));
    return false;
  }
  if (retired && retired->as_bool()) return true;
  std::vector<std::shared_ptr<PolicyTable>> valid;
  uint64_t newest = 0;
  for (const auto& tv : tables->items()) {
    auto t = std::make_shared<PolicyTable>();
    err.clear();
    if (!heroserve::ParseTable(tv, t.get(), &err) || t->group_id != group) {
      Refuse(log, now, refused, "bad table: " + (err.empty() ? "group mismatch" : err));
      continue;
    }
    newest = std::max(newest, t->version);
    valid.push_back(std::move(t));
  }
  NoteWriter(log, gen ? gen->as_string() : std::string(), newest);
  for (auto& t : valid) {
    t->writer_epoch = writer_epoch;
    const uint64_t v = t->version;
    bool too_far = false;
    // Stale versions (every publish lists the versions held before) are dropped quietly.
    if (!store.Publish(std::move(t), &too_far) && too_far) {
      Refuse(log, now, refused,
             "version " + std::to_string(v) + " jumps more than " +
                 std::to_string(heroserve::kMaxVersionJump) + " above the newest held");
    }
  }
  return false;
}

void GroupFeed::LockForFork() {
  refresh_mu.lock();  // waits for a read in progress: kAttachWaitNs and one parse at most
  reader_mu.lock();
}

void GroupFeed::UnlockAfterFork(bool child) {
  if (child) {
    // The copy of the parent's wake-up still counts the parent's thread as a waiter; it is
    // made anew in place (destroying it would wait for that waiter).
    new (&reader_cv) std::condition_variable();
    reader_pid = 0;
    reader_wanted = false;
    seq_deferred.store(0, std::memory_order_relaxed);
  }
  reader_mu.unlock();
  refresh_mu.unlock();
}

namespace {

std::mutex g_feeds_mu;
std::map<std::string, std::unique_ptr<GroupFeed>>* g_feeds = nullptr;  // never freed: NCCL
                                                                       // may unload us late

// The fork handlers stay valid after NCCL's dlclose: the library is linked -z nodelete.
void PrepareFork() {
  g_feeds_mu.lock();
  if (g_feeds)
    for (auto& [name, f] : *g_feeds) f->LockForFork();
}

void AfterFork(bool child) {
  if (g_feeds)
    for (auto& [name, f] : *g_feeds) f->UnlockAfterFork(child);
  g_feeds_mu.unlock();
}

// Registered when the library is loaded, not under g_feeds_mu: glibc runs the handlers
// holding its own lock, which pthread_atfork takes too.
const int g_fork_handlers =
    pthread_atfork(PrepareFork, [] { AfterFork(false); }, [] { AfterFork(true); });

}  // namespace

GroupFeed* FeedFor(const std::string& group) {
  std::lock_guard<std::mutex> lock(g_feeds_mu);
  if (!g_feeds) g_feeds = new std::map<std::string, std::unique_ptr<GroupFeed>>();
  auto& f = (*g_feeds)[group];
  if (!f) {
    f = std::make_unique<GroupFeed>();
    f->group = group;
    f->shm_name = shm::SegmentName(group);
  }
  return f.get();
}

}  // namespace heroserve::tuner
