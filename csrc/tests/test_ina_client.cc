// The C++ INA client core: header codec (bytes from agents/ina/packet.py), lane format,
// the group config file, and the engine (window, retransmission, result acceptance, bounded
// failure) against a small in-process stand-in for the switch. The engine against the real
// switch model is tests/agents/collnet (the plugin harness).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include "client.h"
#include "group_config.h"
#include "heroserve/ina_wire.h"
#include "lanes.h"

using namespace heroserve::ina;

TEST(InaWire, HeaderBytesMatchPython) {
  // pack(InaHeader.at_round(7, 3, 2, 4, 5, is_retx=True, session=0xDEADBEEF,
  //      first_generation=0xFFFFFFFF), ...)[:16] in agents/ina/packet.py: the generation wraps.
  Header h = AtRound(7, 3, 2, 4, 5, true, 0xDEADBEEF, 0xFFFFFFFF);
  uint8_t b[16];
  EncodeHeader(h, b);
  const uint8_t want[16] = {0x00, 0x07, 0x00, 0x03, 0x02, 0x04, 0xc0, 0x00,
                            0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x00, 0x01};
  EXPECT_EQ(0, std::memcmp(b, want, 16));
  Header d;
  ASSERT_TRUE(DecodeHeader(b, 16, &d));
  EXPECT_EQ(d.generation, 1u);
  EXPECT_EQ(d.version, 1);
  EXPECT_TRUE(d.is_retx);
  EXPECT_FALSE(d.is_result);
  b[6] |= 0x01;  // a reserved bit
  EXPECT_FALSE(DecodeHeader(b, 16, &d));
  b[6] &= 0xFE;
  b[7] = 1;  // the reserved byte
  EXPECT_FALSE(DecodeHeader(b, 16, &d));
  EXPECT_FALSE(DecodeHeader(b, 15, &d));
}

TEST(InaLanes, ExactTypesAndRoundTrip) {
  EXPECT_TRUE(Exact(kInt32Lanes, ElemType::kInt32));
  EXPECT_TRUE(Exact(kInt32Lanes, ElemType::kUint8));
  EXPECT_FALSE(Exact(kInt32Lanes, ElemType::kOther));
  EXPECT_EQ(kInt32Lanes.payload_len(), PAYLOAD_LEN);
  int8_t x[3] = {-1, 127, -128};
  uint8_t lanes[VECTOR_BYTES];
  EncodeLanes(kInt32Lanes, ElemType::kInt8, x, 3, lanes);
  EXPECT_EQ(lanes[0], 0xff);  // sign-extended, big-endian
  EXPECT_EQ(lanes[3], 0xff);
  EXPECT_EQ(lanes[7], 127);
  EXPECT_EQ(lanes[8], 0xff);
  EXPECT_EQ(lanes[11], 0x80);
  EXPECT_EQ(lanes[12], 0);  // padding
  // Three members' lanes summed modulo 2^32 (the switch) truncate to the int8 wrapped sum.
  int8_t out[3];
  uint8_t sum[VECTOR_BYTES] = {0};
  for (int m = 0; m < 3; m++) {
    for (int i = 0; i < 3; i++) {
      uint32_t a = static_cast<uint32_t>(sum[4 * i]) << 24 | sum[4 * i + 1] << 16 |
                   sum[4 * i + 2] << 8 | sum[4 * i + 3];
      uint32_t b = static_cast<uint32_t>(lanes[4 * i]) << 24 | lanes[4 * i + 1] << 16 |
                   lanes[4 * i + 2] << 8 | lanes[4 * i + 3];
      uint32_t s = a + b;
      sum[4 * i] = s >> 24;
      sum[4 * i + 1] = s >> 16 & 0xff;
      sum[4 * i + 2] = s >> 8 & 0xff;
      sum[4 * i + 3] = s & 0xff;
    }
  }
  DecodeLanes(kInt32Lanes, ElemType::kInt8, sum, 3, out);
  EXPECT_EQ(out[0], static_cast<int8_t>(-3));
  EXPECT_EQ(out[1], static_cast<int8_t>(127 * 3));
  EXPECT_EQ(out[2], static_cast<int8_t>(-128 * 3));
}

