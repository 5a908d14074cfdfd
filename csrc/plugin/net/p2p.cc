// NCCL point-to-point network over TCP, exported as ncclNetPlugin_v8 ... _v12.
//
// Why it exists: NCCL reads a library's CollNet only if the same library exports a net
// (src/plugin/net.cc, ncclNetPluginLoad), and the communicator that gets our CollNet gets
// our net for all its point-to-point traffic too (csrc/README.md, "What NCCL's loader
// requires"). So this is a plain, correct transport in the manner of NCCL's own socket net
// (src/transport/net_socket.cc): host memory only, one TCP connection per send/recv comm,
// every call non-blocking.
//
// Wire: the connecting side sends a 16-byte hello (magic, the listener's token) once; then
// every message is an 8-byte little-endian length followed by the bytes. A receive may be
// posted larger than the message; test() reports the size received; a message larger than
// the posted receive fails the comm. Requests on a comm complete in posting order (one
// stream), at most NCCL_NET_MAX_REQUESTS outstanding (beyond that request == NULL and NCCL
// posts again).
//
// Bounded waits: connect (refused connections are retried) and accept (from its first call
// on a listen comm, and for the hello of an accepted connection) give up after
// HEROSERVE_NET_CONNECT_TIMEOUT_S (default 120 s) with ncclRemoteError. On data, a peer
// that closes or resets is an error at once (ncclRemoteError); a peer that vanishes
// without closing is detected by TCP keepalive and TCP_USER_TIMEOUT
// (HEROSERVE_NET_PEER_TIMEOUT_S, default 30 s). A receive waiting for a live peer that
// has simply not sent yet waits as long as NCCL asks (NCCL's own abort covers that).
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "client.h"
#include "common.h"
#include "group_config.h"

namespace hs = heroserve::ina;
using heroserve::netplugin::Info;
using heroserve::netplugin::Warn;

