#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <string>

#include "heroserve/shm.h"

namespace heroserve::shm {
namespace {

std::string UniqueName(const char* tag) {
  return "/heroserve-test-" + std::string(tag) + "-" + std::to_string(getpid());
}

TEST(Shm, SegmentNameSanitisesGroup) {
  unsetenv("HEROSERVE_SHM_PREFIX");
  EXPECT_EQ(SegmentName("decode/0/1"), "/heroserve-decode.0.1");
  setenv("HEROSERVE_SHM_PREFIX", "t1/", 1);
  EXPECT_EQ(SegmentName("decode/0/1"), "/heroserve-t1.decode.0.1");
  unsetenv("HEROSERVE_SHM_PREFIX");
}

TEST(Shm, PublishThenReadOnceThenUnchanged) {
  std::string name = UniqueName("rw");
  Segment w, r;
  std::string err;
  ASSERT_TRUE(w.Create(name, 4096, &err)) << err;
  ASSERT_TRUE(r.Open(name, &err)) << err;
  uint64_t seen = 0;
  std::string payload;
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kEmpty);
  ASSERT_TRUE(w.Publish("{\"tables\": []}", 1, &err));
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kOk);
  EXPECT_EQ(payload, "{\"tables\": []}");
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kUnchanged);
  EXPECT_FALSE(w.Publish(std::string(5000, 'x'), 2, &err));  // over capacity
  EXPECT_NE(err.find("capacity"), std::string::npos);
  shm_unlink(name.c_str());
}

// The payload limit holds on both sides: the writer refuses to publish past it even into a
// segment with room, and a reader refuses a header declaring more before copying anything,
// even when the bytes are there and the checksum matches (a forged publish).
TEST(Shm, PayloadAboveTheLimitIsRefusedByWriterAndReader) {
  std::string name = UniqueName("limit");
  Segment w, r;
  std::string err;
  ASSERT_TRUE(w.Create(name, kMaxPayloadBytes + 4096, &err)) << err;
  const std::string big(kMaxPayloadBytes + 8, ' ');
  EXPECT_FALSE(w.Publish(big, 1, &err));
  EXPECT_NE(err.find("payload limit (" + std::to_string(kMaxPayloadBytes)), std::string::npos);
  EXPECT_TRUE(w.Publish(std::string(kMaxPayloadBytes, ' '), 1, &err)) << err;  // at the limit
  ASSERT_TRUE(r.Open(name, &err)) << err;
  uint64_t seen = 0;
  std::string payload;
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kOk);
  EXPECT_EQ(payload.size(), kMaxPayloadBytes);
  // Forge what Publish refused: the bytes, their length and checksum, a new counter value.
  char* data = reinterpret_cast<char*>(w.header()) + ((sizeof(Header) + 63) & ~size_t{63});
  std::memcpy(data, big.data(), big.size());
  __atomic_store_n(&w.header()->length, big.size(), __ATOMIC_RELEASE);
  __atomic_store_n(&w.header()->checksum, Checksum(big.data(), big.size()), __ATOMIC_RELEASE);
  __atomic_fetch_add(&w.header()->seq, 2, __ATOMIC_RELEASE);
  payload = "held";
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kOversized);
  EXPECT_TRUE(payload.empty());  // cleared, never resized to the declared length and filled
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kUnchanged);  // reported once
  shm_unlink(name.c_str());
}

// A republish of the bytes a reader holds (same length and checksum) is not copied again;
// new bytes are, and the stamp follows them.
TEST(Shm, RepublishOfTheHeldPayloadIsNotCopied) {
  std::string name = UniqueName("same");
  Segment w, r;
  std::string err;
  ASSERT_TRUE(w.Create(name, 4096, &err)) << err;
  ASSERT_TRUE(r.Open(name, &err)) << err;
  ASSERT_TRUE(w.Publish("{\"tables\": []}", 1, &err));
  uint64_t seen = 0;
  std::string payload;
  Segment::Stamp held;
  EXPECT_EQ(r.Read(&seen, &payload, 0, &held), Segment::ReadStatus::kOk);
  EXPECT_TRUE(held.valid);
  EXPECT_EQ(held.length, payload.size());
  ASSERT_TRUE(w.Publish("{\"tables\": []}", 1, &err));
  payload = "untouched";
  EXPECT_EQ(r.Read(&seen, &payload, 0, &held), Segment::ReadStatus::kSame);
  EXPECT_EQ(payload, "untouched");
  EXPECT_EQ(r.Read(&seen, &payload, 0, &held), Segment::ReadStatus::kUnchanged);
  ASSERT_TRUE(w.Publish("{\"tables\": [] }", 2, &err));
  EXPECT_EQ(r.Read(&seen, &payload, 0, &held), Segment::ReadStatus::kOk);
  EXPECT_EQ(payload, "{\"tables\": [] }");
  EXPECT_EQ(held.length, payload.size());
  shm_unlink(name.c_str());
}