// The float conversions against independent references: the compiler's _Float16 for
// binary16 and the usual round-to-nearest-even bit trick for bfloat16 (both exact for
// values that are floats), on random and edge values.
TEST(InaLanes, FloatConversionsRoundToNearestEven) {
  using heroserve::ina::ElemType;
  std::mt19937_64 rng(3);
  std::vector<float> vals = {0.0f, -0.0f, 1.0f, -1.5f, 65504.0f, 65519.0f, 65520.0f, 1e-8f,
                             5.96e-8f, 2.98e-8f, 6.1e-5f, 3.4e38f, 1.0f + 1.0f / 256,
                             1.0f + 3.0f / 256};
  std::uniform_real_distribution<double> ex(-30, 30);
  for (int i = 0; i < 200000; i++) {
    uint32_t b = static_cast<uint32_t>(rng());
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isfinite(f)) vals.push_back(f);
    vals.push_back(static_cast<float>(std::ldexp(static_cast<double>(rng() % 1000000) - 5e5, static_cast<int>(ex(rng)))));
  }
  for (float f : vals) {
    uint16_t got;
    heroserve::ina::FromDouble(ElemType::kFloat16, f, &got, 0);
    _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(got, want) << f;
    ASSERT_EQ(heroserve::ina::ToDouble(ElemType::kFloat16, &got, 0), static_cast<double>(h)) << f;
    uint32_t fb;
    std::memcpy(&fb, &f, 4);
    uint16_t wb = static_cast<uint16_t>((fb + 0x7fff + ((fb >> 16) & 1)) >> 16);
    heroserve::ina::FromDouble(ElemType::kBfloat16, f, &got, 0);
    if ((wb & 0x7f80) == 0x7f80) continue;  // the trick's overflow (to inf) is ours too
    ASSERT_EQ(got, wb) << f;
    uint32_t back = static_cast<uint32_t>(wb) << 16;
    float bf;
    std::memcpy(&bf, &back, 4);
    ASSERT_EQ(heroserve::ina::ToDouble(ElemType::kBfloat16, &got, 0), static_cast<double>(bf));
  }
}

// lanes.py's rule: E from frexp, s = 30 - ceil(log2 w) - E, half-even rounding.
TEST(InaLanes, FixedPointFollowsLanesPy) {
  using namespace heroserve::ina;
  int e = 0;
  ASSERT_TRUE(ExponentOf(0.75, &e));
  EXPECT_EQ(e, 0);
  ASSERT_TRUE(ExponentOf(1.0, &e));
  EXPECT_EQ(e, 1);
  ASSERT_TRUE(ExponentOf(0.0, &e));
  EXPECT_EQ(e, kEMin);
  EXPECT_FALSE(ExponentOf(std::ldexp(1.0, kEMax), &e));
  EXPECT_FALSE(ExponentOf(INFINITY, &e));
  EXPECT_EQ(ScaleExponent(4, 1), 27);
  EXPECT_EQ(ScaleExponent(5, 1), 26);
  float x[3] = {0.5f, -2.5f, 2.5f};
  uint8_t lanes[4 * VECTOR_LEN];
  EncodeLanes(kInt32Lanes, ElemType::kFloat32, x, 3, lanes, 0);  // rint: ties to even
  auto lane = [&](int i) {
    return static_cast<int32_t>(static_cast<uint32_t>(lanes[4 * i]) << 24 | lanes[4 * i + 1] << 16 |
                                lanes[4 * i + 2] << 8 | lanes[4 * i + 3]);
  };
  EXPECT_EQ(lane(0), 0);
  EXPECT_EQ(lane(1), -2);
  EXPECT_EQ(lane(2), 2);
  float y[3];
  EncodeLanes(kInt32Lanes, ElemType::kFloat32, x, 3, lanes, 3);
  DecodeLanes(kInt32Lanes, ElemType::kFloat32, lanes, 3, y, 3);
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[1], -2.5f);
}

