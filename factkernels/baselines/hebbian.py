"""Bilinear "Hebbian" MLPs: the seed authors' later construction (HazyResearch/hebbian-mlps).

    g(x) = W φ(x),   φ(x) = s · (A₀ x) ⊙ (A₁ x)   with A₀, A₁ (m, d_in), W (d_out, m)

Three variants, as in the authors' code (protocol re-implemented here):

* ``"raw"`` — random Gaussian A₀, A₁ (s = 1/√m) and the raw Hebbian readout
  W = Σ_i v_f(i) φ(k_i)ᵀ / F (the correlation of outputs and features; their "unwhitened").
* ``"ridge"`` — the same random features and the ridge readout W = argmin Σ_i ||W φ_i − v_f(i)||²
  + λF||W||², solved in feature space (m ≤ F) or in fact space (m > F) (their "whitened").
* ``"data_dependent"`` — A₀, A₁ fitted to the facts (s = 1): starting from random A₀, A₁ and
  the raw readout W₀ of their features, A₁ and then A₀ are each the minimizer of the convex
  quadratic Σ_i [½ y_iᵀ G y_i − v_f(i)ᵀ y_i] + ½λ||A||², y_i = W₀ φ(k_i), G = Σ_i v_f(i) v_f(i)ᵀ,
  (linear in the matrix being fitted; solved by Jacobi-preconditioned CG), then the ridge readout.

Parameters: 2 m d_in + d_out m (A₀, A₁ and W; no biases). The size of a cost search is m.
"""

from __future__ import annotations

import math

import torch

from ..validation import validate_inputs
from ..mlp import DecodingMLP

VARIANTS = ("raw", "ridge", "data_dependent")
RIDGE = 1e-6  # the authors' default ridge λ
CG_TOL = 1e-10  # relative residual of the data-dependent fit (float64)


class HebbianMLP(DecodingMLP):
    """g(x) = W (scale · (A₀ x) ⊙ (A₁ x)). first/second: A₀, A₁ (m, d_in); readout: W (d_out, m)."""

    def __init__(self, first: torch.Tensor, second: torch.Tensor, readout: torch.Tensor, scale: float) -> None:
        super().__init__()
        if first.dim() != 2 or first.shape != second.shape or readout.dim() != 2 or readout.shape[1] != first.shape[0]:
            raise ValueError(f"need A0, A1 (m, d_in) and W (d_out, m), got {tuple(first.shape)}, {tuple(second.shape)}, "
                             f"{tuple(readout.shape)}")
        self.register_buffer("first", first.detach().contiguous())
        self.register_buffer("second", second.detach().contiguous())
        self.register_buffer("readout", readout.detach().contiguous())
        self.scale = float(scale)

    @property
    def num_parameters(self) -> int:
        """2 m d_in + d_out m."""
        return self.first.numel() + self.second.numel() + self.readout.numel()

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """φ(x): (..., d_in) -> (..., m)."""
        return (x @ self.first.T) * (x @ self.second.T) * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x) @ self.readout.T


def raw_readout(targets: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """W = targetsᵀ features / F: targets (F, d_out), features (F, m) -> (d_out, m)."""
    return targets.T @ features / features.shape[0]


def ridge_readout(targets: torch.Tensor, features: torch.Tensor, ridge: float) -> torch.Tensor:
    """argmin_W Σ_i ||W φ_i − t_i||² + λF||W||² -> (d_out, m), in the smaller of feature and fact space."""
    num, width = features.shape
    if width > num:  # W = Tᵀ (Φ Φᵀ + λF I)⁻¹ Φ
        gram = features @ features.T + ridge * num * torch.eye(num, dtype=features.dtype, device=features.device)
        return torch.linalg.solve(gram, targets).T @ features
    covariance = features.T @ features + ridge * num * torch.eye(width, dtype=features.dtype, device=features.device)
    return torch.linalg.solve(covariance, features.T @ targets).T


def _fit_factor(partner: torch.Tensor, keys: torch.Tensor, targets: torch.Tensor, readout: torch.Tensor,
                ridge: float) -> torch.Tensor:
    """The factor A (m, d) minimizing Σ_i [½ y_iᵀ G y_i − t_iᵀ y_i] + ½λ||A||², y_i = W (c_i ⊙ A k_i).

    partner: C (m, F), the other factor's projections of the keys; keys (F, d); targets (F, d_out);
    readout W (d_out, m). The normal equations O(A) = R with O(A) = (C ⊙ Wᵀ G W (C ⊙ A Kᵀ)) K + λA
    and R = (C ⊙ Wᵀ Tᵀ) K are solved by CG preconditioned with O's diagonal.
    """
    gram = targets.T @ targets  # G (d_out, d_out)
    coupling = readout.T @ gram @ readout  # Wᵀ G W (m, m)

    def operator(a: torch.Tensor) -> torch.Tensor:
        return (partner * (coupling @ (partner * (a @ keys.T)))) @ keys + ridge * a

    rhs = (partner * (readout.T @ targets.T)) @ keys
    inverse_diagonal = 1.0 / (coupling.diagonal()[:, None] * (partner.square() @ keys.square()) + ridge).clamp_min(1e-30)
    solution = torch.zeros_like(rhs)
    residual = rhs.clone()
    direction = inverse_diagonal * residual
    residual_dot = (residual * direction).sum()
    tolerance = CG_TOL * float(rhs.norm())
    for _ in range(max(2 * rhs.shape[0], 128)):
        if float(residual.norm()) <= tolerance:
            break
        applied = operator(direction)
        step = residual_dot / (direction * applied).sum()
        solution = solution + step * direction
        residual = residual - step * applied
        preconditioned = inverse_diagonal * residual
        next_dot = (residual * preconditioned).sum()
        direction = preconditioned + (next_dot / residual_dot) * direction
        residual_dot = next_dot
    return solution


def hebbian(K: torch.Tensor, V: torch.Tensor, f: torch.Tensor, m: int, *, variant: str = "ridge",
            ridge: float = RIDGE, seed: int = 0) -> HebbianMLP:
    """A bilinear Hebbian MLP with m features storing f (see the module docstring).

    K: (F, d_in), V: (|V|, d_out), f: (F,); the random factors come from Generator(seed) on
    the CPU. The fit runs in float64; the MLP has the keys' dtype and device.
    """
    facts = validate_inputs(K, V, f)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be a positive int, got {m!r}")
    if not (isinstance(ridge, (int, float)) and ridge >= 0):
        raise ValueError(f"ridge must be a non-negative number, got {ridge!r}")
    keys, targets = K.double(), V.double()[facts]
    generator = torch.Generator().manual_seed(seed)
    first = torch.randn(m, K.shape[1], generator=generator, dtype=torch.float64).to(keys.device)
    second = torch.randn(m, K.shape[1], generator=generator, dtype=torch.float64).to(keys.device)
    scale = 1.0 / math.sqrt(m)
    if variant == "data_dependent":
        scale = 1.0
        start = raw_readout(targets, (keys @ first.T) * (keys @ second.T))
        second = _fit_factor(first @ keys.T, keys, targets, start, ridge)
        first = _fit_factor(second @ keys.T, keys, targets, start, ridge)
    features = (keys @ first.T) * (keys @ second.T) * scale
    readout = raw_readout(targets, features) if variant == "raw" else ridge_readout(targets, features, ridge)
    return HebbianMLP(first.to(K), second.to(K), readout.to(K), scale)


__all__ = ["HebbianMLP", "RIDGE", "VARIANTS", "hebbian", "raw_readout", "ridge_readout"]
