#include "daemon.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "address.h"
#include "heroserve/log.h"
#include "heroserve/v1/control.grpc.pb.h"
#include "heroserve/v1/control.pb.h"
#include "table_json.h"

namespace heroserve::agent {

namespace pb = heroserve::v1;
constexpr const char* kAgentVersion = "heroserve-gpu-agent " HEROSERVE_VERSION;
constexpr size_t kKeepVersions = 4;
constexpr size_t kMaxErrorsNamed = 8;  // an ack names this many errors, then counts the rest

// The shared log format (heroserve/log.h), logger heroserve.gpu-agent; "WARN" is WARNING.
void Log(const char* level, const std::string& msg) {
  log::Level l = log::Level::kInfo;
  if (!log::ParseLevel(level, &l) && std::string(level) == "WARN") l = log::Level::kWarning;
  log::Write(l, "heroserve.gpu-agent", msg);
}

namespace {

bool ReadFile(const std::string& path, std::string* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot read " + path;
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  if (out->empty()) {
    *error = path + " is empty";
    return false;
  }
  return true;
}

bool IsLoopbackController(const std::string& address) {
  HostPort hp;
  return ParseHostPort(address, &hp, nullptr) && IsLoopbackHost(hp.host);
}

// 64 random bits as 16 hex digits: two daemons' runs never share a generation.
std::string NewWriterGeneration() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string Secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::shared_ptr<grpc::ChannelCredentials> Credentials(const Options& o, std::string* error) {
  if (o.tls_ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!ReadFile(o.tls_ca, &ssl.pem_root_certs, error) ||
      !ReadFile(o.tls_cert, &ssl.pem_cert_chain, error) ||
      !ReadFile(o.tls_key, &ssl.pem_private_key, error)) {
    *error = "TLS: " + *error;
    return nullptr;
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

namespace {
std::vector<std::string> GpuIds(const Options& o) {
  std::vector<std::string> ids;
  for (const auto& g : o.gpus) ids.push_back(g.gpu_id);
  return ids;
}
}  // namespace

Daemon::Daemon(Options opts)
    : opts_(std::move(opts)),
      writer_generation_(NewWriterGeneration()),
      ina_(opts_.ina, GpuIds(opts_)) {}
Daemon::~Daemon() = default;

void Daemon::Stop() {
  stop_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  if (stream_ctx_) stream_ctx_->TryCancel();
  cv_.notify_all();
}

bool Daemon::Sleep(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return stop_.load(); });
  return !stop_.load();
}

bool Daemon::InstallTable(const pb::PolicyTable& t, Group* g, std::string* error) {
  auto table = std::make_shared<PolicyTable>();
  std::string why;
  if (!ParseTable(TableJson(t), table.get(), &why)) {
    *error = "table " + t.group_id() + " v" + std::to_string(t.version()) + ": " + why;
    return false;
  }
  auto& ts = g->tables;
  if (!ts.empty() && table->version <= ts.back()->version) {
    for (auto& old : ts) {
      if (old->version == table->version) {
        old = table;  // a re-sent version (full state after a reconnect): replace
        return true;
      }
    }
    // Below the newest version held: the plugin refuses it (versions only grow), so taking
    // it would acknowledge a table NCCL never uses. Refuse it, and say so in the ack.
    *error = "table " + t.group_id() + " v" + std::to_string(t.version()) +
             " is below version " + std::to_string(ts.back()->version) +
             " already published: refused (versions must grow)";
    return false;
  }
  if (!ts.empty() && table->version - ts.back()->version > kMaxVersionJump) {
    // The plugin would refuse it (docs/policy-table.md): say so rather than ack it.
    *error = "table " + t.group_id() + " v" + std::to_string(t.version()) + " jumps more than " +
             std::to_string(kMaxVersionJump) + " versions above version " +
             std::to_string(ts.back()->version) + ": refused";
    return false;
  }
  ts.push_back(std::move(table));
  if (ts.size() > kKeepVersions) ts.erase(ts.begin());
  return true;
}

bool Daemon::Publish(const std::string& group_id, Group* g, std::string* error) {
  if (!g->seg) {
    g->seg = std::make_unique<shm::Segment>();
    if (!g->seg->Create(shm::SegmentName(group_id), opts_.shm_capacity, error)) {
      g->seg.reset();
      return false;
    }
  }
  json::Value doc = json::Value::Object();
  doc.set("writer_generation", json::Value::String(writer_generation_));
  json::Value list = json::Value::Array();
  for (const auto& t : g->tables) list.push_back(TableToJsonValue(*t));
  doc.set("tables", std::move(list));
  uint64_t newest = g->tables.empty() ? 0 : g->tables.back()->version;
  return g->seg->Publish(json::Write(doc), newest, error);
}

void Daemon::Drop(std::map<std::string, Group>::iterator it) {
  if (Group& g = it->second; g.seg) {
    // Retire first: a reader mapping it lets go and looks the name up again, so it finds the
    // group's next segment if the group comes back (an unlinked file's counter never moves).
    json::Value doc = json::Value::Object();
    doc.set("writer_generation", json::Value::String(writer_generation_));
    doc.set("retired", json::Value::Bool(true));
    doc.set("tables", json::Value::Array());
    std::string e;
    if (!g.seg->Publish(json::Write(doc), 0, &e) || !g.seg->Unlink(&e)) {
      Log("WARN", "removing the segment of group " + it->first + ": " + e);
    }
  }
  groups_.erase(it);
}

Daemon::Outcome Daemon::ApplyUpdate(const pb::PolicyUpdate& u, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!u.full() && (u.generation() != generation_ || u.epoch() <= last_epoch_)) {
    Log("INFO", "ignoring stale update epoch " + std::to_string(u.epoch()) +
                    (u.generation() != generation_ ? " (another controller generation)" : ""));
    return Outcome::kIgnored;
  }
  if (u.full() && u.generation() != generation_) {
    // A controller that lost its state counts epochs from 1 again: its epochs are not
    // comparable with ours. Its full state replaces everything below.
    if (!generation_.empty()) {
      Log("WARN", "controller generation changed (" + generation_ + " -> " + u.generation() +
                      "): resynchronising from its full state");
    }
    generation_ = u.generation();
    last_epoch_ = 0;
  }
  if (!u.has_gpu_policy()) {
    std::vector<std::string> ina_errors;  // a full update without a body: no INA groups
    if (u.full()) ina_.Apply(pb::GpuPolicy(), true, &ina_errors);
    for (const auto& e : ina_errors) Log("ERROR", e);
    last_epoch_ = u.epoch();
    return Outcome::kApplied;  // nothing for a GPU agent (an empty full update carries no body)
  }
  const pb::GpuPolicy& gp = u.gpu_policy();
  std::vector<std::string> errors;
  if (u.full()) {
    std::map<std::string, bool> keep;
    for (const auto& t : gp.tables()) keep[t.group_id()] = true;
    for (auto it = groups_.begin(); it != groups_.end();) {
      if (keep.count(it->first)) {
        ++it;
      } else {
        Drop(it++);
      }
    }
  }
  for (const auto& id : gp.removed_group_ids()) {
    if (auto it = groups_.find(id); it != groups_.end()) Drop(it);
  }
  std::map<std::string, bool> touched;
  size_t over_cap = 0;
  for (const auto& t : gp.tables()) {
    if (!groups_.count(t.group_id()) && groups_.size() >= kMaxGroups) {
      if (over_cap++ == 0) {
        errors.push_back("group " + t.group_id() + " refused: this agent holds at most " +
                         std::to_string(kMaxGroups) + " groups");
      }
      continue;
    }
    Group& g = groups_[t.group_id()];
    std::string e;
    if (t.group_id().empty() || !InstallTable(t, &g, &e)) {
      errors.push_back(e.empty() ? "a table has no group_id" : e);
      continue;
    }
    touched[t.group_id()] = true;
  }
  for (const auto& kv : touched) {
    Group& g = groups_[kv.first];
    std::string e;
    if (!Publish(kv.first, &g, &e)) {
      errors.push_back("publish " + kv.first + ": " + e);
    } else {
      Log("INFO", "published group " + kv.first + " version " +
                      std::to_string(g.tables.back()->version) + " (applies from collective " +
                      std::to_string(g.tables.back()->apply_from_seq) + ")");
    }
  }
  ina_.Apply(gp, u.full(), &errors);
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->second.tables.empty()) {
      Drop(it++);
    } else {
      ++it;
    }
  }
  last_epoch_ = u.full() ? u.epoch() : std::max(last_epoch_, u.epoch());
  if (over_cap > 1) errors.push_back(std::to_string(over_cap - 1) + " more group(s) refused");
  if (!errors.empty()) {
    std::string all;
    for (size_t k = 0; k < errors.size() && k < kMaxErrorsNamed; ++k) {
      all += (all.empty() ? "" : "; ") + errors[k];
    }
    if (errors.size() > kMaxErrorsNamed) {
      all += "; and " + std::to_string(errors.size() - kMaxErrorsNamed) + " more error(s)";
    }
    *error = all;
    Log("ERROR", "epoch " + std::to_string(u.epoch()) + ": " + all +
                     " (keeping the last good tables)");
    return Outcome::kFailed;
  }
  return Outcome::kApplied;
}