TEST(Shm, GarbledPayloadIsDetectedOnce) {
  std::string name = UniqueName("garble");
  Segment w, r;
  std::string err;
  ASSERT_TRUE(w.Create(name, 4096, &err));
  ASSERT_TRUE(w.Publish("{\"tables\": [1, 2, 3]}", 1, &err));
  ASSERT_TRUE(r.Open(name, &err));
  // Flip a payload byte behind the writer's back (a stray write in another process).
  char* data = reinterpret_cast<char*>(w.header()) + ((sizeof(Header) + 63) & ~size_t{63});
  data[3] ^= 0x55;
  __atomic_fetch_add(&w.header()->seq, 2, __ATOMIC_RELEASE);
  uint64_t seen = 0;
  std::string payload;
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kGarbled);
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kUnchanged);
  shm_unlink(name.c_str());
}

TEST(Shm, MissingOrForeignSegmentIsAnError) {
  Segment r;
  std::string err;
  EXPECT_FALSE(r.Open(UniqueName("absent"), &err));
  EXPECT_FALSE(err.empty());
  std::string name = UniqueName("foreign");
  {
    Segment w;
    ASSERT_TRUE(w.Create(name, 64, &err));
    std::memcpy(w.header()->magic, "NOTOURS!", 8);
  }
  EXPECT_FALSE(r.Open(name, &err));
  EXPECT_NE(err.find("bad header"), std::string::npos);
  shm_unlink(name.c_str());
}

// A restarted daemon with a smaller --shm-capacity must not cut a file that serving
// processes have mapped; a larger one grows it, and readers remap.
TEST(Shm, CreateNeverShrinksAndReadersRemapAfterGrowth) {
  std::string name = UniqueName("grow");
  std::string err;
  Segment w1, r;
  ASSERT_TRUE(w1.Create(name, 1 << 16, &err)) << err;
  ASSERT_TRUE(w1.Publish("{\"tables\": []}", 1, &err));
  ASSERT_TRUE(r.Open(name, &err)) << err;
  EXPECT_EQ(r.capacity(), size_t{1} << 16);
  Segment w2;
  ASSERT_TRUE(w2.Create(name, 4096, &err)) << err;
  EXPECT_EQ(w2.capacity(), size_t{1} << 16);  // kept, not shrunk
  uint64_t seen = 0;
  std::string payload;
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kOk);  // header kept too
  Segment w3;
  ASSERT_TRUE(w3.Create(name, 1 << 17, &err)) << err;
  ASSERT_TRUE(w3.Publish("{\"tables\": [1]}", 2, &err));
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kResized);
  ASSERT_TRUE(r.Open(name, &err)) << err;
  EXPECT_EQ(r.capacity(), size_t{1} << 17);
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kOk);
  EXPECT_EQ(payload, "{\"tables\": [1]}");
  shm_unlink(name.c_str());
}

// A writer killed mid-publish leaves the counter odd: a reader waits at most its deadline.
TEST(Shm, OddSeqlockIsWaitedOnOnlyUntilTheDeadline) {
  std::string name = UniqueName("odd");
  std::string err;
  Segment w, r;
  ASSERT_TRUE(w.Create(name, 4096, &err));
  ASSERT_TRUE(w.Publish("{\"tables\": []}", 1, &err));
  ASSERT_TRUE(r.Open(name, &err));
  __atomic_fetch_add(&w.header()->seq, 1, __ATOMIC_RELEASE);
  uint64_t seen = 0;
  std::string payload;
  EXPECT_EQ(r.Read(&seen, &payload, 0), Segment::ReadStatus::kBusy);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(r.Read(&seen, &payload, 2000000), Segment::ReadStatus::kBusy);  // 2 ms
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, std::chrono::milliseconds(2));
  EXPECT_LT(waited, std::chrono::milliseconds(100));  // generous: never a spin without end
  ASSERT_TRUE(w.Publish("{\"tables\": [2]}", 2, &err));  // the restarted writer repairs it
  EXPECT_EQ(w.seq() % 2, 0u);
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kOk);
  EXPECT_EQ(payload, "{\"tables\": [2]}");
  shm_unlink(name.c_str());
}

