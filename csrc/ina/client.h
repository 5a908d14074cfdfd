// The host side of the INA slot protocol in C++ (docs/dataplane.md, "What the host must do"),
// the same discipline as agents/ina/transport.py:
//
// * a group owns `window` aggregator indices; chunk j of an all-reduce (one packet of lanes)
//   travels on index j % window as that index's next round; rounds are numbered per index
//   for the whole session and travel as (version, generation) = AtRound(round);
// * on one index the next round is sent only after the result of the previous one arrived;
//   a timed-out chunk is sent again unchanged (same round, same lanes, retransmission flag);
// * a result is taken only from the switch's address and port, of this group and session,
//   for an index with a chunk outstanding and the round it was sent as; anything else is
//   counted and dropped;
// * timeouts as TCP (RFC 6298: srtt + 4 rttvar, Karn, exponential backoff) and a congestion
//   window (RFC 5681, counted in chunks) never above the group's window;
// * every wait is bounded: with no result for `give_up_s` while chunks are outstanding the
//   session fails (every pending all-reduce with it) and stays failed: its rounds are then
//   undefined, a new session is needed.
//
// All-reduces queue in submission order, several in flight at once (as NCCL's proxy posts
// them); chunk j of each starts at index 0 as in transport.py, so a C++ member and a Python
// member of one group number their rounds identically.
//
// bfp16 groups (GroupSpec.lanes, docs/dataplane.md "Lane formats"): an all-reduce of B
// blocks is F = min(window, B) proposal rows (row k on index k: no lanes, the exp byte of
// block k) and then block c on index c % window, scaled at the exp byte the index's previous
// result agreed and proposing block c + window's; transport.py allreduce_bfp16 row by row.
// A block some member could not send (EXP_BAD) or a saturated result fails that op alone
// after all its rows ran, so the rounds stay numbered alike.
//
// An Endpoint is one UDP socket per local address, shared by every session of the process
// bound there (the switch returns results to UDP port 48879 of the member's address, so
// all groups of a host share it) and demultiplexed by (group id, session).
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "heroserve/ina_wire.h"
#include "lanes.h"

namespace heroserve::ina {

struct GroupSpec {
  uint16_t group_id = 0;      // 1..MAX_GROUP_ID
  uint8_t worker_id = 0;      // this member's bit on the switch
  uint8_t num_workers = 0;    // 1..MAX_WORKERS
  uint32_t window = 0;        // aggregator indices the group owns, 1..MAX_AGGREGATOR_SLOTS-1
  in_addr_t switch_ip = 0;    // network byte order: where contributions go, results come from
  uint16_t switch_port = INA_UDP_PORT;
  uint32_t session = 0;
  uint32_t first_generation = 0;
  LaneFormat lanes = kInt32Lanes;
};

// Checks the limits of packet.py / transport.py's InaGroup; "" when fine.
std::string Validate(const GroupSpec& g);

struct Timeouts {
  double initial_rto_s = 0.2;  // until a round trip was measured
  double min_rto_s = 0.02;
  double max_rto_s = 2.0;
  double give_up_s = 10.0;     // no result for this long: the session fails
};

struct Stats {
  uint64_t sent = 0;             // first transmissions
  uint64_t retransmissions = 0;
  uint64_t results = 0;          // results accepted
  uint64_t stale = 0;            // results for an idle index or another round
  uint64_t foreign = 0;          // not from the switch, not a result, another group/session
  uint64_t malformed = 0;        // short, or reserved bits set
  double srtt_s = 0;
  double rto_s = 0;
  double cwnd = 0;
};

class Engine;

class Endpoint {
 public:
  // The process's socket for `bind_ip:bind_port` (network order address, host order port;
  // port 0 picks one), opened on first use. nullptr and *err when it cannot be bound.
  static std::shared_ptr<Endpoint> Open(in_addr_t bind_ip, uint16_t bind_port, std::string* err);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  int fd() const { return fd_; }
  uint16_t port() const { return port_; }  // host order, the one bound
  in_addr_t ip() const { return ip_; }

  // Receives every waiting datagram and queues it on the engine of its (group, session).
  // Caller holds mu.
  void PumpLocked();

  std::mutex mu;

 private:
  friend class Engine;
  Endpoint(int fd, in_addr_t ip, uint16_t port) : fd_(fd), ip_(ip), port_(port) {}
  bool Attach(uint64_t key, Engine* e);  // false: another engine holds the key
  void Detach(uint64_t key);