void Daemon::FillTelemetry(pb::TelemetryReport* r) {
  for (auto& kv : groups_) {
    Group& g = kv.second;
    if (!g.seg) continue;
    for (const auto& [key, a] : g.counted.Update(g.seg->ReadSlots())) {
      if (a.selections == 0) continue;
      const PolicyTable* table = nullptr;
      for (const auto& t : g.tables) {
        if (t->version == key.first) table = t.get();
      }
      if (!table || key.second >= table->policies.size()) continue;
      pb::PolicySelection* s = r->add_selections();
      s->set_group_id(kv.first);
      s->set_version(key.first);
      s->set_policy_id(table->policies[key.second].id);
      s->set_selections(a.selections);
      s->set_bytes(a.bytes);
      s->set_last_seq(a.last_seq);
    }
  }
}

void Daemon::TelemetryLoop() {
  auto last = std::chrono::steady_clock::now();
  while (true) {
    double interval;
    {
      std::lock_guard<std::mutex> lock(mu_);
      interval = opts_.telemetry_interval_s > 0 ? opts_.telemetry_interval_s
                                                : telemetry_interval_s_;
    }
    if (!Sleep(std::max(0.05, interval))) return;
    pb::TelemetryReport report;
    pb::Control::Stub* stub = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (session_.empty() || !stub_) continue;
      stub = static_cast<pb::Control::Stub*>(stub_);
      auto now = std::chrono::steady_clock::now();
      report.mutable_identity()->set_node_id(opts_.node_id);
      report.mutable_identity()->set_kind(pb::NODE_KIND_GPU);
      report.set_session_id(session_);
      report.set_timestamp_ns(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count()));
      report.set_window_s(std::chrono::duration<double>(now - last).count());
      last = now;
      FillTelemetry(&report);
      AddNvlinkLinks(nvml_.Sample(), &report);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::TelemetryAck ack;
    grpc::Status st = stub->ReportTelemetry(&ctx, report, &ack);
    if (!st.ok()) {
      Log("WARN", "telemetry: " + st.error_message() + " (code " +
                      std::to_string(static_cast<int>(st.error_code())) + ")");
    } else if (report.selections_size() > 0) {
      Log("INFO", "telemetry: reported " + std::to_string(report.selections_size()) +
                      " selection record(s), controller accepted " +
                      std::to_string(ack.accepted()));
    }
  }
}

