"""Gradient-descent baselines (seed 000, A.1.3), trained as batches of independent models.

* :func:`gd_mlp` — a SwiGLU MLP trained with cross-entropy on the dot-product logits g(K) Vᵀ
  (full-batch Adam, cosine learning rate 1e-3 -> 1e-6, up to 20000 steps).
* :func:`gd_encoder` — a gated encoder R^d -> R^m trained with MSE to fixed codes, keys
  jittered by N(0, ε_key²), ε_key = 1e-7 (1000 Adam steps at 1e-2).
* :func:`gd_decoder` — learned codes C (|V|, m) and decoding matrix M (m, d) trained with
  cross-entropy on C M Vᵀ (1000 Adam steps, cosine 1 -> 0.01), rescaled after.
* :func:`encoder_decoder` — the hybrids Bin+JL (= :func:`factkernels.construct`), GD+JL,
  Bin+GD and GD+GD, assembled into one gated FactMLP g(x) = D · enc(x).

Each has a ``*_batch`` twin that trains B independent models (one per fact set, size and
seed) as one stacked model: weights (B, ...) with block-batched GEMMs (``torch.bmm``), one
Adam over the stacked tensors and per-model early stopping. Models of different widths are
zero-padded to the widest: a padded unit has zero gate, up and down weights, so its
gradient and Adam update are exactly zero and it never moves. Model b's initial weights
(and key jitter) come from its own generator seeded with seeds[b], so a batch trains the
same models as one call per model (up to GEMM rounding); the single-model functions are
batches of one.

Every variant trains through the one loop :func:`fit`, which stops each model as soon as it
stores every fact (checked on the forward pass of each step, before the update, so the
returned weights are the ones that stored everything) and drops it from the batch; only
the decoder trains all its steps. Tensors live on the device and in the dtype of the keys;
initial weights are drawn on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F_nn

from .. import _ops, geometry
from ..construct import construct
from ..decoder import JLDecoder, jl_decoder
from ..embeddings import FactSet
from ..encoder import assemble, build_shared_gate
from ..mlp import FactMLP
from ..progress import progress_bar
from ..solvers import pick_solver
from ..validation import check_positive_int as _check_count
from ..validation import validate_inputs

ENCODERS = ("bin", "gd")
DECODERS = ("jl", "gd")
KEY_NOISE = 1e-7  # ε_key of the GD encoder
BIN_WIDTH_MULTIPLIER = 1.5  # construct()'s default gadget width multiplier
GD_WIDTH_MULTIPLIER = 1.0  # the seed's default for h = ⌈m (F/d) · multiplier⌉
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


# ----------------------------------------------------------------------------- the gated network


_GATED_NAMES = ("gate", "gate_bias", "up", "up_bias", "down", "down_bias")


def _gated_init(d_in: int, hiddens: Sequence[int], d_outs: Sequence[int], seeds: Sequence[int],
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


def _gated_apply(params: Sequence[torch.Tensor], x: torch.Tensor, activation: str) -> torch.Tensor:
    """Stacked SwiGLU forward: x (B, n, d_in) -> (B, n, d_out) (the batched twin of ``_ops.gated_forward``)."""
    gate, gate_bias, up, up_bias, down, down_bias = params
    hidden = _ops.activate(torch.baddbmm(gate_bias.unsqueeze(1), x, gate.transpose(1, 2)), activation)
    hidden = hidden * torch.baddbmm(up_bias.unsqueeze(1), x, up.transpose(1, 2))
    return torch.baddbmm(down_bias.unsqueeze(1), hidden, down.transpose(1, 2))


def _gated_mlp(params: Sequence[torch.Tensor], b: int, hidden: int, activation: str,
               outs: Optional[int] = None) -> FactMLP:
    """Model b of stacked gated weights, cut back to its own width (and ``outs`` outputs), as a FactMLP."""
    gate, gate_bias, up, up_bias, down, down_bias = (p[b] for p in params)
    outs = down.shape[0] if outs is None else outs
    return FactMLP(gate[:hidden], gate_bias[:hidden], up[:hidden], up_bias[:hidden], down[:outs, :hidden],
                   down_bias[:outs], activation=activation)


def _check_rates(lr: float, final_lr: float) -> None:
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if not (isinstance(final_lr, (int, float)) and 0 <= final_lr <= lr):
        raise ValueError(f"final_lr must be in [0, lr={lr}], got {final_lr!r}")


def _per_model(name: str, values: Union[int, Sequence[int]], count: int) -> list[int]:
    """One positive int per model: broadcast an int, or check a sequence of ``count`` of them."""
    listed = [values] * count if isinstance(values, int) and not isinstance(values, bool) else list(values)
    if len(listed) != count:
        raise ValueError(f"{name} must be an int or one int per model ({count}), got {len(listed)}")
    for value in listed:
        _check_count(name, value)
    return listed


def _seeds(seeds: Sequence[int], count: int) -> list[int]:
    listed = list(seeds)
    if len(listed) != count or not all(isinstance(s, int) and not isinstance(s, bool) for s in listed):
        raise ValueError(f"seeds must be one int per model ({count}), got {seeds!r}")
    return listed


def _stack_fact_sets(fact_sets: Sequence[FactSet]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate B fact sets of one shape and stack them: K (B, F, d_in), V (B, |V|, d_out), f (B, F)."""
    if len(fact_sets) == 0:
        raise ValueError("fact_sets must hold at least one (K, V, f)")
    checked = [(K, V, validate_inputs(K, V, f)) for K, V, f in fact_sets]
    shapes = {(K.shape, V.shape) for K, V, _ in checked}
    if len(shapes) != 1:
        raise ValueError(f"fact_sets must share one shape (K, V) to train as a batch, got {sorted(map(str, shapes))}")
    return (torch.stack([K for K, _, _ in checked]), torch.stack([V for _, V, _ in checked]),
            torch.stack([f for _, _, f in checked]))