TEST(InaConfig, ParsesAndRefuses) {
  std::vector<GroupEntry> e;
  std::string err;
  ASSERT_TRUE(ParseGroupConfig(
      R"({"groups": [{"group_id": 7, "num_workers": 4, "worker_id": 3, "window": 64,
          "switch_ip": "10.77.0.254", "session": 4294967295, "first_generation": 5,
          "bind_ip": "10.77.0.4", "comm_id": "0xabc", "give_up_s": 1.5}]})",
      &e, &err))
      << err;
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].policy.spec.session, 4294967295u);
  EXPECT_EQ(e[0].policy.spec.switch_port, INA_UDP_PORT);
  EXPECT_EQ(e[0].policy.bind_port, INA_UDP_PORT);
  EXPECT_EQ(e[0].comm_id, 0xabcu);
  EXPECT_DOUBLE_EQ(e[0].policy.timeouts.give_up_s, 1.5);
  EXPECT_FALSE(ParseGroupConfig(
      R"({"groups": [{"group_id": 0, "num_workers": 4, "worker_id": 0, "window": 1,
          "switch_ip": "10.0.0.1"}]})",
      &e, &err));
  EXPECT_NE(err.find("group_id"), std::string::npos) << err;
  EXPECT_FALSE(ParseGroupConfig(
      R"({"groups": [{"group_id": 1, "num_workers": 4, "worker_id": 4, "window": 1,
          "switch_ip": "10.0.0.1"}]})",
      &e, &err));
  EXPECT_NE(err.find("worker id 4 of 4"), std::string::npos) << err;
  EXPECT_FALSE(ParseGroupConfig(
      R"({"groups": [{"group_id": 1, "num_workers": 2, "worker_id": 0, "window": 65536,
          "switch_ip": "10.0.0.1"}]})",
      &e, &err));
  // The lane format: bfp16 needs float_sums (it carries floats only); unknown names refused.
  EXPECT_FALSE(ParseGroupConfig(
      R"({"groups": [{"group_id": 1, "num_workers": 2, "worker_id": 0, "window": 1,
          "switch_ip": "10.0.0.1", "lane_format": "bfp16"}]})",
      &e, &err));
  EXPECT_NE(err.find("needs float_sums"), std::string::npos) << err;
  EXPECT_FALSE(ParseGroupConfig(
      R"({"groups": [{"group_id": 1, "num_workers": 2, "worker_id": 0, "window": 1,
          "switch_ip": "10.0.0.1", "lane_format": "int16", "float_sums": true}]})",
      &e, &err));
  EXPECT_NE(err.find("lane_format must be"), std::string::npos) << err;
  ASSERT_TRUE(ParseGroupConfig(
      R"({"groups": [{"group_id": 1, "num_workers": 2, "worker_id": 0, "window": 1,
          "switch_ip": "10.0.0.1", "lane_format": "bfp16", "float_sums": true}]})",
      &e, &err)) << err;
  EXPECT_EQ(e[0].policy.spec.lanes.kind, LaneKind::kBfp16);
}