void Daemon::AddNvlinkLinks(const std::vector<NvlinkSample>& samples,
                            heroserve::v1::TelemetryReport* report) const {
  // The link ids of the topology (docs/topology.md): a GPU and its server's NVSwitch node,
  // or, on a mesh board (no such node), each pair of GPUs. NVML counts a GPU's NVLink
  // traffic over all its links, not per peer, so a pair's link is reported with the smaller
  // of its two ends' figures: no link carries more than either end sends or receives.
  std::vector<std::pair<std::string, const NvlinkSample*>> gpus;
  for (const auto& s : samples) {
    std::string gpu;
    for (const auto& spec : opts_.gpus) {
      if (spec.local_index == static_cast<int>(s.index)) gpu = spec.gpu_id;
    }
    if (gpu.empty()) {
      if (opts_.nvlink_mesh) continue;  // a mesh link names two GPUs of the plan
      gpu = opts_.node_id + "-gpu" + std::to_string(s.index);
    }
    gpus.emplace_back(gpu, &s);
  }
  auto add = [report](const std::string& a, const std::string& b, double util, double bytes) {
    pb::LinkUtilisation* l = report->add_links();
    l->set_link_id(a < b ? a + "|" + b : b + "|" + a);
    l->set_utilisation(util);
    l->set_bytes_per_s(bytes);
  };
  for (size_t i = 0; i < gpus.size(); ++i) {
    const NvlinkSample& x = *gpus[i].second;
    const double bx = std::max(x.tx_bytes_s, x.rx_bytes_s);
    if (!opts_.nvlink_mesh) {
      add(gpus[i].first, opts_.nvlink_peer.empty() ? opts_.node_id + "-nvsw" : opts_.nvlink_peer,
          x.utilisation, bx);
      continue;
    }
    for (size_t j = i + 1; j < gpus.size(); ++j) {
      const NvlinkSample& y = *gpus[j].second;
      add(gpus[i].first, gpus[j].first, std::min(x.utilisation, y.utilisation),
          std::min(bx, std::max(y.tx_bytes_s, y.rx_bytes_s)));
    }
  }
}

