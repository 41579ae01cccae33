"""B SwiGLU MLPs stacked as one model, and the batched losses and stop tests the GD baselines train with.

Weights are (B, ...) tensors multiplied with block-batched GEMMs (``torch.bmm``). Models of different
widths are zero-padded to the widest: a padded unit has zero gate, up and down weights, so its gradient and
Adam update are exactly zero and it never moves. Initial weights are drawn on the CPU, one generator per model.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .. import _ops
from ..mlp import FactMLP


def init_stacked_swiglu(d_in: int, hiddens: Sequence[int], d_outs: Sequence[int], seeds: Sequence[int],
                        like: torch.Tensor) -> list[torch.Tensor]:
    """B stacked SwiGLU nets, nn.Linear's default init U(±1/√fan_in) drawn on the CPU per model from
    Generator(seeds[b]), zero-padded to the widest: gate/up (B, H, d_in), gate/up bias (B, H),
    down (B, D, H), down bias (B, D) with H = max(hiddens), D = max(d_outs). Padding stays zero in
    training (its outputs and gradients are zero), so each model trains as it would alone."""
    width, d_out = max(hiddens), max(d_outs)
    stacked = [torch.zeros(len(hiddens), *shape, dtype=torch.float64)
               for shape in ((width, d_in), (width,), (width, d_in), (width,), (d_out, width), (d_out,))]
    for b, (hidden, outs, seed) in enumerate(zip(hiddens, d_outs, seeds)):
        generator = torch.Generator().manual_seed(seed)

        def uniform(*shape: int, fan_in: int) -> torch.Tensor:
            return (torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1) / math.sqrt(fan_in)

        stacked[0][b, :hidden] = uniform(hidden, d_in, fan_in=d_in)
        stacked[1][b, :hidden] = uniform(hidden, fan_in=d_in)
        stacked[2][b, :hidden] = uniform(hidden, d_in, fan_in=d_in)
        stacked[3][b, :hidden] = uniform(hidden, fan_in=d_in)
        stacked[4][b, :outs, :hidden] = uniform(outs, hidden, fan_in=hidden)
        stacked[5][b, :outs] = uniform(outs, fan_in=hidden)
    return [t.to(like) for t in stacked]


def stacked_swiglu_forward(params: Sequence[torch.Tensor], x: torch.Tensor, activation: str) -> torch.Tensor:
    """Stacked SwiGLU forward: x (B, n, d_in) -> (B, n, d_out) (the batched twin of ``_ops.gated_forward``)."""
    gate, gate_bias, up, up_bias, down, down_bias = params
    hidden = _ops.activate(torch.baddbmm(gate_bias.unsqueeze(1), x, gate.transpose(1, 2)), activation)
    hidden = hidden * torch.baddbmm(up_bias.unsqueeze(1), x, up.transpose(1, 2))
    return torch.baddbmm(down_bias.unsqueeze(1), hidden, down.transpose(1, 2))


def unstack_swiglu(params: Sequence[torch.Tensor], b: int, hidden: int, activation: str,
                   outs: Optional[int] = None) -> FactMLP:
    """Model b of stacked gated weights, cut back to its own width (and ``outs`` outputs), as a FactMLP."""
    gate, gate_bias, up, up_bias, down, down_bias = (p[b] for p in params)
    outs = down.shape[0] if outs is None else outs
    return FactMLP(gate[:hidden], gate_bias[:hidden], up[:hidden], up_bias[:hidden], down[:outs, :hidden],
                   down_bias[:outs], activation=activation)


class _FusedCrossEntropy(torch.autograd.Function):
    """Row-wise cross-entropy of logits (N, C) against targets (N,) -> (loss (N,), hit (N,) bool), where
    hit says the target's logit is the row's largest (an exact tie with another class counts as a hit).

    Forward is :func:`_ops.softmax_cross_entropy` (a compiled kernel: one read of each row, where
    F.cross_entropy's log-softmax, NLL and a separate argmax make several passes over the (models·F, |V|)
    logits of a GD step); backward is softmax − one-hot from the saved softmax. Logits more than
    ``_ops.XENT_EXP_FLOOR`` below their row's max count as that far below (see there)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
        loss, hit, prob = _ops.softmax_cross_entropy(logits, targets, backend=backend)
        ctx.save_for_backward(prob, targets)
        ctx.mark_non_differentiable(hit)
        return loss, hit

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_hit: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        prob, targets = ctx.saved_tensors
        grad = prob * grad_loss.unsqueeze(1)
        return grad.scatter_add_(1, targets.unsqueeze(1), -grad_loss.unsqueeze(1)), None, None


def batched_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                          backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row cross-entropy and hit test: logits (B, n, C), targets (B, n) -> (loss (B, n), hit (B, n) bool)."""
    batch, rows, classes = logits.shape
    loss, hit = _FusedCrossEntropy.apply(logits.reshape(batch * rows, classes), targets.reshape(-1), backend)
    return loss.view(batch, rows), hit.view(batch, rows)


def all_decoded(outputs: torch.Tensor, values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per model, whether argmax_j <outputs_bi, v_bj> = targets_bi for every row i:
    outputs (B, n, d), values (B, |V|, d), targets (B, n) -> (B,) bool."""
    with torch.no_grad():
        return (torch.bmm(outputs, values.transpose(1, 2)).argmax(2) == targets).all(1)


# A row whose output lies within this fraction of its decoding radius counts as decoded without its
# logits: the margin left (1e-3 of the radius) is far above float32 rounding of the logits.
_RADIUS_SAFETY = 1 - 1e-3


def decoding_radii(values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """How far an output may sit from its target value and still decode to it: values (B, |V|, d), targets
    (B, n) -> radii (B, n), r_bi = min over j ≠ t of <v_t, v_t − v_j> / ||v_t − v_j|| (t = targets_bi), the
    distance from v_t to the nearest boundary <o, v_t − v_j> = 0 of the region argmax_j <o, v_j> = t: the
    star score of v_t (:func:`_ops.star_topk`); ≤ 0 when v_t itself does not decode, 0 for a duplicate value."""
    return torch.stack([_ops.star_topk(values[b], 1, rows=targets[b])[0][:, 0] for b in range(values.shape[0])])


def all_decoded_near(outputs: torch.Tensor, values: torch.Tensor, targets: torch.Tensor,
                     squared_errors: torch.Tensor, radii: torch.Tensor) -> torch.Tensor:
    """:func:`all_decoded` for outputs trained towards their target values, without most of the logits:
    outputs (B, n, d), values (B, |V|, d), targets (B, n), squared_errors (B, n) = ||o_bi − v_t||², radii
    (B, n) from :func:`decoding_radii` -> (B,) bool. Rows inside their radius decode; the rest are decoded
    in full, farthest first in growing chunks, stopping at the first miss (at F = 4,096 with 8,192 values
    the full (F, |V|) logits cost ~100× the MSE step they check)."""
    with torch.no_grad():
        bound = (radii.clamp_min(0) * _RADIUS_SAFETY).square().to(squared_errors.dtype)
        unsettled = squared_errors >= bound
        result = torch.ones(outputs.shape[0], dtype=torch.bool, device=outputs.device)
        for b in unsettled.any(1).nonzero().flatten().tolist():
            rows = unsettled[b].nonzero().flatten()
            rows = rows[squared_errors[b, rows].argsort(descending=True)]
            start, size = 0, 32
            while start < rows.numel():
                part = rows[start:start + size]
                if not bool(((outputs[b, part] @ values[b].T).argmax(1) == targets[b, part]).all()):
                    result[b] = False
                    break
                start, size = start + size, size * 4
        return result
