"""The batched Adam loop every GD baseline trains through (seed 000, A.1.3), and the per-model bookkeeping.

:func:`fit` trains B independent models stacked along a leading batch axis (weights (B, ...)) with one
full-batch Adam and a cosine learning rate, and stops each model at the first step whose forward pass
stores every fact (checked before the update, so the returned weights are the ones that stored everything),
dropping it from the batch. Model b's trajectory is the one it would follow alone (up to GEMM rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch

from ..embeddings import FactSet
from ..progress import progress_bar
from ..validation import check_positive_int as _check_count
from ..validation import validate_inputs


ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults
ADAM_EPS = 1e-8


@dataclass
class FitResult:
    """How one model's :func:`fit` run ended: optimizer steps taken, whether every fact was stored, last loss."""

    steps: int
    solved: bool
    loss: float


Objective = Callable[[list[torch.Tensor], torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def cosine_lr(step: int, steps: int, lr: float, final_lr: float) -> float:
    """The learning rate of update ``step`` (0-based) of a cosine schedule lr -> final_lr over ``steps``."""
    return final_lr + (lr - final_lr) * (1 + math.cos(math.pi * step / steps)) / 2


def fit(
    parameters: Sequence[torch.Tensor],
    objective: Objective,
    *,
    steps: int,
    lr: float,
    final_lr: float,
    progress: bool = True,
    desc: str = "gd",
) -> tuple[list[torch.Tensor], list[FitResult]]:
    """Full-batch Adam, cosine learning rate ``lr`` -> ``final_lr`` over ``steps``, on B stacked models.

    parameters: tensors (B, ...) — row b of each is model b's. ``objective(params, active)``
    gets the parameters of the models still training (rows ``active``, a (b,) index into
    0..B−1, with requires_grad) and returns (loss (b,), solved (b,) bool) from one forward pass;
    the models are independent, so the gradient of loss.sum() is each model's own. A model
    stops before the update of the first step whose forward pass stores every fact; it is then
    dropped from the batch. Adam is torch.optim.Adam's update (betas 0.9/0.999, eps 1e-8)
    applied elementwise, so each model follows the trajectory it would follow alone.

    Returns (final parameters (B, ...) detached, one :class:`FitResult` per model).
    """
    count = parameters[0].shape[0]
    shapes = [p.shape[1:] for p in parameters]
    sizes = [math.prod(shape) for shape in shapes]
    # One flat (B, N) buffer: Adam is a handful of ops per step however many tensors a model has.
    flat = torch.cat([p.detach().reshape(count, -1) for p in parameters], dim=1)
    final = flat.clone()
    results: list[Optional[FitResult]] = [None] * count
    first_moment, second_moment = torch.zeros_like(flat), torch.zeros_like(flat)
    active = torch.arange(count, device=flat.device)
    beta1, beta2 = ADAM_BETAS
    with progress_bar(total=steps, desc=desc, enabled=progress, leave=False) as bar:
        for step in range(steps + 1):
            flat.requires_grad_(True)
            params = [part.view(-1, *shape) for part, shape in zip(flat.split(sizes, dim=1), shapes)]
            loss, solved = objective(params, active)
            done = solved.detach().to(torch.bool) | (step == steps)
            any_done = bool(done.any())  # read back once: a GPU waits for the host at each read
            if any_done:
                rows = active[done]
                final[rows] = flat.detach()[done]
                for row, value, ok in zip(rows.tolist(), loss.detach()[done].tolist(), solved[done].tolist()):
                    results[row] = FitResult(step, bool(ok), float(value))
                if bool(done.all()):
                    break
            (grad,) = torch.autograd.grad(loss.sum(), flat)
            flat = flat.detach()
            if any_done:
                index = (~done).nonzero().squeeze(1)
                active, flat, grad = active[index], flat[index], grad[index]
                first_moment, second_moment = first_moment[index], second_moment[index]
            rate = cosine_lr(step, steps, lr, final_lr)
            correction1 = 1 - beta1 ** (step + 1)
            correction2_sqrt = math.sqrt(1 - beta2 ** (step + 1))
            first_moment.lerp_(grad, 1 - beta1)
            second_moment.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (second_moment.sqrt() / correction2_sqrt).add_(ADAM_EPS)
            flat = flat.addcdiv(first_moment, denom, value=-rate / correction1)
            bar.update(1)
            if step % 100 == 0:
                bar.set_postfix(loss=f"{float(loss.detach().mean()):.3g}", training=int(active.numel()))
    final_params = [part.reshape(count, *shape) for part, shape in zip(final.split(sizes, dim=1), shapes)]
    return final_params, [r for r in results]  # every model has a result: the last step finishes all


def check_rates(lr: float, final_lr: float) -> None:
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if not (isinstance(final_lr, (int, float)) and 0 <= final_lr <= lr):
        raise ValueError(f"final_lr must be in [0, lr={lr}], got {final_lr!r}")


def per_model_counts(name: str, values: Union[int, Sequence[int]], count: int) -> list[int]:
    """One positive int per model: broadcast an int, or check a sequence of ``count`` of them."""
    listed = [values] * count if isinstance(values, int) and not isinstance(values, bool) else list(values)
    if len(listed) != count:
        raise ValueError(f"{name} must be an int or one int per model ({count}), got {len(listed)}")
    for value in listed:
        _check_count(name, value)
    return listed


def per_model_seeds(seeds: Sequence[int], count: int) -> list[int]:
    listed = list(seeds)
    if len(listed) != count or not all(isinstance(s, int) and not isinstance(s, bool) for s in listed):
        raise ValueError(f"seeds must be one int per model ({count}), got {seeds!r}")
    return listed


def stack_fact_sets(fact_sets: Sequence[FactSet]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate B fact sets of one shape and stack them: K (B, F, d_in), V (B, |V|, d_out), f (B, F)."""
    if len(fact_sets) == 0:
        raise ValueError("fact_sets must hold at least one (K, V, f)")
    checked = [(K, V, validate_inputs(K, V, f)) for K, V, f in fact_sets]
    shapes = {(K.shape, V.shape) for K, V, _ in checked}
    if len(shapes) != 1:
        raise ValueError(f"fact_sets must share one shape (K, V) to train as a batch, got {sorted(map(str, shapes))}")
    return (torch.stack([K for K, _, _ in checked]), torch.stack([V for _, V, _ in checked]),
            torch.stack([f for _, _, f in checked]))


class ActiveRows:
    """Rows ``active`` of per-model tensors (B, ...), indexed again only when the set of training models
    changes: :func:`fit` passes one ``active`` tensor until a model stops, and indexing every step
    costs a copy of each tensor per step."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors
        self.active: Optional[torch.Tensor] = None
        self.rows = tensors

    def __call__(self, active: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if active is not self.active:
            self.active = active
            whole = active.numel() == self.tensors[0].shape[0]  # fit starts with every model, in order
            self.rows = self.tensors if whole else tuple(t[active] for t in self.tensors)
        return self.rows
