"""Service-level agreement: TTFT and TPOT bounds and the attainment percentile.

Holds :func:`default_sla` (the paper's bounds per workload and scale) and re-exports
:class:`~controller.plan.SLA`, which a plan records (``controller/plan.py``)."""

from __future__ import annotations

from controller.plan import SLA

__all__ = ["SLA", "default_sla"]


# The paper's defaults (§V): testbed with OPT-66B, large scale with OPT-175B.
_DEFAULTS = {
    ("chatbot", "testbed"): (2.5, 0.15),
    ("summarization", "testbed"): (15.0, 0.15),
    ("chatbot", "large"): (4.0, 0.2),
    ("summarization", "large"): (25.0, 0.2),
}


def default_sla(workload: str, scale: str = "testbed") -> SLA:
    ttft, tpot = _DEFAULTS.get((workload, scale), _DEFAULTS[("chatbot", scale)])
    return SLA(ttft, tpot)
