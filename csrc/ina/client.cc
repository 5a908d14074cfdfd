#include "client.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace heroserve::ina {

namespace {
constexpr double kInitialWindow = 10;  // chunks, TCP's initial window (RFC 6928)
constexpr int kSocketBuffer = 4 << 20;

std::mutex g_registry_mu;
std::map<uint64_t, std::weak_ptr<Endpoint>>& Registry() {
  static auto* r = new std::map<uint64_t, std::weak_ptr<Endpoint>>();
  return *r;
}
uint64_t AddrKey(in_addr_t ip, uint16_t port) { return static_cast<uint64_t>(ip) << 16 | port; }

std::string Ip(in_addr_t a) {
  char buf[INET_ADDRSTRLEN] = {0};
  in_addr x{};
  x.s_addr = a;
  inet_ntop(AF_INET, &x, buf, sizeof buf);
  return buf;
}
}  // namespace

double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Validate(const GroupSpec& g) {
  if (g.group_id == 0) return "group id 0 means no group (ids are 1..65535)";
  if (g.num_workers < 1 || g.num_workers > MAX_WORKERS)
    return "num_workers " + std::to_string(g.num_workers) + " outside 1..32";
  if (g.worker_id >= g.num_workers)
    return "worker id " + std::to_string(g.worker_id) + " of " + std::to_string(g.num_workers);
  if (g.window < 1 || g.window >= MAX_AGGREGATOR_SLOTS)
    return "window " + std::to_string(g.window) + " outside 1..65535";
  if (g.switch_ip == 0 || g.switch_port == 0) return "no switch address";
  return "";
}

// ---------------------------------------------------------------------------------------
// Endpoint

std::shared_ptr<Endpoint> Endpoint::Open(in_addr_t bind_ip, uint16_t bind_port,
                                         std::string* err) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  if (bind_port != 0) {
    auto it = Registry().find(AddrKey(bind_ip, bind_port));
    if (it != Registry().end()) {
      if (auto ep = it->second.lock()) return ep;
    }
  }
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = std::string("socket: ") + std::strerror(errno);
    return nullptr;
  }
  int sz = kSocketBuffer;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = bind_ip;
  a.sin_port = htons(bind_port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    *err = "bind " + Ip(bind_ip) + ":" + std::to_string(bind_port) + ": " +
           std::strerror(errno);
    close(fd);
    return nullptr;
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  std::shared_ptr<Endpoint> ep(new Endpoint(fd, bind_ip, ntohs(a.sin_port)));
  Registry()[AddrKey(bind_ip, ep->port_)] = ep;
  return ep;
}

Endpoint::~Endpoint() {
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto it = Registry().find(AddrKey(ip_, port_));
    if (it != Registry().end() && it->second.expired()) Registry().erase(it);
  }
  close(fd_);
}

bool Endpoint::Attach(uint64_t key, Engine* e) {
  std::lock_guard<std::mutex> lock(mu);
  return engines_.emplace(key, e).second;
}

void Endpoint::Detach(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu);
  engines_.erase(key);
}

void Endpoint::PumpLocked() {
  uint8_t buf[2048];
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    ssize_t n = recvfrom(fd_, buf, sizeof buf, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from),
                         &len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN, or an error a later send will show
    }
    Header h;
    Engine* e = nullptr;
    if (DecodeHeader(buf, static_cast<size_t>(n), &h)) {
      auto it = engines_.find(static_cast<uint64_t>(h.group_id) << 32 | h.session);
      if (it != engines_.end()) e = it->second;
    }
    if (e == nullptr) {
      unclaimed_++;
      continue;
    }
    e->Deliver(buf, static_cast<size_t>(n), from);
  }
}

// ---------------------------------------------------------------------------------------
// Engine