namespace {

struct LogName {  // the logger name, as a type for HostMemory
  static constexpr const char* kLog = "heroserve.net";
};
constexpr const char* kLog = LogName::kLog;
constexpr const char* kName = "HeroServe-TCP";
constexpr uint32_t kHandleMagic = 0x48535450;  // "HSTP"
constexpr uint64_t kHelloMagic = 0x3150325054454e48ULL;  // "HNETP2P1"
constexpr int kMaxRequests = NCCL_NET_MAX_REQUESTS;
constexpr size_t kMaxNetSizeBytes = 1ULL << 40;  // NCCL_MAX_NET_SIZE_BYTES (as its socket net)

double Now() { return hs::MonotonicSeconds(); }

double EnvSeconds(const char* name, double dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  return end != v && *end == '\0' && d > 0 && d < 1e7 ? d : dflt;
}
double ConnectTimeout() { return EnvSeconds("HEROSERVE_NET_CONNECT_TIMEOUT_S", 120.0); }
double PeerTimeout() { return EnvSeconds("HEROSERVE_NET_PEER_TIMEOUT_S", 30.0); }

struct Dev {
  heroserve::netplugin::Nic nic;
  in_addr_t ip;  // network order: listen sockets bind here
};

std::mutex g_mu;
std::vector<Dev> g_devs;  // fixed after the first init (NCCL asks devices once)
bool g_devs_done = false;

std::string IpStr(in_addr_t a) {
  char buf[INET_ADDRSTRLEN] = {0};
  in_addr x{};
  x.s_addr = a;
  inet_ntop(AF_INET, &x, buf, sizeof buf);
  return buf;
}

// The NICs the INA config names (each group's bind_ip: the rail the switch is on), else
// every interface that is up, else the loopback interface (a single host).
void DiscoverDevs() {
  if (g_devs_done) return;
  g_devs_done = true;
  std::vector<hs::GroupEntry> entries;
  std::string err;
  if (hs::LoadConfiguredGroups(&entries, &err)) {
    for (const auto& e : entries) {
      in_addr_t ip = e.policy.bind_ip;
      bool seen = false;
      for (const auto& d : g_devs) seen |= d.ip == ip;
      Dev d;
      if (!seen && ip != INADDR_ANY && heroserve::netplugin::FindNic(ip, &d.nic)) {
        d.ip = ip;
        g_devs.push_back(d);
      }
    }
  }
  if (g_devs.empty()) {
    for (const auto& n : heroserve::netplugin::AllNics(false)) g_devs.push_back({n.nic, n.ip});
  }
  if (g_devs.empty()) {
    for (const auto& n : heroserve::netplugin::AllNics(true)) g_devs.push_back({n.nic, n.ip});
  }
  std::string names;
  for (const auto& d : g_devs) names += (names.empty() ? "" : ", ") + d.nic.name + "/" + IpStr(d.ip);
  Info(kLog, "devices: " + (names.empty() ? std::string("none") : names));
}

struct Context {
  uint64_t comm_id = 0;
};

// What connect() keeps between its calls: NCCL passes the same handle buffer again until
// a comm comes back (as NCCL's socket net keeps its stage in the handle).
struct Stage {
  int state;  // 0: nothing yet, 1: connecting, 2: sending the hello
  int fd;
  double deadline;
  uint32_t hello_sent;
  uint32_t dev;
};

struct Handle {
  uint32_t magic;
  uint32_t dev;
  uint32_t ip;  // network order
  uint16_t port;  // network order
  uint16_t pad;
  uint64_t token;  // the listen comm's: stray connections are told apart
  Stage stage;
};
static_assert(sizeof(Handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large");

struct ListenComm {
  int fd = -1;
  int dev = 0;
  uint64_t token = 0;
  double first_accept = 0;  // 0: accept not called yet
  int pending = -1;          // accepted, hello not complete
  double pending_deadline = 0;
  uint8_t hello[16];
  uint32_t hello_got = 0;
};

struct Comm;

struct Request {
  Comm* comm = nullptr;
  bool used = false;
  bool send = false;
  uint8_t* data = nullptr;
  size_t size = 0;     // posted (send: the message; recv: the buffer)
  size_t msg = 0;      // receive: size of the message (from its header)
  uint8_t hdr[8];
  size_t hdr_done = 0;
  size_t done = 0;     // payload bytes moved
  bool complete = false;
  bool flush = false;  // a completed no-op (iflush)
};

struct Comm {
  int fd = -1;
  bool is_send = false;
  int dev = 0;
  std::string error;  // set once: every later call fails
  Request reqs[kMaxRequests];
  std::deque<Request*> fifo;
  uint64_t bytes = 0;
};

void TuneDataSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  double peer = PeerTimeout();
  int idle = std::max(1, static_cast<int>(peer / 3));
  int intvl = std::max(1, static_cast<int>(peer / 6));
  int cnt = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  unsigned int ut = static_cast<unsigned int>(peer * 1000);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

// ---- init / devices / properties ------------------------------------------------------

ncclResult_t Init(void** ctx, uint64_t comm_id, ncclDebugLogger_t logger) {
  heroserve::netplugin::SetLogger(logger);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    DiscoverDevs();
  }
  if (ctx != nullptr) *ctx = new Context{comm_id};
  return ncclSuccess;
}

ncclResult_t Devices(int* ndev) {
  std::lock_guard<std::mutex> lock(g_mu);
  DiscoverDevs();
  *ndev = static_cast<int>(g_devs.size());  // NCCL disables the library on 0
  return ncclSuccess;
}

bool DevOf(int dev, Dev* out) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (dev < 0 || dev >= static_cast<int>(g_devs.size())) return false;
  *out = g_devs[dev];
  return true;
}

ncclResult_t GetProperties(int dev, ncclNetProperties_v12_t* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (dev < 0 || dev >= static_cast<int>(g_devs.size())) return ncclInvalidArgument;
  std::memset(p, 0, sizeof *p);
  Dev& d = g_devs[dev];  // stable: g_devs never changes after discovery
  heroserve::netplugin::FillCommonProps(
      p, d.nic.name.c_str(), d.nic.pci_path.empty() ? nullptr : const_cast<char*>(d.nic.pci_path.c_str()),
      static_cast<uint64_t>(dev), d.nic.speed_mbps);
  p->forceFlush = 0;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = dev;
  p->maxP2pBytes = kMaxNetSizeBytes;
  p->maxCollBytes = 512 << 20;  // MAX_COLLNET_SIZE (unused for a net)
  p->maxMultiRequestSize = 1;
  p->railId = -1;  // NCCL_NET_ID_UNDEF
  p->planeId = -1;
  return ncclSuccess;
}

// ---- listen / connect / accept -------------------------------------------------------

ncclResult_t Listen(void*, int dev, void* opaque_handle, void** listen_comm) {
  *listen_comm = nullptr;
  Dev d;
  if (!DevOf(dev, &d)) return ncclInvalidArgument;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    Warn(kLog, std::string("listen: socket: ") + std::strerror(errno));
    return ncclSystemError;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = d.ip;
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 16384) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Warn(kLog, "listen on " + IpStr(d.ip) + ": " + std::strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  auto* l = new ListenComm;
  l->fd = fd;
  l->dev = dev;
  std::random_device rd;
  l->token = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(fd);
  Handle h{};
  h.magic = kHandleMagic;
  h.dev = static_cast<uint32_t>(dev);
  h.ip = d.ip;
  h.port = a.sin_port;
  h.token = l->token;
  std::memset(opaque_handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  std::memcpy(opaque_handle, &h, sizeof h);
  *listen_comm = l;
  return ncclSuccess;
}

Comm* NewComm(int fd, bool is_send, int dev) {
  auto* c = new Comm;
  c->fd = fd;
  c->is_send = is_send;
  c->dev = dev;
  for (auto& r : c->reqs) r.comm = c;
  return c;
}

ncclResult_t Connect(void*, int dev, void* opaque_handle, void** send_comm) {
  *send_comm = nullptr;
  Handle h;
  std::memcpy(&h, opaque_handle, sizeof h);
  if (h.magic != kHandleMagic) {
    Warn(kLog, "connect: not a handle of this plugin");
    return ncclInvalidArgument;
  }
  Stage& st = h.stage;
  auto save = [&]() { std::memcpy(opaque_handle, &h, sizeof h); };
  auto fail = [&](const std::string& why, ncclResult_t rc) {
    Warn(kLog, "connect to " + IpStr(h.ip) + ":" + std::to_string(ntohs(h.port)) + ": " + why);
    if (st.state != 0 && st.fd >= 0) close(st.fd);
    st = Stage{};
    save();
    return rc;
  };
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = h.ip;
  a.sin_port = h.port;
  double now = Now();
  if (st.state == 0) {
    st.deadline = now + ConnectTimeout();
    st.dev = static_cast<uint32_t>(dev);
    st.fd = -1;
  }
  if (st.state == 0 || st.fd < 0) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return fail(std::string("socket: ") + std::strerror(errno), ncclSystemError);
    Dev d;
    if (DevOf(dev, &d)) {  // leave from the device's address (the rail NCCL chose)
      sockaddr_in me{};
      me.sin_family = AF_INET;
      me.sin_addr.s_addr = d.ip;
      bind(fd, reinterpret_cast<sockaddr*>(&me), sizeof me);  // best effort
    }
    TuneDataSocket(fd);
    st.fd = fd;
    st.state = 1;
    st.hello_sent = 0;
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
      if (errno == ECONNREFUSED || errno == EAGAIN) {  // retried until the deadline
        close(fd);
        st.fd = -1;
        if (now > st.deadline) return fail("refused until the timeout", ncclRemoteError);
        save();
        return ncclSuccess;
      }
      return fail(std::string("connect: ") + std::strerror(errno), ncclRemoteError);
    }
  }
  if (st.state == 1) {
    int err = 0;
    socklen_t len = sizeof err;
    sockaddr_in peer{};
    socklen_t plen = sizeof peer;
    if (getpeername(st.fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) {
      getsockopt(st.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0 || err == EINPROGRESS || err == EALREADY) {  // still connecting
        if (now > st.deadline) return fail("no connection within the timeout", ncclRemoteError);
        save();
        return ncclSuccess;
      }
      if (err == ECONNREFUSED) {
        close(st.fd);
        st.fd = -1;
        if (now > st.deadline) return fail("refused until the timeout", ncclRemoteError);
        save();
        return ncclSuccess;
      }
      return fail(std::string("connect: ") + std::strerror(err), ncclRemoteError);
    }
    st.state = 2;
  }
  // state 2: the hello
  uint8_t hello[16];
  std::memcpy(hello, &kHelloMagic, 8);
  std::memcpy(hello + 8, &h.token, 8);
  while (st.hello_sent < sizeof hello) {
    ssize_t n = send(st.fd, hello + st.hello_sent, sizeof hello - st.hello_sent,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (now > st.deadline) return fail("hello not sent within the timeout", ncclRemoteError);
      save();
      return ncclSuccess;
    }
    if (n < 0) return fail(std::string("send: ") + std::strerror(errno), ncclRemoteError);
    st.hello_sent += static_cast<uint32_t>(n);
  }
  *send_comm = NewComm(st.fd, true, dev);
  st = Stage{};  // a later connect with this handle starts afresh
  save();
  return ncclSuccess;
}

ncclResult_t Accept(void* listen_comm, void** recv_comm) {
  *recv_comm = nullptr;
  auto* l = static_cast<ListenComm*>(listen_comm);
  double now = Now();
  if (l->first_accept == 0) l->first_accept = now;
  double timeout = ConnectTimeout();
  for (;;) {
    if (l->pending < 0) {
      int fd = accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
            errno == ECONNABORTED) {
          if (now - l->first_accept > timeout) {
            Warn(kLog, "accept: no peer connected within " + std::to_string(timeout) + " s");
            return ncclRemoteError;
          }
          return ncclSuccess;
        }
        Warn(kLog, std::string("accept: ") + std::strerror(errno));
        return ncclSystemError;
      }
      TuneDataSocket(fd);
      l->pending = fd;
      l->hello_got = 0;
      l->pending_deadline = now + timeout;
    }
    while (l->hello_got < sizeof l->hello) {
      ssize_t n = recv(l->pending, l->hello + l->hello_got, sizeof l->hello - l->hello_got,
                       MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (now > l->pending_deadline) {
          Warn(kLog, "accept: a peer connected but sent no hello within the timeout");
          return ncclRemoteError;
        }
        return ncclSuccess;
      }
      if (n <= 0) break;  // closed or reset before its hello: drop it, keep listening
      l->hello_got += static_cast<uint32_t>(n);
    }
    uint64_t magic = 0, token = 0;
    std::memcpy(&magic, l->hello, 8);
    std::memcpy(&token, l->hello + 8, 8);
    if (l->hello_got == sizeof l->hello && magic == kHelloMagic && token == l->token) {
      *recv_comm = NewComm(l->pending, false, l->dev);
      l->pending = -1;
      return ncclSuccess;
    }
    Info(kLog, "accept: dropped a connection without this listener's hello");
    close(l->pending);
    l->pending = -1;
  }
}

