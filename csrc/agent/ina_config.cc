#include "ina_config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "group_config.h"
#include "heroserve/ina_wire.h"
#include "heroserve/json.h"
#include "heroserve/v1/control.pb.h"

namespace heroserve::agent {

namespace pb = heroserve::v1;

bool ParseInaEndpoint(const std::string& text, uint16_t default_port, InaEndpoint* out) {
  std::string host = text;
  uint16_t port = default_port;
  if (size_t colon = text.find(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    std::string p = text.substr(colon + 1);
    if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
      return false;
    unsigned long v = std::strtoul(p.c_str(), nullptr, 10);
    if (v < 1 || v > 65535) return false;
    port = static_cast<uint16_t>(v);
  }
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) != 1) return false;
  out->ip = a.s_addr;
  out->port = port;
  return true;
}

InaConfigWriter::InaConfigWriter(InaConfigOptions opts, std::vector<std::string> gpu_ids)
    : opts_(std::move(opts)), gpu_ids_(std::move(gpu_ids)) {}
InaConfigWriter::~InaConfigWriter() = default;

namespace {

std::string Dotted(in_addr_t ip) {
  char buf[INET_ADDRSTRLEN] = {};
  in_addr a{};
  a.s_addr = ip;
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

}  // namespace

std::string InaConfigWriter::Document(std::vector<std::string>* errors) const {
  json::Value groups = json::Value::Array();
  for (const auto& [gid, a] : held_) {
    std::string what = "INA group " + std::to_string(gid) + " (" + a->group_name() + ")";
    auto sw = opts_.switches.find(a->switch_());
    bool mine = false;
    for (const auto& m : a->members()) {
      bool ours = false;
      for (const auto& g : gpu_ids_) ours |= g == m.gpu();
      if (!ours) continue;
      mine = true;
      if (sw == opts_.switches.end()) break;  // named once below
      json::Value e = json::Value::Object();
      e.set("group_id", json::Value::Uint(gid));
      e.set("num_workers", json::Value::Uint(a->worker_count()));
      e.set("worker_id", json::Value::Uint(m.worker_id()));
      e.set("window", json::Value::Uint(a->slots().count()));
      e.set("switch_ip", json::Value::String(Dotted(sw->second.ip)));
      e.set("switch_port", json::Value::Uint(sw->second.port));
      e.set("session", json::Value::Uint(a->session()));
      e.set("first_generation", json::Value::Uint(a->first_generation()));
      e.set("bind_ip", json::Value::String(Dotted(opts_.bind.ip)));
      e.set("bind_port", json::Value::Uint(opts_.bind.port));
      if (!a->lane_format().empty()) e.set("lane_format", json::Value::String(a->lane_format()));
      // bfp16 lanes carry float sums only: a group the controller priced with them opts in
      if (a->lane_format() == "bfp16") e.set("float_sums", json::Value::Bool(true));
      e.set("gpu", json::Value::String(m.gpu()));
      e.set("group_name", json::Value::String(a->group_name()));
      // The plugin's parser decides: what it would refuse is not written.
      json::Value one = json::Value::Object();
      json::Value list = json::Value::Array();
      list.push_back(e);
      one.set("groups", std::move(list));
      std::vector<ina::GroupEntry> parsed;
      std::string why;
      if (static_cast<int>(m.worker_id()) >= a->members_size() ||
          a->worker_count() != static_cast<uint32_t>(a->members_size())) {
        errors->push_back(what + ": worker ids do not match its " +
                          std::to_string(a->members_size()) + " members; not written");
      } else if (!ina::ParseGroupConfig(json::Write(one), &parsed, &why)) {
        errors->push_back(what + ", GPU " + m.gpu() + ": " + why + "; not written");
      } else {
        groups.push_back(std::move(e));
      }
    }
    if (mine && sw == opts_.switches.end()) {
      errors->push_back(what + ": no address for switch " + a->switch_() +
                        " (--ina-switch NAME=IPV4[:PORT]); not written");
    }
  }
  json::Value doc = json::Value::Object();
  doc.set("groups", std::move(groups));
  return json::Write(doc);
}

void InaConfigWriter::Apply(const pb::GpuPolicy& gp, bool full, std::vector<std::string>* errors) {
  if (opts_.path.empty()) return;
  bool changed = !written_;
  if (full && !held_.empty()) {
    held_.clear();
    changed = true;
  }
  for (uint32_t gid : gp.removed_ina_group_ids()) changed |= held_.erase(gid) > 0;
  for (const auto& a : gp.ina()) {
    auto& slot = held_[a.group_id()];
    if (!slot) slot = std::make_unique<pb::InaAssignment>();
    slot->CopyFrom(a);
    changed = true;
  }
  if (!changed) return;
  std::string doc = Document(errors);
  std::string err;
  if (doc.size() > ina::kMaxConfigBytes) {
    errors->push_back("INA group configuration of " + std::to_string(doc.size()) +
                      " bytes exceeds " + std::to_string(ina::kMaxConfigBytes) + "; not written");
  } else if (!WriteFileAtomically(opts_.path, doc, &err)) {
    errors->push_back("INA group configuration " + opts_.path + ": " + err);
  } else {
    written_ = true;
  }
}

bool WriteFileAtomically(const std::string& path, const std::string& text, std::string* err) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    *err = "cannot create " + tmp + ": " + std::strerror(errno);
    return false;
  }
  size_t done = 0;
  bool ok = true;
  while (ok && done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *err = std::string("write: ") + std::strerror(errno);
      ok = false;
    } else {
      done += static_cast<size_t>(n);
    }
  }
  if (ok && ::fsync(fd) != 0) {
    *err = std::string("fsync: ") + std::strerror(errno);
    ok = false;
  }
  ::close(fd);
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    *err = "rename to " + path + ": " + std::strerror(errno);
    ok = false;
  }
  if (!ok) ::unlink(tmp.c_str());
  return ok;
}

}  // namespace heroserve::agent
