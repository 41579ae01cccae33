"""Fact MLPs on two-hot keys (seed 000, Construction 4.1 and B.3.2).

Keys are k_(i,j) = e_i − e_j (i ≠ j, F = d(d−1)). The gate ReLU(I x) selects coordinate i of
the key, so each encoder gadget is exact without any solve (:func:`factkernels.encoder.two_hot_gadgets`):

    g(x) = D · E (ReLU(x)^{⊕m} ⊙ (A x)),   A = [A_1; …; A_m] (m·d, d),  E = block ones (m, m·d)

with the JL decoder D (Alg. 4). The gate is the fixed identity, so the stored parameters are
A and D·E: m·d² + d_out·m·d, i.e. 2|K| + O(d) per gadget for d_out = d (the seed's count,
which stores the identity gate too, is 2|K| + O(d) with the gate counted as O(d)).
"""

from __future__ import annotations

from typing import Union

import torch
from torch import nn

from .decoder import OUTPUTS, check_decodable, choose_m, output_embeddings
from .encoder import two_hot_gadgets, two_hot_keys
from .mlp import DecodingMLP
from .validation import check_choice, check_positive_int, validate_inputs


class TwoHotMLP(DecodingMLP):
    """g(x) = W_down (ReLU(x) tiled m times ⊙ (W_up x)).

    up_weight: (m·d, d), down_weight: (d_out, m·d); the gate is the fixed identity.
    """

    def __init__(self, up_weight: torch.Tensor, down_weight: torch.Tensor) -> None:
        super().__init__()
        if up_weight.shape[0] % up_weight.shape[1] or down_weight.shape[1] != up_weight.shape[0]:
            raise ValueError(f"up_weight must be (m·d, d) and down_weight (d_out, m·d), got "
                             f"{tuple(up_weight.shape)} and {tuple(down_weight.shape)}")
        self.up_weight = nn.Parameter(up_weight.detach().contiguous(), requires_grad=False)
        self.down_weight = nn.Parameter(down_weight.detach().contiguous(), requires_grad=False)

    @property
    def num_parameters(self) -> int:
        """A (m·d²) and D·E (d_out·m·d); the identity gate has none."""
        return self.up_weight.numel() + self.down_weight.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d) -> (..., d_out)."""
        dim = self.up_weight.shape[1]
        gate = torch.relu(x).repeat(*([1] * (x.dim() - 1)), self.up_weight.shape[0] // dim)  # (..., m·d)
        return torch.nn.functional.linear(gate * torch.nn.functional.linear(x, self.up_weight), self.down_weight)


def construct_two_hot(
    V: torch.Tensor,
    f: torch.Tensor,
    dim: int,
    m: Union[int, None] = None,
    *,
    outputs: str = "margin_optimal",
    seed: int = 0,
) -> TwoHotMLP:
    """A fact MLP for the two-hot keys of R^dim (:func:`factkernels.encoder.two_hot_keys` order).

    Args:
        V: (|V|, d_out) values; f: (d(d−1),) value index per key; dim: key dimension d.
        m: code dimension; None picks the smallest m whose JL decoder decodes every used value
            (as in :func:`factkernels.construct`). The encoder is exact, so that m stores every fact.
        outputs: "margin_optimal" (U*) or "values".
        seed: seeds the JL projection.

    Returns:
        :class:`TwoHotMLP` with ``m`` and ``m_search`` attributes.
    """
    keys, _ = two_hot_keys(dim, dtype=V.dtype if isinstance(V, torch.Tensor) else torch.float32)
    if isinstance(V, torch.Tensor):
        keys = keys.to(V.device)
    facts = validate_inputs(keys, V, f)
    check_choice("outputs", outputs, OUTPUTS)
    check_positive_int("m", m, allow_none=True)
    out_embed, rho = output_embeddings(V, outputs)
    rho = check_decodable(float(rho), outputs)
    decoder, m_search = choose_m(m, out_embed, V, torch.unique(facts), rho, torch.Generator().manual_seed(seed), "auto")
    up = two_hot_gadgets(decoder.codes[facts], dim)  # (m, d, d)
    mlp = TwoHotMLP(up.reshape(-1, dim), decoder.projection.repeat_interleave(dim, dim=1))
    mlp.m, mlp.m_search = decoder.m, m_search
    return mlp


__all__ = ["TwoHotMLP", "construct_two_hot", "two_hot_keys"]