// ---- memory ----------------------------------------------------------------------------

// Refused registrations are only info: NCCL's GDR probe tries CUDA memory first.
using Memory = heroserve::netplugin::HostMemory<LogName, Info>;

// ---- data ------------------------------------------------------------------------------

Request* NewRequest(Comm* c) {
  for (auto& r : c->reqs) {
    if (!r.used) {
      Request* comm_back = &r;
      r = Request{};
      r.comm = c;
      r.used = true;
      return comm_back;
    }
  }
  return nullptr;
}

void FailComm(Comm* c, const std::string& why) {
  if (c->error.empty()) {
    c->error = why;
    Warn(kLog, std::string(c->is_send ? "send" : "receive") + " comm: " + why);
  }
}

// Moves bytes for the requests in posting order until the socket would block.
void Progress(Comm* c) {
  while (c->error.empty() && !c->fifo.empty()) {
    Request* r = c->fifo.front();
    if (r->send) {
      while (r->hdr_done < 8 || r->done < r->size) {
        iovec iov[2];
        int n = 0;
        if (r->hdr_done < 8) iov[n++] = {r->hdr + r->hdr_done, 8 - r->hdr_done};
        if (r->done < r->size) iov[n++] = {r->data + r->done, r->size - r->done};
        msghdr m{};
        m.msg_iov = iov;
        m.msg_iovlen = n;
        ssize_t k = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
          FailComm(c, std::string("peer gone: ") + std::strerror(errno));
          return;
        }
        size_t left = static_cast<size_t>(k);
        size_t h = std::min(left, 8 - r->hdr_done);
        r->hdr_done += h;
        left -= h;
        r->done += left;
      }
    } else {
      while (r->hdr_done < 8) {
        ssize_t k = recv(c->fd, r->hdr + r->hdr_done, 8 - r->hdr_done, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (k <= 0) {
          FailComm(c, k == 0 ? "the peer closed the connection"
                             : std::string("peer gone: ") + std::strerror(errno));
          return;
        }
        r->hdr_done += static_cast<size_t>(k);
        if (r->hdr_done == 8) {
          uint64_t m = 0;
          for (int i = 7; i >= 0; i--) m = m << 8 | r->hdr[i];
          if (m > r->size) {
            FailComm(c, "a message of " + std::to_string(m) + " bytes for a receive of " +
                            std::to_string(r->size));
            return;
          }
          r->msg = m;
        }
      }
      while (r->done < r->msg) {
        ssize_t k = recv(c->fd, r->data + r->done, r->msg - r->done, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (k <= 0) {
          FailComm(c, k == 0 ? "the peer closed the connection mid-message"
                             : std::string("peer gone: ") + std::strerror(errno));
          return;
        }
        r->done += static_cast<size_t>(k);
      }
    }
    r->complete = true;
    c->bytes += r->send ? r->size : r->msg;
    c->fifo.pop_front();
  }
}

ncclResult_t Isend(void* send_comm, void* data, size_t size, int, void*, void** request) {
  *request = nullptr;
  auto* c = static_cast<Comm*>(send_comm);
  if (!c->error.empty()) return ncclRemoteError;
  Request* r = NewRequest(c);
  if (r == nullptr) return ncclSuccess;  // NCCL posts again
  r->send = true;
  r->data = static_cast<uint8_t*>(data);
  r->size = size;
  uint64_t m = size;
  for (int i = 0; i < 8; i++) r->hdr[i] = static_cast<uint8_t>(m >> (8 * i));
  c->fifo.push_back(r);
  Progress(c);
  *request = r;
  return ncclSuccess;
}

ncclResult_t Irecv(void* recv_comm, int n, void** data, size_t* sizes, int*, void**, void**,
                   void** request) {
  *request = nullptr;
  auto* c = static_cast<Comm*>(recv_comm);
  if (n != 1) {  // maxRecvs = 1
    Warn(kLog, "irecv: " + std::to_string(n) + " grouped receives (maxRecvs is 1)");
    return ncclInternalError;
  }
  if (!c->error.empty()) return ncclRemoteError;
  Request* r = NewRequest(c);
  if (r == nullptr) return ncclSuccess;
  r->send = false;
  r->data = static_cast<uint8_t*>(data[0]);
  r->size = sizes[0];
  c->fifo.push_back(r);
  Progress(c);
  *request = r;
  return ncclSuccess;
}

ncclResult_t Iflush(void* recv_comm, int, void**, int*, void**, void** request) {
  // Host memory: the bytes are in place when test() reports the receive done.
  *request = nullptr;
  auto* c = static_cast<Comm*>(recv_comm);
  Request* r = NewRequest(c);
  if (r == nullptr) return ncclSuccess;
  r->flush = true;
  r->complete = true;
  *request = r;
  return ncclSuccess;
}

ncclResult_t Test(void* request, int* done, int* sizes) {
  auto* r = static_cast<Request*>(request);
  Comm* c = r->comm;
  *done = 0;
  if (!r->complete) Progress(c);
  if (!r->complete) {
    if (!c->error.empty()) {
      r->used = false;
      return ncclRemoteError;
    }
    return ncclSuccess;
  }
  *done = 1;
  if (sizes != nullptr) {
    size_t s = r->flush ? 0 : r->send ? r->size : r->msg;
    *sizes = s > INT_MAX ? INT_MAX : static_cast<int>(s);
  }
  r->used = false;
  return ncclSuccess;
}

ncclResult_t CloseComm(void* comm) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr) return ncclSuccess;
  if (c->fd >= 0) close(c->fd);
  delete c;
  return ncclSuccess;
}