namespace {

// A stand-in for the switch: sums each (index, generation, version) over the workers, sends
// the result to every worker when complete and again to a worker that repeats itself after
// completion; drops the first transmission of every `drop_every`-th contribution. bfp16
// packets: int16 lanes added with saturation (flagged), the exp byte's maximum returned, as
// the switch (agents/softswitch/ingress.py).
class FakeSwitch {
 public:
  explicit FakeSwitch(int workers, int drop_every = 0) : n_(workers), drop_every_(drop_every) {
    fd_ = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~FakeSwitch() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  uint16_t port() const { return port_; }
  int dropped() const { return dropped_; }
  // From now on every bfp16 result carries the overflow flag, as the switch sets it when a
  // contribution saturated a lane (a member that scaled with another exponent).
  void FlagOverflow() { flag_overflow_ = true; }
  // From now on every bfp16 result carries an exp byte of at most `byte`, as a faulty switch
  // (or foreign traffic on the slot) could answer a proposal round.
  void CapAgreement(uint8_t byte) { agreement_cap_ = byte; }

 private:
  struct Round {
    uint32_t sum[VECTOR_LEN] = {0};
    int32_t sum16[BFP16_LANES] = {0};
    uint8_t exp = 0;
    bool overflow = false;
    uint32_t seen = 0;
    int count = 0;
    uint8_t result[PAYLOAD_LEN];
  };
  void Run() {
    uint8_t buf[2048];
    int contributions = 0;
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      sockaddr_in from{};
      socklen_t len = sizeof from;
      ssize_t n = recvfrom(fd_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
      Header h;
      if (n < static_cast<ssize_t>(PAYLOAD_LEN) || !DecodeHeader(buf, n, &h)) continue;
      addr_[h.worker_id] = from;
      if (drop_every_ && !h.is_retx && ++contributions % drop_every_ == 0) {
        dropped_++;
        continue;
      }
      Round& r = rounds_[std::make_tuple(h.agg_index, h.generation, h.version)];
      uint32_t bit = 1u << h.worker_id;
      if (r.seen & bit) {
        if (r.count == n_) Reply(r.result, from);
        continue;
      }
      r.seen |= bit;
      r.count++;
      if (h.bfp16) {
        r.exp = r.count == 1 ? h.exp : std::max(r.exp, h.exp);
        for (uint32_t i = 0; i < BFP16_LANES; i++) {
          const uint8_t* v = buf + HEADER_LEN + 2 * i;
          int32_t s = r.sum16[i] + static_cast<int16_t>(static_cast<uint16_t>(v[0] << 8 | v[1]));
          if (s > 32767 || s < -32768) r.overflow = true;
          r.sum16[i] = std::min(32767, std::max(-32768, s));
        }
      } else {
        for (uint32_t i = 0; i < VECTOR_LEN; i++) {
          const uint8_t* v = buf + HEADER_LEN + 4 * i;
          r.sum[i] += static_cast<uint32_t>(v[0]) << 24 | v[1] << 16 | v[2] << 8 | v[3];
        }
      }
      if (r.count == n_) {
        h.is_result = true;
        h.is_retx = false;
        h.overflow = h.bfp16 && (r.overflow || flag_overflow_);
        h.exp = h.bfp16 ? std::min<uint8_t>(r.exp, agreement_cap_) : 0;
        EncodeHeader(h, r.result);
        for (uint32_t i = 0; i < VECTOR_LEN && !h.bfp16; i++) {
          uint8_t* v = r.result + HEADER_LEN + 4 * i;
          v[0] = r.sum[i] >> 24;
          v[1] = r.sum[i] >> 16 & 0xff;
          v[2] = r.sum[i] >> 8 & 0xff;
          v[3] = r.sum[i] & 0xff;
        }
        for (uint32_t i = 0; i < BFP16_LANES && h.bfp16; i++) {
          uint8_t* v = r.result + HEADER_LEN + 2 * i;
          auto u = static_cast<uint16_t>(static_cast<int16_t>(r.sum16[i]));
          v[0] = static_cast<uint8_t>(u >> 8);
          v[1] = static_cast<uint8_t>(u);
        }
        for (auto& [w, a] : addr_) Reply(r.result, a);
      }
    }
  }
  void Reply(const uint8_t* p, const sockaddr_in& to) {
    sendto(fd_, p, PAYLOAD_LEN, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
  }

  int n_, drop_every_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> dropped_{0};
  std::atomic<bool> flag_overflow_{false};
  std::atomic<uint8_t> agreement_cap_{0xFF};
  std::thread thread_;
  std::map<int, sockaddr_in> addr_;
  std::map<std::tuple<uint16_t, uint32_t, uint8_t>, Round> rounds_;
};

GroupSpec Spec(uint16_t port, uint8_t w, uint8_t n, uint32_t window) {
  GroupSpec g;
  g.group_id = 9;
  g.worker_id = w;
  g.num_workers = n;
  g.window = window;
  g.switch_ip = htonl(INADDR_LOOPBACK);
  g.switch_port = port;
  g.session = 77;
  g.first_generation = 0xFFFFFFF0u;  // crosses the generation wrap
  return g;
}

Timeouts Fast(double give_up = 5.0) {
  Timeouts t;
  t.initial_rto_s = 0.02;
  t.min_rto_s = 0.005;
  t.max_rto_s = 0.2;
  t.give_up_s = give_up;
  return t;
}

// The n members of one bfp16 group on the fake switch, each on its own loopback endpoint;
// fewer than n when one could not be made (the failure is recorded: callers check the size).
std::vector<std::unique_ptr<Engine>> Bfp16Group(FakeSwitch& sw, int n, uint32_t window) {
  std::vector<std::unique_ptr<Engine>> eng;
  for (int w = 0; w < n; w++) {
    std::string err;
    auto ep = Endpoint::Open(htonl(INADDR_LOOPBACK), 0, &err);
    EXPECT_TRUE(ep) << err;
    if (!ep) break;
    GroupSpec g = Spec(sw.port(), w, n, window);
    g.lanes = kBfp16Lanes;
    eng.push_back(Engine::Create(g, Fast(), ep, &err));
    EXPECT_TRUE(eng.back()) << err;
    if (!eng.back()) {
      eng.pop_back();
      break;
    }
  }
  return eng;
}

// One all-reduce on every member at once (member w sums data[w] into out[w]): each member's
// error, "" where it completed.
std::vector<std::string> AllReduceEach(std::vector<std::unique_ptr<Engine>>& eng,
                                       std::vector<std::vector<float>>& data,
                                       std::vector<std::vector<float>>& out) {
  const size_t n = eng.size();
  std::vector<Engine::Op*> op(n);
  std::vector<Engine::State> st(n);
  for (size_t w = 0; w < n; w++)
    op[w] = eng[w]->Submit(data[w].data(), out[w].data(), data[w].size(), ElemType::kFloat32);
  std::vector<std::thread> th;
  for (size_t w = 0; w < n; w++) th.emplace_back([&, w] { st[w] = eng[w]->Wait(op[w]); });
  for (auto& t : th) t.join();
  std::vector<std::string> errs;
  for (size_t w = 0; w < n; w++) {
    errs.push_back(st[w] == Engine::State::kDone ? "" : eng[w]->ErrorOf(op[w]));
    eng[w]->Release(op[w]);
  }
  return errs;
}

}  // namespace

TEST(InaEngine, ExactSumsUnderLossAcrossCollectives) {
  const int n = 3;
  FakeSwitch sw(n, 7);
  std::vector<std::unique_ptr<Engine>> eng;
  for (int w = 0; w < n; w++) {
    std::string err;
    auto ep = Endpoint::Open(htonl(INADDR_LOOPBACK), 0, &err);
    ASSERT_TRUE(ep) << err;
    eng.push_back(Engine::Create(Spec(sw.port(), w, n, 4), Fast(), ep, &err));
    ASSERT_TRUE(eng.back()) << err;
  }
  std::mt19937 rng(1);
  for (size_t count : {1u, 31u, 32u, 33u, 1000u}) {
    std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count));
    std::vector<std::vector<int32_t>> out(n, std::vector<int32_t>(count, 0x5a5a5a5a));
    std::vector<int32_t> want(count, 0);
    for (int w = 0; w < n; w++) {
      for (size_t i = 0; i < count; i++) {
        in[w][i] = static_cast<int32_t>(rng());
        want[i] = static_cast<int32_t>(static_cast<uint32_t>(want[i]) +
                                       static_cast<uint32_t>(in[w][i]));
      }
    }
    // Two collectives queued at once per member: the second reuses the indices after the first.
    std::vector<Engine::Op*> a(n), b(n);
    std::vector<std::vector<int32_t>> out2 = out;
    for (int w = 0; w < n; w++) {
      a[w] = eng[w]->Submit(in[w].data(), out[w].data(), count, ElemType::kInt32);
      b[w] = eng[w]->Submit(in[w].data(), out2[w].data(), count, ElemType::kInt32);
    }
    std::vector<std::thread> th;
    for (int w = 0; w < n; w++) {
      th.emplace_back([&, w] {
        EXPECT_EQ(eng[w]->Wait(a[w]), Engine::State::kDone) << eng[w]->error();
        EXPECT_EQ(eng[w]->Wait(b[w]), Engine::State::kDone) << eng[w]->error();
      });
    }
    for (auto& t : th) t.join();
    for (int w = 0; w < n; w++) {
      EXPECT_EQ(out[w], want) << "count " << count << " worker " << w;
      EXPECT_EQ(out2[w], want) << "count " << count << " worker " << w;
      eng[w]->Release(a[w]);
      eng[w]->Release(b[w]);
    }
  }
  uint64_t retx = 0;
  for (auto& e : eng) retx += e->stats().retransmissions;
  EXPECT_GT(sw.dropped(), 0);
  EXPECT_GE(retx, static_cast<uint64_t>(sw.dropped()));
}

