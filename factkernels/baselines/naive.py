"""The naïve construction (seed 000, B.3.1): one ReLU unit per key.

    g(x) = W_out ReLU(K x − b),   b_j ∈ (β_j, α_j),  α_j = ⟨k_j, k_j⟩,  β_j = max_{i≠j} ⟨k_j, k_i⟩

so ReLU(K k_i − b) = a_i e_i with a_i = α_i − b_i > 0, and W_out = [u_{f(1)}/a_1 ⋯ u_{f(F)}/a_F]
gives g(k_i) = u_{f(i)} exactly. Hidden size F, 2dF + F parameters (Table 1: Θ(d|K|)).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import ustar
from ..decoder import OUTPUTS
from ..mlp import DecodingMLP
from ..validation import check_choice, validate_inputs


class NaiveMLP(DecodingMLP):
    """g(x) = W_out ReLU(W_in x − b).

    in_weight: (F, d_in) (the keys), threshold: (F,) b, out_weight: (d_out, F).
    """

    def __init__(self, in_weight: torch.Tensor, threshold: torch.Tensor, out_weight: torch.Tensor) -> None:
        super().__init__()
        self.in_weight = nn.Parameter(in_weight.detach().contiguous(), requires_grad=False)
        self.threshold = nn.Parameter(threshold.detach().contiguous(), requires_grad=False)
        self.out_weight = nn.Parameter(out_weight.detach().contiguous(), requires_grad=False)

    @property
    def hidden_size(self) -> int:
        return self.in_weight.shape[0]

    @property
    def num_parameters(self) -> int:
        """W_in (F·d_in) + b (F) + W_out (d_out·F)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_in) -> (..., d_out)."""
        return torch.relu(x @ self.in_weight.T - self.threshold) @ self.out_weight.T


def naive(K: torch.Tensor, V: torch.Tensor, f: torch.Tensor, *, outputs: str = "values") -> NaiveMLP:
    """The naïve fact MLP of B.3.1: keys K (F, d_in), values V (|V|, d_out), f (F,) -> NaiveMLP.

    outputs: "values" (u_j = v_j, as in B.3.1; stores every fact when each v_j is its own best
        match, e.g. unit-norm values) or "margin_optimal" (u_j = U*_j, which needs only ρ(V) > 0).
    b_j is the midpoint of (max(β_j, α_j − 1), α_j), so a single key (no β) is handled too.
    """
    facts = validate_inputs(K, V, f)
    check_choice("outputs", outputs, OUTPUTS)
    gram = K @ K.T  # (F, F)
    alpha = gram.diagonal().clone()
    beta = gram.fill_diagonal_(-torch.inf).max(dim=1).values.maximum(alpha - 1.0)
    bad = torch.nonzero(beta >= alpha).flatten()
    if bad.numel():
        raise ValueError(
            f"K row {int(bad[0])} is not its own best match (<k_j, k_j> <= max_i<k_j, k_i>): the naïve construction "
            "needs every key to have a larger inner product with itself than with any other key (e.g. distinct "
            "unit-norm keys)"
        )
    threshold = (alpha + beta) / 2
    targets = ustar.margin_optimal_outputs(V)[0] if outputs == "margin_optimal" else V
    out_weight = (targets[facts] / (alpha - threshold).unsqueeze(1)).T  # (d_out, F)
    return NaiveMLP(K, threshold, out_weight)
