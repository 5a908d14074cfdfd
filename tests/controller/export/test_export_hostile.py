"""The vLLM and SGLang start scripts treat every value as data: hostile values run nothing.

Each script is rendered with hostile values in every field a command line can put into it
(the model path, the tuner plugin, the addresses) and then run for every server and the
router, with stub ``vllm``, ``ray``, ``python``, ``vllm-router``, ``curl`` and ``getent`` on
PATH that record their argv and environment: the recorded calls must be exactly the ones
the JSON twin lists (``${ADDR}`` the server's address, ``${RUN}`` a new folder of the run),
and nothing else may run (no ``INJECTED`` file). Values the scripts cannot carry (a scope id,
the scripts' own variables, a duplicate or a broadcast address) are refused in one line.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.cli import main
from controller.export.script import _q
from tests.controller.export.test_export import hand_plan

# Shell that would run a command if a token reached the script unescaped; ``${ADDR}`` and
# ``${RUN}`` in a value are refused (test_values_the_scripts_expand_are_refused).
HOSTILE = [
    "$(touch INJECTED)",
    "`touch INJECTED`",
    "'; touch INJECTED; echo '",
    '"; touch INJECTED; echo "',
    "a b;touch INJECTED&&",
    "$ADDR\\$RUN*?[x]~ -x",
]
STUBS = ("vllm", "ray", "python", "vllm-router", "curl")
GETENT_ADDR = "10.9.8.7"  # what the stub getent resolves every name to
ENV_SEEN = ("NCCL_TUNER_PLUGIN", "VLLM_CONFIG_ROOT", "RAY_ADDRESS", "VLLM_NIXL_SIDE_CHANNEL_HOST",
            "VLLM_HOST_IP", "SGLANG_HOST_IP", "CUDA_VISIBLE_DEVICES")  # fmt: skip


def _stubs(d: Path) -> Path:
    """A folder of stub commands: each writes its name, argv and ENV_SEEN (NUL-separated)
    into a file of its own under $STUB_CALLS."""
    bin_ = d / "bin"
    bin_.mkdir()
    env = " ".join(f'"{k}=${{{k}-<unset>}}"' for k in ENV_SEEN)
    for name in STUBS:
        (bin_ / name).write_text(
            "#!/bin/bash\n"
            'f=$(mktemp "$STUB_CALLS/call.XXXXXXXX")\n'
            f'printf \'%s\\0\' {name} "$@" --env-- {env} > "$f"\n'
        )
    (bin_ / "getent").write_text(f'#!/bin/bash\necho "{GETENT_ADDR}  STREAM $2"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    return bin_


def _calls(d: Path) -> list[tuple[list[str], dict[str, str]]]:
    out = []
    for f in sorted(d.iterdir()):
        items = f.read_bytes().decode().split("\0")[:-1]
        k = items.index("--env--")
        env = dict(x.split("=", 1) for x in items[k + 1 :])
        out.append((items[:k], {n: v for n, v in env.items() if v != "<unset>"}))
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Plans with instances over two servers (Ray for vLLM, --nnodes for SGLang) and with
    instances on one server each."""
    d = tmp_path_factory.mktemp("hostile-plans")
    out = {}
    for engine in ("vllm", "sglang"):
        out[engine] = d / f"{engine}.json"
        argv = ["plan", "--topology", "testbed", "--model", "LLaMA-3-70B", "--engine", engine,
                "--planner", "heroserve", "--quiet", "--json", str(out[engine])]  # fmt: skip
        assert main(argv) == 0
    out["single"] = d / "single.json"
    hand_plan().save(out["single"])
    return out


@pytest.fixture
def listener() -> Iterator[tuple[str, socket.socket]]:
    """A loopback address of its own (127.x.y.z), where the test listens for the Ray
    workers' wait on their head's port."""
    rng = random.Random()
    ip = f"127.{rng.randint(1, 254)}.{rng.randint(1, 254)}.{rng.randint(1, 254)}"
    s = socket.socket()
    s.bind((ip, 20000))  # Ray block 0, the block every testbed instance takes
    s.listen(16)
    try:
        yield ip, s
    finally:
        s.close()


