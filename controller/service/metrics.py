"""Prometheus metrics of the controller (docs/design.md §9), on a private registry so several
controllers (tests) can live in one process.

Conventions (Prometheus' naming guide): ``heroserve_`` prefix, base units with
their suffix (``_seconds``, ``_bytes``, ``_ratio`` for fractions), ``_total`` on counters
(the client library adds it to a Counter's name), ``heroserve_build_info`` at 1 with the
versions as labels. Every label value comes from a fixed set (kind, ok, rpc, reason) or from
what the plan's cluster names (switch, agent, link, group, policy id): the controller checks
an agent's claims against the plan before any of them becomes a label, so no client can
create series of its own choosing.
"""

from __future__ import annotations

import platform
from importlib import metadata

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Fixed label values of heroserve_telemetry_records_dropped_total.
DROP_REASONS = ("no_cluster", "unknown_group", "unknown_link", "held_table_not_own")


def _version() -> str:
    try:
        return metadata.version("heroserve")
    except metadata.PackageNotFoundError:
        return "unknown"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.build_info = Gauge(
            "heroserve_build_info",
            "Always 1; the labels name the controller's version and runtimes",
            ["version", "python", "grpc"],
            registry=r,
        )
        self.build_info.labels(_version(), platform.python_version(), grpc.__version__).set(1)
        self.epoch = Gauge("heroserve_epoch", "Last policy epoch issued", registry=r)
        self.acked_epoch = Gauge(
            "heroserve_agent_acked_epoch",
            "Highest epoch each agent of the plan's cluster acknowledged",
            ["agent"],
            registry=r,
        )
        self.registrations = Counter(
            "heroserve_registrations", "Agent registrations", ["kind"], registry=r
        )
        self.connected = Gauge(
            "heroserve_agents_connected", "Agents with an open policy stream", registry=r
        )
        self.updates = Counter(
            "heroserve_policy_updates", "Policy updates sent", ["full"], registry=r
        )
        self.acks = Counter("heroserve_acks", "Acks received", ["ok"], registry=r)
        self.invalid = Counter(
            "heroserve_invalid_requests", "Requests refused as malformed", ["rpc"], registry=r
        )
        self.denied = Counter(
            "heroserve_denied_requests",
            "Requests refused because the identity may not say or ask that",
            ["rpc"],
            registry=r,
        )
        self.telemetry = Counter(
            "heroserve_telemetry_reports", "Telemetry reports accepted", registry=r
        )
        self.telemetry_dropped = Counter(
            "heroserve_telemetry_records_dropped",
            "Records of accepted reports left out (reason: no_cluster, unknown_group, "
            "unknown_link, held_table_not_own)",
            ["reason"],
            registry=r,
        )
        for reason in DROP_REASONS:
            self.telemetry_dropped.labels(reason)
        self.link_util = Gauge(
            "heroserve_link_utilisation_ratio",
            "Last reported utilisation of a link of the cluster, [0, 1]",
            ["link"],
            registry=r,
        )
        self.selections = Counter(
            "heroserve_policy_selections",
            "Policy selections reported by GPU agents",
            ["group", "policy"],
            registry=r,
        )
        self.selected_bytes = Counter(
            "heroserve_policy_selected_bytes",
            "All-reduce bytes reported per policy",
            ["group", "policy"],
            registry=r,
        )
        self.slots = Gauge(
            "heroserve_aggregator_slots_allocated",
            "Aggregator slots allocated on a switch",
            ["switch"],
            registry=r,
        )
        self.plan_seconds = Histogram(
            "heroserve_plan_apply_seconds",
            "Time to derive and commit a plan's policies (ApplyPlan, start-up, resync)",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose ``/metrics`` over HTTP on ``addr:port``."""
        start_http_server(port, addr=addr, registry=self.registry)
