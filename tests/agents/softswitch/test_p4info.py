"""The checked-in P4Info agrees with p4/heroserve_ina.p4 (docs/design.md §10).

Where p4c is on PATH (tests/support/bmv2.py), the checked-in file must be p4c's own output, byte
for byte, and the v1model program must compile without a warning; the TNA program must
front-end-check clean with p4test against the open-source Tofino includes (their
``p4include`` folder named by HEROSERVE_TNA_INCLUDE). Everywhere, this reads the P4 source
itself (a small parser for the constructs the program uses: typedefs, consts, #defines,
headers, actions, tables, counters, registers) and checks every name, id, match field,
parameter, bitwidth and size of the P4Info.
Ids are p4c's: Jenkins one-at-a-time hash of the fully-qualified name, low 24 bits, with
the P4Ids prefix (0x01 action, 0x02 table, 0x12 counter, 0x16 register) in the top byte.
The P4Info is read with a text-protobuf-free parser too, so this test needs no p4runtime
stubs (they need the pure-Python protobuf runtime, which this process does not use).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import ROOT
from support.bmv2 import compile_v1model, tool_missing

P4_SRC = ROOT / "p4" / "heroserve_ina.p4"
P4INFO = ROOT / "p4" / "heroserve_ina.p4info.txtpb"

PREFIX = {"action": 0x01, "table": 0x02, "counter": 0x12, "register": 0x16}
V1MODEL_FIELDS = {"standard_metadata.egress_port": 9, "standard_metadata.ingress_port": 9}


def jenkins_one_at_a_time(name: str) -> int:
    h = 0
    for c in name.encode():
        h = (h + c) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    h = (h + (h << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    h = (h + (h << 15)) & 0xFFFFFFFF
    return h


def p4c_id(name: str, kind: str) -> int:
    return (PREFIX[kind] << 24) | (jenkins_one_at_a_time(name) & 0xFFFFFF)


def test_hash_reproduces_known_p4c_ids() -> None:
    # Ids p4c gave the p4lang tutorials' basic.p4 (its published basic.p4info.txt).
    assert p4c_id("MyIngress.ipv4_lpm", "table") == 37375156
    assert p4c_id("NoAction", "action") == 21257015
    assert p4c_id("MyIngress.drop", "action") == 25652968
    assert p4c_id("MyIngress.ipv4_forward", "action") == 28792405


# ---- the P4 source --------------------------------------------------------------------


@dataclass
class Source:
    actions: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    tables: dict[str, dict] = field(default_factory=dict)
    counters: dict[str, tuple[int, str]] = field(default_factory=dict)
    registers: dict[str, tuple[int, int]] = field(default_factory=dict)


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _block(text: str, start: int) -> tuple[str, int]:
    """The text between the brace at/after ``start`` and its match; index after it."""
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j], j + 1
    raise ValueError("unbalanced braces")


def parse_source(path: Path = P4_SRC) -> Source:
    text = _strip_comments(path.read_text())
    consts: dict[str, int] = {}
    for name, value in re.findall(r"#define\s+(\w+)\s+(\d+)\s*$", text, flags=re.M):
        consts[name] = int(value)
    for name, value in re.findall(r"const\s+bit<\d+>\s+(\w+)\s*=\s*(\w+)\s*;", text):
        consts[name] = int(value, 0)
    typedefs = {n: int(w) for w, n in re.findall(r"typedef\s+bit<(\d+)>\s+(\w+)\s*;", text)}

    def width(t: str) -> int:
        m = re.fullmatch(r"bit<(\d+)>", t.strip())
        return int(m.group(1)) if m else typedefs[t.strip()]

    def evaluate(expr: str) -> int:
        expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(consts[m.group(0)]), expr)
        assert re.fullmatch(r"[\d\s*+()<-]+", expr), expr
        return int(eval(expr))  # digits and arithmetic only, checked above

    headers: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"header\s+(\w+)\s*", text):
        body, _ = _block(text, m.end())
        headers[m.group(1)] = {
            f: width(t) for t, f in re.findall(r"(bit<\d+>|\w+)\s+(\w+)\s*;", body)
        }
    hdr_body, _ = _block(text, re.search(r"struct\s+headers_t", text).end())
    instances = {f: headers[t] for t, f in re.findall(r"(\w+)\s+(\w+)\s*;", hdr_body)}

    def field_width(expr: str) -> int:
        if expr in V1MODEL_FIELDS:
            return V1MODEL_FIELDS[expr]
        _, inst, f = expr.split(".")
        return instances[inst][f]

    src = Source()
    src.actions["NoAction"] = []  # core.p4
    for m in re.finditer(r"control\s+(\w+)\s*\(", text):
        control = m.group(1)
        body, _ = _block(text, m.end())
        declared: dict[str, list[tuple[str, int]]] = {}
        for a in re.finditer(r"action\s+(\w+)\s*\(([^)]*)\)", body):
            params = [p.strip().rsplit(None, 1) for p in a.group(2).split(",") if p.strip()]
            declared[f"{control}.{a.group(1)}"] = [(n, width(t)) for t, n in params]
        # p4c lists every action a control declares, also those only called from apply
        # (make_result), which p4c-bm2-ss runs through a table of its own.
        src.actions.update(declared)
        for t in re.finditer(r"table\s+(\w+)\s*", body):
            tbody, _ = _block(body, t.end())
            key_body, _ = _block(tbody, tbody.index("key"))
            keys = []
            for expr, kind, name in re.findall(
                r"([\w.]+)\s*:\s*(\w+)\s*(?:@name\(\"(\w+)\"\))?\s*;", key_body
            ):
                keys.append((name or expr, field_width(expr), kind))
            act_body, _ = _block(tbody, tbody.index("actions"))
            actions = []
            for ann, a in re.findall(r"(@defaultonly\s+)?(\w+)\s*;", act_body):
                full = "NoAction" if a == "NoAction" else f"{control}.{a}"
                actions.append((full, bool(ann)))
                assert full == "NoAction" or full in declared, full
            const_default = re.search(r"const\s+default_action\s*=\s*(\w+)", tbody)
            size = re.search(r"size\s*=\s*(\w+)\s*;", tbody)
            src.tables[f"{control}.{t.group(1)}"] = {
                "keys": keys,
                "actions": actions,
                "const_default": (
                    None
                    if const_default is None
                    else "NoAction"
                    if const_default.group(1) == "NoAction"
                    else f"{control}.{const_default.group(1)}"
                ),
                "size": evaluate(size.group(1)) if size else 1024,
            }
        for size, unit, name in re.findall(
            r"counter\(([^,]+),\s*CounterType\.(\w+)\)\s*(\w+)\s*;", body
        ):
            src.counters[f"{control}.{name}"] = (evaluate(size), unit)
        for w, size, name in re.findall(r"register<(bit<\d+>|\w+)>\(([^)]*)\)\s*(\w+)\s*;", body):
            src.registers[f"{control}.{name}"] = (evaluate(size), width(w))
    return src


# ---- the P4Info text ----------------------------------------------------------------


def parse_txtpb(text: str) -> dict:
    """Minimal protobuf text-format reader: nested messages -> dict of lists."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|[{}]|[\w.]+:?|#[^\n]*', text)
    pos = 0

    def message() -> dict:
        nonlocal pos
        out: dict[str, list] = {}
        while pos < len(tokens) and tokens[pos] != "}":
            tok = tokens[pos]
            if tok.startswith("#"):
                pos += 1
                continue
            key = tok.rstrip(":")
            pos += 1
            if tokens[pos] == "{":
                pos += 1
                value = message()
                pos += 1  # the closing brace
            else:
                raw = tokens[pos]
                pos += 1
                value = raw[1:-1] if raw.startswith('"') else int(raw) if raw.isdigit() else raw
            out.setdefault(key, []).append(value)
        return out

    return message()


