"""Gated encoder gadgets and their stacking (seed 000, Alg. 2/3/6/7).

The encoder maps every key k_i to its code c_{f(i)} ∈ R^m with m scalar gadgets
``enc_j(x) = 1ᵀ[σ(G x + b_G) ⊙ (A_j x + b_A,j)] + b_E[j]``. Three builds:

* :func:`build_shared_gate` — one generic gate shared by all m gadgets (still
  generic for each), so one Gram factorization or one CG run serves every
  gadget: the fast path.
* :func:`build_per_gadget` — Alg. 3/7 exactly: each gadget samples its own gate,
  forms M explicitly and solves its own minimum-norm least squares. Kept as the
  faithful reference (and the slow baseline of the benchmarks).
* :func:`two_hot_gadgets` — Construction 4.1 for two-hot keys e_i − e_j: gate ReLU(I x),
  no solve at all (the MLP around it is :mod:`factkernels.twohot`).

:func:`assemble` puts an encoder and a decoder projection together into one FactMLP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from . import _ops
from .memory import VERIFY_CHUNK
from .mlp import FactMLP
from .progress import progress_bar
from .solvers import RESIDUAL_TOL, GadgetOperator, SolveInfo, cg_iterations_hint, solve_cg, solve_cholesky


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
    # (F, m) the encoder's outputs at the keys it was built on, when the build computed them (see
    # :func:`build_shared_gate`): what verification decodes, and how far they miss the targets is the residual.
    codes: Optional[torch.Tensor] = None

    @property
    def num_gadgets(self) -> int:
        return self.output_bias.shape[0]

    @property
    def coefficients(self) -> torch.Tensor:
        """[A_j | b_A,j] per gadget: (m, h̃, d+1) (shared gate)."""
        up = torch.cat([self.up_weight, self.up_bias[:, None]], dim=1)
        return up.view(self.num_gadgets, self.gadget_width, -1)


def encoder_codes(encoder: GatedEncoder, keys: torch.Tensor, *, activation: str, backend: str = "auto",
                  features: Optional[torch.Tensor] = None, chunk: int = VERIFY_CHUNK,
                  coefficients: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Outputs (n, m) of a shared-gate encoder at keys (n, d): enc_j(x) = Σ_r σ_r(x) [A_j | b_A,j]_r x̃ + b_E[j].

    The assembled MLP computes D · enc(x), so these are its outputs before the (d_out, m) projection D:
    one F·m·h̃(d+1) product instead of the MLP's two F·d·m·h̃ ones. features: the (n, h̃) gate features
    of ``keys`` when already computed. Chunks of ``chunk`` keys bound the torch twin's (chunk, m·h̃) temporary.
    coefficients: ``encoder.coefficients`` when at hand (the build's solve gives them; the property copies).
    """
    if encoder.gate_weight.shape[0] != encoder.gadget_width:
        raise ValueError("encoder_codes needs a shared gate (one gate row per gadget row); evaluate the assembled "
                         "MLP instead")
    coef = encoder.coefficients if coefficients is None else coefficients  # (m, h̃, d+1)
    out = []
    for lo in range(0, keys.shape[0], chunk):
        x = keys[lo : lo + chunk]
        s = (_ops.gate_features(x, encoder.gate_weight, encoder.gate_bias, activation, backend=backend)
             if features is None else features[lo : lo + chunk])
        out.append(_ops.gadget_matvec(s, augment(x), coef, backend=backend))
    return torch.cat(out).add_(encoder.output_bias)