// bfp16, hand-worked (lanes.py's test): 4 members, a block below 0.75 has E = 0 (byte 127),
// s = 14 - 2 - 0 = 12, so 0.75 travels as 3072.
TEST(InaLanes, Bfp16FollowsLanesPy) {
  float x[2] = {0.75f, -0.5f};
  EXPECT_EQ(BlockExponent(ElemType::kFloat32, x, 2), 127);
  EXPECT_EQ(Bfp16ScaleExponent(4, 127), 12);
  uint8_t lanes[2 * BFP16_LANES];
  EncodeLanes(kBfp16Lanes, ElemType::kFloat32, x, 2, lanes, 12);
  EXPECT_EQ(lanes[0] << 8 | lanes[1], 3072);
  EXPECT_EQ(lanes[2] << 8 | lanes[3], 0x10000 - 2048);
  float nan[1] = {NAN}, zero[1] = {0.0f};
  EXPECT_EQ(BlockExponent(ElemType::kFloat32, nan, 1), EXP_BAD);
  EXPECT_EQ(BlockExponent(ElemType::kFloat32, zero, 1), 0);
  EXPECT_FALSE(Exact(kBfp16Lanes, ElemType::kInt32));  // saturates: no exact integer sums
  EXPECT_EQ(LaneFormatByName("bfp16"), &kBfp16Lanes);
  EXPECT_EQ(LaneFormatByName("int16"), nullptr);
}