ncclResult_t CloseListen(void* listen_comm) {
  auto* l = static_cast<ListenComm*>(listen_comm);
  if (l == nullptr) return ncclSuccess;
  if (l->pending >= 0) close(l->pending);
  if (l->fd >= 0) close(l->fd);
  delete l;
  return ncclSuccess;
}

ncclResult_t Finalize(void* ctx) {
  delete static_cast<Context*>(ctx);
  return ncclSuccess;
}

// ---- version adapters ------------------------------------------------------------------

using Older = heroserve::netplugin::OlderProps<GetProperties>;

ncclResult_t InitV8(ncclDebugLogger_t l) { return Init(nullptr, 0, l); }
ncclResult_t InitV10(ncclDebugLogger_t l, ncclProfilerCallback_t) { return Init(nullptr, 0, l); }
template <typename Cfg>
ncclResult_t InitV11(void** ctx, uint64_t id, Cfg*, ncclDebugLogger_t l, ncclProfilerCallback_t) {
  return Init(ctx, id, l);
}
ncclResult_t ListenNoCtx(int dev, void* h, void** l) { return Listen(nullptr, dev, h, l); }
template <typename D>
ncclResult_t ConnectV8(int dev, void* h, void** s, D**) { return Connect(nullptr, dev, h, s); }
template <typename Cfg, typename D>
ncclResult_t ConnectV10(int dev, Cfg*, void* h, void** s, D**) { return Connect(nullptr, dev, h, s); }
template <typename D>
ncclResult_t ConnectV11(void* ctx, int dev, void* h, void** s, D**) { return Connect(ctx, dev, h, s); }
template <typename D>
ncclResult_t AcceptAny(void* l, void** r, D**) { return Accept(l, r); }

