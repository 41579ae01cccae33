"""The NTK MLP baseline of Nichani et al. (seed 000, Alg. 5), as a gated MLP.

    Z = K W_gateᵀ,  H = ĥ_k(Z),  A = V_f P,  W_up = (1/h) (H ⊙ A)ᵀ K,
    g(x) = P (σ(W_gate x) ⊙ (W_up x))

with W_gate ~ N(0, 1)^{h×d}, P ~ N(0, 1)^{d×h} with unit-norm columns and ĥ_k the
normalized probabilists' Hermite polynomial He_k / √k!. For unit-norm keys,
E_w[σ(w·x) ĥ_k(w·k_j)] = c_k ⟨x, k_j⟩^k with c_k = E[σ(z) ĥ_k(z)], so
g(x) ≈ (c_k / d) Σ_j ⟨x, k_j⟩^{k+1} v_{f(j)}: key j's value dominates at x = k_j,
with the other keys as noise that a wide h averages out. As in the seed, the
gated MLP is used directly (no NTK approximation by a non-gated one). One addition
to Alg. 5: W_up is multiplied by sign(c_k), since for c_k < 0 (SiLU at k = 4) the
output would point away from the value and store no fact at any width.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import _ops, ustar
from ..mlp import FactMLP
from ..validation import check_positive_int, validate_inputs

# |c_k| below this counts as zero: the degree-k term of σ is absent and the construction cannot work.
_COEFFICIENT_TOL = 1e-8
_QUADRATURE_NODES = 120
# Elements of each (F, block) temporary while W_up is formed (2^24: 128 MB in float64).
_BLOCK_ELEMENTS = 1 << 24


def normalized_hermite(z: torch.Tensor, degree: int) -> torch.Tensor:
    """ĥ_k(z) = He_k(z) / √k! elementwise (orthonormal under N(0, 1)); any shape.

    Recurrence: ĥ_{n+1} = (z ĥ_n − √n ĥ_{n−1}) / √(n+1), ĥ_0 = 1, ĥ_1 = z.
    """
    prev, cur = torch.ones_like(z), z
    if degree == 0:
        return prev
    for n in range(1, degree):
        prev, cur = cur, (z * cur - math.sqrt(n) * prev) / math.sqrt(n + 1)
    return cur


def hermite_coefficient(activation: str, degree: int) -> float:
    """c_k = E_{z~N(0,1)}[σ(z) ĥ_k(z)], by Gauss–Hermite quadrature (probabilists' weight)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(_QUADRATURE_NODES)
    z = torch.from_numpy(nodes)
    values = _ops.activate(z, activation) * normalized_hermite(z, degree)
    return float((values.numpy() * weights).sum() / math.sqrt(2.0 * math.pi))


def _check_options(hidden: int, degree: int, activation: str, seed: int) -> float:
    """Validate the options and return σ's Hermite coefficient c_k."""
    check_positive_int("hidden", hidden)
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 0:
        raise ValueError(f"degree must be a non-negative int (the Hermite degree k), got {degree!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    _ops.check_activation(activation)
    coefficient = hermite_coefficient(activation, degree)
    if abs(coefficient) < _COEFFICIENT_TOL:
        usable = [k for k in range(1, 9) if abs(hermite_coefficient(activation, k)) >= _COEFFICIENT_TOL]
        raise ValueError(
            f"degree={degree} cannot be used with activation={activation!r}: its degree-{degree} Hermite "
            f"coefficient is zero, so the construction outputs no signal; use one of degrees {usable}"
        )
    return coefficient


def ntk(
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    hidden: int,
    *,
    degree: int = 2,
    margin_optimal: bool = False,
    activation: str = "silu",
    seed: int = 0,
) -> FactMLP:
    """NTK MLP of width ``hidden`` (Alg. 5): a gated FactMLP with no biases.

    Args:
        K: (F, d_in) keys (the analysis assumes unit norm). V: (|V|, d_out) values. f: (F,) value indices.
        hidden: hidden width h (the size the fact-storage cost search varies).
        degree: Hermite degree k; σ's degree-k Hermite coefficient must be non-zero (for SiLU:
            1 or even, since SiLU minus z/2 is even). Default 2, the best SiLU degree at d=32,
            F=256 (k=1 leaves more cross-talk between keys; k=4 has a 6x smaller coefficient and
            heavier-tailed features, so it needs a far wider h).
        margin_optimal: replace V by the margin-optimal outputs U* before the construction.
        activation: gate activation σ.
        seed: seeds W_gate and P (same seed, same MLP on CPU).

    Returns:
        FactMLP with gate_weight W_gate (h, d_in), up_weight W_up (h, d_in), down_weight P (d_out, h).
    """
    facts = validate_inputs(K, V, f)
    coefficient = _check_options(hidden, degree, activation, seed)
    outputs = ustar.margin_optimal_outputs(V)[0] if margin_optimal else V
    generator = torch.Generator().manual_seed(seed)
    gate = torch.randn(hidden, K.shape[1], generator=generator, dtype=torch.float64).to(K)  # W_gate (h, d_in)
    down = torch.randn(V.shape[1], hidden, generator=generator, dtype=torch.float64).to(K)  # P_raw (d_out, h)
    down = down / down.norm(dim=0, keepdim=True)
    targets = outputs[facts]  # Y: (F, d_out)
    scale = math.copysign(1.0, coefficient) / hidden  # c_k < 0 would point g(k_i) away from v_f(i)
    up = torch.empty_like(gate)  # W_up: (h, d_in)
    # Row j of W_up needs only column j of H and A, so blocks of hidden units keep the (F, block) temporaries
    # near _BLOCK_ELEMENTS: at F = 8,192 and h = 131,072 the whole H and A would be 8.6 GB each in float64.
    block = max(1, _BLOCK_ELEMENTS // K.shape[0])
    for start in range(0, hidden, block):
        rows = slice(start, start + block)
        features = normalized_hermite(K @ gate[rows].T, degree)  # H = ĥ_k(Z): (F, block)
        features *= targets @ down[:, rows]  # H ⊙ A, A = Y P: (F, block)
        up[rows] = features.T @ K * scale
    return FactMLP(gate, None, up, None, down, None, activation=activation)