int Daemon::Run() {
  std::string why;
  if (nvml_.Load(&why)) {
    Log("INFO", "NVML: " + std::to_string(nvml_.devices().size()) + " GPU(s)");
  } else {
    Log("INFO", why);
  }
  if (opts_.tls_ca.empty()) {
    Log("WARN", "insecure (no TLS) connection to " + opts_.controller +
                    (IsLoopbackController(opts_.controller) ? " on loopback" : ""));
  }
  std::thread telemetry([this] { TelemetryLoop(); });
  double backoff = 0.2;
  while (!stop_.load()) {
    std::string error;
    auto creds = Credentials(opts_, &error);
    if (!creds) {
      Log("ERROR", error + "; retrying in " + Secs(backoff));
      if (!Sleep(backoff)) break;
      backoff = std::min(opts_.max_backoff_s, backoff * 2);
      continue;
    }
    grpc::ChannelArguments args;
    if (!opts_.tls_server_name.empty()) args.SetSslTargetNameOverride(opts_.tls_server_name);
    auto channel = grpc::CreateCustomChannel(opts_.controller, creds, args);
    auto stub = pb::Control::NewStub(channel);

    pb::RegisterRequest reg;
    reg.mutable_identity()->set_node_id(opts_.node_id);
    reg.mutable_identity()->set_kind(pb::NODE_KIND_GPU);
    reg.set_agent_version(kAgentVersion);
    {
      // What we hold and from which controller generation: a controller that lost its
      // database issues table versions above these, applying after these sequence numbers.
      std::lock_guard<std::mutex> lock(mu_);
      reg.set_last_applied_epoch(last_epoch_);
      reg.set_generation(generation_);
      for (const auto& [group_id, g] : groups_) {
        if (g.tables.empty()) continue;
        auto* h = reg.add_held_tables();
        h->set_group_id(group_id);
        h->set_version(g.tables.back()->version);
        uint64_t last_seq = 0;
        if (g.seg) {
          for (const auto& slot : g.seg->ReadSlots()) last_seq = std::max(last_seq, slot.last_seq);
        }
        h->set_last_seq(last_seq);
      }
    }
    auto* inv = reg.mutable_gpu();
    for (const auto& g : opts_.gpus) {
      auto* gi = inv->add_gpus();
      gi->set_gpu_id(g.gpu_id);
      gi->set_server(opts_.node_id);
      if (g.local_index >= 0) {
        gi->set_local_index(static_cast<uint32_t>(g.local_index));
        for (const auto& d : nvml_.devices()) {
          if (static_cast<int>(d.index) == g.local_index) {
            gi->set_gpu_type(d.name);
            gi->set_memory_bytes(d.memory_bytes);
          }
        }
      }
    }
    grpc::ClientContext rctx;
    rctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::RegisterResponse rresp;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_.load()) break;
      stream_ctx_ = &rctx;  // so Stop() cancels a registration in progress
    }
    grpc::Status st = stub->Register(&rctx, reg, &rresp);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ctx_ = nullptr;
    }
    if (!st.ok()) {
      Log("ERROR", "cannot register with the controller at " + opts_.controller + ": " +
                       st.error_message() + " (code " +
                       std::to_string(static_cast<int>(st.error_code())) + ")" +
                       (opts_.tls_ca.empty() ? ""
                                             : " [TLS: is the controller's certificate signed by "
                                               "--tls-ca, and ours by the controller's CA?]") +
                       "; retrying in " + Secs(backoff) + ", last good tables stay published");
      if (!Sleep(backoff)) break;
      backoff = std::min(opts_.max_backoff_s, backoff * 2);
      continue;
    }
    Log("INFO", "registered " + opts_.node_id + " with " + opts_.controller + " (epoch " +
                    std::to_string(rresp.current_epoch()) + ")");
    backoff = 0.2;
    grpc::ClientContext sctx;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_.load()) break;
      session_ = rresp.session_id();
      stub_ = stub.get();
      if (rresp.telemetry_interval_s() > 0) telemetry_interval_s_ = rresp.telemetry_interval_s();
      stream_ctx_ = &sctx;
    }
    pb::SubscribeRequest sreq;
    *sreq.mutable_identity() = reg.identity();
    sreq.set_session_id(rresp.session_id());
    auto reader = stub->Subscribe(&sctx, sreq);
    pb::PolicyUpdate upd;
    while (reader->Read(&upd)) {
      std::string err;
      Outcome outcome = ApplyUpdate(upd, &err);
      if (outcome == Outcome::kIgnored) continue;  // never acknowledge what was not applied
      bool ok = outcome == Outcome::kApplied;
      if (!upd.has_gpu_policy() && !upd.full()) continue;
      pb::AckRequest ack;
      *ack.mutable_identity() = reg.identity();
      ack.set_session_id(rresp.session_id());
      ack.set_epoch(upd.epoch());
      ack.set_ok(ok);
      if (!ok) ack.set_error(err);
      if (upd.epoch() == 0) continue;  // nothing applied yet on the controller
      grpc::ClientContext actx;
      actx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      pb::AckResponse aresp;
      grpc::Status as = stub->Ack(&actx, ack, &aresp);
      if (!as.ok()) Log("WARN", "ack of epoch " + std::to_string(upd.epoch()) + ": " +
                                    as.error_message());
    }
    st = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ctx_ = nullptr;
      session_.clear();
      stub_ = nullptr;
    }
    if (stop_.load()) break;
    Log("WARN", "policy stream ended: " + (st.ok() ? std::string("closed by the controller")
                                                   : st.error_message()) +
                    "; reconnecting");
    if (!Sleep(backoff)) break;
    backoff = std::min(opts_.max_backoff_s, backoff * 2);
  }
  Stop();
  telemetry.join();
  Log("INFO", "stopped");
  return 0;
}

}  // namespace heroserve::agent