def _run_all(out: Path, fmt: str, tmp: Path, addresses: dict[str, str]) -> None:
    """Run the script for every server and the router with the stubs; check each server's
    calls are the JSON's commands for it, with its address and a new run folder."""
    doc = json.loads((out / f"{fmt}.json").read_text())
    bin_ = _stubs(tmp)
    servers = [*doc["addresses"], "router"]
    for server in servers:
        calls = tmp / f"calls-{server}"
        calls.mkdir()
        work = tmp / f"work-{server}"
        work.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ENV_SEEN}
        env.update(PATH=f"{bin_}:{os.environ['PATH']}", STUB_CALLS=str(calls),
                   TMPDIR=str(work), HEROSERVE_LOGS=str(work / "logs"),
                   HEROSERVE_START_TIMEOUT="30")  # fmt: skip
        r = subprocess.run(["bash", str(out / f"{fmt}.sh"), server], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, (server, r.stderr[-2000:])
        assert not list(tmp.rglob("INJECTED")), (server, r.stderr[-2000:])
        addr = addresses.get(server, GETENT_ADDR)
        runs = list(work.glob("heroserve-run.*"))
        assert len(runs) <= 1
        run = str(runs[0]) if runs else "<none>"

        def sub(v: str, addr: str = addr, run: str = run) -> str:
            return v.replace("${ADDR}", addr).replace("${RUN}", run)

        mine = [c for c in doc["commands"] if c["server"] == server]
        want = [
            ([sub(t) for t in c["argv"]], {k: sub(v) for k, v in c["env"].items() if k in ENV_SEEN})
            for c in mine
            if c["argv"][0] != "bash"  # the vLLM config writer: real bash, checked below
        ]
        urls = [c["health"] for c in mine if c["health"]]
        if server == "router":
            urls += [i["url"] for i in doc["instances"]]
        got = _calls(calls)
        assert sorted((c for c in got if c[0][0] != "curl"), key=repr) == sorted(want, key=repr)
        assert sorted(a for a, _ in got if a[0] == "curl") == sorted(
            ["curl", "-fsS", "-o", "/dev/null", f"{u}/health"] for u in urls
        )
        for c in mine:  # vLLM's config file, written into the run's own folder
            if c["argv"][0] == "bash":
                cfg = Path(sub(c["argv"][4])) / c["argv"][6]
                assert cfg.parent.parent == Path(run) and json.loads(cfg.read_text()) == json.loads(
                    c["argv"][5]
                )
                assert (Path(run).stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("hostile", range(len(HOSTILE)))
@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_scripts_run_only_the_intended_commands(
    fmt: str,
    hostile: int,
    plans: dict[str, Path],
    tmp_path: Path,
    listener: tuple[str, socket.socket],
) -> None:
    value = HOSTILE[hostile]
    ip, _ = listener
    for kind in (fmt, "single"):
        if kind == "single" and hostile % 2:  # every value on both shapes, half the runs
            continue
        tmp = tmp_path / kind
        tmp.mkdir()
        # heads on the listener's address (the workers wait on its port 20000), one server
        # on IPv6, the others resolved by the stub getent
        addresses = {"srv0": ip, "srv2": ip, "srv3": "fd00::3"}
        if kind == "single":
            addresses = {"srv0": "fd00::10", "srv1": "10.0.0.1"}
        flags = [x for s, a in addresses.items() for x in ("--address", f"{s}={a}")]
        out = tmp / "out"
        rc = main(["export", "--plan", str(plans[kind]), "--format", fmt, "--out", str(out),
                   "--model-path", value, "--tuner-plugin", value + ".so", *flags])  # fmt: skip
        assert rc == 0
        subprocess.run(["bash", "-n", str(out / f"{fmt}.sh")], check=True)
        doc = json.loads((out / f"{fmt}.json").read_text())
        engines = [c for c in doc["commands"] if c["what"].startswith("engine")]
        assert all(value in c["argv"] for c in engines)
        assert all(c["env"]["NCCL_TUNER_PLUGIN"] == value + ".so" for c in engines)
        _run_all(out, fmt, tmp, addresses)


def test_ipv6_is_bracketed_where_it_meets_a_port(plans: dict[str, Path], tmp_path: Path) -> None:
    """Before: ``http://fd00::2:8101`` and ``RAY_ADDRESS=fd00::2:21000`` could not be
    parsed; a bare IPv6 address stays bare where no port follows (--node-ip-address)."""
    out = tmp_path / "out"
    flags = ["--address", "srv0=fd00::2", "--address", "srv2=fd00::4"]
    argv = ["export", "--plan", str(plans["vllm"]), "--format", "vllm", "--out", str(out)]
    assert main([*argv, *flags]) == 0
    doc = json.loads((out / "vllm.json").read_text())
    serve = {c["instance"]: c for c in doc["commands"] if c["what"] == "engine"}
    head = {c["instance"]: c for c in doc["commands"] if c["what"] == "ray head"}
    worker = {c["instance"]: c for c in doc["commands"] if c["what"] == "ray worker"}
    for inst, ip in (("decode/0", "fd00::2"), ("prefill/0", "fd00::4")):
        assert serve[inst]["health"].startswith(f"http://[{ip}]:")
        assert serve[inst]["env"]["RAY_ADDRESS"] == f"[{ip}]:20000"
        assert worker[inst]["after"] == f"[{ip}]:20000"
        argv = head[inst]["argv"]
        assert argv[argv.index("--node-ip-address") + 1] == ip
    router = next(c for c in doc["commands"] if c["what"] == "router")
    assert "http://[fd00::2]:8101" in router["argv"]
    sg = tmp_path / "sg"
    argv = ["export", "--plan", str(plans["sglang"]), "--format", "sglang", "--out", str(sg)]
    assert main([*argv, *flags]) == 0
    doc = json.loads((sg / "sglang.json").read_text())
    dist = {c["argv"][c["argv"].index("--dist-init-addr") + 1] for c in doc["commands"]
            if "--dist-init-addr" in c["argv"]}  # fmt: skip
    assert dist and all(re.fullmatch(r"\[fd00::[24]\]:50\d\d", d) for d in dist), dist


def test_q_quotes_everything_but_the_scripts_variables(tmp_path: Path) -> None:
    """``_q`` used to wrap a token holding ``${ADDR}`` in double quotes as it was."""
    for token in ['${ADDR}"; touch INJECTED; echo "', "http://${ADDR}:1/$(touch INJECTED)`y`'z'",
                  "${RUN}/a b", "${ADDR}${RUN}", "", "$", "'"]:  # fmt: skip
        r = subprocess.run(["bash", "-c", f"ADDR='1.2.3.4'; RUN=/r; printf %s {_q(token)}"],
                           capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
        assert r.stdout == token.replace("${ADDR}", "1.2.3.4").replace("${RUN}", "/r"), token
        assert not (tmp_path / "INJECTED").exists(), token


REFUSED = [
    # (flag, value, what the line says)
    ("--model-path", '${ADDR}"; touch INJECTED; echo "', "the start scripts expand"),
    ("--tuner-plugin", "${RUN}/x.so", "the start scripts expand"),
    ("--tuner-plugin", "", "NCCL_TUNER_PLUGIN needs"),
    ("--address", "srv0=fe80::1%$(touch INJECTED)", "scope id"),
    ("--address", "srv0=fe80::1%eth0", "scope id"),
    ("--address", "srv0=0.0.0.0", "names no server"),
    ("--address", "srv0=::", "names no server"),
    ("--address", "srv0=255.255.255.255", "names no server"),
    ("--address", "srv0=224.0.0.1", "names no server"),
    ("--address", "srv0=ff02::1", "names no server"),
    ("--address", "srv0=10.0.0.1 --address srv0=10.0.0.2", "was given an address already"),
]


@pytest.mark.parametrize("flag,value,says", REFUSED)
def test_values_the_scripts_cannot_carry_are_refused(
    flag: str, value: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pf = tmp_path / "plan.json"
    hand_plan().save(pf)
    extra = [flag, value]
    if " --address " in value:  # the duplicate
        a, b = value.split(" --address ")
        extra = [flag, a, flag, b]
    out = tmp_path / "out"
    rc = main(["export", "--plan", str(pf), "--format", "vllm", "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert not out.exists() and not list(tmp_path.rglob("INJECTED"))