ncclResult_t IsendV8(void* c, void* d, int size, int tag, void* m, void** req) {
  if (size < 0) return ncclInvalidArgument;
  return Isend(c, d, static_cast<size_t>(size), tag, m, req);
}
ncclResult_t IsendV9(void* c, void* d, size_t size, int tag, void* m, void** req) {
  return Isend(c, d, size, tag, m, req);
}
ncclResult_t IsendV10(void* c, void* d, size_t size, int tag, void* m, void*, void** req) {
  return Isend(c, d, size, tag, m, req);
}
ncclResult_t IrecvV8(void* c, int n, void** d, int* sizes, int* tags, void** m, void** req) {
  if (n != 1 || sizes[0] < 0) return ncclInternalError;
  size_t s = static_cast<size_t>(sizes[0]);
  return Irecv(c, n, d, &s, tags, m, nullptr, req);
}
ncclResult_t IrecvV9(void* c, int n, void** d, size_t* sizes, int* tags, void** m, void** req) {
  return Irecv(c, n, d, sizes, tags, m, nullptr, req);
}

}  // namespace

// getDeviceMr, irecvConsumed, makeVDevice and setNetAttr are NULL, as in NCCL's socket net
// (src/transport/net_socket.cc, ncclNetSocket): NCCL calls the first two only for device
// offload (netDeviceType != NCCL_NET_DEVICE_HOST), and checks the last two for NULL
// (src/graph/topo.cc, src/transport/net.cc setNetAttrs; net_v9..v11.cc adapters).
extern "C" {

__attribute__((visibility("default"))) ncclNet_v12_t ncclNetPlugin_v12 = {
    kName,        InitV11<ncclNetCommConfig_v12_t>, Devices, GetProperties, Listen,
    ConnectV11<ncclNetDeviceHandle_v12_t>, AcceptAny<ncclNetDeviceHandle_v12_t>, Memory::RegMr,
    Memory::RegMrDmaBuf, Memory::DeregMr, IsendV10, Irecv, Iflush, Test, CloseComm, CloseComm, CloseListen,
    nullptr,      nullptr, nullptr, Finalize, nullptr};

__attribute__((visibility("default"))) ncclNet_v11_t ncclNetPlugin_v11 = {
    kName,        InitV11<ncclNetCommConfig_v11_t>, Devices, Older::V11, Listen,
    ConnectV11<ncclNetDeviceHandle_v11_t>, AcceptAny<ncclNetDeviceHandle_v11_t>, Memory::RegMr,
    Memory::RegMrDmaBuf, Memory::DeregMr, IsendV10, Irecv, Iflush, Test, CloseComm, CloseComm, CloseListen,
    nullptr,      nullptr, nullptr, Finalize, nullptr};

__attribute__((visibility("default"))) ncclNet_v10_t ncclNetPlugin_v10 = {
    kName,        InitV10, Devices, Older::V9To11<ncclNetProperties_v10_t>, ListenNoCtx,
    ConnectV10<ncclNetCommConfig_v10_t, ncclNetDeviceHandle_v10_t>,
    AcceptAny<ncclNetDeviceHandle_v10_t>, Memory::RegMr, Memory::RegMrDmaBuf, Memory::DeregMr, IsendV10, Irecv, Iflush,
    Test,         CloseComm, CloseComm, CloseListen, nullptr, nullptr, nullptr};

__attribute__((visibility("default"))) ncclNet_v9_t ncclNetPlugin_v9 = {
    kName,        InitV8, Devices, Older::V9To11<ncclNetProperties_v9_t>, ListenNoCtx,
    ConnectV8<ncclNetDeviceHandle_v9_t>, AcceptAny<ncclNetDeviceHandle_v9_t>, Memory::RegMr,
    Memory::RegMrDmaBuf, Memory::DeregMr, IsendV9, IrecvV9, Iflush, Test, CloseComm, CloseComm, CloseListen,
    nullptr,      nullptr, nullptr};

__attribute__((visibility("default"))) ncclNet_v8_t ncclNetPlugin_v8 = {
    kName,        InitV8, Devices, Older::V8, ListenNoCtx,
    ConnectV8<ncclNetDeviceHandle_v8_t>, AcceptAny<ncclNetDeviceHandle_v8_t>, Memory::RegMr,
    Memory::RegMrDmaBuf, Memory::DeregMr, IsendV8, IrecvV8, Iflush, Test, CloseComm, CloseComm, CloseListen,
    nullptr,      nullptr};

}  // extern "C"
