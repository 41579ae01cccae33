"""Head-aggregated QK scores, the one place they are computed (pure torch).

Max-over-heads (seed 002, Sec. 3):   S_pq = max_k  q_p^(k) . k_q^(k),        edge iff S_pq > tau.
Softmax variant (Sec. 8, Alg. 2):    A_pq = sum_k softmax_q(q_p^(k) . k_q^(k) / sqrt(d_k)),  edge iff A_pq > tau.

``max_head_scores`` is the pure-torch twin of the fused max-over-heads kernel
(scores, max over heads and the threshold decision in one pass); constructions,
evaluation and training all call it, so a compiled kernel can replace it in one place.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

Threshold = Union[float, torch.Tensor]


def _check_qk(queries: torch.Tensor, keys: torch.Tensor) -> None:
    for name, t in (("Q", queries), ("K", keys)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, h, ell, d_k), got {tuple(t.shape)}")
    if keys.dtype != queries.dtype or keys.device != queries.device:
        raise TypeError(f"Q ({queries.dtype}, {queries.device}) and K ({keys.dtype}, {keys.device}) "
                        "must share dtype and device")
    (b, h, _, d), (bk, hk, _, dk) = queries.shape, keys.shape
    if (b, h, d) != (bk, hk, dk):
        raise ValueError(f"Q (batch, h, ell_q, d_k) = {tuple(queries.shape)} and K (batch, h, ell_k, d_k) = "
                         f"{tuple(keys.shape)} must agree in batch, h and d_k")
    if h == 0 or d == 0:
        raise ValueError(f"need at least one head and d_k >= 1, got h={h}, d_k={d}")


def _decide(scores: torch.Tensor, tau: Threshold) -> torch.Tensor:
    """scores (batch, ell_q, ell_k) > tau, tau a number, a 0-d tensor or one threshold per batch row (batch,)."""
    if isinstance(tau, torch.Tensor):
        if tau.dim() == 1 and tau.shape[0] == scores.shape[0]:
            tau = tau.view(-1, 1, 1)
        elif tau.dim() != 0:
            raise ValueError(f"tau must be a number, a 0-d tensor or have shape ({scores.shape[0]},), "
                             f"got {tuple(tau.shape)}")
        if not bool(torch.isfinite(tau).all()):
            raise ValueError("tau must be finite")
        return scores > tau.to(scores.dtype)
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau):
        raise TypeError(f"tau must be a finite number or a tensor, got {tau!r}")
    return scores > tau


def max_head_scores(queries: torch.Tensor, keys: torch.Tensor, tau: Optional[Threshold] = None
                    ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Max-over-heads scores S[b, p, q] = max_k Q[b, k, p] . K[b, k, q], and optionally S > tau.

    Args:
        queries: Q (batch, h, ell_q, d_k), one query per source p and head k.
        keys:    K (batch, h, ell_k, d_k), one key per target q and head k (ell_k may differ
                 from ell_q, e.g. a block of sources scored against a whole context).
        tau:     None, a number, a 0-d tensor, or one threshold per batch row (batch,).

    Returns:
        S (batch, ell_q, ell_k) in the dtype of Q when tau is None, else (S, S > tau) with
        the decision a bool tensor of the same shape. Differentiable in Q and K.
    """
    _check_qk(queries, keys)
    scores = torch.matmul(queries, keys.transpose(-1, -2)).amax(dim=1)
    return scores if tau is None else (scores, _decide(scores, tau))


def softmax_head_scores(queries: torch.Tensor, keys: torch.Tensor, tau: Optional[Threshold] = None
                        ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Summed per-head attention A[b, p, q] = sum_k softmax_q(Q[b, k, p] . K[b, k, q] / sqrt(d_k)).

    The softmax runs over the ell_k keys, which form the context. Shapes and ``tau`` as
    in ``max_head_scores``; A lies in [0, h] and each row sums to h.
    """
    _check_qk(queries, keys)
    logits = torch.matmul(queries, keys.transpose(-1, -2)) / math.sqrt(queries.shape[-1])
    scores = torch.softmax(logits, dim=-1).sum(dim=1)
    return scores if tau is None else (scores, _decide(scores, tau))
