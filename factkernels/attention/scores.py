"""Head-aggregated QK scores, the one place attention code gets them from.

Max-over-heads (seed 002, Sec. 3):   S_pq = max_k  q_p^(k) . k_q^(k),        edge iff S_pq > tau.
Softmax variant (Sec. 8, Alg. 2):    A_pq = sum_k softmax_q(q_p^(k) . k_q^(k) / sqrt(d_k)),  edge iff A_pq > tau.

``max_head_scores`` is the op in ``factkernels._ops`` (compiled fused kernel, with its
pure-torch twin there); constructions, evaluation and training all call it from here.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from .._ops import batch_thresholds, check_head_projections, max_head_scores

Threshold = Union[float, torch.Tensor]

__all__ = ["max_head_scores", "softmax_head_scores"]


def softmax_head_scores(queries: torch.Tensor, keys: torch.Tensor, tau: Optional[Threshold] = None, *,
                        head_dim: Optional[torch.Tensor] = None
                        ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Summed per-head attention A[b, p, q] = sum_k softmax_q(Q[b, k, p] . K[b, k, q] / sqrt(d_k)).

    Q (batch, h, ell_q, d_k), K (batch, h, ell_k, d_k); the softmax runs over the ell_k keys,
    which form the context. ``tau`` as in ``max_head_scores``; A (batch, ell_q, ell_k) lies in
    [0, h] and each row sums to h. Returns A, or (A, A > tau) when tau is given.
    ``head_dim`` (batch,): the true d_k of each row when Q, K are zero-padded to a common width
    (zero columns leave the dot products alone, but the 1/sqrt(d_k) scale must be the row's own).
    """
    check_head_projections(queries, keys)
    logits = torch.matmul(queries, keys.transpose(-1, -2))
    if head_dim is None:
        logits = logits / math.sqrt(queries.shape[-1])
    else:
        if head_dim.shape != (queries.shape[0],):
            raise ValueError(f"head_dim must have shape ({queries.shape[0]},), got {tuple(head_dim.shape)}")
        logits = logits / head_dim.to(logits.dtype).sqrt().view(-1, 1, 1, 1)
    scores = torch.softmax(logits, dim=-1).sum(dim=1)
    if tau is None:
        return scores
    return scores, scores > batch_thresholds(tau, scores.shape[0], scores).view(-1, 1, 1)
