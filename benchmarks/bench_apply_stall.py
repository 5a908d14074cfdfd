"""How long the controller's event loop stops while an ApplyPlan body is parsed.

A controller on its own event loop thread (``ThreadedServer``, SQLite in a temporary folder)
gets one large ApplyPlan body: a sample plan whose ``reason`` strings are padded until the
body is ``--mb`` MB (the controller parses all of it, then refuses it or applies it: the
stall is the parse). Meanwhile a probe thread calls ``Admin.GetState`` back to back and
records each call's latency; the longest is how long the loop could not answer. Two ways,
alternating ``--repeats`` times in the same run:

- ``on loop`` (the baseline, what the controller did before): the Admin RPC with the parse
  run inline on the loop (the servicer's ``asyncio.to_thread`` replaced by a plain call);
- ``thread`` (what it does now): the Admin RPC, which parses in a worker thread.

    .venv/bin/python benchmarks/bench_apply_stall.py [--mb 56] [--repeats 3]
        [--shape strings|numbers]

Prints each way's longest GetState latency (median over repeats) and their ratio. Figures
depend on the machine and on sharing its cores: compare only the two ways of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service import servicer
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ControllerServer, ThreadedServer
from controller.service.store import Store


def big_body(mb: float, shape: str = "strings") -> str:
    """A sample plan padded to ``mb`` MB: through its groups' ``reason`` strings (``strings``,
    cheap to decode), or through a list of small numbers in its ``options`` (``numbers``, the
    costliest JSON to decode per byte)."""
    doc = json.loads(sample_plan(ina_groups=2, ring_groups=2).to_json())
    if shape == "numbers":
        doc["options"]["pad"] = [0] * int(mb * 1e6 / 2)  # "0," per item
        return json.dumps(doc, separators=(",", ":"))
    groups = doc["prefill"]["groups"] + doc["decode"]["groups"]
    pad = int(mb * 1e6 / len(groups))
    for g in groups:
        g["reason"] = "x" * pad
    return json.dumps(doc)


def longest_stall(srv: ThreadedServer, apply) -> float:  # noqa: ANN001 - a callable
    """The longest GetState latency (s) while ``apply()`` runs."""
    done = threading.Event()
    worst = 0.0
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        stub = pb_grpc.AdminStub(ch)
        stub.GetState(pb.GetStateRequest(), timeout=30)  # connected before timing

        def probe() -> None:
            nonlocal worst
            while not done.is_set():
                t0 = time.perf_counter()
                stub.GetState(pb.GetStateRequest(), timeout=60)
                worst = max(worst, time.perf_counter() - t0)

        t = threading.Thread(target=probe)
        t.start()
        try:
            apply()
        finally:
            done.set()
            t.join(120)
    return worst


# The client, in its own process so that building and sending the body does not hold this
# process's interpreter lock: it says "ready" once the body is built, sends on a line.
CLIENT = """
import sys, grpc
from agents.proto.heroserve.v1 import control_pb2 as pb, control_pb2_grpc as pb_grpc
req = pb.ApplyPlanRequest(plan_json=sys.stdin.readline().rstrip("\\n"))
print("ready", flush=True)
sys.stdin.readline()
with grpc.insecure_channel(sys.argv[1]) as ch:
    try:
        pb_grpc.AdminStub(ch).ApplyPlan(req, timeout=300)
    except grpc.RpcError:
        pass  # refused: the decoding before it is what is timed
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=56.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shape", choices=("strings", "numbers"), default="strings")
    a = ap.parse_args()
    body = big_body(a.mb, a.shape)
    with tempfile.TemporaryDirectory() as d:
        srv = ThreadedServer(
            ControllerServer(Store(Path(d) / "c.db"), topology=sample_topology(ina_groups=2))
        )
        try:

            def rpc() -> float:
                client = subprocess.Popen(
                    [sys.executable, "-c", CLIENT, f"127.0.0.1:{srv.port}"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert client.stdin is not None and client.stdout is not None
                client.stdin.write(body + "\n")
                client.stdin.flush()
                assert client.stdout.readline() == "ready\n"

                def send() -> None:
                    client.stdin.write("go\n")
                    client.stdin.flush()
                    client.wait()

                return longest_stall(srv, send)

            async def inline(fn, *args):  # noqa: ANN001, ANN002, ANN202 - to_thread's shape
                return fn(*args)

            def on_loop() -> float:
                real = servicer.asyncio.to_thread
                servicer.asyncio.to_thread = inline  # type: ignore[assignment]
                try:
                    return rpc()
                finally:
                    servicer.asyncio.to_thread = real  # type: ignore[assignment]

            ways = {"on loop": on_loop, "thread": rpc}
            got: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(a.repeats):
                for k, way in ways.items():
                    got[k].append(way())
        finally:
            srv.stop()
    print(
        f"ApplyPlan body of {len(body) / 1e6:.1f} MB ({a.shape});"
        " longest GetState latency meanwhile"
    )
    med = {k: statistics.median(v) for k, v in got.items()}
    for k, v in got.items():
        runs = ", ".join(f"{x * 1e3:.1f}" for x in v)
        print(f"  {k:8} median {med[k] * 1e3:8.1f} ms  (runs: {runs})")
    print(f"  ratio on loop / thread: {med['on loop'] / med['thread']:.1f}x")


if __name__ == "__main__":
    main()
