#include <cstdint>
#include "heroserve/policy.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace heroserve {

const char* SchemeName(Scheme s) {
  switch (s) {
    case Scheme::kIna: return "ina";
    case Scheme::kRing: return "ring";
    case Scheme::kNvls: return "nvls";
    case Scheme::kHier: return "hier";
  }
  return "?";
}

bool ParseScheme(std::string_view name, Scheme* out) {
  for (Scheme s : {Scheme::kIna, Scheme::kRing, Scheme::kNvls, Scheme::kHier}) {
    if (name == SchemeName(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}

int PolicyTable::LinkIndex(std::string_view id) const {
  for (size_t i = 0; i < link_ids.size(); ++i) {
    if (link_ids[i] == id) return static_cast<int>(i);
  }
  return -1;
}

namespace {

bool Fail(std::string* error, std::string msg) {
  if (error) *error = std::move(msg);
  return false;
}

bool Number(const json::Value* v, const std::string& what, double* out, std::string* error) {
  if (!v || !v->is_number()) return Fail(error, what + " must be a number");
  *out = v->as_double();
  if (!std::isfinite(*out)) return Fail(error, what + " must be finite");
  return true;
}

bool Uint(const json::Value* v, const std::string& what, uint64_t* out, std::string* error) {
  if (!v || !v->as_uint64(out)) {
    return Fail(error, what + " must be an unsigned 64-bit integer");
  }
  return true;
}

// `rails` of a policy: required and non-empty for hier (one rail per shard, in shard order,
// each naming its switch; the policy's own `switch` is then empty), absent or empty for the
// other schemes.
bool ParseRails(const json::Value* rails, const std::string& pw, Policy* pol,
                std::string* error) {
  bool hier = pol->scheme == Scheme::kHier;
  if (!rails || (rails->is_array() && rails->items().empty())) {
    if (hier) return Fail(error, pw + ": a hier policy needs a non-empty rails list");
    return true;
  }
  if (!rails->is_array()) return Fail(error, pw + ": rails must be a list");
  if (!hier) return Fail(error, pw + ": rails are for hier policies only");
  if (!pol->switch_name.empty()) {
    return Fail(error, pw + ": a hier policy's switch must be empty (its rails name them)");
  }
  if (rails->items().size() > kMaxRails) {
    return Fail(error, pw + ": more than " + std::to_string(kMaxRails) + " rails");
  }
  for (size_t k = 0; k < rails->items().size(); ++k) {
    const json::Value& r = rails->items()[k];
    std::string where = pw + ": rails[" + std::to_string(k) + "]";
    const json::Value* sh = r.is_object() ? r.find("shard") : nullptr;
    const json::Value* sw = r.is_object() ? r.find("switch") : nullptr;
    uint64_t shard = 0;
    if (!sh || !sh->as_uint64(&shard)) return Fail(error, where + ".shard must be a uint32");
    if (shard != k) {
      return Fail(error, where + ".shard is " + std::to_string(shard) +
                             ": rails must list shards 0, 1, ... in order");
    }
    if (!sw || !sw->is_string() || sw->as_string().empty()) {
      return Fail(error, where + ".switch must be a non-empty string");
    }
    pol->rails.push_back(Rail{static_cast<uint32_t>(shard), sw->as_string()});
  }
  return true;
}

}  // namespace

bool ParseTable(const json::Value& v, PolicyTable* out, std::string* error) {
  if (!v.is_object()) return Fail(error, "a policy table must be a JSON object");
  for (const char* key :
       {"group_id", "version", "apply_from_seq", "window_s", "gamma", "links", "policies"}) {
    if (!v.find(key)) return Fail(error, std::string("policy table lacks '") + key + "'");
  }
  PolicyTable t;
  const json::Value* g = v.find("group_id");
  if (!g->is_string() || g->as_string().empty()) {
    return Fail(error, "group_id must be a non-empty string");
  }
  t.group_id = g->as_string();
  if (!Uint(v.find("version"), "version", &t.version, error)) return false;
  if (!Uint(v.find("apply_from_seq"), "apply_from_seq", &t.apply_from_seq, error)) return false;
  if (!Number(v.find("window_s"), "window_s", &t.window_s, error)) return false;
  if (!(t.window_s > 0.0)) return Fail(error, "window_s must be > 0");
  if (!Number(v.find("gamma"), "gamma", &t.gamma, error)) return false;
  if (!(t.gamma >= 0.0 && t.gamma <= 1.0)) return Fail(error, "gamma must be in [0, 1]");

  const json::Value* links = v.find("links");
  if (!links->is_array() || links->items().empty()) {
    return Fail(error, "links must be a non-empty list");
  }
  if (links->items().size() > kMaxTableLinks) {
    return Fail(error, "links lists " + std::to_string(links->items().size()) +
                           " links, more than " + std::to_string(kMaxTableLinks));
  }
  // Link id -> index while parsing (LinkIndex is linear; a table may hold thousands).
  std::unordered_map<std::string_view, uint32_t> link_index;
  auto index_of = [&](const json::Value& id) -> int {
    if (!id.is_string()) return -1;
    auto it = link_index.find(id.as_string());
    return it == link_index.end() ? -1 : static_cast<int>(it->second);
  };
  for (size_t i = 0; i < links->items().size(); ++i) {
    const json::Value& l = links->items()[i];
    std::string where = "links[" + std::to_string(i) + "]";
    if (!l.is_object() || !l.find("id") || !l.find("capacity")) {
      return Fail(error, where + " must be an object with id and capacity");
    }
    const json::Value* id = l.find("id");
    if (!id->is_string() || id->as_string().empty()) {
      return Fail(error, where + ".id must be a non-empty string");
    }
    if (index_of(*id) >= 0) {
      return Fail(error, "link '" + id->as_string() + "' is listed twice");
    }
    double cap = 0.0;
    if (!Number(l.find("capacity"), where + ".capacity", &cap, error)) return false;
    if (!(cap > 0.0)) return Fail(error, "link '" + id->as_string() + "' capacity must be > 0");
    t.link_ids.push_back(id->as_string());
    t.capacities.push_back(cap);
    // Keys view the parsed document's strings, which outlive this function's use of them.
    link_index.emplace(id->as_string(), static_cast<uint32_t>(i));
  }

  const json::Value* pols = v.find("policies");
  if (!pols->is_array() || pols->items().empty()) {
    return Fail(error, "policies must be a non-empty list");
  }
  if (pols->items().size() > kMaxTablePolicies) {
    return Fail(error, "policies lists " + std::to_string(pols->items().size()) +
                           " policies, more than " + std::to_string(kMaxTablePolicies));
  }
  for (size_t i = 0; i < pols->items().size(); ++i) {
    const json::Value& p = pols->items()[i];
    std::string where = "policies[" + std::to_string(i) + "]";
    if (!p.is_object()) return Fail(error, where + " must be an object");
    for (const char* key : {"id", "scheme", "links", "cost"}) {
      if (!p.find(key)) return Fail(error, where + " lacks '" + key + "'");
    }
    Policy pol;
    uint64_t id = 0;
    if (!p.find("id")->as_uint64(&id) || id > 0xFFFFFFFFull) {
      return Fail(error, where + ".id must be a uint32");
    }
    pol.id = static_cast<uint32_t>(id);
    if (!t.policies.empty() && pol.id <= t.policies.back().id) {
      return Fail(error, "policies must be in increasing id order (id " + std::to_string(id) +
                             " at " + std::to_string(i) + ")");
    }
    std::string pw = "policy " + std::to_string(id);
    const json::Value* scheme = p.find("scheme");
    if (!scheme->is_string() || !ParseScheme(scheme->as_string(), &pol.scheme)) {
      return Fail(error, pw + ": scheme must be ina, ring, nvls or hier");
    }
    if (const json::Value* sw = p.find("switch")) {
      if (!sw->is_string()) return Fail(error, pw + ": switch must be a string");
      pol.switch_name = sw->as_string();
    }
    if (!ParseRails(p.find("rails"), pw, &pol, error)) return false;
    const json::Value* pl = p.find("links");
    if (!pl->is_array() || pl->items().empty()) {
      return Fail(error, pw + ": links must be a non-empty list");
    }
    if (pl->items().size() > t.link_ids.size()) {
      return Fail(error, pw + ": links lists more links than the table has");
    }
    for (const auto& lid : pl->items()) {
      int k = index_of(lid);
      if (k < 0) {
        return Fail(error, pw + ": unknown link '" + (lid.is_string() ? lid.as_string() : "?") +
                               "'");
      }
      if (std::find(pol.links.begin(), pol.links.end(), static_cast<uint32_t>(k)) !=
          pol.links.end()) {
        return Fail(error, pw + ": link '" + lid.as_string() + "' listed twice");
      }
      pol.links.push_back(static_cast<uint32_t>(k));
    }
    pol.bottleneck = t.capacities[pol.links[0]];
    for (size_t k = 1; k < pol.links.size(); ++k) {
      if (t.capacities[pol.links[k]] < pol.bottleneck) pol.bottleneck = t.capacities[pol.links[k]];
    }
    if (!Number(p.find("cost"), pw + ": cost", &pol.cost, error)) return false;
    if (!(pol.cost >= 0.0)) return Fail(error, pw + ": cost must be >= 0");
    // Eq. 16's optional time model; absent: no latency, the bottleneck's bandwidth.
    if (const json::Value* lat = p.find("latency_s")) {
      if (!Number(lat, pw + ": latency_s", &pol.latency_s, error)) return false;
      if (!(pol.latency_s >= 0.0)) return Fail(error, pw + ": latency_s must be >= 0");
    }
    pol.bandwidth = pol.bottleneck;
    if (const json::Value* bw = p.find("bandwidth")) {
      if (!Number(bw, pw + ": bandwidth", &pol.bandwidth, error)) return false;
      if (!(pol.bandwidth > 0.0)) return Fail(error, pw + ": bandwidth must be > 0");
    }
    if (const json::Value* paths = p.find("paths")) {
      if (!paths->is_object()) return Fail(error, pw + ": paths must be a map");
      if (paths->members().size() > kMaxPathMembers) {
        return Fail(error, pw + ": paths names more than " + std::to_string(kMaxPathMembers) +
                               " members");
      }
      for (const auto& kv : paths->members()) {
        if (!kv.second.is_array()) return Fail(error, pw + ": paths values must be lists");
        if (kv.second.items().size() > kMaxPathHops) {
          return Fail(error, pw + ": the path of " + kv.first + " has more than " +
                                 std::to_string(kMaxPathHops) + " nodes");
        }
        std::vector<std::string> route;
        for (const auto& n : kv.second.items()) {
          if (!n.is_string()) return Fail(error, pw + ": path nodes must be strings");
          route.push_back(n.as_string());
        }
        pol.paths[kv.first] = std::move(route);
      }
    }
    t.policies.push_back(std::move(pol));
  }

  t.utilisation.assign(t.link_ids.size(), 0.0);
  if (const json::Value* u = v.find("utilisation")) {
    if (!u->is_object()) return Fail(error, "utilisation must be a map link id -> utilisation");
    for (const auto& kv : u->members()) {
      double x = 0.0;
      if (!Number(&kv.second, "utilisation['" + kv.first + "']", &x, error)) return false;
      if (!(x >= 0.0 && x <= 1.0)) {
        return Fail(error, "utilisation['" + kv.first + "'] is outside [0, 1]");
      }
      auto it = link_index.find(kv.first);
      if (it == link_index.end()) {
        return Fail(error, "utilisation names unknown link '" + kv.first + "'");
      }
      int k = static_cast<int>(it->second);
      t.utilisation[static_cast<size_t>(k)] = x;
    }
  }
  *out = std::move(t);
  return true;
}

bool ParseTableJson(std::string_view text, PolicyTable* out, std::string* error) {
  json::Value v;
  std::string perr;
  if (!json::Parse(text, &v, &perr)) return Fail(error, "policy table is not JSON: " + perr);
  return ParseTable(v, out, error);
}

json::Value TableToJsonValue(const PolicyTable& t) {
  using json::Value;
  Value o = Value::Object();
  o.set("group_id", Value::String(t.group_id));
  o.set("version", Value::Uint(t.version));
  o.set("apply_from_seq", Value::Uint(t.apply_from_seq));
  o.set("window_s", Value::Number(t.window_s));
  o.set("gamma", Value::Number(t.gamma));
  Value links = Value::Array();
  for (size_t i = 0; i < t.link_ids.size(); ++i) {
    Value l = Value::Object();
    l.set("id", Value::String(t.link_ids[i]));
    l.set("capacity", Value::Number(t.capacities[i]));
    links.push_back(std::move(l));
  }
  o.set("links", std::move(links));
  Value pols = Value::Array();
  for (const auto& p : t.policies) {
    Value q = Value::Object();
    q.set("id", Value::Uint(p.id));
    q.set("scheme", Value::String(SchemeName(p.scheme)));
    q.set("switch", Value::String(p.switch_name));
    if (!p.rails.empty()) {
      Value rails = Value::Array();
      for (const auto& r : p.rails) {
        Value x = Value::Object();
        x.set("shard", Value::Uint(r.shard));
        x.set("switch", Value::String(r.switch_name));
        rails.push_back(std::move(x));
      }
      q.set("rails", std::move(rails));
    }
    Value pl = Value::Array();
    for (uint32_t k : p.links) pl.push_back(Value::String(t.link_ids[k]));
    q.set("links", std::move(pl));
    Value paths = Value::Object();
    for (const auto& kv : p.paths) {
      Value route = Value::Array();
      for (const auto& n : kv.second) route.push_back(Value::String(n));
      paths.set(kv.first, std::move(route));
    }
    q.set("paths", std::move(paths));
    q.set("cost", Value::Number(p.cost));
    q.set("latency_s", Value::Number(p.latency_s));
    q.set("bandwidth", Value::Number(p.bandwidth));  // effective: parses back to the same
    pols.push_back(std::move(q));
  }
  o.set("policies", std::move(pols));
  Value u = Value::Object();
  for (size_t i = 0; i < t.link_ids.size(); ++i) {
    if (t.utilisation[i] != 0.0) u.set(t.link_ids[i], Value::Number(t.utilisation[i]));
  }
  o.set("utilisation", std::move(u));
  return o;
}

std::string TableToJson(const PolicyTable& t) { return json::Write(TableToJsonValue(t)); }

double SharingRatio(const PolicyTable& t, const std::vector<double>& util, size_t i, size_t j) {
  double shared = 0.0;
  double total = 0.0;
  const auto& mine = t.policies[i].links;
  for (uint32_t k : t.policies[j].links) {
    total += util[k];
    if (std::find(mine.begin(), mine.end(), k) != mine.end()) shared += util[k];
  }
  if (total == 0.0) return 0.0;
  return shared / total;
}

// ---------------------------------------------------------------------------------------
// Scheduler

bool Scheduler::Install(std::shared_ptr<const PolicyTable> table) {
  if (!table) return false;
  if (seen_any_ && !(table->writer_epoch > max_epoch_ ||
                     (table->writer_epoch == max_epoch_ && table->version > max_version_))) {
    return false;
  }
  seen_any_ = true;
  max_epoch_ = table->writer_epoch;
  max_version_ = table->version;
  if (table->apply_from_seq < seq_) ++late_tables_;  // other members may have switched earlier
  auto pos = std::upper_bound(pending_.begin(), pending_.end(), table,
                              [](const auto& a, const auto& b) {
                                if (a->apply_from_seq != b->apply_from_seq) {
                                  return a->apply_from_seq < b->apply_from_seq;
                                }
                                return Precedes(*a, *b);
                              });
  pending_.insert(pos, std::move(table));
  return true;
}

void Scheduler::PollStore() {
  uint64_t gen = store_->generation();
  if (gen == store_generation_) return;
  TableStore::Snapshot snap = store_->Read();
  store_generation_ = snap.generation;
  for (auto& t : snap.tables) Install(t);  // refuses what it has seen
}

void Scheduler::ActivateDue() {
  std::shared_ptr<const PolicyTable> due;
  size_t n_due = 0;
  while (n_due < pending_.size() && pending_[n_due]->apply_from_seq <= seq_) {
    if (!due || Precedes(*due, *pending_[n_due])) due = pending_[n_due];
    ++n_due;
  }
  if (!due) return;
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n_due));
  // A newer version that took effect supersedes older ones still waiting.
  const PolicyTable& d = *due;
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&d](const auto& p) { return !Precedes(d, *p); }),
                 pending_.end());
  table_ = std::move(due);
  const PolicyTable& t = *table_;
  size_t n = t.policies.size();
  costs_.resize(n);
  lat_.resize(n);
  wb_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    costs_[i] = t.policies[i].cost;
    lat_[i] = t.policies[i].latency_s / t.window_s;
    wb_[i] = t.window_s * t.policies[i].bandwidth;
  }
  util_ = t.utilisation;
  penalty_.assign(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i != j) penalty_[i * n + j] = SharingRatio(t, util_, i, j);
    }
  }
}