struct Engine::Op {
  const uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
  size_t count = 0;
  ElemType type = ElemType::kInt32;
  size_t chunks = 0;
  size_t next_chunk = 0;  // next chunk to send
  size_t done_chunks = 0;
  State state = State::kPending;
  // Floats (lanes.h): the exponent agreement op that must finish before this op's lanes
  // can be encoded, and its vectors; scale_exp once agreed.
  Op* agreement = nullptr;
  bool prepared = true;
  int scale_exp = 0;
  std::vector<uint32_t> agree_send, agree_recv;
  std::string error;  // this op alone failed (the session did not)
  // bfp16: proposal rows first, then one row per block; proposals[c] is block c's exp byte
  // (padded with window entries of EXP_BIAS + EXP_MIN: nothing to propose).
  bool bfp16 = false;
  size_t firsts = 0;
  std::vector<uint8_t> proposals;
};

std::unique_ptr<Engine> Engine::Create(const GroupSpec& g, const Timeouts& t,
                                       std::shared_ptr<Endpoint> ep, std::string* err) {
  std::string bad = Validate(g);
  if (!bad.empty()) {
    *err = bad;
    return nullptr;
  }
  if (!(t.initial_rto_s > 0 && t.min_rto_s > 0 && t.max_rto_s >= t.min_rto_s &&
        t.give_up_s > 0 && std::isfinite(t.give_up_s) && std::isfinite(t.max_rto_s))) {
    *err = "timeouts must be positive seconds with min_rto_s <= max_rto_s";
    return nullptr;
  }
  std::unique_ptr<Engine> e(new Engine(g, t, std::move(ep)));
  if (!e->ep_->Attach(e->Key(), e.get())) {
    *err = "group " + std::to_string(g.group_id) + " session " + std::to_string(g.session) +
           " is already open on " + Ip(e->ep_->ip()) + ":" + std::to_string(e->ep_->port());
    e->ep_.reset();  // not attached: the destructor must not detach the holder
    return nullptr;
  }
  return e;
}

Engine::Engine(const GroupSpec& g, const Timeouts& t, std::shared_ptr<Endpoint> ep)
    : g_(g), t_(t), ep_(std::move(ep)), slots_(g.window), agreed_(g.window, 0) {
  dest_.sin_family = AF_INET;
  dest_.sin_addr.s_addr = g.switch_ip;
  dest_.sin_port = htons(g.switch_port);
  cwnd_ = std::min<double>(g.window, kInitialWindow);
  ssthresh_ = g.window;
}

Engine::~Engine() {
  if (ep_) ep_->Detach(Key());
}

double Engine::Rto() const {
  if (!have_rtt_) return t_.initial_rto_s;
  return std::min(t_.max_rto_s, std::max(t_.min_rto_s, srtt_ + 4 * rttvar_));
}

void Engine::Deliver(const uint8_t* data, size_t n, const sockaddr_in& from) {
  Datagram d;
  d.n = n;
  d.from = from;
  std::memcpy(d.buf, data, std::min(n, sizeof d.buf));
  inbox_.push_back(d);
}

