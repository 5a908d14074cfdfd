"""Workloads: request lengths and arrivals (docs/design.md §4), and SLAs."""

from controller.workload.generators import (
    WORKLOADS,
    Request,
    Workload,
    chatbot,
    resolve_workload,
    summarization,
)
from controller.workload.sla import SLA, default_sla
from controller.workload.traces import load_trace

__all__ = [
    "SLA",
    "WORKLOADS",
    "Request",
    "Workload",
    "chatbot",
    "default_sla",
    "load_trace",
    "resolve_workload",
    "summarization",
]