def assemble(
    encoder: GatedEncoder,
    projection: torch.Tensor,
    *,
    activation: str,
    backend: str = "auto",
    key_transform: Optional[torch.Tensor] = None,
    value_transform: Optional[torch.Tensor] = None,
) -> FactMLP:
    """g(x) = D · enc(x) as one gated FactMLP (Alg. 1): down = D·E, E = block ones (Alg. 2).

    projection: D (d_out, m). key_transform W_K (d_in, d_in, symmetric) folds a whitening of
    the keys into gate and up (g(x) = g̃(W_K x)); value_transform W_V (d_out, d_out) folds a
    whitening of the values into down (<g̃, W_V v> = <W_V g̃, v>).
    """
    gate_weight, up_weight = encoder.gate_weight, encoder.up_weight
    down_weight = projection.repeat_interleave(encoder.gadget_width, dim=1)  # (d_out, m·h̃)
    down_bias = projection @ encoder.output_bias
    if key_transform is not None:
        gate_weight, up_weight = gate_weight @ key_transform, up_weight @ key_transform
    if value_transform is not None:
        down_weight, down_bias = value_transform @ down_weight, value_transform @ down_bias
    return FactMLP(gate_weight, encoder.gate_bias, up_weight, encoder.up_bias, down_weight, down_bias,
                   activation=activation, backend=backend)


def host_to_device(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A host tensor (e.g. drawn from a CPU generator, so that a seed gives the same draw on every
    device) in ``like``'s dtype on its device, copied from pinned memory without waiting for the
    device: a plain host-to-GPU copy synchronizes the stream."""
    if like.device.type == "cuda":
        return t.to(like.dtype).pin_memory().to(like.device, non_blocking=True)
    return t.to(like)


def gadget_width(num_facts: int, dim: int, width_multiplier: float) -> int:
    """h̃ = ⌈multiplier · F / (d+1)⌉, so that h̃(d+1) ≥ multiplier · F (Lemma 4.1.2 needs ≥ F)."""
    return max(1, math.ceil(width_multiplier * num_facts / (dim + 1)))


def sample_gate(keys: torch.Tensor, rows: int, generator: torch.Generator, gate_scale: float = 1.0,
                key_rms: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A generic gate: i.i.d. Gaussian rows scaled so pre-activations are ~N(0, gate_scale²),
    and a zero bias (Alg. 7's default; a random bias made the Gram ~10x worse conditioned).

    keys: (F, d) -> (gate_weight (rows, d), gate_bias (rows,)). key_rms: the keys' RMS norm
    when ``keys`` is one shard of them (default: computed from ``keys``).
    """
    d = keys.shape[1]
    if key_rms is None:
        key_rms = keys.square().sum(1).mean().sqrt()
    key_rms = key_rms.clamp_min(1e-12)
    weight = host_to_device(torch.randn(rows, d, generator=generator, dtype=torch.float64), keys) * (gate_scale / key_rms)
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
    cg_preconditioner: str = "auto",
    progress: bool = True,
    gate: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    features: Optional[torch.Tensor] = None,
    deferred: bool = False,
    codes: bool = False,
) -> GatedEncoder:
    """Encoder with one shared gate: keys (F, d), targets (F, m) -> :class:`GatedEncoder`.

    targets may be a function returning them, called once the work that does not need them is queued
    (the gate and, with solver="cholesky", the Gram and its factorization; see :func:`solve_cholesky`).

    solver: "cholesky" (dense Gram, one factorization) or "cg" (matrix-free; cg_preconditioner: see
        :func:`factkernels.solvers.solve_cg`).
    gate: a given (gate_weight (h̃, d), gate_bias (h̃,)) instead of a sampled one.
    features: precomputed (F, h̃) gate features of that gate (e.g. σ'(K Gᵀ + b) for the
        non-gated gadget of :mod:`factkernels.nongated`); default σ(K Gᵀ + b) with ``activation``.
    deferred: the Cholesky solve decides nothing on the host (see :func:`solve_cholesky`); its residual is
        measured on the weights, ||enc(K) − O|| / ||O|| (the dual residual ||Gα − O|| / ||O|| in exact
        arithmetic, without a second pass over the F×F Gram), and ``solve.accepted`` also asks it to be
        <= RESIDUAL_TOL. Implies ``codes``.
    codes: also return the encoder's outputs at the keys (``encoder.codes``, (F, m)), e.g. for verification.
    """
    num_facts, d = keys.shape
    if features is not None and gate is None:
        raise ValueError("features were computed from some gate: pass that gate too (gate=(weight, bias))")
    if gate is None:
        gate = sample_gate(keys, gadget_width(num_facts, d, width_multiplier), generator, gate_scale)
    gate_weight, gate_bias = gate
    width = gate_weight.shape[0]
    if features is None:
        features = _ops.gate_features(keys, gate_weight, gate_bias, activation, backend=backend)
    elif features.shape != (num_facts, width):
        raise ValueError(f"features must have shape ({num_facts}, {width}) (keys x gate rows), got {tuple(features.shape)}")
    op = GadgetOperator.whitened(features, augment(keys), backend=backend)
    if solver == "cholesky":
        pending = targets

        def factored() -> torch.Tensor:  # the targets, formed once the factorization is queued
            nonlocal targets
            targets = pending() if callable(pending) else pending
            return targets

        alpha, info = solve_cholesky(op, factored, deferred=deferred)
    elif solver == "cg":
        targets = targets() if callable(targets) else targets
        max_iter = cg_max_iter or cg_iterations_hint(width_multiplier)
        alpha, info = solve_cg(op, targets, tol=cg_tol, max_iter=max_iter, progress=progress,
                               preconditioner=cg_preconditioner)
    else:
        raise ValueError(f"solver must be 'cholesky' or 'cg' here, got {solver!r}")
    coef, out_bias = op.unknowns(alpha)  # (m, h̃, d+1), (m,)
    m = coef.shape[0]
    encoder = GatedEncoder(
        gate_weight=gate_weight,
        gate_bias=gate_bias,
        up_weight=coef[:, :, :d].reshape(m * width, d).contiguous(),
        up_bias=coef[:, :, d].reshape(m * width).contiguous(),
        output_bias=out_bias,
        gadget_width=width,
        solve=info,
    )
    if codes or deferred:
        encoder.codes = encoder_codes(encoder, keys, activation=activation, backend=backend, features=features,
                                      coefficients=coef)
    if deferred:
        info.residual = (encoder.codes - targets).norm() / targets.norm().clamp_min(1e-300)
        info.accepted = info.accepted & (info.residual <= RESIDUAL_TOL)
    return encoder


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
    for j in progress_bar(range(m), desc="per-gadget solves", enabled=progress, leave=False):
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


