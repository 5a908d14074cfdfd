"""The request scheduler of the heterogeneous high-throughput paper (``003_...`` §4): an
output-length predictor, a workload calculator and a mapper.

- Predictor: the paper's simple one, a normal draw with the workload's output mean and
  standard deviation (clipped to at least 1 token).
- Workload calculator (Eqs. 5-8, rebuilt from the prose, docs/related-planners.md): for
  request r on instance j, b* identical copies of r fill j's KV memory (Eq. 5); they take
  T = Eq. 3 + sum of Eq. 4 (Eq. 6); the request's share is tau = T / b*. With u_j the share of
  j's KV memory its unfinished requests would fill at their prompt plus predicted output
  (Eq. 8, may exceed 1), the workload is ``W = tau + u_j^k`` (Eq. 7, k = 2): at moderate load
  tau dominates and favours fast instances; when KV fills, u^k grows and takes over, as the
  paper describes.
- Mapper: send r to the instance minimising ``L_j + W_rj``, L_j the sum of the workloads of
  j's unfinished requests; add W on dispatch and subtract it when the request finishes.
- ``mb`` (memory-based, the paper's comparison) is the same with tau fixed to 1.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from controller.errors import InputError
from controller.related.hetero_model import InstanceModel


class Mapper:
    def __init__(
        self,
        instances: Sequence[InstanceModel],
        policy: str,
        k: float,
        out_mean: float,
        out_std: float,
        rng: random.Random,
        max_out: int = 1 << 20,
    ) -> None:
        if policy not in ("os", "mb"):
            raise InputError(f"unknown workload mapper {policy!r}")
        if not instances:
            raise InputError("the mapper needs at least one instance")
        self.inst = list(instances)
        self.policy = policy
        self.k = k
        self.out_mean, self.out_std = out_mean, out_std
        self.rng = rng
        self.max_out = max_out
        n = len(self.inst)
        self.load = [0.0] * n  # L_j
        self.in_sum = [0.0] * n
        self.out_sum = [0.0] * n

    @classmethod
    def from_params(cls, params: dict, n: int, policy: str, rng: random.Random) -> Mapper:
        try:
            insts = [InstanceModel.from_params(d) for d in params["instances"]]
            k = float(params.get("mapper_k", 2.0))
            mean, std = float(params["out_mean"]), float(params.get("out_std", 0.0))
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"plan's mapper parameters are incomplete ({e})") from None
        if len(insts) != n:
            raise InputError(f"plan has {n} replicas but {len(insts)} instance models")
        return cls(insts, policy, k, mean, std, rng)

    def predict(self) -> float:
        x = self.rng.gauss(self.out_mean, self.out_std) if self.out_std > 0 else self.out_mean
        return float(min(self.max_out, max(1.0, round(x))))

    def tau(self, j: int, l_in: float, l_out: float) -> float:
        """Eqs. 5-6: per-request time of ``b*`` identical requests on instance j."""
        im = self.inst[j]
        b = im.ideal_batch(l_in, l_out)
        return im.batch_s(b, l_in, l_out) / b

    def utilisation(self, j: int) -> float:
        """Eq. 8."""
        im = self.inst[j]
        return (self.in_sum[j] + self.out_sum[j]) * im.kv_per_token / max(im.kv_bytes, 1.0)

    def workload(self, j: int, l_in: float, l_out: float) -> float:
        """Eq. 7."""
        t = self.tau(j, l_in, l_out) if self.policy == "os" else 1.0
        return t + self.utilisation(j) ** self.k

    def assign(self, l_in: float) -> tuple[int, float, float]:
        """(instance, workload booked, predicted output) for a new request."""
        pred = self.predict()
        w = [self.workload(j, l_in, pred) for j in range(len(self.inst))]
        j = min(range(len(w)), key=lambda i: (self.load[i] + w[i], i))
        self.load[j] += w[j]
        self.in_sum[j] += l_in
        self.out_sum[j] += pred
        return j, w[j], pred

    def release(self, j: int, work: float, l_in: float, pred: float) -> None:
        """The hook run when a request finishes."""
        self.load[j] -= work
        self.in_sum[j] -= l_in
        self.out_sum[j] -= pred
