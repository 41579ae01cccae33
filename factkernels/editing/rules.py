"""The weight-update rules of the parameter editors, on one linear map W (d_out, h) from keys to values.

Each takes keys k (n, h) (rows), target outputs v* (n, d_out) and the keys' second moment
C = E[k kᵀ] (h, h) over ordinary text:

    ROME       W + (v* − W k)(C⁻¹u)ᵀ / ((C⁻¹u)ᵀ k)          one rank-one edit per fact, in turn
    MEMIT      W + R Kᵀ (λ C + K Kᵀ)⁻¹,  R = V* − W K         one batch least-squares edit
    AlphaEdit  W + R Kᵀ P (P (K Kᵀ + K_p K_pᵀ) + l2 I)⁻¹    P: projector onto C's null space

(formulas with keys as columns; rows in the code). ROME's u is the key averaged over context prefixes
(its ``compute_u``), k the bare prompt's key; AlphaEdit's K_p are the keys of earlier sequential batches
(its ``cache_c``). The toy LM (:mod:`factkernels.transformer.editing`) and real models
(:mod:`factkernels.hf.editors`) both call these.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .methods import AlphaEditHparams, MEMITHparams, ROMEHparams


def _check_edit(weight: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    if weight.dim() != 2:
        raise ValueError(f"weight must be (d_out, h), got shape {tuple(weight.shape)}")
    d_out, h = weight.shape
    if keys.dim() != 2 or keys.shape[1] != h:
        raise ValueError(f"keys must be (n, {h}), got shape {tuple(keys.shape)}")
    if values.shape != (keys.shape[0], d_out):
        raise ValueError(f"values must be ({keys.shape[0]}, {d_out}) (one target output per key), "
                         f"got shape {tuple(values.shape)}")


def rome_update(weight: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, cov: torch.Tensor,
                directions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """ROME's rank-one edit, applied for one key after another (n, h), each to the current W.

    Each edit makes W k* = v* exactly along C⁻¹u (u = ``directions`` row, default k* itself: ROME
    averages u over context prefixes) and leaves W k unchanged for every k with kᵀ C⁻¹ u = 0.
    weight (d_out, h), values (n, d_out), cov (h, h) symmetric positive definite,
    directions (n, h) or None -> (d_out, h).
    """
    _check_edit(weight, keys, values)
    directions = keys if directions is None else directions
    if directions.shape != keys.shape:
        raise ValueError(f"directions must have the keys' shape {tuple(keys.shape)}, got {tuple(directions.shape)}")
    cinv = torch.linalg.solve(cov, directions.T).T  # (n, h) rows C⁻¹ u
    weight = weight.clone()
    for key, value, u in zip(keys, values, cinv):
        weight += torch.outer(value - weight @ key, u) / (u @ key)
    return weight


def memit_update(weight: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, cov: torch.Tensor,
                 lam: float) -> torch.Tensor:
    """MEMIT's batch edit W + R Kᵀ (λC + K Kᵀ)⁻¹ with R = V* − W K (keys/values as rows here).

    It minimises λ tr(Δ C Δᵀ) + ||(W + Δ) K − V*||²: λ → 0 gives the minimum-(C-)norm exact
    least-squares fit of the edits, large λ keeps W close to the old map on the keys C stands for.
    When C comes from fewer keys than h, λC + K Kᵀ is singular: directions that neither C nor the
    edited keys reach leave the objective unchanged, and a plain solve fills them with rounding noise
    divided by rounding noise (the edit then depends on the thread count). The system is solved in
    float64 (as MEMIT's released code does); eigen-directions below √h·eps of its largest eigenvalue
    (eps of the weight's dtype: the norm of rounding errors of that size in an h × h matrix) count as
    exactly null, and Δ is the minimum-norm minimiser, zero along them; a well-conditioned system is
    solved as before.
    weight (d_out, h), keys (n, h), values (n, d_out), cov (h, h) -> (d_out, h).
    """
    _check_edit(weight, keys, values)
    if not lam >= 0:
        raise ValueError(f"lam must be >= 0, got {lam!r}")
    residual = values - keys @ weight.T  # (n, d_out)
    keys64 = keys.double()
    eigenvalues, vectors = torch.linalg.eigh(lam * cov.double() + keys64.T @ keys64)  # (h,), (h, h)
    floor = eigenvalues[-1].clamp_min(0) * math.sqrt(weight.shape[1]) * torch.finfo(weight.dtype).eps
    kept = eigenvalues > floor
    basis = vectors[:, kept]  # (h, r)
    delta = basis @ ((basis.T @ keys64.T @ residual.double()) / eigenvalues[kept, None])  # (h, d_out)
    return weight + delta.T.to(weight.dtype)


def null_space_projector(cov: torch.Tensor, threshold: float) -> torch.Tensor:
    """AlphaEdit's P (h, h): projector onto the eigenvectors of ``cov`` with eigenvalue < ``threshold``."""
    eigenvalues, eigenvectors = torch.linalg.eigh(cov)
    basis = eigenvectors[:, eigenvalues < threshold]
    return basis @ basis.T


def alphaedit_update(weight: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, projector: torch.Tensor,
                     l2: float = 1.0, previous: Optional[torch.Tensor] = None) -> torch.Tensor:
    """AlphaEdit's null-space-constrained edit (keys as rows here):
    Δᵀ = (P (K Kᵀ + K_p K_pᵀ) + l2 I)⁻¹ P K R, with R = V* − W K.

    The update satisfies Δ = Δ P, so keys in the preserved span (P k = 0) keep their outputs.
    previous: K_p K_pᵀ (h, h), the Gram of the keys an earlier sequential batch edited (AlphaEdit's
    ``cache_c``), or None. weight (d_out, h), keys (n, h), values (n, d_out), projector (h, h) -> (d_out, h).
    """
    _check_edit(weight, keys, values)
    residual = values - keys @ weight.T  # (n, d_out)
    eye = torch.eye(weight.shape[1], dtype=weight.dtype, device=weight.device)
    gram = keys.T @ keys if previous is None else keys.T @ keys + previous.to(weight)
    delta_t = torch.linalg.solve(projector @ gram + l2 * eye, projector @ keys.T @ residual)
    return weight + delta_t.T


def nullspace_threshold(hp: AlphaEditHparams, cov: torch.Tensor) -> float:
    """AlphaEdit's eigenvalue threshold on ``cov`` (h, h): the published absolute one, or
    ``nullspace_relative`` × C's mean eigenvalue when that is set."""
    if hp.nullspace_relative is None:
        return float(hp.nullspace_threshold)
    return float(hp.nullspace_relative * cov.diagonal().mean())


def update_weight(hp: object, weight: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, cov: torch.Tensor, *,
                  directions: Optional[torch.Tensor] = None, projector: Optional[torch.Tensor] = None,
                  previous: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The edited W (d_out, h) by the rule of the method whose hyperparameters ``hp`` are: ROME (C plus
    ``ridge`` · mean diag, ``directions`` u), MEMIT (λ = ``mom2_weight``) or AlphaEdit (``projector``, default
    from C and the threshold; ``previous`` batches' key Gram). weight (d_out, h), keys (n, h), values (n, d_out)."""
    if isinstance(hp, ROMEHparams):
        eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
        return rome_update(weight, keys, values, cov + hp.ridge * cov.diagonal().mean() * eye, directions)
    if isinstance(hp, MEMITHparams):
        return memit_update(weight, keys, values, cov, hp.mom2_weight)
    if isinstance(hp, AlphaEditHparams):
        projector = null_space_projector(cov, nullspace_threshold(hp, cov)) if projector is None else projector
        return alphaedit_update(weight, keys, values, projector, hp.l2, previous)
    raise TypeError(f"hp must be ROME, MEMIT or AlphaEdit hyperparameters, got {type(hp).__name__}")


__all__ = ["update_weight", "nullspace_threshold", "rome_update", "memit_update", "null_space_projector", "alphaedit_update"]