  int fd_;
  in_addr_t ip_;
  uint16_t port_;
  std::map<uint64_t, Engine*> engines_;  // by (group id << 32 | session); guarded by mu
  uint64_t unclaimed_ = 0;               // datagrams no engine here wanted
};

class Engine {
 public:
  enum class State { kPending, kDone, kFailed };
  struct Op;

  // nullptr and *err when the spec is invalid or another session of the process holds the
  // same (group, session) on this endpoint.
  static std::unique_ptr<Engine> Create(const GroupSpec& g, const Timeouts& t,
                                        std::shared_ptr<Endpoint> ep, std::string* err);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues the sum of every member's `count` elements of `type` (Exact in the group's lane
  // format, or Quantized: floats, preceded by an exponent agreement round, lanes.h) from
  // `send` into `recv` (may be the same buffer). Both must stay valid until the op is no
  // longer pending. nullptr when the session has failed. The caller decides whether the
  // group may use Quantized types (the CollNet: the group's float_sums).
  Op* Submit(const void* send, void* recv, size_t count, ElemType type);
  // Takes what arrived, retransmits what timed out, sends what the window allows; waits up
  // to `wait_s` for a datagram first when something is outstanding.
  void Progress(double wait_s);
  State StateOf(const Op* op) const;
  // bfp16: the exp byte index `k`'s last result agreed (tests).
  uint8_t AgreedExp(uint32_t k) const;
  size_t BytesOf(const Op* op) const;
  // Why a failed op failed: its own reason (a float op whose data some member could not
  // quantize; the session goes on), else the session's error.
  std::string ErrorOf(const Op* op) const;
  // The agreed 2^s scale exponent of a float op once its agreement finished (tests), else
  // INT32_MIN.
  int ScaleOf(const Op* op) const;
  // Forgets an op that is no longer pending.
  void Release(Op* op);
  // Progresses until `op` is no longer pending (bounded by give_up_s of no progress).
  State Wait(Op* op);

  // One all-reduce that every member must join: each contributes a 1 in the lane of its
  // worker id; fine when every worker's lane is exactly 1. Bounded by give_up_s. In the
  // group's own lanes (a TNA build runs one format): uint32 in int32 lanes, float32 in
  // bfp16 lanes (a one-hot block sums exactly: every lane's total is 0 or 1 x 2^s).
  bool Join(std::string* err);

  const GroupSpec& group() const { return g_; }
  const std::string& error() const { return error_; }
  Stats stats() const;
  size_t pending() const;

 private:
  friend class Endpoint;
  struct Slot {
    uint64_t round = 0;   // round of the next (or outstanding) contribution on this index
    Op* op = nullptr;     // outstanding op (nullptr: idle)
    size_t chunk = 0;
    std::vector<uint8_t> payload;
    double sent_at = 0;
    double deadline = 0;
    double rto = 0;
    uint32_t retries = 0;
  };
  struct Datagram {
    size_t n = 0;
    sockaddr_in from{};
    uint8_t buf[256];
  };

  Engine(const GroupSpec& g, const Timeouts& t, std::shared_ptr<Endpoint> ep);
  void Deliver(const uint8_t* data, size_t n, const sockaddr_in& from);  // under ep mu
  void Accept(const Datagram& d, double now);
  void Start(uint32_t index, Op* op, size_t chunk, double now);
  uint32_t IndexOf(const Op* op, size_t row) const;
  void Send(Slot& s, double now);
  void Fail(const std::string& why);
  bool Prepare(Op* op);  // false: its agreement is still pending
  double Rto() const;
  uint64_t Key() const { return static_cast<uint64_t>(g_.group_id) << 32 | g_.session; }

  GroupSpec g_;
  Timeouts t_;
  std::shared_ptr<Endpoint> ep_;
  sockaddr_in dest_{};

  mutable std::mutex mu_;  // the engine's state (one proxy thread uses it; tests use more)
  std::deque<Datagram> inbox_;  // guarded by ep_->mu
  std::vector<Slot> slots_;
  std::vector<uint8_t> agreed_;  // bfp16: per index, the exp byte its last result agreed
  std::list<std::unique_ptr<Op>> ops_;  // submission order
  size_t in_flight_ = 0;
  double last_progress_ = 0;
  // RFC 6298 estimator and the congestion window (transport.py _Rtt, _Window).
  double srtt_ = 0, rttvar_ = 0;
  bool have_rtt_ = false;
  double cwnd_ = 0, ssthresh_ = 0, last_decrease_ = -1;
  Stats stats_;
  std::string error_;
};

double MonotonicSeconds();

}  // namespace heroserve::ina