// Members and blocks of different exponents: every member gets the exact sum of the
// quantized values at each block's largest exponent (worked out here from frexp, not from
// the library), with loss; then a NaN block fails the op at every member alike and the next
// op still runs.
TEST(InaEngine, Bfp16SumsAtTheAgreedBlockExponent) {
  const int n = 3;
  const uint32_t window = 4;
  FakeSwitch sw(n, 5);
  auto eng = Bfp16Group(sw, n, window);
  ASSERT_EQ(eng.size(), static_cast<size_t>(n));
  const size_t count = 1000;  // 16 blocks on 4 indices
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> in(n, std::vector<float>(count));
  for (int w = 0; w < n; w++)
    for (size_t i = 0; i < count; i++)
      in[w][i] = normal(rng) * std::ldexp(1.0f, 3 * w + static_cast<int>(i / 64 % 5));
  std::vector<float> want(count);
  for (size_t b = 0; b < count; b += 64) {
    int e = -127;
    for (int w = 0; w < n; w++)
      for (size_t i = b; i < std::min(count, b + 64); i++) {
        int ex = 0;
        std::frexp(in[w][i], &ex);
        e = std::max(e, ex);
      }
    int s = 14 - 2 - e;  // ceil(log2 3) = 2
    for (size_t i = b; i < std::min(count, b + 64); i++) {
      double q = 0;
      for (int w = 0; w < n; w++) q += std::nearbyint(std::ldexp(double{in[w][i]}, s));
      want[i] = static_cast<float>(std::ldexp(q, -s));
    }
  }
  std::vector<std::vector<float>> out(n, std::vector<float>(count, -1.0f));
  for (const std::string& e : AllReduceEach(eng, in, out)) EXPECT_EQ(e, "");
  for (int w = 0; w < n; w++) EXPECT_EQ(out[w], want) << "worker " << w;
  in[1][200] = NAN;  // block 3 of member 1
  for (const std::string& e : AllReduceEach(eng, in, out))
    EXPECT_NE(e.find("block 3: a member's block cannot travel"), std::string::npos) << e;
  std::vector<std::vector<float>> ones(n, std::vector<float>(100, 0.5f)), got = ones;
  for (const std::string& e : AllReduceEach(eng, ones, got)) EXPECT_EQ(e, "");
  for (int w = 0; w < n; w++) EXPECT_EQ(got[w], std::vector<float>(100, 1.5f));
  EXPECT_GT(sw.dropped(), 0);
}

