"""Workloads: request lengths and arrivals (DESIGN.md §4), and SLAs."""

from controller.workload.generators import (
    WORKLOADS,
    Request,
    Workload,
    chatbot,
    load_trace,
    resolve_workload,
    summarization,
)
from controller.workload.sla import SLA, default_sla

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
