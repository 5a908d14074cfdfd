"""What the tests of the controller's gRPC service (tests/controller/service/) share: the
identities they register as, a switch's inventory, registration, a policy stream read on a
thread, the status code of a refused call, and a hand-made hierarchical-INA plan."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan

SW = pb.NodeIdentity(node_id="s1", kind=pb.NODE_KIND_SWITCH)
GPU = pb.NodeIdentity(node_id="p0-g1", kind=pb.NODE_KIND_GPU)


def switch_inventory(slots: int = 1024) -> pb.SwitchInventory:
    inv = pb.SwitchInventory(device_id=1, aggregator_slots=slots, slot_bytes=128)
    for k in range(4):
        inv.ports.add(
            port=k + 1,
            peer=f"p0-g{k}",
            capacity=12.5e9,
            peer_mac=f"02:00:00:00:00:0{k + 1}",
            peer_ipv4=f"10.0.0.{k + 1}",
        )
    return inv


def register(stub: pb_grpc.ControlStub, ident: pb.NodeIdentity, slots: int = 1024) -> str:
    req = pb.RegisterRequest(identity=ident)
    if ident.kind == pb.NODE_KIND_SWITCH:
        req.switch_inventory.CopyFrom(switch_inventory(slots))
    else:
        req.gpu.gpus.add(gpu_id=ident.node_id, gpu_type="A100-40GB")
    return stub.Register(req, timeout=5).session_id


class Stream:
    """A policy stream read on a thread, so tests can wait with a timeout."""

    def __init__(self, stub: pb_grpc.ControlStub, ident: pb.NodeIdentity, session: str) -> None:
        self.call = stub.Subscribe(pb.SubscribeRequest(identity=ident, session_id=session))
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for upd in self.call:
                self.q.put(upd)
        except grpc.RpcError as exc:
            self.q.put(exc)

    def next(self, timeout: float = 10) -> pb.PolicyUpdate:
        item = self.q.get(timeout=timeout)
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self.call.cancel()


def code_of(fn, *args, **kw) -> grpc.StatusCode:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as ei:
        fn(*args, **kw)
    return ei.value.code()


def hier_plan(model: str = "none"):  # noqa: ANN201
    """A hand-made testbed plan: prefill instance 0 is one hierarchical group over two A100
    servers x two GPUs (rail 0 = the GPU 0s on s1, rail 1 = the GPU 1s on s2); decode is
    TP=1 (no table)."""
    from controller.plan import Group, Instance, Rail

    p = sample_plan(ina_groups=0, ring_groups=0)
    p.topology, p.model = "testbed", model
    gpus = ["srv0-gpu0", "srv0-gpu1", "srv1-gpu0", "srv1-gpu1"]
    rails = [
        Rail(sw, k, 2, [f"srv0-gpu{k}", f"srv1-gpu{k}"], None, {
            f"srv{s}-gpu{k}": [f"srv{s}-gpu{k}", sw] for s in (0, 1)
        })
        for k, sw in enumerate(("s1", "s2"))
    ]  # fmt: skip
    g = Group(0, 0, gpus, "hier", None, None, {}, 1e-4, 2e-4, 3e-4, "hand-made", rails, 1e-4)
    p.prefill.tp, p.prefill.instances, p.prefill.groups = 4, [Instance([gpus])], [g]
    p.decode.tp, p.decode.instances = 1, [Instance([["srv2-gpu0"]])]
    p.decode.groups = [Group(0, 0, ["srv2-gpu0"], "ring", None, None, {}, 0.0, None, 0.0, "TP=1")]
    return p