// A result flagged as saturated is refused by every member: the all-reduce fails naming the
// block, and no lane of the refused sum reaches the receive buffer.
TEST(InaEngine, Bfp16RefusesASaturatedResult) {
  const int n = 2;
  FakeSwitch sw(n);
  auto eng = Bfp16Group(sw, n, 2);
  ASSERT_EQ(eng.size(), static_cast<size_t>(n));
  std::vector<std::vector<float>> in(n, std::vector<float>(100, 0.25f));
  std::vector<std::vector<float>> out(n, std::vector<float>(100, -1.0f));
  for (const std::string& e : AllReduceEach(eng, in, out)) EXPECT_EQ(e, "");
  EXPECT_EQ(out[0], std::vector<float>(100, 0.5f));
  sw.FlagOverflow();
  out[0].assign(100, -1.0f);
  out[1].assign(100, -1.0f);
  for (const std::string& e : AllReduceEach(eng, in, out))
    EXPECT_NE(e.find("block 0: the switch saturated a lane"), std::string::npos) << e;
  EXPECT_EQ(out[1], std::vector<float>(100, -1.0f));  // no block of a refused sum delivered
}

// A proposal round answered below this member's own proposal (no honest switch does: the
// agreement is a maximum over the members) fails the op with its own error naming the block
// and both exponent bytes, not as data that cannot travel.
TEST(InaEngine, Bfp16RefusesAnAgreementBelowItsOwnProposal) {
  const int n = 2;
  FakeSwitch sw(n);
  auto eng = Bfp16Group(sw, n, 2);
  ASSERT_EQ(eng.size(), static_cast<size_t>(n));
  // 100 = 0.78 * 2^7: exp byte 127 + 7 = 134; 0.5 = 0.5 * 2^0: byte 127.
  std::vector<std::vector<float>> in = {std::vector<float>(100, 100.0f),
                                        std::vector<float>(100, 0.5f)};
  std::vector<std::vector<float>> out(n, std::vector<float>(100));
  sw.CapAgreement(127);
  const std::vector<std::string> errs = AllReduceEach(eng, in, out);
  EXPECT_EQ(errs[0],
            "block 0: this member's exponent byte 134 exceeds the agreed 127 the switch "
            "returned, which is no maximum over the members: a wrong proposal round (a faulty "
            "switch or foreign traffic on the slot)");
  EXPECT_EQ(errs[1], "");  // its own proposal is within the (wrong) agreement
}

