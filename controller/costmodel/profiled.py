"""The compute model fitted to an engine profile: Eqs. 12-13's coefficients from measured
times instead of datasheet figures (docs/engine-profile.md).

Holds ``fit_profile`` (a ``ComputeProfile`` and its model to ``ComputeCoefficients``, with the
fit's residuals and the grid's reach in a ``ProfileFit``) and ``compute_table`` (the fitted
coefficients per GPU type that ``PlannerOptions.compute`` carries).

Why a fit and not interpolation: the paper obtains C1..C6 by profiling (its §IV-C), every
pricer of the planner and both simulators take the compute model in Eqs. 12-13's form (the
simulator's fast path and its decode hot loop precompute its terms), so a profile enters as
the same six numbers, and the planner and the simulator still price with one model. Within
the grid the fit's error is reported (``ProfileFit.max_error``); beyond it Eqs. 12-13's form
extrapolates, and ``ProfileFit.outside`` says where an operating point lies past the grid.

The fit, per layer (times / the model's layers), at the profile's TP:
    prefill  t = C1 W K / TP + C2 3 h K2 / (b TP) + C3         K = B L, K2 = B L^2
    decode   t = C1d W B / TP + C5 3 h_kv K / TP + C6           K = B c;  C4 = 0
by non-negative least squares on relative errors (each point weighs as much as any other).
Decode has its own GEMM coefficient C1d and no memory floor (C4 = 0): a step's fixed
weight read is indistinguishable from its fixed overhead, and both land in C6. Other TP
degrees scale C1, C2, C5 by 1/TP as Eqs. 12-13 do (an assumption the profile cannot check).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from controller.costmodel.compute import ATTENTION_BLOCK, ComputeCoefficients, layer_weights
from controller.errors import InputError
from controller.models.profile import ComputeProfile
from controller.models.specs import ModelSpec


@dataclass(frozen=True)
class ProfileFit:
    coefficients: ComputeCoefficients
    max_error: dict[str, float]  # table -> largest |fit - measured| / measured over its grid
    profile: ComputeProfile

    def outside(self, prompt: float, batch: float, context: float) -> list[str]:
        """Where an operating point (a prefill of one ``prompt``, a decode ``batch`` holding
        ``context`` tokens each) lies past the measured grid: the extrapolated parts."""
        p, d = self.profile.prefill, self.profile.decode
        out = []
        if prompt > p.cols[-1]:
            out.append(f"prompt {prompt:.0f} > {p.cols[-1]} tokens")
        if batch > d.rows[-1]:
            out.append(f"decode batch {batch:.0f} > {d.rows[-1]}")
        if context > d.cols[-1]:
            out.append(f"decode context {context:.0f} > {d.cols[-1]} tokens")
        return out

    def describe(self) -> str:
        """One line: what the profile is and how well Eqs. 12-13 fit it."""
        pr = self.profile
        return (
            f"compute from profile ({pr.engine} on {pr.hardware}, {pr.model} TP {pr.tp}, as "
            f"{pr.gpu_type}): Eqs. 12-13 fitted, largest error prefill "
            f"{self.max_error['prefill']:.1%}, decode {self.max_error['decode']:.1%}"
        )


def _nnls_relative(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative x-coefficients minimising the squared relative error; and the largest
    relative error. Columns are scaled to unit norm for the solver's conditioning."""
    a = x / t[:, None]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    sol, _ = nnls(a / scale, np.ones_like(t))
    coef = sol / scale
    err = np.abs(x @ coef - t) / t
    return coef, float(err.max())


def fit_profile(profile: ComputeProfile, model: ModelSpec) -> ProfileFit:
    """Eqs. 12-13's coefficients fitted to ``profile`` for ``model`` (module docstring).
    InputError when the profile is for another model."""
    if profile.model.lower() != model.name.lower():
        raise InputError(f"the profile measures {profile.model}, the plan is for {model.name}")
    w, tp, layers = layer_weights(model), profile.tp, model.layers
    pre = np.array(profile.prefill.points(), dtype=float)
    b, length, t = pre[:, 0], pre[:, 1], pre[:, 2] / layers
    xp = np.stack([w * b * length / tp, 3 * model.hidden * b * length**2 / (ATTENTION_BLOCK * tp),
                   np.ones_like(t)], axis=1)  # fmt: skip
    (c1, c2, c3), e_pre = _nnls_relative(xp, t)
    dec = np.array(profile.decode.points(), dtype=float)
    b, ctx, t = dec[:, 0], dec[:, 1], dec[:, 2] / layers
    xd = np.stack([w * b / tp, 3 * model.kv_dim * b * ctx / tp, np.ones_like(t)], axis=1)
    (c1d, c5, c6), e_dec = _nnls_relative(xd, t)
    co = ComputeCoefficients(
        c1=float(c1), c2=float(c2), c3=float(c3), c4=0.0, c5=float(c5), c6=float(c6),
        c1d=float(c1d),
    )  # fmt: skip
    return ProfileFit(co, {"prefill": e_pre, "decode": e_dec}, profile)


def compute_table(fit: ProfileFit) -> tuple[tuple[str, ComputeCoefficients], ...]:
    """What ``PlannerOptions.compute`` holds for ``fit``: its GPU type's coefficients."""
    return ((fit.profile.gpu_type, fit.coefficients),)
