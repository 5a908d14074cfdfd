"""Readable tables of plans for the terminal."""

from __future__ import annotations

from controller.plan import Plan


def fmt_seconds(x: float) -> str:
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.1f} us"


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def comparison_table(plans: dict[str, Plan], reference: str = "heroserve") -> str:
    """One row per planner: parallelism, instances, predicted latencies, H (Eq. 1's total
    SLA-meeting rate), H per GPU used, and the reference planner's H over this one's."""
    ref = plans.get(reference)
    rows = [
        [
            "planner",
            "prefill TPxPP",
            "decode TPxPP",
            "GPUs",
            "TTFT",
            "TPOT",
            "KV xfer",
            "H r/s",
            "H/GPU",
            f"H {reference}/this",
        ]
    ]
    for name, p in plans.items():
        pr = p.predicted
        ratio = f"{ref.predicted.rate / pr.rate:.2f}x" if ref and pr.rate > 0 else "-"
        rows.append(
            [
                f"{name} (time limit)" if p.time_limit_reached else name,
                f"{p.prefill.tp}x{p.prefill.pp} ({len(p.prefill.instances)} inst)",
                f"{p.decode.tp}x{p.decode.pp} ({len(p.decode.instances)} inst, "
                f"B={p.decode.batch_size})",
                str(pr.gpus_used),
                fmt_seconds(pr.ttft_s),
                fmt_seconds(pr.tpot_s),
                fmt_seconds(pr.kv_transfer_s),
                f"{pr.rate:.3f}",
                f"{pr.rate_per_gpu:.4f}",
                ratio,
            ]
        )
    return text_table(rows)


def idle_lines(plans: dict[str, Plan]) -> str:
    """Per planner, the GPUs its plan leaves idle and why (``Plan.idle``), and whether it
    stopped at its time limit; empty when every plan uses every GPU in full."""
    lines = []
    for name, p in plans.items():
        if p.time_limit_reached:
            lines.append(f"{name}: time limit reached, the best plan found by then")
        for e in p.idle:
            lines.append(f"{name}: {e.gpus} {e.role} GPU(s) idle: {e.reason}")
    return "\n".join(lines)


def groups_table(plan: Plan, limit: int = 40) -> str:
    """The groups of a plan: members, scheme, switch, slots and why the scheme was chosen."""
    rows = [["phase", "inst", "stage", "GPUs", "scheme", "switch", "slots", "all-reduce", "why"]]
    shown = 0
    total = 0
    for phase in (plan.prefill, plan.decode):
        for gr in phase.groups:
            total += 1
            if shown >= limit:
                continue
            shown += 1
            slots = f"{gr.slots.start}+{gr.slots.count}" if gr.slots else "-"
            rows.append(
                [
                    phase.role,
                    str(gr.instance),
                    str(gr.stage),
                    ",".join(gr.gpus),
                    gr.scheme,
                    gr.switch or "-",
                    slots,
                    fmt_seconds(gr.allreduce_s),
                    gr.reason,
                ]
            )
    out = text_table(rows)
    if total > shown:
        out += f"\n... {total - shown} more groups (see --json)"
    return out