Engine::Op* Engine::Submit(const void* send, void* recv, size_t count, ElemType type) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty() || !(Exact(g_.lanes, type) || Quantized(g_.lanes, type))) return nullptr;
  Op* agreement = nullptr;
  if (g_.lanes.kind == LaneKind::kBfp16) {
    auto op = std::make_unique<Op>();
    op->bfp16 = true;
    op->send = static_cast<const uint8_t*>(send);
    op->recv = static_cast<uint8_t*>(recv);
    op->count = count;
    op->type = type;
    const size_t per = ElemsPerPacket(g_.lanes), esz = ElemBits(type) / 8;
    const size_t blocks = (count + per - 1) / per;
    op->firsts = std::min<size_t>(g_.window, blocks);
    for (size_t c = 0; c < blocks; c++) {
      size_t first = c * per;
      op->proposals.push_back(
          BlockExponent(type, op->send + first * esz, std::min(per, count - first)));
    }
    op->proposals.resize(blocks + g_.window, static_cast<uint8_t>(EXP_BIAS + EXP_MIN));
    op->chunks = op->firsts + blocks;
    if (op->chunks == 0) op->state = State::kDone;
    ops_.push_back(std::move(op));
    return ops_.back().get();
  }
  if (Quantized(g_.lanes, type) && count > 0) {
    // One aggregation of one-hot exponent lanes first (lanes.py agree_exponent), queued
    // right before the data so every member numbers its rounds alike.
    auto a = std::make_unique<Op>();
    a->agree_send.assign(kAgreementLanes, 0);
    a->agree_recv.assign(kAgreementLanes, 0);
    double m = 0;
    int e = 0;
    if (MaxAbs(type, send, count, &m) && ExponentOf(m, &e)) {
      a->agree_send[e - kEMin] = 1;
    } else {
      a->agree_send[kBadDataLane] = 1;
    }
    a->send = reinterpret_cast<const uint8_t*>(a->agree_send.data());
    a->recv = reinterpret_cast<uint8_t*>(a->agree_recv.data());
    a->count = kAgreementLanes;
    a->type = ElemType::kUint32;
    uint32_t per = ElemsPerPacket(g_.lanes);
    a->chunks = (a->count + per - 1) / per;
    agreement = a.get();
    ops_.push_back(std::move(a));
  }
  auto op = std::make_unique<Op>();
  op->agreement = agreement;
  op->prepared = agreement == nullptr;
  op->send = static_cast<const uint8_t*>(send);
  op->recv = static_cast<uint8_t*>(recv);
  op->count = count;
  op->type = type;
  uint32_t per = ElemsPerPacket(g_.lanes);
  op->chunks = (count + per - 1) / per;
  if (op->chunks == 0) op->state = State::kDone;
  ops_.push_back(std::move(op));
  return ops_.back().get();
}

void Engine::Send(Slot& s, double now) {
  // A full socket buffer or a transient error loses the datagram as the network would:
  // the retransmission timer covers it.
  sendto(ep_->fd(), s.payload.data(), s.payload.size(), MSG_DONTWAIT,
         reinterpret_cast<const sockaddr*>(&dest_), sizeof dest_);
  s.deadline = now + s.rto;
}

uint32_t Engine::IndexOf(const Op* op, size_t row) const {
  if (op->bfp16 && row >= op->firsts) row -= op->firsts;  // block c on index c % window
  return static_cast<uint32_t>(row % g_.window);
}

void Engine::Start(uint32_t index, Op* op, size_t chunk, double now) {
  Slot& s = slots_[index];
  s.op = op;
  s.chunk = chunk;
  s.retries = 0;
  s.sent_at = now;
  s.rto = Rto();
  const LaneFormat& f = g_.lanes;
  s.payload.assign(f.payload_len(), 0);
  Header h = AtRound(g_.group_id, static_cast<uint16_t>(index), g_.worker_id, g_.num_workers,
                     s.round, false, g_.session, g_.first_generation);
  uint32_t per = ElemsPerPacket(f);
  size_t esz = ElemBits(op->type) / 8;
  if (op->bfp16) {
    h.bfp16 = true;
    if (chunk < op->firsts) {  // the index's proposal row: no lanes
      h.exp = op->proposals[chunk];
    } else {
      size_t c = chunk - op->firsts, first = c * per;
      size_t n = std::min<size_t>(per, op->count - first);
      h.exp = op->proposals[c + g_.window];
      uint8_t agreed = agreed_[index];
      // Either refusal sends zeros, which keep the group's rounds in step.
      if (agreed == EXP_BAD) {
        if (op->error.empty())
          op->error = "block " + std::to_string(c) + ": a member's block cannot travel " +
                      "(NaN, infinity or beyond 2^" + std::to_string(EXP_MAX) + ")";
      } else if (op->proposals[c] > agreed) {
        // The agreement is a maximum over the members' proposals, this one's included: a
        // smaller one is no member's doing but a wrong proposal round.
        if (op->error.empty())
          op->error = "block " + std::to_string(c) + ": this member's exponent byte " +
                      std::to_string(op->proposals[c]) + " exceeds the agreed " +
                      std::to_string(agreed) + " the switch returned, which is no maximum " +
                      "over the members: a wrong proposal round (a faulty switch or foreign " +
                      "traffic on the slot)";
      } else {
        EncodeLanes(f, op->type, op->send + first * esz, n, s.payload.data() + HEADER_LEN,
                    Bfp16ScaleExponent(g_.num_workers, agreed));
      }
    }
    EncodeHeader(h, s.payload.data());
  } else {
    EncodeHeader(h, s.payload.data());
    size_t first = chunk * per;
    size_t n = std::min<size_t>(per, op->count - first);
    EncodeLanes(f, op->type, op->send + first * esz, n, s.payload.data() + HEADER_LEN,
                op->scale_exp);
  }
  if (in_flight_ == 0) last_progress_ = now;  // an idle session's silence is not a failure
  in_flight_++;
  stats_.sent++;
  Send(s, now);
}

