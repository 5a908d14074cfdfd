"""Prometheus metrics of the controller (DESIGN.md §9), on a private registry so several
controllers (tests) can live in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.epoch = Gauge("heroserve_epoch", "Last policy epoch issued", registry=r)
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
            "heroserve_denied_requests", "Requests refused for identity", ["rpc"], registry=r
        )
        self.telemetry = Counter(
            "heroserve_telemetry_reports", "Telemetry reports accepted", registry=r
        )
        self.link_util = Gauge(
            "heroserve_link_utilisation", "Last reported utilisation [0, 1]", ["link"], registry=r
        )
        self.selections = Counter(
            "heroserve_policy_selections",
            "Policy selections reported by GPU agents",
            ["group", "policy"],
            registry=r,
        )
        self.selected_bytes = Counter(
            "heroserve_policy_bytes",
            "All-reduce bytes reported per policy",
            ["group", "policy"],
            registry=r,
        )
        self.slots = Gauge(
            "heroserve_slots_allocated", "Aggregator slots allocated", ["switch"], registry=r
        )

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose ``/metrics`` over HTTP on ``addr:port``."""
        start_http_server(port, addr=addr, registry=self.registry)