bool Scheduler::Select(double nbytes, Selection* out) {
  if (store_) PollStore();
  if (!pending_.empty() && pending_.front()->apply_from_seq <= seq_) ActivateDue();
  if (!table_) return false;
  const size_t n = costs_.size();
  const double d = nbytes;
  // Eq. 16: delta_c = latency_c / T_u + D / (T_u * bandwidth_c), the two terms in online.py's
  // order; J(c, D) = b_c + delta_c; strict '<' keeps the lowest id on ties.
  size_t best = 0;
  double best_j = costs_[0] + (lat_[0] + d / wb_[0]);
  for (size_t i = 1; i < n; ++i) {
    double j = costs_[i] + (lat_[i] + d / wb_[i]);
    if (j < best_j) {
      best = i;
      best_j = j;
    }
  }
  // Eq. 17 as docs/design.md §8 reads it: the winner pays its increment, others a share f(c*, c).
  const double dstar = lat_[best] + d / wb_[best];
  const double* row = &penalty_[best * n];
  for (size_t i = 0; i < n; ++i) {
    if (i == best) {
      costs_[i] = costs_[i] + dstar;
    } else {
      costs_[i] = costs_[i] + dstar * row[i];
    }
  }
  if (out) {
    const Policy& p = table_->policies[best];
    out->policy_id = p.id;
    out->index = static_cast<uint32_t>(best);
    out->scheme = p.scheme;
    out->cost = best_j;
    out->seq = seq_;
    out->version = table_->version;
  }
  ++seq_;
  return true;
}

bool Scheduler::ObserveUtilisation(const std::vector<std::pair<std::string, double>>& util,
                                   std::string* error) {
  if (!table_) return Fail(error, "no policy table in force");
  const PolicyTable& t = *table_;
  std::vector<double> u(t.link_ids.size(), 0.0);
  for (const auto& kv : util) {
    if (!(kv.second >= 0.0 && kv.second <= 1.0)) {
      return Fail(error, "utilisation['" + kv.first + "'] is outside [0, 1]");
    }
    int k = t.LinkIndex(kv.first);
    if (k >= 0) u[static_cast<size_t>(k)] = kv.second;  // other groups' links are ignored
  }
  util_ = std::move(u);
  const double g = t.gamma;
  const size_t n = t.policies.size();
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i != j) {
        double& f = penalty_[i * n + j];
        f = (1.0 - g) * f + g * SharingRatio(t, util_, i, j);  // Eq. 18
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    double peak = 0.0;
    for (uint32_t k : t.policies[i].links) {
      if (util_[k] > peak) peak = util_[k];
    }
    costs_[i] = (1.0 - g) * costs_[i] + g * peak;  // per-window decay towards measured load
  }
  return true;
}

}  // namespace heroserve