TEST(InaEngine, IgnoresForeignAndStaleResults) {
  FakeSwitch sw(1);
  std::string err;
  auto ep = Endpoint::Open(htonl(INADDR_LOOPBACK), 0, &err);
  ASSERT_TRUE(ep) << err;
  auto e = Engine::Create(Spec(sw.port(), 0, 1, 2), Fast(), ep, &err);
  ASSERT_TRUE(e) << err;
  // A forged result from another socket (not the switch's address and port), with the right
  // group, session and round: counted as foreign, never taken.
  int forger = socket(AF_INET, SOCK_DGRAM, 0);
  uint8_t p[PAYLOAD_LEN] = {0};
  Header h = AtRound(9, 0, 0, 1, 0, false, 77, 0xFFFFFFF0u);
  h.is_result = true;
  EncodeHeader(h, p);
  p[HEADER_LEN + 3] = 99;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(ep->port());
  sendto(forger, p, sizeof p, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  usleep(20000);
  int32_t x = 5, y = 0;
  Engine::Op* op = e->Submit(&x, &y, 1, ElemType::kInt32);
  ASSERT_EQ(e->Wait(op), Engine::State::kDone) << e->error();
  EXPECT_EQ(y, 5);
  EXPECT_EQ(e->stats().foreign, 1u);
  close(forger);
  // Another session of the same group on the same endpoint is refused.
  GroupSpec same = Spec(sw.port(), 0, 1, 2);
  EXPECT_FALSE(Engine::Create(same, Fast(), ep, &err));
  EXPECT_NE(err.find("already open"), std::string::npos) << err;
}

TEST(InaEngine, DeadSwitchFailsWithinTheBound) {
  FakeSwitch sw(2);
  uint16_t port = sw.port();
  sw.Stop();  // nobody answers (the port is closed: ICMP errors must not break the engine)
  std::string err;
  auto ep = Endpoint::Open(htonl(INADDR_LOOPBACK), 0, &err);
  ASSERT_TRUE(ep) << err;
  auto e = Engine::Create(Spec(port, 0, 2, 8), Fast(0.5), ep, &err);
  ASSERT_TRUE(e) << err;
  std::vector<int32_t> x(100, 1), y(100);
  double t0 = MonotonicSeconds();
  Engine::Op* op = e->Submit(x.data(), y.data(), x.size(), ElemType::kInt32);
  EXPECT_EQ(e->Wait(op), Engine::State::kFailed);
  double took = MonotonicSeconds() - t0;
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 1.5);
  EXPECT_NE(e->error().find("no result"), std::string::npos) << e->error();
  EXPECT_EQ(e->Submit(x.data(), y.data(), 1, ElemType::kInt32), nullptr);  // stays failed
  std::string jerr;
  EXPECT_FALSE(e->Join(&jerr));
}

TEST(InaEngine, JoinChecksEveryWorkerOnce) {
  const int n = 2;
  FakeSwitch sw(n);
  std::vector<std::unique_ptr<Engine>> eng;
  for (int w = 0; w < n; w++) {
    std::string err;
    auto ep = Endpoint::Open(htonl(INADDR_LOOPBACK), 0, &err);
    eng.push_back(Engine::Create(Spec(sw.port(), w, n, 4), Fast(), ep, &err));
    ASSERT_TRUE(eng.back()) << err;
  }
  std::vector<std::string> errs(n);
  std::vector<int> ok(n);
  std::vector<std::thread> th;
  for (int w = 0; w < n; w++) th.emplace_back([&, w] { ok[w] = eng[w]->Join(&errs[w]); });
  for (auto& t : th) t.join();
  EXPECT_TRUE(ok[0]) << errs[0];
  EXPECT_TRUE(ok[1]) << errs[1];
}
