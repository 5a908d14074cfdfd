#include "group_config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "heroserve/json.h"

namespace heroserve::ina {
namespace {

bool Uint(const json::Value& o, const char* key, uint64_t lo, uint64_t hi, bool required,
          uint64_t* out, std::string* err) {
  const json::Value* v = o.find(key);
  if (v == nullptr) {
    if (required) *err = std::string("missing ") + key;
    return !required;
  }
  uint64_t u = 0;
  if (!v->as_uint64(&u) || u < lo || u > hi) {
    *err = std::string(key) + " must be an integer in [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]";
    return false;
  }
  *out = u;
  return true;
}

bool Seconds(const json::Value& o, const char* key, double* out, std::string* err) {
  const json::Value* v = o.find(key);
  if (v == nullptr) return true;
  if (!v->is_number() || !(v->as_double() > 0) || !std::isfinite(v->as_double()) ||
      v->as_double() > 3600) {
    *err = std::string(key) + " must be seconds in (0, 3600]";
    return false;
  }
  *out = v->as_double();
  return true;
}

bool Ipv4(const json::Value& o, const char* key, bool required, in_addr_t* out,
          std::string* err) {
  const json::Value* v = o.find(key);
  if (v == nullptr) {
    if (required) *err = std::string("missing ") + key;
    return !required;
  }
  in_addr a{};
  if (!v->is_string() || inet_pton(AF_INET, v->as_string().c_str(), &a) != 1) {
    *err = std::string(key) + " must be a dotted IPv4 address";
    return false;
  }
  *out = a.s_addr;
  return true;
}

bool ParseEntry(const json::Value& o, GroupEntry* e, std::string* err) {
  if (!o.is_object()) {
    *err = "an entry is a JSON object";
    return false;
  }
  GroupPolicy& p = e->policy;
  uint64_t u = 0;
  if (!Uint(o, "group_id", 1, MAX_GROUP_ID, true, &u, err)) return false;
  p.spec.group_id = static_cast<uint16_t>(u);
  if (!Uint(o, "num_workers", 1, MAX_WORKERS, true, &u, err)) return false;
  p.spec.num_workers = static_cast<uint8_t>(u);
  if (!Uint(o, "worker_id", 0, MAX_WORKERS - 1, true, &u, err)) return false;
  p.spec.worker_id = static_cast<uint8_t>(u);
  if (!Uint(o, "window", 1, MAX_AGGREGATOR_SLOTS - 1, true, &u, err)) return false;
  p.spec.window = static_cast<uint32_t>(u);
  if (!Ipv4(o, "switch_ip", true, &p.spec.switch_ip, err)) return false;
  u = INA_UDP_PORT;
  if (!Uint(o, "switch_port", 1, 65535, false, &u, err)) return false;
  p.spec.switch_port = static_cast<uint16_t>(u);
  u = 0;
  if (!Uint(o, "session", 0, SESSIONS - 1, false, &u, err)) return false;
  p.spec.session = static_cast<uint32_t>(u);
  u = 0;
  if (!Uint(o, "first_generation", 0, GENERATIONS - 1, false, &u, err)) return false;
  p.spec.first_generation = static_cast<uint32_t>(u);
  p.bind_ip = INADDR_ANY;
  if (!Ipv4(o, "bind_ip", false, &p.bind_ip, err)) return false;
  u = INA_UDP_PORT;
  if (!Uint(o, "bind_port", 0, 65535, false, &u, err)) return false;
  p.bind_port = static_cast<uint16_t>(u);
  if (!Seconds(o, "give_up_s", &p.timeouts.give_up_s, err) ||
      !Seconds(o, "initial_rto_s", &p.timeouts.initial_rto_s, err) ||
      !Seconds(o, "min_rto_s", &p.timeouts.min_rto_s, err) ||
      !Seconds(o, "max_rto_s", &p.timeouts.max_rto_s, err))
    return false;
  if (const json::Value* f = o.find("float_sums")) {
    if (!f->is_bool()) {
      *err = "float_sums must be true or false";
      return false;
    }
    p.float_sums = f->as_bool();
  }
  if (const json::Value* l = o.find("lane_format")) {
    const LaneFormat* f = l->is_string() ? LaneFormatByName(l->as_string().c_str()) : nullptr;
    if (f == nullptr) {
      *err = "lane_format must be \"int32\" or \"bfp16\" (agents/ina/packet.py LANE_FORMATS)";
      return false;
    }
    p.spec.lanes = *f;
  }
  if (p.spec.lanes.kind == LaneKind::kBfp16 && !p.float_sums) {
    *err = "lane_format \"bfp16\" carries float sums only: it needs float_sums true";
    return false;
  }
  for (const char* key : {"gpu", "group_name"}) {
    const json::Value* v = o.find(key);
    if (v != nullptr && (!v->is_string() || v->as_string().size() > kMaxConfigNameChars)) {
      *err = std::string(key) + " must be a string of at most " +
             std::to_string(kMaxConfigNameChars) + " characters";
      return false;
    }
  }
  if (const json::Value* c = o.find("comm_id")) {
    char* end = nullptr;
    if (!c->is_string() || c->as_string().empty()) {
      *err = "comm_id must be a string (hexadecimal, as 0x...)";
      return false;
    }
    e->comm_id = std::strtoull(c->as_string().c_str(), &end, 16);
    if (end == nullptr || *end != '\0') {
      *err = "comm_id must be hexadecimal";
      return false;
    }
    e->has_comm_id = true;
  }
  std::string bad = Validate(p.spec);
  if (!bad.empty()) {
    *err = bad;
    return false;
  }
  return true;
}

class FileSource : public GroupConfigSource {
 public:
  explicit FileSource(std::string path) : path_(std::move(path)) {}

