// TableJson (table_json.h): a table from the controller's proto to its JSON form.
#include "table_json.h"

#include <map>
#include <string>
#include <vector>

#include "heroserve/v1/control.pb.h"

namespace heroserve::agent {

namespace pb = heroserve::v1;

namespace {

// Hierarchical INA adds SCHEME_HIER = 4 and Policy.rails (field 9) to the proto.
// Both are read here without naming them, so the agent builds against the proto before and
// after that change (a controller can send hier tables only with the new one).
constexpr int kSchemeHier = 4;  // pb::SCHEME_HIER

const char* SchemeString(int s) {
  switch (s) {
    case pb::SCHEME_INA: return "ina";
    case pb::SCHEME_RING: return "ring";
    case pb::SCHEME_NVLS: return "nvls";
    case kSchemeHier: return "hier";
    default: return "unspecified";
  }
}

// A hier policy's rails as docs/policy-table.md writes them: [{shard, switch}, ...].
template <typename P>
auto RailsJson(const P& p, int) -> decltype(p.rails(), json::Value()) {
  json::Value rails = json::Value::Array();
  for (const auto& r : p.rails()) {
    json::Value x = json::Value::Object();
    x.set("shard", json::Value::Uint(r.shard()));
    x.set("switch", json::Value::String(r.switch_()));
    rails.push_back(std::move(x));
  }
  return rails;
}
template <typename P>
json::Value RailsJson(const P& /*proto without rails*/, long) {
  return json::Value::Array();
}

}  // namespace

json::Value TableJson(const heroserve::v1::PolicyTable& t) {
  using json::Value;
  Value o = Value::Object();
  o.set("group_id", Value::String(t.group_id()));
  o.set("version", Value::Uint(t.version()));
  o.set("apply_from_seq", Value::Uint(t.apply_from_seq()));
  o.set("window_s", Value::Number(t.window_s()));
  o.set("gamma", Value::Number(t.gamma()));
  Value links = Value::Array();
  for (const auto& l : t.links()) {
    Value x = Value::Object();
    x.set("id", Value::String(l.id()));
    x.set("capacity", Value::Number(l.capacity()));
    links.push_back(std::move(x));
  }
  o.set("links", std::move(links));
  Value pols = Value::Array();
  for (const auto& p : t.policies()) {
    Value q = Value::Object();
    q.set("id", Value::Uint(p.id()));
    q.set("scheme", Value::String(SchemeString(p.scheme())));
    q.set("switch", Value::String(p.switch_()));
    Value rails = RailsJson(p, 0);
    if (!rails.items().empty()) q.set("rails", std::move(rails));
    Value pl = Value::Array();
    for (const auto& l : p.links()) pl.push_back(Value::String(l));
    q.set("links", std::move(pl));
    std::map<std::string, std::vector<std::string>> sorted;
    for (const auto& kv : p.paths()) {
      sorted[kv.first].assign(kv.second.nodes().begin(), kv.second.nodes().end());
    }
    Value paths = Value::Object();
    for (const auto& kv : sorted) {
      Value route = Value::Array();
      for (const auto& n : kv.second) route.push_back(Value::String(n));
      paths.set(kv.first, std::move(route));
    }
    q.set("paths", std::move(paths));
    q.set("cost", Value::Number(p.cost()));
    // proto3 has no presence: latency 0 is the default anyway; bandwidth 0 means "absent"
    // (the bottleneck), so it is left out rather than rejected by ParseTable as <= 0.
    q.set("latency_s", Value::Number(p.latency_s()));
    if (p.bandwidth() != 0.0) q.set("bandwidth", Value::Number(p.bandwidth()));
    pols.push_back(std::move(q));
  }
  o.set("policies", std::move(pols));
  std::map<std::string, double> util(t.utilisation().begin(), t.utilisation().end());
  Value u = Value::Object();
  for (const auto& kv : util) u.set(kv.first, Value::Number(kv.second));
  o.set("utilisation", std::move(u));
  return o;
}

}  // namespace heroserve::agent
