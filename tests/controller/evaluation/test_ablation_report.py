"""The ablation section of docs/fidelity.md: rewritten in place (``--section ablation``), the
rest of the report kept byte for byte; a report without the section refused at once."""

import pytest

from controller.cli import main
from controller.errors import InputError
from controller.evaluation.ablation_report import HEADING, replace_section, section_span

REPORT = f"# Report\n\nintro\n\n{HEADING}\n\nold table\n\n## TPOT\n\nkept\n"


def test_only_the_section_is_replaced():
    new = replace_section(REPORT, [f"{HEADING}\n", "new table\n"])
    assert new == f"# Report\n\nintro\n\n{HEADING}\n\nnew table\n\n## TPOT\n\nkept\n"


def test_a_last_section_runs_to_the_end():
    text = f"# Report\n\n{HEADING}\n\nold\n"
    assert replace_section(text, [f"{HEADING}\n", "new\n"]) == f"# Report\n\n{HEADING}\n\nnew\n"


def test_a_report_without_the_section_is_refused():
    with pytest.raises(InputError, match="no ablation section"):
        section_span("# Report\n\n## TPOT\n")


def test_the_command_refuses_before_any_work(tmp_path, capsys):
    """``--section ablation`` on a report without the section: exit 2, one line, the file
    untouched: the check comes before the minutes of planning and simulation, whose progress
    lines would come first on stderr."""
    out = tmp_path / "f.md"
    out.write_text("# Report\n")
    rc = main(["fidelity", "--out", str(out), "--section", "ablation", "--quick"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no ablation section" in err[0]
    assert out.read_text() == "# Report\n"
    rc = main(["fidelity", "--out", str(tmp_path / "none.md"), "--section", "ablation"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "cannot read" in err[0]


def test_the_summary_claims_only_what_the_ratios_show():
    """Rows that move H (1.006x predicted; 1.021x simulated with an interval above 1), rows
    within the tolerance whose simulated interval holds 1, one never simulated, one without
    a plan, then the rows after the ladder."""
    from controller.evaluation.ablation import Row
    from controller.evaluation.ablation_report import _summary
    from controller.evaluation.ablation_sim import SimCell

    pred = [None, 1.006, 1.0, 1.004, 1.0, None, 1.0, 0.5]
    sim = [None, 1.0, 1.021, 0.99, None, None, 1.0, 0.5]
    names = ["distserve", "a", "b", "c", "d", "e", "lanes", "roles"]
    rows = [Row(n, 1.0, 1, p, 1.2) for n, p in zip(names, pred, strict=True)]
    verdict = {1.0: "same deployment", 1.021: "gain", 0.99: "no difference", 0.5: "loss"}
    ci = {1.0: (1.0, 1.0), 1.021: (1.005, 1.04), 0.99: (0.97, 1.01), 0.5: (0.45, 0.55)}
    cells = [
        SimCell(1.0, "", q, 1.3, 1.0, 1.0, ci.get(q), (1.2, 1.4), verdict.get(q, ""), "gain")
        for q in sim
    ]
    assert _summary("x", rows, cells) == (
        "- **x**: DistServe to HeroServe 1.200x predicted, 1.300x [1.200, 1.400] gain "
        "simulated. Moves H: a: 1.006x predicted, 1.000x (same deployment) simulated; "
        "b: 1.000x predicted, 1.021x [1.005, 1.040] gain simulated; "
        "roles (against the full planner): 0.500x predicted, 0.500x [0.450, 0.550] loss "
        "simulated. No change, predicted (within the tolerance) and simulated (no difference "
        "or the same deployment): c, lanes (against the full planner). "
        "Within 0.5% predicted, not simulated: d. No ratio (a side without a plan): e."
    )
