"""The model-free parts of the side-memory editors: GRACE's codebook and WISE's routing distance and margins.

GRACE (Hartvigsen et al., NeurIPS 2023) keeps (key, value, radius, label) entries at one layer; a query
within a key's radius gets that key's value as the layer's output. WISE (Wang et al., NeurIPS 2024)
trains a side copy of a down projection and routes a sequence to it when the activation distance
between side and main outputs is large. :mod:`factkernels.hf.side_memory` puts both into a real model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F_nn


@dataclass
class GraceCodebook:
    """GRACE's codebook: keys (m, h), values (m, d), radii (m,) and one target label per entry."""

    keys: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None
    radii: Optional[torch.Tensor] = None
    labels: list = field(default_factory=list)

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[0]

    def _append(self, key: torch.Tensor, value: torch.Tensor, radius: float, label: str) -> int:
        key, value = key.detach()[None], value.detach()[None]
        radius_t = torch.tensor([float(radius)], dtype=key.dtype, device=key.device)
        if self.keys is None:
            self.keys, self.values, self.radii = key, value, radius_t
        else:
            self.keys = torch.cat([self.keys, key])
            self.values = torch.cat([self.values, value])
            self.radii = torch.cat([self.radii, radius_t])
        self.labels.append(label)
        return len(self) - 1

    def add(self, query: torch.Tensor, label: str, value: torch.Tensor, eps: float) -> int:
        """GRACE's codebook update for an edit with key ``query`` (h,) and target ``label``; ``value`` (d,)
        initialises a new entry. Returns the entry whose value the edit then trains: a new one when no key
        is within its radius + ``eps``; for a key of another label within reach, a new one and both radii
        split at half the distance; for a key of the same label, that key, its radius grown to reach
        the query (coverage)."""
        if len(self) == 0:
            return self._append(query, value, eps, label)
        dists = torch.linalg.vector_norm(self.keys.float() - query.float(), dim=1)
        dist, nearest = (float(v) for v in dists.min(0))
        nearest = int(nearest)
        if dist > eps + float(self.radii[nearest]):
            return self._append(query, value, eps, label)
        if self.labels[nearest] != label:
            new = self._append(query, value, eps, label)
            self.radii[nearest] = dist / 2 - 1e-5
            self.radii[new] = dist / 2
            return new
        if dist > float(self.radii[nearest]):
            self.radii[nearest] = dist
        return nearest

    def lookup(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For queries (n, h): (hit (n,) bool: within the nearest key's radius, nearest entry (n,) long)."""
        if len(self) == 0:
            return (torch.zeros(queries.shape[0], dtype=torch.bool, device=queries.device),
                    torch.zeros(queries.shape[0], dtype=torch.long, device=queries.device))
        dists = torch.cdist(queries.float(), self.keys.float())  # (n, m)
        dist, nearest = dists.min(1)
        return dist <= self.radii[nearest].float(), nearest


def wise_activation_distance(main_out: torch.Tensor, side_out: torch.Tensor, mask: torch.Tensor,
                             top1_beyond: Optional[int] = None) -> torch.Tensor:
    """WISE's per-sequence distance (b,): mean over real tokens (mask (b, T)) of ||silu(side) − silu(main)||
    (the side and main down-projection outputs (b, T, d)); sequences longer than ``top1_beyond`` tokens use
    their largest token distance (WISE's inference rule)."""
    per_token = torch.linalg.vector_norm(F_nn.silu(side_out) - F_nn.silu(main_out), dim=-1)  # (b, T)
    m = mask.to(per_token.dtype)
    mean = (per_token * m).sum(1) / m.sum(1).clamp_min(1)
    if top1_beyond is None:
        return mean
    longest = (per_token * m).max(1).values
    return torch.where(m.sum(1) > top1_beyond, longest, mean)


def wise_margin_loss(in_scope: torch.Tensor, out_scope: torch.Tensor, alpha: float, beta: float,
                     gamma: float) -> torch.Tensor:
    """WISE's routing loss on activation distances of edit (in_scope (n,)) and unrelated (out_scope (m,))
    sequences: the means of the positive parts of out − in + γ (every pair), out − α and β − in."""
    def positive_mean(x: torch.Tensor) -> torch.Tensor:
        x = x[x > 0]
        return x.mean() if x.numel() else x.new_zeros(())

    return (positive_mean(out_scope[:, None] - in_scope[None, :] + gamma) + positive_mean(out_scope - alpha)
            + positive_mean(beta - in_scope))


__all__ = ["GraceCodebook", "wise_activation_distance", "wise_margin_loss"]
