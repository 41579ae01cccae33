"""Gated encoder gadgets and their stacking (seed 000, Alg. 2/3/6/7).

The encoder maps every key k_i to its code c_{f(i)} ∈ R^m with m scalar gadgets
``enc_j(x) = 1ᵀ[σ(G x + b_G) ⊙ (A_j x + b_A,j)] + b_E[j]``. Two builds:

* :func:`build_shared_gate` — one generic gate shared by all m gadgets (still
  generic for each), so one Gram factorization or one CG run serves every
  gadget: the fast path.
* :func:`build_per_gadget` — Alg. 3/7 exactly: each gadget samples its own gate,
  forms M explicitly and solves its own minimum-norm least squares. Kept as the
  faithful reference (and the slow baseline of the benchmarks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from tqdm.auto import tqdm

from . import _ops
from .solvers import GadgetOperator, SolveInfo, cg_iterations_hint, solve_cg, solve_cholesky


@dataclass
class GatedEncoder:
    """Stacked gadgets in gated-MLP layout; hidden unit r uses gate row r mod h_g.

    gate_weight: (h_g, d), gate_bias: (h_g,), up_weight: (m·h̃, d), up_bias: (m·h̃,),
    output_bias: (m,), with h_g = h̃ when the gate is shared and h_g = m·h̃ otherwise.
    """

    gate_weight: torch.Tensor
    gate_bias: torch.Tensor
    up_weight: torch.Tensor
    up_bias: torch.Tensor
    output_bias: torch.Tensor
    gadget_width: int
    solve: SolveInfo

    @property
    def num_gadgets(self) -> int:
        return self.output_bias.shape[0]


def gadget_width(num_facts: int, dim: int, width_multiplier: float) -> int:
    """h̃ = ⌈multiplier · F / (d+1)⌉, so that h̃(d+1) ≥ multiplier · F (Lemma 4.1.2 needs ≥ F)."""
    return max(1, math.ceil(width_multiplier * num_facts / (dim + 1)))


def sample_gate(keys: torch.Tensor, rows: int, generator: torch.Generator, gate_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A generic gate: i.i.d. Gaussian rows scaled so pre-activations are ~N(0, gate_scale²),
    and a zero bias (Alg. 7's default; a random bias made the Gram ~10x worse conditioned).

    keys: (F, d) -> (gate_weight (rows, d), gate_bias (rows,))
    """
    d = keys.shape[1]
    key_rms = keys.square().sum(1).mean().sqrt().clamp_min(1e-12)
    weight = torch.randn(rows, d, generator=generator, dtype=torch.float64).to(keys) * (gate_scale / key_rms)
    bias = torch.zeros(rows, dtype=keys.dtype, device=keys.device)
    return weight, bias


def augment(keys: torch.Tensor) -> torch.Tensor:
    """K̃ = [K, 1]: (F, d) -> (F, d+1); the last up-projection column is the bias b_A."""
    return torch.cat([keys, torch.ones(keys.shape[0], 1, dtype=keys.dtype, device=keys.device)], dim=1)


def build_shared_gate(
    keys: torch.Tensor,
    targets: torch.Tensor,
    *,
    width_multiplier: float,
    activation: str,
    solver: str,
    generator: torch.Generator,
    backend: str = "auto",
    gate_scale: float = 1.0,
    cg_tol: float = 1e-4,
    cg_max_iter: Optional[int] = None,
    progress: bool = True,
) -> GatedEncoder:
    """Encoder with one shared gate: keys (F, d), targets (F, m) -> :class:`GatedEncoder`.

    solver: "cholesky" (dense Gram, one factorization) or "cg" (matrix-free).
    """
    num_facts, d = keys.shape
    width = gadget_width(num_facts, d, width_multiplier)
    gate_weight, gate_bias = sample_gate(keys, width, generator, gate_scale)
    features = _ops.gate_features(keys, gate_weight, gate_bias, activation, backend=backend)
    op = GadgetOperator.whitened(features, augment(keys), backend=backend)
    if solver == "cholesky":
        alpha, info = solve_cholesky(op, targets)
    elif solver == "cg":
        max_iter = cg_max_iter or cg_iterations_hint(width_multiplier)
        alpha, info = solve_cg(op, targets, tol=cg_tol, max_iter=max_iter, progress=progress)
    else:
        raise ValueError(f"solver must be 'cholesky' or 'cg' here, got {solver!r}")
    coef, out_bias = op.unknowns(alpha)  # (m, h̃, d+1), (m,)
    m = coef.shape[0]
    return GatedEncoder(
        gate_weight=gate_weight,
        gate_bias=gate_bias,
        up_weight=coef[:, :, :d].reshape(m * width, d).contiguous(),
        up_bias=coef[:, :, d].reshape(m * width).contiguous(),
        output_bias=out_bias,
        gadget_width=width,
        solve=info,
    )


def build_per_gadget(
    keys: torch.Tensor,
    targets: torch.Tensor,
    *,
    width_multiplier: float,
    activation: str,
    generator: torch.Generator,
    gate_scale: float = 1.0,
    progress: bool = True,
) -> GatedEncoder:
    """Alg. 3/7 as written: per gadget, its own gate, explicit M̃ (F, h̃(d+1)+1) and
    a minimum-norm least-squares solve. Pure torch; O(m F² h̃ d) time.

    keys (F, d), targets (F, m) -> :class:`GatedEncoder` with h_g = m·h̃.
    """
    num_facts, d = keys.shape
    m = targets.shape[1]
    width = gadget_width(num_facts, d, width_multiplier)
    keys_aug = augment(keys)
    gates, gate_biases, ups, up_biases, out_biases = [], [], [], [], []
    worst = 0.0
    for j in tqdm(range(m), desc="per-gadget solves", disable=not progress, leave=False):
        gate_weight, gate_bias = sample_gate(keys, width, generator, gate_scale)
        features = _ops.activate(keys @ gate_weight.T + gate_bias, activation)  # (F, h̃)
        system = torch.cat([(features.unsqueeze(2) * keys_aug.unsqueeze(1)).reshape(num_facts, -1),
                            torch.ones(num_facts, 1, dtype=keys.dtype, device=keys.device)], dim=1)
        # gelsd: SVD-based minimum-norm solution of the underdetermined system, as Alg. 3 asks.
        driver = "gelsd" if system.device.type == "cpu" else None
        theta = torch.linalg.lstsq(system, targets[:, j : j + 1], driver=driver).solution.squeeze(1)
        worst = max(worst, float((system @ theta - targets[:, j]).norm() / targets[:, j].norm().clamp_min(1e-30)))
        coef = theta[:-1].view(width, d + 1)
        gates.append(gate_weight)
        gate_biases.append(gate_bias)
        ups.append(coef[:, :d])
        up_biases.append(coef[:, d])
        out_biases.append(theta[-1])
    return GatedEncoder(
        gate_weight=torch.cat(gates),
        gate_bias=torch.cat(gate_biases),
        up_weight=torch.cat(ups).contiguous(),
        up_bias=torch.cat(up_biases),
        output_bias=torch.stack(out_biases),
        gadget_width=width,
        solve=SolveInfo("per_gadget", str(keys.dtype).replace("torch.", ""), worst),
    )


__all__ = ["GatedEncoder", "build_shared_gate", "build_per_gadget", "gadget_width", "sample_gate", "augment"]