@pytest.fixture(scope="module")
def info() -> dict:
    return parse_txtpb(P4INFO.read_text())


@pytest.fixture(scope="module")
def src() -> Source:
    return parse_source()


def _by_name(entries: list[dict]) -> dict[str, dict]:
    return {e["preamble"][0]["name"][0]: e for e in entries}


def test_source_parser_sees_the_program(src: Source) -> None:
    assert set(src.tables) == {
        "InaIngress.aggregation_table",
        "InaIngress.worker_port",
        "InaIngress.l2_forward",
        "InaEgress.result_rewrite",
    }
    assert src.tables["InaIngress.aggregation_table"]["keys"] == [
        ("group_id", 16, "exact"),
        ("agg_index", 16, "exact"),
    ]
    assert src.tables["InaIngress.worker_port"]["keys"] == [
        ("group_id", 16, "exact"),
        ("worker_id", 8, "exact"),
    ]
    assert src.actions["InaIngress.set_worker_port"] == [("port", 9)]
    assert src.actions["InaIngress.make_result"] == []  # called from apply; p4c lists it too
    assert src.registers["InaIngress.slot_gen"] == (1024 * 2, 32)
    assert src.registers["InaIngress.slot_tag"] == (1024 * 2, 64)
    assert src.registers["InaIngress.pool"] == (1024 * 64, 32)
    assert src.counters["InaIngress.ina_drops"] == (16, "packets")


def test_actions_agree(src: Source, info: dict) -> None:
    actions = _by_name(info["actions"])
    assert set(actions) == set(src.actions)
    for name, params in src.actions.items():
        a = actions[name]
        pre = a["preamble"][0]
        assert pre["id"][0] == p4c_id(name, "action"), name
        assert pre["alias"][0] == name.split(".")[-1]
        got = [(p["id"][0], p["name"][0], p["bitwidth"][0]) for p in a.get("params", [])]
        assert got == [(i, n, w) for i, (n, w) in enumerate(params, 1)], name