  bool Claim(const GroupRequest& req, GroupPolicy* out, std::string* err) override {
    std::string text;
    if (!ReadConfigFile(path_, &text, err)) {
      *err = "HEROSERVE_INA_CONFIG " + path_ + ": " + *err;
      return false;
    }
    std::vector<GroupEntry> entries;
    if (!ParseGroupConfig(text, &entries, err)) {
      *err = path_ + ": " + *err;
      return false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    int pick = -1;
    for (size_t i = 0; i < entries.size() && pick < 0; i++) {
      if (entries[i].has_comm_id && req.comm_id != 0 && entries[i].comm_id == req.comm_id)
        pick = static_cast<int>(i);
    }
    for (size_t i = 0; i < entries.size() && pick < 0; i++) {
      if (!entries[i].has_comm_id && held_.count(static_cast<int>(i)) == 0)
        pick = static_cast<int>(i);
    }
    if (pick < 0) {
      *err = path_ + ": no INA group for this communicator (" + std::to_string(entries.size()) +
             " entries, " + std::to_string(held_.size()) + " held by open communicators)";
      return false;
    }
    held_.insert(pick);
    *out = entries[static_cast<size_t>(pick)].policy;
    out->entry = pick;
    return true;
  }

  void Release(const GroupPolicy& p) override {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(p.entry);
  }

 private:
  std::string path_;
  std::mutex mu_;
  std::set<int> held_;
};

}  // namespace

bool ReadConfigFile(const std::string& path, std::string* out, std::string* err) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *err = std::string("cannot open: ") + std::strerror(errno);
    return false;
  }
  struct stat st{};
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!ok) {
    *err = "not a regular file";
  } else if (static_cast<uint64_t>(st.st_size) > kMaxConfigBytes) {
    *err = "larger than " + std::to_string(kMaxConfigBytes) + " bytes";
    ok = false;
  }
  out->clear();
  char buf[65536];
  while (ok) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = std::string("read: ") + std::strerror(errno);
      ok = false;
    } else if (n == 0) {
      break;
    } else if (out->size() + static_cast<size_t>(n) > kMaxConfigBytes) {
      *err = "larger than " + std::to_string(kMaxConfigBytes) + " bytes";  // grew meanwhile
      ok = false;
    } else {
      out->append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return ok;
}

bool ParseGroupConfig(const std::string& text, std::vector<GroupEntry>* out, std::string* err) {
  json::Value doc;
  if (!json::Parse(text, &doc, err)) return false;
  const json::Value* groups = doc.find("groups");
  if (groups == nullptr || !groups->is_array()) {
    *err = "the document needs a \"groups\" array";
    return false;
  }
  if (groups->items().size() > 4096) {
    *err = "more than 4096 groups";
    return false;
  }
  out->clear();
  for (size_t i = 0; i < groups->items().size(); i++) {
    GroupEntry e;
    if (!ParseEntry(groups->items()[i], &e, err)) {
      *err = "groups[" + std::to_string(i) + "]: " + *err;
      return false;
    }
    out->push_back(e);
  }
  return true;
}

std::unique_ptr<GroupConfigSource> MakeFileGroupConfigSource(const std::string& path) {
  return std::make_unique<FileSource>(path);
}

bool LoadConfiguredGroups(std::vector<GroupEntry>* out, std::string* err) {
  const char* path = std::getenv("HEROSERVE_INA_CONFIG");
  if (path == nullptr || *path == '\0') {
    *err = "HEROSERVE_INA_CONFIG is not set: this process has no INA groups";
    return false;
  }
  std::string text;
  return ReadConfigFile(path, &text, err) && ParseGroupConfig(text, out, err);
}

std::unique_ptr<GroupConfigSource> MakeGroupConfigSource(std::string* err) {
  const char* path = std::getenv("HEROSERVE_INA_CONFIG");
  if (path == nullptr || *path == '\0') {
    *err = "HEROSERVE_INA_CONFIG is not set: this process has no INA groups";
    return nullptr;
  }
  return MakeFileGroupConfigSource(path);
}

}  // namespace heroserve::ina
