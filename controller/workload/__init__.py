"""Workloads: request lengths and arrivals (docs/design.md §4), and SLAs.

Modules: ``base`` (Request, Workload), ``generators`` (chatbot, summarization), ``traces``
(load_trace), ``resolve`` (resolve_workload: a name or a trace file; plan_workload: a
name), ``sla`` (SLA, default_sla). This package only re-exports their public names."""

from controller.workload.base import Request, Workload
from controller.workload.generators import WORKLOADS, chatbot, summarization
from controller.workload.resolve import plan_workload, resolve_workload
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
    "plan_workload",
    "resolve_workload",
    "summarization",
]