void Engine::Accept(const Datagram& d, double now) {
  const LaneFormat& f = g_.lanes;
  Header h;
  if (d.n < f.payload_len() || !DecodeHeader(d.buf, d.n, &h)) {
    stats_.malformed++;
    return;
  }
  if (d.from.sin_addr.s_addr != dest_.sin_addr.s_addr || d.from.sin_port != dest_.sin_port ||
      !h.is_result || h.group_id != g_.group_id || h.session != g_.session ||
      h.agg_index >= slots_.size()) {
    stats_.foreign++;
    return;
  }
  Slot& s = slots_[h.agg_index];
  Header want = AtRound(g_.group_id, h.agg_index, g_.worker_id, g_.num_workers, s.round, false,
                        g_.session, g_.first_generation);
  if (s.op == nullptr || h.generation != want.generation || h.version != want.version) {
    stats_.stale++;
    return;
  }
  Op* op = s.op;
  uint32_t per = ElemsPerPacket(f);
  size_t esz = ElemBits(op->type) / 8;
  if (op->bfp16) {
    uint8_t& agreed = agreed_[h.agg_index];
    if (!h.bfp16) {
      if (op->error.empty()) op->error = "the switch answered a bfp16 round in int32 lanes";
    } else if (s.chunk >= op->firsts) {
      size_t c = s.chunk - op->firsts, first = c * per;
      size_t n = std::min<size_t>(per, op->count - first);
      if (h.overflow) {
        if (op->error.empty())
          op->error = "block " + std::to_string(c) + ": the switch saturated a lane";
      } else if (agreed != EXP_BAD) {
        DecodeLanes(f, op->type, d.buf + HEADER_LEN, n, op->recv + first * esz,
                    Bfp16ScaleExponent(g_.num_workers, agreed));
      }
    }
    agreed = h.exp;
  } else {
    size_t first = s.chunk * per;
    size_t n = std::min<size_t>(per, op->count - first);
    DecodeLanes(f, op->type, d.buf + HEADER_LEN, n, op->recv + first * esz, op->scale_exp);
  }
  if (s.retries == 0) {  // Karn: only unambiguous samples
    double r = now - s.sent_at;
    if (!have_rtt_) {
      srtt_ = r;
      rttvar_ = r / 2;
      have_rtt_ = true;
    } else {
      rttvar_ = 0.75 * rttvar_ + 0.25 * std::fabs(srtt_ - r);
      srtt_ = 0.875 * srtt_ + 0.125 * r;
    }
  }
  stats_.results++;
  s.op = nullptr;
  s.round++;
  in_flight_--;
  last_progress_ = now;
  double grow = cwnd_ < ssthresh_ ? 1.0 : 1.0 / cwnd_;
  cwnd_ = std::min<double>(g_.window, cwnd_ + grow);
  if (++op->done_chunks == op->chunks)
    op->state = op->error.empty() ? State::kDone : State::kFailed;
}

