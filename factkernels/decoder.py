"""The JL decoder (seed 000, Alg. 4 and Thm B.5.3).

A Gaussian D ∈ R^{d×m} compresses output embeddings U (|V|, d) into codes
C = U D (|V|, m); the MLP decodes a code back with D, and D Dᵀ u_j still
dot-product-decodes to v_j when m = O(ρ⁻² log|V|).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import _ops


@dataclass
class JLDecoder:
    """projection: (d, m) with i.i.d. N(0, 1/m) entries; codes: (|V|, m) = U · projection."""

    projection: torch.Tensor
    codes: torch.Tensor

    @property
    def m(self) -> int:
        return self.projection.shape[1]


def jl_decoder(outputs: torch.Tensor, m: int, generator: torch.Generator) -> JLDecoder:
    """Sample D (d, m) ~ N(0, 1/m) and codes C = U D.  outputs: (|V|, d)."""
    d = outputs.shape[1]
    projection = torch.randn(d, m, generator=generator, dtype=torch.float64).to(outputs) / math.sqrt(m)
    return JLDecoder(projection, outputs @ projection)


def decoder_failures(decoder: JLDecoder, values: torch.Tensor, used: torch.Tensor, backend: str = "auto") -> int:
    """How many of the values ``used`` (indices, (k,)) do not decode to themselves from D c_j."""
    decoded = decoder.codes[used] @ decoder.projection.T  # (k, d)
    index, _ = _ops.decode(decoded, values, used, backend=backend)
    return int((index != used).sum())


def jl_bound(rho: float, num_values: int, delta: float = 0.1) -> int:
    """Thm B.5.3: m ≥ 32 ρ⁻² ln(4|V|(|V|−1)/δ) guarantees decoding with probability ≥ 1 − δ.

    A worst-case bound, loose by orders of magnitude in practice.
    """
    pairs = max(num_values * (num_values - 1), 1)
    return math.ceil(32.0 / rho**2 * math.log(4.0 * pairs / delta))


def initial_m(rho: float, num_values: int) -> int:
    """Empirical starting point ρ⁻² ln|V| for the search over m (the bound's shape, constant 1)."""
    return max(1, math.ceil(math.log(max(num_values, 2)) / rho**2))