// Lengths are checked against the mapping, never the header's capacity.
TEST(Shm, LengthOrCapacityBeyondTheMappingIsNeverRead) {
  std::string name = UniqueName("len");
  std::string err;
  Segment w, r;
  ASSERT_TRUE(w.Create(name, 4096, &err));
  ASSERT_TRUE(w.Publish("{}", 1, &err));
  ASSERT_TRUE(r.Open(name, &err));
  // Within the payload limit but beyond the 4 KiB mapping: garbled.
  __atomic_store_n(&w.header()->length, uint64_t{8192}, __ATOMIC_RELEASE);
  __atomic_fetch_add(&w.header()->seq, 2, __ATOMIC_RELEASE);
  uint64_t seen = 0;
  std::string payload;
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kGarbled);
  // Beyond the payload limit as well: refused on the limit first.
  __atomic_store_n(&w.header()->length, uint64_t{1} << 40, __ATOMIC_RELEASE);
  __atomic_fetch_add(&w.header()->seq, 2, __ATOMIC_RELEASE);
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kOversized);
  __atomic_store_n(&w.header()->capacity, uint64_t{1} << 40, __ATOMIC_RELEASE);
  __atomic_fetch_add(&w.header()->seq, 2, __ATOMIC_RELEASE);
  EXPECT_EQ(r.Read(&seen, &payload), Segment::ReadStatus::kResized);
  Segment again;
  EXPECT_FALSE(again.Open(name, &err));  // the header claims more than the file holds
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  shm_unlink(name.c_str());
}

TEST(Shm, CountersPerProcessSlot) {
  std::string name = UniqueName("count");
  Segment w, r;
  std::string err;
  ASSERT_TRUE(w.Create(name, 64, &err));
  ASSERT_TRUE(r.Open(name, &err));
  int slot = r.ClaimSlot();
  ASSERT_GE(slot, 0);
  EXPECT_EQ(r.ClaimSlot(), slot);  // same process, same slot
  r.ResetSlot(slot, 7);
  r.Count(slot, 1, 1000, 0);
  r.Count(slot, 1, 24, 1);
  r.Count(slot, 0, 5, 2);
  auto slots = w.ReadSlots();
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0].pid, static_cast<uint64_t>(getpid()));
  EXPECT_EQ(slots[0].version, 7u);
  EXPECT_EQ(slots[0].last_seq, 2u);
  EXPECT_EQ(slots[0].counters[1].selections, 2u);
  EXPECT_EQ(slots[0].counters[1].bytes, 1024u);
  EXPECT_EQ(slots[0].counters[0].bytes, 5u);
  shm_unlink(name.c_str());
}

// A writer republishes while a reader polls: every payload the reader accepts is one the
// writer wrote whole (the seqlock and checksum never let a torn copy through). TSAN-clean.
TEST(Shm, ConcurrentPublishAndReadNeverTears) {
  std::string name = UniqueName("race");
  Segment w, r;
  std::string err;
  ASSERT_TRUE(w.Create(name, 1 << 16, &err));
  ASSERT_TRUE(r.Open(name, &err));
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 1; i <= 2000; ++i) {
      // Payload i: the digit (i % 10) repeated 1000 + i bytes.
      std::string p(static_cast<size_t>(1000 + i), static_cast<char>('0' + i % 10));
      std::string e;
      w.Publish(p, static_cast<uint64_t>(i), &e);
    }
    done.store(true);
  });
  uint64_t seen = 0;
  int ok = 0, bad = 0;
  std::string payload;
  while (!done.load()) {
    auto st = r.Read(&seen, &payload);
    if (st == Segment::ReadStatus::kOk) {
      ++ok;
      size_t i = payload.size() - 1000;
      if (payload.find_first_not_of(static_cast<char>('0' + i % 10)) != std::string::npos) ++bad;
    } else if (st == Segment::ReadStatus::kGarbled) {
      ++bad;
    }
  }
  writer.join();
  EXPECT_EQ(bad, 0);
  auto last = r.Read(&seen, &payload);
  EXPECT_TRUE(last == Segment::ReadStatus::kOk || last == Segment::ReadStatus::kUnchanged);
  EXPECT_EQ(payload.size(), 3000u);  // the last one
  (void)ok;
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace heroserve::shm