void Engine::Fail(const std::string& why) {
  if (error_.empty()) error_ = why;
  for (auto& op : ops_) {
    if (op->state == State::kPending) op->state = State::kFailed;
  }
  for (auto& s : slots_) s.op = nullptr;
  in_flight_ = 0;
}

void Engine::Progress(double wait_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) return;
  if (wait_s > 0 && in_flight_ > 0) {
    // Wait no longer than the first retransmission deadline.
    double now = MonotonicSeconds();
    for (const Slot& s : slots_) {
      if (s.op != nullptr) wait_s = std::min(wait_s, std::max(0.0, s.deadline - now));
    }
    pollfd p{ep_->fd(), POLLIN, 0};
    poll(&p, 1, static_cast<int>(std::ceil(wait_s * 1000)));
  }
  std::deque<Datagram> got;
  {
    std::lock_guard<std::mutex> eplock(ep_->mu);
    ep_->PumpLocked();
    got.swap(inbox_);
  }
  double now = MonotonicSeconds();
  for (const Datagram& d : got) Accept(d, now);
  // Retransmit what timed out.
  for (uint32_t k = 0; k < slots_.size(); k++) {
    Slot& s = slots_[k];
    if (s.op == nullptr || s.deadline > now) continue;
    if (s.sent_at > last_decrease_) {  // one decrease per loss episode
      ssthresh_ = std::max(2.0, static_cast<double>(in_flight_) / 2);
      cwnd_ = ssthresh_;
      last_decrease_ = now;
    }
    s.retries++;
    s.rto = std::min(t_.max_rto_s, s.rto * 2);
    s.payload[6] |= FLAG_RETX;  // same round, same lanes
    stats_.retransmissions++;
    Send(s, now);
  }
  if (in_flight_ > 0 && now - last_progress_ > t_.give_up_s) {
    size_t missing = 0;
    for (auto& op : ops_) {
      if (op->state == State::kPending) missing += op->chunks - op->done_chunks;
      // (an op still waiting for its agreement counts its chunks too)
    }
    char msg[256];
    snprintf(msg, sizeof msg,
             "group %u session %u: no result from the switch %s:%u for %.3gs (%zu chunks "
             "missing; switch down, a member absent, or no aggregators installed)",
             g_.group_id, g_.session, Ip(g_.switch_ip).c_str(), g_.switch_port, t_.give_up_s,
             missing);
    Fail(msg);
    return;
  }
  // Send in submission order while the window allows and the chunk's index is free.
  for (auto& up : ops_) {
    Op* op = up.get();
    if (op->state != State::kPending) continue;
    if (!op->prepared && !Prepare(op)) return;  // in order: wait for its agreement
    if (op->state != State::kPending) continue;
    while (op->next_chunk < op->chunks) {
      uint32_t index = IndexOf(op, op->next_chunk);
      if (slots_[index].op != nullptr ||
          in_flight_ >= static_cast<size_t>(std::max(1.0, std::floor(cwnd_))))
        return;  // in order: nothing later may overtake this chunk on its index
      Start(index, op, op->next_chunk, now);
      op->next_chunk++;
    }
  }
}