def test_tables_agree(src: Source, info: dict) -> None:
    tables = _by_name(info["tables"])
    assert set(tables) == set(src.tables)
    for name, t in src.tables.items():
        pi = tables[name]
        assert pi["preamble"][0]["id"][0] == p4c_id(name, "table"), name
        got_keys = [
            (m["id"][0], m["name"][0], m["bitwidth"][0], m["match_type"][0].lower())
            for m in pi["match_fields"]
        ]
        want_keys = [(i, n, w, k) for i, (n, w, k) in enumerate(t["keys"], 1)]
        assert got_keys == want_keys, name
        refs = [
            (r["id"][0], r.get("scope", ["TABLE_AND_DEFAULT"])[0] == "DEFAULT_ONLY")
            for r in pi["action_refs"]
        ]
        assert refs == [(p4c_id(a, "action"), d) for a, d in t["actions"]], name
        if t["const_default"] is None:
            assert "const_default_action_id" not in pi
        else:
            assert pi["const_default_action_id"][0] == p4c_id(t["const_default"], "action")
        assert pi["size"][0] == t["size"], name


def test_counters_agree(src: Source, info: dict) -> None:
    counters = _by_name(info["counters"])
    assert set(counters) == set(src.counters)
    unit = {"packets": "PACKETS", "bytes": "BYTES", "packets_and_bytes": "BOTH"}
    for name, (size, kind) in src.counters.items():
        c = counters[name]
        assert c["preamble"][0]["id"][0] == p4c_id(name, "counter"), name
        assert c["spec"][0]["unit"][0] == unit[kind]
        assert c["size"][0] == size


def test_registers_agree(src: Source, info: dict) -> None:
    registers = _by_name(info["registers"])
    assert set(registers) == set(src.registers)
    for name, (size, w) in src.registers.items():
        r = registers[name]
        assert r["preamble"][0]["id"][0] == p4c_id(name, "register"), name
        assert r["type_spec"][0]["bitstring"][0]["bit"][0]["bitwidth"][0] == w
        assert r["size"][0] == size


def test_ids_are_unique(info: dict) -> None:
    ids = [
        e["preamble"][0]["id"][0]
        for kind in ("tables", "actions", "counters", "registers")
        for e in info[kind]
    ]
    assert len(ids) == len(set(ids))


def test_model_matches_p4info_names_and_widths(src: Source) -> None:
    from agents.softswitch.pipeline import InaPipeline

    p = InaPipeline()
    assert set(p.tables) == set(src.tables)
    for name, table in p.tables.items():
        assert [(n, w) for n, w, _ in src.tables[name]["keys"]] == list(table.KEY)
        for spec in table.ACTIONS:
            assert list(spec.params) == src.actions[spec.name]
    assert {n: c.size for n, c in p.counters.items()} == {
        n: s for n, (s, _) in src.counters.items()
    }
    assert {n: (r.size, r.width) for n, r in p.registers.items()} == src.registers


# ---- with the toolchain ---------------------------------------------------------------

TNA_SRC = ROOT / "p4" / "tna" / "heroserve_ina.p4"


@pytest.fixture(scope="module")
def p4c_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    reason = tool_missing("p4c-bm2-ss")
    if reason:
        pytest.skip(reason)
    out = Path(tmp_path_factory.mktemp("p4c"))
    try:
        _json, p4info = compile_v1model(out)
    except subprocess.CalledProcessError as e:
        pytest.fail(f"p4c-bm2-ss failed:\n{e.stderr}")
    # Again, for its messages (compile_v1model raises only on errors).
    proc = subprocess.run(
        ["p4c-bm2-ss", "--p4v", "16", "-o", str(out / "again.json"), str(P4_SRC)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return p4info, proc.stdout + proc.stderr


def test_v1model_program_compiles_without_warnings(p4c_output: tuple[Path, str]) -> None:
    _, messages = p4c_output
    assert messages.strip() == ""


def test_checked_in_p4info_is_p4cs_output(p4c_output: tuple[Path, str]) -> None:
    p4info, _ = p4c_output
    assert P4INFO.read_text() == p4info.read_text(), (
        "regenerate: p4c-bm2-ss --p4v 16 --p4runtime-files p4/heroserve_ina.p4info.txtpb "
        "-o /tmp/heroserve_ina.json p4/heroserve_ina.p4"
    )


@pytest.mark.parametrize("lanes", [[], ["-DINA_BFP16"]], ids=["int32", "bfp16"])
def test_tna_program_front_end_checks_clean(lanes: list[str]) -> None:
    # One build per lane format (docs/dataplane.md, "Lane formats").
    reason = tool_missing("p4test")
    if reason:
        pytest.skip(reason)
    include = os.environ.get("HEROSERVE_TNA_INCLUDE", "")
    if not include or not (Path(include) / "tna.p4").is_file():
        pytest.skip("HEROSERVE_TNA_INCLUDE does not name the Tofino p4include folder (tna.p4)")
    proc = subprocess.run(
        # bf-p4c defines the target; tna.p4 refuses to be read without it (Tofino 1 here).
        ["p4test", "-D__TARGET_TOFINO__=1", *lanes, "-I", include, str(TNA_SRC)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout + proc.stderr).strip() == ""
