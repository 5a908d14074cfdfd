"""The INA session the controller hands each aggregation group (controller.service.groups,
SessionSource; docs/dataplane.md, "Known limits", Sessions): the epoch that installed the
group's content, kept while the content is unchanged (and across a restart of the
controller on its database), newer when the content changes; the first generation a hash
of the database's generation, the session and the name; the switch's lane format."""

from __future__ import annotations

import hashlib
from pathlib import Path

from agents.ina.packet import DEFAULT_LANE_FORMAT as LANE_FORMAT
from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.service.core import Controller
from controller.service.sample import sample_plan, sample_topology
from controller.service.store import Store

GROUP = "prefill/0/0"


def _assignment(c: Controller, name: str = GROUP) -> pb.InaAssignment:
    assert c.state is not None
    return c.state.ina_by_name[name]


def _first_generation(store: Store, session: int, name: str) -> int:
    seed = f"{store.generation}/{session}/{name}".encode()
    return int.from_bytes(hashlib.blake2b(seed, digest_size=4).digest(), "big")


def test_session_kept_while_unchanged_newer_when_changed_and_after_restart(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "c.db")
    c = Controller(store, topology=sample_topology())
    e1, _ = c.apply_plan(sample_plan().to_json())
    a1 = _assignment(c)
    assert (a1.session, a1.lane_format) == (e1, LANE_FORMAT)
    assert a1.first_generation == _first_generation(store, e1, GROUP)
    # Another plan (only its notes differ): the group's content is unchanged, so is its session.
    e2, _ = c.apply_plan(sample_plan(tag="v2").to_json())
    assert e2 > e1
    a2 = _assignment(c)
    assert (a2.session, a2.first_generation) == (a1.session, a1.first_generation)
    # Members in another order: other worker ids, so a new session, newer than the last.
    p3 = sample_plan(tag="v3")
    p3.prefill.groups[0].gpus.reverse()
    e3, _ = c.apply_plan(p3.to_json())
    a3 = _assignment(c)
    assert a3.session == e3 and a3.session > a2.session
    assert a3.first_generation == _first_generation(store, e3, GROUP)
    assert a3.first_generation != a2.first_generation
    store.close()
    # A restarted controller on the same database hands out the same session.
    store = Store(tmp_path / "c.db")
    restarted = Controller(store, topology=sample_topology())
    a4 = _assignment(restarted)
    assert (a4.session, a4.first_generation) == (a3.session, a3.first_generation)
    store.close()


def test_a_gpu_agent_receives_the_session_of_its_groups(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    c = Controller(store, topology=sample_topology())
    epoch, _ = c.apply_plan(sample_plan().to_json())
    ident = pb.NodeIdentity(node_id="p0", kind=pb.NODE_KIND_GPU)
    inv = pb.GpuInventory(gpus=[pb.GpuInfo(gpu_id=f"p0-g{k}") for k in range(4)])
    c.register(pb.RegisterRequest(identity=ident, gpu=inv))
    state = c.node_state(ident)
    (a,) = state.gpu_ina.values()
    assert a.session == epoch and a.lane_format == LANE_FORMAT
    assert [m.gpu for m in a.members] == [f"p0-g{k}" for k in range(4)]
    assert [m.worker_id for m in a.members] == [0, 1, 2, 3]
    store.close()