bool Engine::Prepare(Op* op) {
  Op* a = op->agreement;
  if (a->state == State::kPending) return false;
  if (a->state == State::kFailed) {
    op->state = State::kFailed;
    return true;
  }
  const std::vector<uint32_t>& sum = a->agree_recv;
  int top = -1;
  for (int k = 0; k < kExponentLanes; k++) {
    if (sum[k] != 0) top = k;
  }
  op->agreement = nullptr;
  uint32_t bad = sum[kBadDataLane];
  for (auto it = ops_.begin(); it != ops_.end(); ++it) {
    if (it->get() == a) {
      ops_.erase(it);
      break;
    }
  }
  // Every member sees the same sums, so every member skips (or runs) the data alike and
  // the rounds stay numbered alike.
  if (bad != 0) {
    op->state = State::kFailed;
    op->error = std::to_string(bad) + " member(s) of the group hold data that is not finite "
                "or beyond 2^" + std::to_string(kEMax) + ": the sum cannot travel as fixed point";
    return true;
  }
  if (top < 0) {
    Fail("exponent agreement returned no member's exponent (a member without this "
         "plugin's float support?)");
    return true;
  }
  op->scale_exp = ScaleExponent(g_.num_workers, top + kEMin);
  op->prepared = true;
  return true;
}

std::string Engine::ErrorOf(const Op* op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return op->error.empty() ? error_ : op->error;
}

uint8_t Engine::AgreedExp(uint32_t k) const {
  std::lock_guard<std::mutex> lock(mu_);
  return k < agreed_.size() ? agreed_[k] : 0;
}

int Engine::ScaleOf(const Op* op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return op->prepared ? op->scale_exp : INT32_MIN;
}

Engine::State Engine::StateOf(const Op* op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return op->state;
}

size_t Engine::BytesOf(const Op* op) const { return op->count * (ElemBits(op->type) / 8); }

void Engine::Release(Op* op) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = ops_.begin(); it != ops_.end(); ++it) {
    if (it->get() == op) {
      if (op->state != State::kPending) {
        Op* a = op->agreement;  // still queued when the session failed first
        ops_.erase(it);
        if (a != nullptr) {
          for (auto jt = ops_.begin(); jt != ops_.end(); ++jt) {
            if (jt->get() == a) {
              ops_.erase(jt);
              break;
            }
          }
        }
      }
      return;
    }
  }
}

Engine::State Engine::Wait(Op* op) {
  for (;;) {
    State s = StateOf(op);
    if (s != State::kPending) return s;
    Progress(0.05);
  }
}

bool Engine::Join(std::string* err) {
  uint32_t mine[MAX_WORKERS] = {0};
  uint32_t sum[MAX_WORKERS] = {0};
  float mine_f[MAX_WORKERS] = {0};
  float sum_f[MAX_WORKERS] = {0};
  mine[g_.worker_id] = 1;
  mine_f[g_.worker_id] = 1.0f;
  const bool bfp16 = g_.lanes.kind == LaneKind::kBfp16;
  Op* op = bfp16 ? Submit(mine_f, sum_f, MAX_WORKERS, ElemType::kFloat32)
                 : Submit(mine, sum, MAX_WORKERS, ElemType::kUint32);
  if (op == nullptr) {
    *err = error_.empty() ? "cannot submit" : error_;
    return false;
  }
  State s = Wait(op);
  Release(op);
  if (s != State::kDone) {
    *err = error_;
    return false;
  }
  for (uint32_t w = 0; w < MAX_WORKERS; w++) {
    uint32_t want = w < g_.num_workers ? 1 : 0;
    double got = bfp16 ? static_cast<double>(sum_f[w]) : static_cast<double>(sum[w]);
    if (got != want) {
      char times[32];
      snprintf(times, sizeof times, "%g", got);
      *err = "join: worker " + std::to_string(w) + " counted " + times +
             " times (members must hold distinct worker ids 0.." +
             std::to_string(g_.num_workers - 1) + ")";
      std::lock_guard<std::mutex> lock(mu_);
      Fail(*err);
      return false;
    }
  }
  return true;
}

Stats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.srtt_s = srtt_;
  s.rto_s = Rto();
  s.cwnd = cwnd_;
  return s;
}

size_t Engine::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto& op : ops_) n += op->state == State::kPending;
  return n;
}

}  // namespace heroserve::ina