def two_hot_keys(dim: int, *, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The two-hot keys k_(i,j) = e_i − e_j, i ≠ j, in row-major (i, j) order.

    Returns keys (d(d−1), d) and pairs (d(d−1), 2) long with pairs[r] = (i, j).
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2:
        raise ValueError(f"dim must be an int >= 2 (two-hot keys need two coordinates), got {dim!r}")
    i, j = torch.meshgrid(torch.arange(dim), torch.arange(dim), indexing="ij")
    off = i != j
    pairs = torch.stack([i[off], j[off]], dim=1)
    eye = torch.eye(dim, dtype=dtype)
    return eye[pairs[:, 0]] - eye[pairs[:, 1]], pairs


def two_hot_gadgets(targets: torch.Tensor, dim: int) -> torch.Tensor:
    """Construction 4.1: up-projections A_j with 1ᵀ[ReLU(x) ⊙ (A_j x)] = targets[(i,j), j] at x = e_i − e_j.

    A_j[p, q] = −h_j(p, q) for p ≠ q and 0 on the diagonal, so at x = e_i − e_j the gate keeps
    coordinate i only and (A_j x)[i] = A_j[i, i] − A_j[i, j] = h_j(i, j).
    targets: (d(d−1), m), rows in :func:`two_hot_keys` order -> A: (m, d, d).
    """
    num_keys = dim * (dim - 1)
    if targets.dim() != 2 or targets.shape[0] != num_keys:
        raise ValueError(f"targets must have shape ({num_keys}, m) (one row per two-hot key of dim {dim}), "
                         f"got {tuple(targets.shape)}")
    _, pairs = two_hot_keys(dim)
    up = torch.zeros(targets.shape[1], dim, dim, dtype=targets.dtype, device=targets.device)
    up[:, pairs[:, 0], pairs[:, 1]] = -targets.T
    return up


__all__ = ["GatedEncoder", "encoder_codes", "two_hot_keys", "two_hot_gadgets", "assemble", "build_shared_gate", "build_per_gadget", "gadget_width", "sample_gate", "augment"]