class _CrossEntropy(torch.autograd.Function):
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


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                   backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row cross-entropy and hit test: logits (B, n, C), targets (B, n) -> (loss (B, n), hit (B, n) bool)."""
    batch, rows, classes = logits.shape
    loss, hit = _CrossEntropy.apply(logits.reshape(batch * rows, classes), targets.reshape(-1), backend)
    return loss.view(batch, rows), hit.view(batch, rows)


class _ActiveRows:
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


def _all_decoded(outputs: torch.Tensor, values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per model, whether argmax_j <outputs_bi, v_bj> = targets_bi for every row i:
    outputs (B, n, d), values (B, |V|, d), targets (B, n) -> (B,) bool."""
    with torch.no_grad():
        return (torch.bmm(outputs, values.transpose(1, 2)).argmax(2) == targets).all(1)


# A row whose output lies within this fraction of its decoding radius counts as decoded without its
# logits: the margin left (1e-3 of the radius) is far above float32 rounding of the logits.
_RADIUS_SAFETY = 1 - 1e-3


def _decoding_radii(values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """How far an output may sit from its target value and still decode to it: values (B, |V|, d), targets
    (B, n) -> radii (B, n), r_bi = min over j ≠ t of <v_t, v_t − v_j> / ||v_t − v_j|| (t = targets_bi), the
    distance from v_t to the nearest boundary <o, v_t − v_j> = 0 of the region argmax_j <o, v_j> = t: the
    star score of v_t (:func:`_ops.star_topk`); ≤ 0 when v_t itself does not decode, 0 for a duplicate value."""
    return torch.stack([_ops.star_topk(values[b], 1, rows=targets[b])[0][:, 0] for b in range(values.shape[0])])


def _all_decoded_near(outputs: torch.Tensor, values: torch.Tensor, targets: torch.Tensor,
                      squared_errors: torch.Tensor, radii: torch.Tensor) -> torch.Tensor:
    """:func:`_all_decoded` for outputs trained towards their target values, without most of the logits:
    outputs (B, n, d), values (B, |V|, d), targets (B, n), squared_errors (B, n) = ||o_bi − v_t||², radii
    (B, n) from :func:`_decoding_radii` -> (B,) bool. Rows inside their radius decode; the rest are decoded
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


# ----------------------------------------------------------------------------- GD MLP


GD_LOSSES = ("ce", "mse")
# When a GD MLP stops: "stored", at the first step whose forward pass stores every fact (the capacity searches);
# "converged", after its whole cosine schedule or once its loss per output coordinate falls to CONVERGED_LOSS
# (the authors' released fact experts: 10,000 full-batch Adam steps, cutoff 1e-7 on the mean squared error).
GD_STOPS = ("stored", "converged")
CONVERGED_LOSS = 1e-7


def gd_mlp_batch(
    fact_sets: Sequence[FactSet],
    hiddens: Union[int, Sequence[int]],
    seeds: Sequence[int],
    *,
    steps: int = 20000,
    lr: float = 1e-3,
    final_lr: float = 1e-6,
    activation: str = "silu",
    loss: str = "ce",
    until: str = "stored",
    progress: bool = True,
    backend: str = "auto",
) -> list[FactMLP]:
    """B SwiGLU MLPs trained as one batch: model b stores fact set b with width hiddens[b] from seed seeds[b].

    fact_sets: B triples (K (F, d_in), V (|V|, d_out), f (F,)) of one shape (the same one B times
    for several seeds on one fact set). Otherwise as :func:`gd_mlp`, which is the batch of one.
    """
    K, V, facts = _stack_fact_sets(fact_sets)
    count = K.shape[0]
    hiddens = _per_model("hidden", hiddens, count)
    seeds = _seeds(seeds, count)
    _check_count("steps", steps)
    _check_rates(lr, final_lr)
    _ops.check_activation(activation)
    if loss not in GD_LOSSES:
        raise ValueError(f"loss must be one of {GD_LOSSES}, got {loss!r}")
    if until not in GD_STOPS:
        raise ValueError(f"until must be one of {GD_STOPS}, got {until!r}")
    if backend not in _ops.BACKENDS:
        raise ValueError(f"backend must be one of {_ops.BACKENDS}, got {backend!r}")
    cutoff = CONVERGED_LOSS * (1 if loss == "ce" else V.shape[2])  # the MSE below sums over the d_out coordinates
    targets = torch.gather(V, 1, facts.unsqueeze(2).expand(-1, -1, V.shape[2]))  # (B, F, d_out)
    # MSE checks decoding only where an output is not already inside its target's decoding region (a converged
    # run never checks decoding while it trains, so it needs no radii)
    radii = (_decoding_radii(V, facts) if loss == "mse" and until == "stored"
             else torch.zeros(facts.shape, device=K.device))
    training = _ActiveRows(K, V, facts, targets, radii)

    def objective(params: list[torch.Tensor], active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values, rows, wanted, radius = training(active)
        outputs = _gated_apply(params, keys, activation)  # (b, F, d_out)
        if loss == "ce":
            value, hit = _cross_entropy(torch.bmm(outputs, values.transpose(1, 2)), rows, backend)  # (b, F, |V|)
            value = value.mean(1)
            return value, (hit.all(1) if until == "stored" else value.detach() <= cutoff)
        errors = (outputs - wanted).square().sum(2)
        value = errors.mean(1)
        if until == "converged":
            return value, value.detach() <= cutoff
        return value, _all_decoded_near(outputs.detach(), values, rows, errors.detach(), radius)

    params, results = fit(_gated_init(K.shape[2], hiddens, [V.shape[2]] * count, seeds, K), objective, steps=steps,
                          lr=lr, final_lr=final_lr, progress=progress, desc=f"gd mlp x{count} h<={max(hiddens)}")
    mlps = []
    for b, (hidden, result) in enumerate(zip(hiddens, results)):
        mlp = _gated_mlp(params, b, hidden, activation)
        if until == "converged":  # fit's "solved" said converged: record whether it stores every fact
            result = replace(result, solved=bool((mlp.predict(K[b], V[b]) == facts[b]).all()))
        mlp.fit_results = {"mlp": result}
        mlps.append(mlp)
    return mlps


def gd_mlp(
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    hidden: int,
    *,
    steps: int = 20000,
    lr: float = 1e-3,
    final_lr: float = 1e-6,
    activation: str = "silu",
    loss: str = "ce",
    until: str = "stored",
    seed: int = 0,
    progress: bool = True,
    backend: str = "auto",
) -> FactMLP:
    """A SwiGLU MLP of width ``hidden`` trained to store f with full-batch Adam.

    loss "ce": CE(g(K) Vᵀ, f) (the capacity baseline); "mse": mean_i ||g(k_i) − v_f(i)||²
    (the fact experts of the seed's language model, App. A.3.2).
    K: (F, d_in), V: (|V|, d_out), f: (F,). ``until`` (one of :data:`GD_STOPS`): "stored" stops early once
    every fact is stored; "converged" trains through the schedule unless the loss reaches :data:`CONVERGED_LOSS`.
    backend: the cross-entropy's (:func:`_ops.softmax_cross_entropy`): "auto", "kernels" or "torch".
    Returns a FactMLP with biases (gate/up (hidden, d_in), down (d_out, hidden)); its
    ``fit_results`` attribute holds {"mlp": :class:`FitResult`}.
    """
    _check_count("hidden", hidden)
    return gd_mlp_batch([FactSet(K, V, f)], [hidden], [seed], steps=steps, lr=lr, final_lr=final_lr,
                        activation=activation, loss=loss, until=until, progress=progress, backend=backend)[0]


# ----------------------------------------------------------------------------- GD encoder / decoder


def gd_encoder_batch(
    keys: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    hiddens: Union[int, Sequence[int]],
    seeds: Sequence[int],
    *,
    stored: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
    steps: int = 1000,
    lr: float = 1e-2,
    key_noise: float = KEY_NOISE,
    activation: str = "silu",
    progress: bool = True,
) -> list[tuple[FactMLP, FitResult]]:
    """B gated encoders trained as one batch: model b maps keys[b] (F, d) to targets[b] (F, m_b).

    ``stored(outputs (b, F, m), active (b,)) -> (b,) bool`` stops model active[i] early.
    Model b's key jitter comes from Generator(seeds[b]) on the keys' device. Targets of several
    widths m_b are zero-padded to the widest (outputs (b, F, max m) then hold zeros past m_b).
    Otherwise as :func:`gd_encoder`, which is the batch of one.
    """
    if len(keys) == 0 or len(keys) != len(targets):
        raise ValueError(f"keys and targets must be non-empty and of one length, got {len(keys)} and {len(targets)}")
    for K, target in zip(keys, targets):
        if not isinstance(target, torch.Tensor) or target.dim() != 2 or target.shape[0] != K.shape[0]:
            raise ValueError(f"targets must be a ({K.shape[0]}, m) tensor (one code per key), got "
                             f"{tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__}")
    if len({K.shape for K in keys}) != 1:
        raise ValueError("keys must share one shape to train as a batch")
    count = len(keys)
    hiddens = _per_model("hidden", hiddens, count)
    seeds = _seeds(seeds, count)
    _check_count("steps", steps)
    _check_rates(lr, lr)
    if not (isinstance(key_noise, (int, float)) and key_noise >= 0):
        raise ValueError(f"key_noise must be a non-negative number, got {key_noise!r}")
    _ops.check_activation(activation)
    outs = [t.shape[1] for t in targets]
    K = torch.stack(list(keys))  # (B, F, d)
    codes = torch.stack([F_nn.pad(t, (0, max(outs) - t.shape[1])) for t in targets])  # (B, F, max m)
    noise = [torch.Generator(device=K.device).manual_seed(seed) for seed in seeds]
    # Each model draws the jitter of `chunk` steps in one call: one randn per model per step cost more
    # than the step itself in small batches. The stream is the per-step one whenever F·d is a multiple
    # of 16 (torch's CPU normal sampler works in blocks of 16), and the same alone as in a batch always.
    chunk = max(1, min(64, (1 << 18) // K[0].numel()))
    jitter = torch.empty(count, chunk, *K.shape[1:], device=K.device, dtype=K.dtype)
    training = _ActiveRows(K, codes)
    step = 0

    def objective(params: list[torch.Tensor], active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal step  # fit calls this once per step, every model still training being at that step
        position, step = step % chunk, step + 1
        if position == 0:
            for b in active.tolist():
                jitter[b] = torch.randn(jitter.shape[1:], generator=noise[b], device=K.device, dtype=K.dtype)
        keys, wanted = training(active)
        rows = jitter[:, position] if keys is K else jitter[active, position]
        outputs = _gated_apply(params, keys + rows * key_noise, activation)
        loss = (outputs - wanted).square().sum(2).mean(1)
        solved = (stored(outputs.detach(), active) if stored is not None
                  else torch.zeros(active.shape, dtype=torch.bool, device=K.device))
        return loss, solved

    params, results = fit(_gated_init(K.shape[2], hiddens, outs, seeds, K), objective, steps=steps, lr=lr,
                          final_lr=lr, progress=progress, desc=f"gd encoder x{count} h<={max(hiddens)}")
    return [(_gated_mlp(params, b, hidden, activation, out), result)
            for b, (hidden, out, result) in enumerate(zip(hiddens, outs, results))]


def gd_encoder(
    K: torch.Tensor,
    targets: torch.Tensor,
    hidden: int,
    *,
    stored: Optional[Callable[[torch.Tensor], bool]] = None,
    steps: int = 1000,
    lr: float = 1e-2,
    key_noise: float = KEY_NOISE,
    activation: str = "silu",
    seed: int = 0,
    progress: bool = True,
) -> tuple[FactMLP, FitResult]:
    """A gated encoder of width ``hidden`` fit to codes: keys K (F, d) -> targets (F, m).

    Minimizes mean_i ||enc(k_i + η_i) − targets_i||², η_i ~ N(0, key_noise² I), with Adam at a
    constant ``lr``. ``stored(outputs (F, m)) -> bool`` stops training early (e.g. when the
    decoded codes give every fact). Returns the encoder as a FactMLP (down = E (m, hidden)).
    """
    _check_count("hidden", hidden)
    batch_stored = None if stored is None else (
        lambda outputs, active: torch.tensor([bool(stored(outputs[0]))], device=outputs.device))
    return gd_encoder_batch([K], [targets], [hidden], [seed], stored=batch_stored, steps=steps, lr=lr,
                            key_noise=key_noise, activation=activation, progress=progress)[0]


def gd_decoder_batch(
    values: Sequence[torch.Tensor],
    used: Sequence[torch.Tensor],
    ms: Union[int, Sequence[int]],
    seeds: Sequence[int],
    *,
    steps: int = 1000,
    lr: float = 1.0,
    final_lr: float = 0.01,
    progress: bool = True,
) -> list[tuple[JLDecoder, FitResult]]:
    """B learned decoders trained as one batch: model b has codes (|V|, ms[b]) for values[b] and
    trains on used[b]. Codes and matrices are zero-padded to the largest m (padding gets zero
    gradient) and the cross-entropy of model b averages over its own used values. Otherwise
    as :func:`gd_decoder`, which is the batch of one.
    """
    count = len(values)
    if count == 0 or len(used) != count or len({V.shape for V in values}) != 1:
        raise ValueError("values must be a non-empty sequence of one shape, with one used tensor per model")
    for V, u in zip(values, used):
        if u.dim() != 1 or u.numel() == 0 or int(u.min()) < 0 or int(u.max()) >= V.shape[0]:
            raise ValueError(f"used must be a non-empty 1-D tensor of value indices in [0, {V.shape[0]})")
    ms = _per_model("m", ms, count)
    seeds = _seeds(seeds, count)
    _check_count("steps", steps)
    _check_rates(lr, final_lr)
    V = torch.stack(list(values))  # (B, |V|, d)
    num_values, dim, width = V.shape[1], V.shape[2], max(ms)
    longest = max(u.numel() for u in used)
    index = torch.zeros(count, longest, dtype=torch.int64, device=V.device)  # used values, padded with 0
    weight = torch.zeros(count, longest, dtype=V.dtype, device=V.device)  # 1/k_b on real entries, 0 on padding
    codes = torch.zeros(count, num_values, width, dtype=torch.float64)
    matrix = torch.zeros(count, width, dim, dtype=torch.float64)
    for b, (u, m, seed) in enumerate(zip(used, ms, seeds)):
        index[b, :u.numel()] = u
        weight[b, :u.numel()] = 1.0 / u.numel()
        generator = torch.Generator().manual_seed(seed)
        codes[b, :, :m] = torch.randn(num_values, m, generator=generator, dtype=torch.float64) / math.sqrt(m)
        matrix[b, :m] = torch.randn(m, dim, generator=generator, dtype=torch.float64) / math.sqrt(m)

    training = _ActiveRows(index, V, weight)

    def objective(params: list[torch.Tensor], active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, values, weights = training(active)  # rows (b, k)
        chosen = torch.gather(params[0], 1, rows.unsqueeze(2).expand(-1, -1, width))  # (b, k, m)
        logits = torch.bmm(torch.bmm(chosen, params[1]), values.transpose(1, 2))  # (b, k, |V|)
        loss = (_cross_entropy(logits, rows)[0] * weights).sum(1)
        return loss, torch.zeros(active.shape, dtype=torch.bool, device=V.device)  # never early: see gd_decoder

    (codes, matrix), results = fit([codes.to(V), matrix.to(V)], objective, steps=steps, lr=lr, final_lr=final_lr,
                                   progress=progress, desc=f"gd decoder x{count} m<={width}")
    decoders = []
    for b, (m, result) in enumerate(zip(ms, results)):
        code, mat = codes[b, :, :m], matrix[b, :m]
        code = code / code.norm(dim=1, keepdim=True).clamp_min(1e-30)
        mat = mat / mat.norm(dim=1).square().mean().sqrt().clamp_min(1e-30)
        decoders.append((JLDecoder(mat.T.contiguous(), code.contiguous()), result))
    return decoders


def gd_decoder(
    V: torch.Tensor,
    used: torch.Tensor,
    m: int,
    *,
    steps: int = 1000,
    lr: float = 1.0,
    final_lr: float = 0.01,
    seed: int = 0,
    progress: bool = True,
) -> tuple[JLDecoder, FitResult]:
    """Learned decoder: codes C (|V|, m) and M (m, d) with CE(C[used] M Vᵀ, used).

    V: (|V|, d); used: (k,) indices of the values that facts map to. C and M start i.i.d.
    N(0, 1/m). After training, the rows of C are normalized (as in the seed) and M is divided
    by its RMS row norm: the seed also normalizes M's rows, but that changes which value a
    code decodes to (it broke 2 of 64 values in our tests), one scalar does not. Unlike the other
    variants it trains all ``steps``: stopping at the first step that decodes every value
    leaves near-zero margins, which the encoder's fitting error then flips. Returns the
    decoder as a :class:`JLDecoder` container with projection D = Mᵀ (d, m) and codes C.
    """
    _check_count("m", m)
    return gd_decoder_batch([V], [used], [m], [seed], steps=steps, lr=lr, final_lr=final_lr, progress=progress)[0]


# ----------------------------------------------------------------------------- hybrids


def encoder_decoder_batch(
    fact_sets: Sequence[FactSet],
    ms: Union[int, Sequence[int]],
    seeds: Sequence[int],
    *,
    encoder: str = "gd",
    decoder: str = "jl",
    width_multiplier: Optional[float] = None,
    encoder_hidden: Union[None, int, Sequence[int]] = None,
    encoder_steps: int = 1000,
    decoder_steps: int = 1000,
    outputs: Optional[Sequence[torch.Tensor]] = None,
    progress: bool = True,
) -> list[FactMLP]:
    """B hybrid fact MLPs (see :func:`encoder_decoder`, the batch of one): model b stores fact set b
    with code dimension ms[b] from seed seeds[b]. The GD decoders train as one batch, then the GD
    encoders (codes of several m zero-padded to the largest); closed-form parts are built per model.
    ``encoder_hidden``: one width or one per model (GD encoder only). ``outputs``: decoder "jl" only,
    U* (|V|, d_out) of each model's values, solved here (once per fact set) when not given.
    """
    K, V, facts = _stack_fact_sets(fact_sets)
    count, num_facts, d_in = K.shape
    if encoder not in ENCODERS:
        raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    ms = _per_model("m", ms, count)
    seeds = _seeds(seeds, count)
    if width_multiplier is not None and not (isinstance(width_multiplier, (int, float)) and width_multiplier > 0):
        raise ValueError(f"width_multiplier must be a positive number, got {width_multiplier!r}")
    if encoder_hidden is not None:
        if encoder != "gd":
            raise ValueError(f"encoder_hidden sets the GD encoder's width; it does not apply to encoder={encoder!r}")
        encoder_hidden = _per_model("encoder_hidden", encoder_hidden, count)
    if outputs is not None:
        if decoder != "jl":
            raise ValueError(f"outputs are U* for the JL decoder; they do not apply to decoder={decoder!r}")
        outputs = list(outputs)
        if len(outputs) != count or any(not isinstance(u, torch.Tensor) or u.shape != V.shape[1:] for u in outputs):
            raise ValueError(f"outputs must be one ({V.shape[1]}, {V.shape[2]}) tensor per model ({count})")
    elif decoder == "jl":
        solved: dict = {}  # U* once per fact set: a search's batch repeats each one for several m
        for b, (_, values, _) in enumerate(fact_sets):
            if id(values) not in solved:
                solved[id(values)] = geometry.margin_optimal_outputs(V[b])[0]
        outputs = [solved[id(values)] for _, values, _ in fact_sets]
    if encoder == "bin" and decoder == "jl":
        return [construct(K[b], V[b], facts[b], m=ms[b], outputs=outputs[b], seed=seeds[b], verify="report",
                          progress=progress, width_multiplier=width_multiplier or BIN_WIDTH_MULTIPLIER)
                for b in range(count)]

    fit_results: list[dict] = [{} for _ in range(count)]
    if decoder == "jl":
        decoders = [jl_decoder(outputs[b], ms[b], torch.Generator().manual_seed(seeds[b])) for b in range(count)]
    else:
        trained = gd_decoder_batch(list(V), [torch.unique(facts[b]) for b in range(count)], ms, seeds,
                                   steps=decoder_steps, progress=progress)
        decoders = [dec for dec, _ in trained]
        for results, (_, result) in zip(fit_results, trained):
            results["decoder"] = result

    if encoder == "bin":
        mlps = []
        for b, dec in enumerate(decoders):
            enc = build_shared_gate(K[b], dec.codes[facts[b]], width_multiplier=width_multiplier or BIN_WIDTH_MULTIPLIER,
                                    activation="silu", solver=pick_solver(num_facts, K.device),
                                    generator=torch.Generator().manual_seed(seeds[b]), progress=progress)
            mlps.append(assemble(enc, dec.projection, activation="silu"))
    else:
        hiddens = encoder_hidden or [math.ceil(m * num_facts / d_in * (width_multiplier or GD_WIDTH_MULTIPLIER))
                                     for m in ms]
        widest = max(ms)
        projections = torch.stack([F_nn.pad(dec.projection, (0, widest - dec.projection.shape[1]))
                                   for dec in decoders])  # (B, d_out, max m): zero columns past m_b

        decoding = _ActiveRows(projections, V, facts)

        def stored(outputs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
            projection, values, rows = decoding(active)
            return _all_decoded(torch.bmm(outputs, projection.transpose(1, 2)), values, rows)

        encoders = gd_encoder_batch(list(K), [dec.codes[facts[b]] for b, dec in enumerate(decoders)], hiddens, seeds,
                                    stored=stored, steps=encoder_steps, progress=progress)
        mlps = []
        for results, dec, (enc, result) in zip(fit_results, decoders, encoders):
            results["encoder"] = result
            mlps.append(FactMLP(enc.gate_weight, enc.gate_bias, enc.up_weight, enc.up_bias,
                                dec.projection @ enc.down_weight, dec.projection @ enc.down_bias))
    for mlp, results in zip(mlps, fit_results):
        mlp.fit_results = results
    return mlps


def encoder_decoder(
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    m: int,
    *,
    encoder: str = "gd",
    decoder: str = "jl",
    width_multiplier: Optional[float] = None,
    encoder_hidden: Optional[int] = None,
    encoder_steps: int = 1000,
    decoder_steps: int = 1000,
    outputs: Optional[torch.Tensor] = None,
    seed: int = 0,
    progress: bool = True,
) -> FactMLP:
    """A fact MLP g(x) = D · enc(x) from an encoder ("bin" | "gd") and a decoder ("jl" | "gd").

    K: (F, d_in), V: (|V|, d_out), f: (F,); m: code dimension.
    - decoder "jl": D ~ N(0, 1/m) (d_out, m), codes C = U* D (Alg. 4); "gd": :func:`gd_decoder`.
    - encoder "bin": the closed-form shared-gate gadgets (Alg. 2/3) with gadget width
      ⌈multiplier·F/(d_in+1)⌉ (multiplier default 1.5); "gd": :func:`gd_encoder` of width
      ``encoder_hidden`` or ⌈m (F/d_in) · multiplier⌉ (multiplier default 1).
    - encoder_steps / decoder_steps: Adam steps of the GD encoder / decoder.
    - outputs: decoder "jl" only, U* (|V|, d_out) of V when already solved (a search builds many
      sizes on one fact set); solved here otherwise.
    Bin+JL is exactly :func:`factkernels.construct` with margin-optimal outputs.

    Returns a gated FactMLP (SwiGLU layout); for the hybrids with a trained part,
    ``fit_results`` holds the :class:`FitResult` of each ({"decoder": ..., "encoder": ...}).
    """
    _check_count("m", m)
    if encoder_hidden is not None:
        _check_count("encoder_hidden", encoder_hidden)
    return encoder_decoder_batch([FactSet(K, V, f)], [m], [seed], encoder=encoder, decoder=decoder,
                                 width_multiplier=width_multiplier, encoder_hidden=encoder_hidden,
                                 encoder_steps=encoder_steps, decoder_steps=decoder_steps,
                                 outputs=None if outputs is None else [outputs], progress=progress)[0]
