"""Reusable transformer pieces (seed 000 §5, App. A.2.2): RMSNorm, rotary position
embedding and single-head causal self-attention, each with the seed's switches.

    norm = RMSNorm(d)                      # x / rms(x) * weight, weight trainable
    unit = RMSNorm(d, frozen=True)         # x / ||x||: projects onto the unit sphere, no parameters
    attn = CausalSelfAttention(d, identity_value_output=True)   # V = O = identity (frozen)
    y = attn(x, padding_mask)              # x (B, T, d), padding_mask (B, T) bool, True = real token

All modules take and return (batch, time, dim) tensors.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F_nn
from torch import nn


def _check_dim(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class RMSNorm(nn.Module):
    """Root-mean-square normalization over the last dimension.

    Trainable: ``y = x / sqrt(mean(x²) + eps) * weight`` with ``weight`` (dim,) initialised to ones.
    ``frozen=True``: no parameters and ``y = x / sqrt(sum(x²) + eps)``, i.e. RMSNorm with a fixed
    weight 1/sqrt(dim), which projects onto the unit sphere. This is the seed's frozen pre-MLP
    norm: the MLP key embeddings are the transformer key embeddings projected onto the sphere.
    x: (..., dim) -> (..., dim).
    """

    def __init__(self, dim: int, eps: float = 1e-6, frozen: bool = False) -> None:
        super().__init__()
        _check_dim("dim", dim)
        if not (isinstance(eps, (int, float)) and eps >= 0):
            raise ValueError(f"eps must be a number >= 0, got {eps!r}")
        self.dim, self.eps, self.frozen = dim, float(eps), bool(frozen)
        self.weight = None if frozen else nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dimension {self.dim}, got shape {tuple(x.shape)}")
        if self.frozen:
            return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, frozen={self.frozen}"


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al.) for head dimension ``dim`` (even).

    Pairs (x[2i], x[2i+1]) are rotated by the angle ``position · base^(-2i/dim)``, so
    <rope(q, s), rope(k, t)> depends on positions only through s - t.
    forward(x (B, T, dim), positions (T,) long or None = arange(T)) -> (B, T, dim).
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        _check_dim("dim", dim)
        if dim % 2:
            raise ValueError(f"rotary dim must be even, got {dim}")
        if not (isinstance(base, (int, float)) and base > 1):
            raise ValueError(f"base must be a number > 1, got {base!r}")
        self.dim = dim
        self.register_buffer("inv_freq", base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim),
                             persistent=False)

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dimension {self.dim}, got shape {tuple(x.shape)}")
        if positions is None:
            positions = torch.arange(x.shape[-2], device=x.device)
        angles = positions.to(torch.float64)[:, None] * self.inv_freq.to(x.device)[None, :]  # (T, dim/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class CausalSelfAttention(nn.Module):
    """Single-head causal self-attention with RoPE on queries and keys.

    Args:
        dim: model width d.
        head_dim: query/key width (default d). Values and outputs have width d.
        identity_value_output: freeze the value and output projections to the identity
            (seed modification iv); the output is then the attention-weighted average of x.
        rope: apply rotary embeddings to queries and keys.
        bias: biases in the trainable projections.
        query, key: optional modules (B, T, d) -> (B, T, head_dim) replacing the linear
            query/key projections (e.g. MLP-parametrized QK for the language-model setup).

    forward(x (B, T, d), padding_mask (B, T) bool or None, return_weights=False)
        -> (B, T, d), plus the attention weights (B, T, T) when ``return_weights``.
    ``padding_mask`` marks real tokens True; padded keys get no attention (a padded query
    attends to itself only, so no row is empty).
    """

    def __init__(self, dim: int, head_dim: Optional[int] = None, *, identity_value_output: bool = False,
                 rope: bool = True, bias: bool = False, query: Optional[nn.Module] = None,
                 key: Optional[nn.Module] = None, rope_base: float = 10000.0) -> None:
        super().__init__()
        _check_dim("dim", dim)
        head_dim = dim if head_dim is None else head_dim
        _check_dim("head_dim", head_dim)
        self.dim, self.head_dim = dim, head_dim
        self.identity_value_output = bool(identity_value_output)
        self.query = nn.Linear(dim, head_dim, bias=bias) if query is None else query
        self.key = nn.Linear(dim, head_dim, bias=bias) if key is None else key
        if self.identity_value_output:
            self.value = self.output = None
        else:
            self.value = nn.Linear(dim, dim, bias=bias)
            self.output = nn.Linear(dim, dim, bias=bias)
        self.rotary = RotaryEmbedding(head_dim, rope_base) if rope else None

    def forward(self, x: torch.Tensor, padding_mask: Optional[torch.Tensor] = None,
                return_weights: bool = False):
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (batch, time, {self.dim}), got {tuple(x.shape)}")
        batch, time = x.shape[:2]
        q, k = self.query(x), self.key(x)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        v = x if self.value is None else self.value(x)
        allowed = torch.ones(time, time, dtype=torch.bool, device=x.device).tril()  # (T, T) query x key
        if padding_mask is not None:
            if padding_mask.shape != (batch, time) or padding_mask.dtype != torch.bool:
                raise ValueError(f"padding_mask must be a bool tensor of shape ({batch}, {time}), "
                                 f"got {padding_mask.dtype} {tuple(padding_mask.shape)}")
            eye = torch.eye(time, dtype=torch.bool, device=x.device)
            allowed = (allowed & padding_mask[:, None, :]) | eye  # (B, T, T)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        weights = F_nn.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)  # (B, T, T)
        out = weights @ v
        if self.output is not None:
            out = self.output(out)
        return (out, weights) if return_weights else out

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, head_dim={self.head_dim}, identity_value_output={self.identity_value_output}, "
                f"rope={self.rotary is not None}")
