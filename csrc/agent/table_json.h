// The GPU agent's conversion of a table from the controller's proto (heroserve.v1.PolicyTable)
// to the JSON form of docs/policy-table.md, so one validator (ParseTable) serves the plugin,
// the C API and the daemon.
#pragma once

#include "heroserve/json.h"

namespace heroserve::v1 {
class PolicyTable;
}  // namespace heroserve::v1

namespace heroserve::agent {

// Map fields are written in sorted key order; a policy's bandwidth 0 (proto3: absent) is
// left out, so ParseTable takes the bottleneck.
json::Value TableJson(const heroserve::v1::PolicyTable& t);

}  // namespace heroserve::agent
