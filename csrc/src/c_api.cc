#include "heroserve/heroserve.h"

#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "heroserve/json.h"
#include "heroserve/policy.h"
#include "heroserve/shm.h"

struct hs_store {
  heroserve::TableStore store;
};

struct hs_scheduler {
  explicit hs_scheduler(const heroserve::TableStore* st) : sched(st) {}
  heroserve::Scheduler sched;
};

namespace {

int Error(char* err, size_t errlen, const std::string& msg) {
  if (err && errlen > 0) {
    size_t n = msg.size() < errlen - 1 ? msg.size() : errlen - 1;
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
  }
  return -1;
}

std::shared_ptr<const heroserve::PolicyTable> Parse(const char* text, std::string* error) {
  if (!text) {
    *error = "table is NULL";
    return nullptr;
  }
  auto t = std::make_shared<heroserve::PolicyTable>();
  if (!heroserve::ParseTableJson(text, t.get(), error)) return nullptr;
  return t;
}

}  // namespace

extern "C" {

const char* hs_version(void) { return "heroserve-policy-core 0.1.0"; }

hs_store* hs_store_new(void) { return new (std::nothrow) hs_store(); }
void hs_store_free(hs_store* s) { delete s; }

int hs_store_publish_json(hs_store* s, const char* table_json, char* err, size_t errlen) {
  if (!s) return Error(err, errlen, "store is NULL");
  try {
    std::string e;
    auto t = Parse(table_json, &e);
    if (!t) return Error(err, errlen, e);
    return s->store.Publish(std::move(t)) ? 1 : 0;
  } catch (const std::exception& ex) {
    return Error(err, errlen, ex.what());
  }
}

hs_scheduler* hs_scheduler_new(hs_store* store) {
  return new (std::nothrow) hs_scheduler(store ? &store->store : nullptr);
}
void hs_scheduler_free(hs_scheduler* s) { delete s; }

int hs_scheduler_install_json(hs_scheduler* s, const char* table_json, char* err, size_t errlen) {
  if (!s) return Error(err, errlen, "scheduler is NULL");
  try {
    std::string e;
    auto t = Parse(table_json, &e);
    if (!t) return Error(err, errlen, e);
    return s->sched.Install(std::move(t)) ? 1 : 0;
  } catch (const std::exception& ex) {
    return Error(err, errlen, ex.what());
  }
}

int hs_scheduler_select(hs_scheduler* s, double nbytes, uint32_t* policy_id, double* cost) {
  if (!s || !(nbytes >= 0.0)) return -1;
  heroserve::Selection sel;
  if (!s->sched.Select(nbytes, &sel)) return -1;
  if (policy_id) *policy_id = sel.policy_id;
  if (cost) *cost = sel.cost;
  return 0;
}

int hs_scheduler_observe_json(hs_scheduler* s, const char* util_json, char* err, size_t errlen) {
  if (!s || !util_json) return Error(err, errlen, "scheduler or utilisation is NULL");
  try {
    heroserve::json::Value v;
    std::string e;
    if (!heroserve::json::Parse(util_json, &v, &e)) {
      return Error(err, errlen, "utilisation is not JSON: " + e);
    }
    if (!v.is_object()) return Error(err, errlen, "utilisation must be a map link id -> value");
    std::vector<std::pair<std::string, double>> u;
    for (const auto& kv : v.members()) {
      if (!kv.second.is_number()) {
        return Error(err, errlen, "utilisation['" + kv.first + "'] must be a number");
      }
      u.emplace_back(kv.first, kv.second.as_double());
    }
    if (!s->sched.ObserveUtilisation(u, &e)) return Error(err, errlen, e);
    return 0;
  } catch (const std::exception& ex) {
    return Error(err, errlen, ex.what());
  }
}

uint64_t hs_scheduler_seq(const hs_scheduler* s) { return s ? s->sched.seq() : 0; }
uint64_t hs_scheduler_version(const hs_scheduler* s) { return s ? s->sched.version() : 0; }

size_t hs_scheduler_costs(const hs_scheduler* s, double* out, size_t cap) {
  if (!s) return 0;
  const auto& c = s->sched.costs();
  for (size_t i = 0; i < c.size() && i < cap && out; ++i) out[i] = c[i];
  return c.size();
}

int hs_shm_publish_json(const char* group_id, const char* tables_json, char* err, size_t errlen) {
  if (!group_id || !tables_json) return Error(err, errlen, "group or tables is NULL");
  try {
    heroserve::json::Value v;
    std::string e;
    if (!heroserve::json::Parse(tables_json, &v, &e)) return Error(err, errlen, "not JSON: " + e);
    heroserve::json::Value list = heroserve::json::Value::Array();
    if (const heroserve::json::Value* ts = v.find("tables")) {
      list = *ts;
    } else {
      list.push_back(v);
    }
    uint64_t newest = 0;
    for (const auto& tv : list.items()) {
      heroserve::PolicyTable t;
      if (!heroserve::ParseTable(tv, &t, &e)) return Error(err, errlen, e);
      if (t.group_id != group_id) return Error(err, errlen, "table of another group");
      if (t.version > newest) newest = t.version;
    }
    heroserve::json::Value doc = heroserve::json::Value::Object();
    doc.set("tables", list);
    heroserve::shm::Segment seg;
    if (!seg.Create(heroserve::shm::SegmentName(group_id), heroserve::shm::kDefaultCapacity,
                    &e) ||
        !seg.Publish(heroserve::json::Write(doc), newest, &e)) {
      return Error(err, errlen, e);
    }
    return 0;
  } catch (const std::exception& ex) {
    return Error(err, errlen, ex.what());
  }
}

}  // extern "C"
