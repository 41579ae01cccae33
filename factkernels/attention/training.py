"""Learned QK heads for RGR, trained exactly as in the seed's experiments (Sec. 6, App. A.1/A.2).

One run: a permutation graph pi and Gaussian unit-norm embeddings X (m, d_model), both
fixed by the seed; learned W_Q, W_K (d_model, D_K) split into h heads of d_k = D_K / h and
a global threshold tau; max-over-heads scores, edge iff S_max > tau. AdamW (lr 1e-3, no
weight decay) on a weighted logistic loss over all ell^2 ordered pairs of one context of
length ell = 16 per step (positive weight ell - 1, logit sharpness alpha = 10); contexts
drawn with target-in-context rate rho = 0.5; 500 validation and 2,000 test contexts; every
500 steps validation micro-F1, halting after five consecutive checks above 0.995; step
cut-offs from Table 2. The reported number is test micro-F1 with the learned tau.

Runs that share m, d_model and h are trained together as one batch: parameters are
stacked along a leading run axis, and a run with d_k smaller than the batch's widest is
zero-padded. Padded columns have exactly zero gradient and so stay zero under AdamW
(no weight decay), and AdamW is elementwise, so every run is the same optimisation it
would be alone (up to float rounding of differently shaped matmuls). A run that stops
early is removed from the batch, with its optimizer state. Runs with the same seed share
the graph, embeddings and training context stream.

Extensions (``TrainingConfig``): ``degree`` r > 1 trains on an r-regular graph (App. A.3:
contexts keep an out-neighbour of each chosen source, positives weighted #neg/#pos per
context); ``objective="messages"`` adds the frozen random value channel of Sec. 7.2 (messages
y = x W_V, prediction S_max V_C with raw scores, MSE over rows whose neighbour is in context,
early stop after ``patience`` checks without a better validation MSE; the last parameters
are kept). Evaluation takes decisions / scores from the fused max-over-heads kernel.

Budget search (App. A.2): for each (m, d_model), head counts h against a geometric D_K ladder
(``bracket_budget``), D_K* = min{D_K : mean test F1 >= 0.99 for some h}, with the conservative
upper estimate (95% t-interval low end >= 0.99) and the optimistic lower one (high end >=
0.99); h* the head count attaining D_K* (ties: larger mean F1) with the paired-t-test interval.
Fits: D_K* ~ c m log2(m) / d_model through the origin, and h* ~ a m / d_model + b.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from ..progress import progress_bar
from .constructions import AGGREGATIONS, AttentionHeads, EdgeCounts, gaussian_unit_norm
from .graphs import RelationGraph, random_graph
from .scores import max_head_scores, softmax_head_scores

PASS_F1 = 0.99  # the seed's D_K* criterion on mean test micro-F1
CONFIDENCE = 0.95
DEFAULT_STEP_CUTOFF = 20_000
# Table 2: (m, d_model) -> training step cut-off; everything else gets DEFAULT_STEP_CUTOFF.
STEP_CUTOFFS = {(256, 16): 30_000, (512, 16): 80_000, (1024, 128): 80_000, (2048, 256): 80_000,
                (4096, 512): 200_000}
# The seed's reported constants, written beside ours in every experiment report.
SEED_FITS = {"key_budget_slope": 1.19, "key_budget_r2": 0.944, "heads_slope": 1.65, "heads_intercept": -6.64,
             "heads_r2": 0.824}
SEED_REGULAR_SLOPE = 0.46  # App. A.3, eq. (32): D_K* ~ 0.46 r m log2(m) / d_model over r in {1, 2, 4, 8, 16}
_INIT_SEED_OFFSET = 1_000_003  # parameter init uses its own stream, so data do not depend on D_K
_VALUE_SEED_OFFSET = 2_000_003  # the frozen value map W_V too, so edge-task data do not depend on it
OBJECTIVES = ("edges", "messages")
SOFTMAX_STEP_CUTOFF = 80_000  # Sec. 7.1: softmax runs may train up to 80,000 steps
_EVAL_ELEMENTS = 1 << 23  # floats held at once by an evaluation chunk


def step_cutoff(m: int, d_model: int) -> int:
    """Training step cut-off of Table 2 (20,000 unless the table says otherwise)."""
    return STEP_CUTOFFS.get((m, d_model), DEFAULT_STEP_CUTOFF)


@dataclass(frozen=True)
class TrainingConfig:
    """The seed's protocol (App. A.1). ``max_steps`` None means ``step_cutoff(m, d_model)``."""

    context_length: int = 16
    target_rate: float = 0.5
    lr: float = 1e-3
    weight_decay: float = 0.0
    sharpness: float = 10.0
    check_every: int = 500
    patience: int = 5
    stop_f1: float = 0.995
    val_contexts: int = 500
    test_contexts: int = 2000
    max_steps: Optional[int] = None
    threads: Optional[int] = 1  # torch CPU threads while training (tiny ops: 1 is fastest); None: leave as is
    degree: int = 1  # out-degree r: 1 = permutation graph (Sec. 6), r > 1 = r-regular graph (App. A.3)
    objective: str = "edges"  # "edges": thresholded edge classification; "messages": value channel (Sec. 7.2)
    message_dim: Optional[int] = None  # d_msg of the frozen random value map; None: d_model
    aggregation: str = "max"  # "max": max over heads (Sec. 3); "softmax-sum": summed scaled softmax (Sec. 7.1)

    def __post_init__(self) -> None:
        for name in ("context_length", "check_every", "patience", "val_contexts", "test_contexts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("max_steps", "threads", "message_dim"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int or None, got {v!r}")
        if self.context_length < 2:
            raise ValueError(f"context_length must be at least 2 (pairs need two items), got {self.context_length}")
        if not 0.0 <= self.target_rate <= 1.0:
            raise ValueError(f"target_rate must lie in [0, 1], got {self.target_rate}")
        for name in ("lr", "sharpness"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if isinstance(self.degree, bool) or not isinstance(self.degree, int) or self.degree < 1:
            raise ValueError(f"degree (out-degree r of the graph) must be a positive int, got {self.degree!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.aggregation == "softmax-sum" and self.objective != "edges":
            raise ValueError("aggregation='softmax-sum' is the seed's edge-classification variant (Sec. 7.1): "
                             "it needs objective='edges'")
        if self.objective == "messages" and self.degree != 1:
            raise ValueError("objective='messages' retrieves the one neighbour's message: it needs degree=1 "
                             "(a permutation graph, as in Sec. 7.2)")

    def steps_for(self, m: int, d_model: int) -> int:
        """``max_steps``, else Table 2's cut-off (max) or Sec. 7.1's 80,000 (softmax)."""
        if self.max_steps is not None:
            return self.max_steps
        return SOFTMAX_STEP_CUTOFF if self.aggregation == "softmax-sum" else step_cutoff(m, d_model)


# ----------------------------------------------------------------------------- data


def sample_contexts(neighbors: torch.Tensor, num: int, length: int, target_rate: float,
                    generator: torch.Generator) -> torch.Tensor:
    """Contexts with a target-in-context rate (App. A.1, A.3), (num, length) int64 distinct items.

    Per context: (1) ell distinct items uniformly; (2) b ~ Binomial(ell, rho) sources U (the
    first b positions, the order being uniform); (3) for each source i in U in turn, if no
    out-neighbour of i is present, one (pi(i), or a uniformly chosen one of r) replaces the
    item at a uniformly chosen other position.

    neighbors: the permutation pi (m,), or the out-neighbours (m, r) of an r-regular graph
    (``RelationGraph.out_neighbors``). With r = 1 both give the same contexts.
    """
    if not isinstance(neighbors, torch.Tensor) or neighbors.dim() not in (1, 2) or neighbors.dtype != torch.int64:
        raise TypeError("neighbors must be an int64 tensor: the permutation pi (m,) or out-neighbours (m, r)")
    table = neighbors[:, None] if neighbors.dim() == 1 else neighbors
    m, r = table.shape
    if not 2 <= length <= m:
        raise ValueError(f"context length must lie in [2, m={m}], got {length}")
    if not 0.0 <= target_rate <= 1.0:
        raise ValueError(f"target_rate must lie in [0, 1], got {target_rate}")
    contexts = torch.multinomial(torch.ones(num, m), length, replacement=False, generator=generator)
    num_sources = torch.binomial(torch.full((num,), float(length)), torch.full((num,), float(target_rate)),
                                 generator=generator).long()
    other = torch.randint(0, length - 1, (num, length), generator=generator)
    pick = torch.randint(0, r, (num, length), generator=generator) if r > 1 else None
    rows = torch.arange(num)
    for t in range(length):
        nbrs = table[contexts[:, t]]  # (num, r)
        target = nbrs[:, 0] if pick is None else nbrs[rows, pick[:, t]]
        present = (contexts[:, None, :] == nbrs[:, :, None]).any(dim=2).any(dim=1)
        place = (t < num_sources) & ~present
        slot = other[:, t] + (other[:, t] >= t).long()  # uniform over positions != t
        contexts[rows[place], slot[place]] = target[place]
    return contexts


def _labels(targets: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
    """Edge labels (..., ell, ell) of contexts (..., ell) whose items have out-neighbours (..., ell, r)."""
    return (targets[..., :, None, :] == contexts[..., None, :, None]).any(dim=-1)


@dataclass(eq=False)
class RunData:
    """What a run's seed fixes: the graph (permutation, or r-regular with ``config.degree`` r),
    embeddings X (m, d_model), validation and test contexts (N, ell), the generator that then
    draws the training contexts and, for the value channel, the messages Y = X W_V (m, d_msg).

    ``RunData.make(seed, m, d_model, config)`` rebuilds them exactly as ``train_runs`` does,
    e.g. to evaluate a run's ``heads`` with ``f1(heads, data.graph, data.embeddings, data.test)``.
    """

    graph: RelationGraph
    embeddings: torch.Tensor  # (m, d_model)
    val: torch.Tensor  # (N_val, ell)
    test: torch.Tensor  # (N_test, ell)
    stream: torch.Generator  # draws the training contexts
    messages: Optional[torch.Tensor] = None  # (m, d_msg), objective "messages" only

    @classmethod
    def make(cls, seed: int, m: int, d_model: int, config: TrainingConfig = TrainingConfig()) -> "RunData":
        gen = torch.Generator().manual_seed(seed)
        if config.degree == 1:
            graph = random_graph(m, "permutation", generator=gen)
        else:
            graph = random_graph(m, "r-regular", degree=config.degree, generator=gen)
        embeddings = gaussian_unit_norm(m, d_model, generator=gen)
        nbrs = graph.out_neighbors
        val = sample_contexts(nbrs, config.val_contexts, config.context_length, config.target_rate, gen)
        test = sample_contexts(nbrs, config.test_contexts, config.context_length, config.target_rate, gen)
        messages = None
        if config.objective == "messages":
            # W_V (d_model, d_msg) ~ N(0, 1/d_msg), frozen: E||x W_V||^2 = ||x||^2 = 1
            d_msg = config.message_dim or d_model
            w_v = torch.randn(d_model, d_msg, generator=torch.Generator().manual_seed(seed + _VALUE_SEED_OFFSET))
            messages = embeddings @ (w_v / math.sqrt(d_msg))
        return cls(graph, embeddings, val, test, gen, messages)


# ----------------------------------------------------------------------------- training


@dataclass
class RunResult:
    """One trained run. ``heads`` holds the learned W_Q, W_K (h, d_model, d_k) and tau.

    Objective "edges" reports micro-F1 (``test_f1``, ``val_f1``); "messages" reports the
    message-retrieval MSE (``test_mse``, ``val_mse``) and NaN F1s (tau is not trained there).
    """

    seed: int
    num_heads: int
    head_dim: int
    test_f1: float
    val_f1: float
    steps: int
    early_stopped: bool
    heads: AttentionHeads = field(repr=False)
    test_mse: Optional[float] = None
    val_mse: Optional[float] = None

    @property
    def key_budget(self) -> int:
        return self.num_heads * self.head_dim

    def to_dict(self) -> dict:
        return {"seed": self.seed, "num_heads": self.num_heads, "head_dim": self.head_dim,
                "key_budget": self.key_budget, "test_f1": self.test_f1, "val_f1": self.val_f1,
                "steps": self.steps, "early_stopped": self.early_stopped, "threshold": self.heads.threshold,
                "test_mse": self.test_mse, "val_mse": self.val_mse}


def _check_int_list(name: str, values: Sequence[int], low: int) -> list[int]:
    values = list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
        raise ValueError(f"{name} must be a non-empty list of ints >= {low}, got {values!r}")
    return values


def train_runs(m: int, d_model: int, num_heads: int, head_dims: Sequence[int], seeds: Sequence[int],
               config: TrainingConfig = TrainingConfig(), *, quiet: bool = False) -> list[RunResult]:
    """Train one run per (d_k, seed) with h = ``num_heads`` heads, as one batch (module docstring).

    Returns the runs in order [(d_k, seed) for d_k in head_dims for seed in seeds].
    """
    with _torch_threads(config.threads):
        return _train_runs(m, d_model, num_heads, head_dims, seeds, config, quiet)


@contextmanager
def _torch_threads(threads: Optional[int]) -> Iterator[None]:
    """Run with ``threads`` torch CPU threads, restoring the previous setting after."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _train_runs(m: int, d_model: int, num_heads: int, head_dims: Sequence[int], seeds: Sequence[int],
                config: TrainingConfig, quiet: bool) -> list[RunResult]:
    for name, v, low in (("m", m, 2), ("d_model", d_model, 1), ("num_heads", num_heads, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
    head_dims, seeds = _check_int_list("head_dims (d_k)", head_dims, 1), _check_int_list("seeds", seeds, 0)
    if config.context_length > m:
        raise ValueError(f"context_length {config.context_length} exceeds m = {m}")
    data = [RunData.make(s, m, d_model, config) for s in seeds]
    runs = [(d_k, i) for d_k in head_dims for i in range(len(seeds))]
    num_runs = len(runs)
    dims = [d_k for d_k, _ in runs]
    all_dims = torch.tensor(dims)  # true d_k per run (the softmax scale; parameters are zero-padded)
    all_seeds = torch.tensor([i for _, i in runs])

    # W_Q, W_K ~ N(0, 1/d_model) entries (std 1/sqrt(d_model)), tau = 0
    init = []
    for d_k, i in runs:
        gen = torch.Generator().manual_seed(seeds[i] + _INIT_SEED_OFFSET)
        init.append([torch.randn(num_heads, d_model, d_k, generator=gen) / math.sqrt(d_model) for _ in range(2)])
    params = [_padded([w[0] for w in init]).requires_grad_(), _padded([w[1] for w in init]).requires_grad_(),
              torch.zeros(num_runs, requires_grad=True)]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, fused=True)

    embeddings = torch.stack([d.embeddings for d in data])  # (S, m, d_model)
    neighbors = torch.stack([d.graph.out_neighbors for d in data])  # (S, m, r)
    messages = torch.stack([d.messages for d in data]) if config.objective == "messages" else None  # (S, m, d_msg)
    val = torch.stack([d.val for d in data])
    seed_rows = torch.arange(len(seeds))[None, :, None]
    max_steps = config.steps_for(m, d_model)
    active = list(range(num_runs))  # run ids of the rows of params
    streak = torch.zeros(num_runs, dtype=torch.long)  # consecutive checks above stop_f1 / without a better MSE
    best_mse = torch.full((num_runs,), math.inf)
    steps, val_metric, early = [max_steps] * num_runs, [0.0] * num_runs, [False] * num_runs
    final: list = [None] * num_runs  # (W_Q, W_K, tau) of each run once it stops

    bar = progress_bar(total=max_steps, desc=f"m={m} d={d_model} h={num_heads}", leave=False, enabled=not quiet)
    step = 0
    while step < max_steps and active:
        wq, wk, tau = params
        run_seed, run_dims = all_seeds[active], all_dims[active]
        block = min(config.check_every, max_steps - step)
        contexts = torch.stack([sample_contexts(d.graph.out_neighbors, block, config.context_length,
                                                config.target_rate, d.stream) for d in data], dim=1)  # (block, S, ell)
        xs = embeddings[seed_rows, contexts]  # (block, S, ell, d_model)
        ys = _labels(neighbors[seed_rows, contexts], contexts).float()  # (block, S, ell, ell)
        vs = None if messages is None else messages[seed_rows, contexts]  # (block, S, ell, d_msg)
        for t in range(block):
            x = xs[t][run_seed]  # (R, ell, d_model)
            scores = _head_scores(config.aggregation, _heads(x, wq), _heads(x, wk), run_dims)  # (R, ell, ell)
            loss = _loss(config, scores, tau, ys[t][run_seed], None if vs is None else vs[t][run_seed])
            optimizer.zero_grad(set_to_none=True)
            loss.sum().backward()
            optimizer.step()
        step += block
        bar.update(block)
        if block < config.check_every:
            break
        if messages is None:
            metric = torch.tensor([c.f1 for c in _evaluate(wq, wk, tau, embeddings, neighbors, run_seed, val,
                                                            config.aggregation, run_dims)])
            hit = metric > config.stop_f1
        else:
            metric = _evaluate_messages(wq, wk, embeddings, messages, neighbors, run_seed, val)
            hit = ~(metric < best_mse[active])  # no improvement on the best validation MSE so far
            best_mse[active] = torch.minimum(best_mse[active], metric)
        streak = torch.where(hit, streak + 1, torch.zeros_like(streak))
        for row, r in enumerate(active):
            val_metric[r] = float(metric[row])
        done = [row for row in range(len(active)) if streak[row] >= config.patience]
        for row in done:
            r = active[row]
            final[r] = _snapshot(params, row, dims[r])
            steps[r], early[r] = step, True
        if done:
            keep = [row for row in range(len(active)) if row not in done]
            active, streak = [active[row] for row in keep], streak[keep]
            if active:
                params, optimizer = _compact(optimizer, params, keep, max(dims[r] for r in active))
        bar.set_postfix(stopped=f"{num_runs - len(active)}/{num_runs}")
    bar.close()
    for row, r in enumerate(active):
        final[r] = _snapshot(params, row, dims[r])
        steps[r] = step

    wq, wk, tau = _padded([f[0] for f in final]), _padded([f[1] for f in final]), torch.stack([f[2] for f in final])
    test_contexts = torch.stack([d.test for d in data])
    details = {"m": m, "d_model": d_model, "degree": config.degree, "objective": config.objective}
    results = []
    for r, (d_k, i) in enumerate(runs):
        heads = AttentionHeads(final[r][0], final[r][1], float(final[r][2]), config.aggregation, "trained",
                               {"seed": seeds[i], **details})
        results.append(RunResult(seeds[i], num_heads, d_k, math.nan, math.nan, steps[r], early[r], heads))
    if messages is None:
        for run, counts, v in zip(results, _evaluate(wq, wk, tau, embeddings, neighbors, all_seeds, test_contexts,
                                                                   config.aggregation, all_dims),
                                  val_metric):
            run.test_f1, run.val_f1 = counts.f1, v
    else:
        test_mse = _evaluate_messages(wq, wk, embeddings, messages, neighbors, all_seeds, test_contexts)
        for run, mse, v in zip(results, test_mse.tolist(), val_metric):
            run.test_mse, run.val_mse = mse, v
    return results


def _head_scores(aggregation: str, queries: torch.Tensor, keys: torch.Tensor, head_dim: torch.Tensor
                 ) -> torch.Tensor:
    """Head-aggregated scores (R, ell, ell) of per-head projections (R, h, ell, width); head_dim (R,) true d_k."""
    if aggregation == "softmax-sum":
        return softmax_head_scores(queries, keys, head_dim=head_dim)
    return max_head_scores(queries, keys)


def _loss(config: TrainingConfig, scores: torch.Tensor, tau: torch.Tensor, labels: torch.Tensor,
          values: Optional[torch.Tensor]) -> torch.Tensor:
    """Per-run training loss (R,) of one context per run: scores (R, ell, ell), labels (R, ell, ell) float.

    Edges: logistic loss on alpha (S - tau), positives weighted ell - 1 (permutations, App. A.1)
    or #negatives / #positives of the context (r-regular, eq. 30). Messages (values (R, ell, d_msg)):
    eq. (4), the mean over valid rows of ||S V_C - y_pi(i)||^2.
    """
    if values is not None:
        error, valid = _message_errors(scores, labels, values)
        return (error * valid).sum(dim=1) / valid.sum(dim=1).clamp_min(1)
    logits = config.sharpness * (scores - tau[:, None, None])
    if config.degree == 1:
        pos_weight = torch.tensor(float(config.context_length - 1))
    else:
        positives = labels.sum(dim=(1, 2), keepdim=True)
        pos_weight = (labels[0].numel() - positives) / positives.clamp_min(1)
    loss = F.binary_cross_entropy_with_logits(logits, labels, pos_weight=pos_weight, reduction="none")
    return loss.mean(dim=(1, 2))


def _message_errors(scores: torch.Tensor, labels: torch.Tensor, values: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (3): y_hat = S V_C with the raw scores as weights, against the neighbour's message labels V_C.

    scores, labels (B, ell, ell), values V_C (B, ell, d_msg) -> squared errors (B, ell) and the
    valid rows (B, ell) float (the source's neighbour is in the context).
    """
    labels = labels.to(values.dtype)
    error = ((scores @ values - labels @ values) ** 2).sum(dim=-1)
    return error, (labels.sum(dim=-1) > 0).to(values.dtype)


def _padded(weights: list) -> torch.Tensor:
    """Stack per-run weights (h, d_model, d_k_r) into (R, h, d_model, max d_k), zero-padded."""
    width = max(w.shape[-1] for w in weights)
    return torch.stack([F.pad(w, (0, width - w.shape[-1])) for w in weights])


def _snapshot(params: list, row: int, head_dim: int) -> tuple:
    """Detached copy of one run's (W_Q (h, d_model, d_k), W_K, tau) from the batched parameters."""
    wq, wk, tau = params
    return wq[row, ..., :head_dim].detach().clone(), wk[row, ..., :head_dim].detach().clone(), tau[row].detach().clone()


def _compact(optimizer: torch.optim.Optimizer, params: list, keep: list, width: int):
    """Keep rows ``keep`` (and the first ``width`` head columns) of every parameter and its AdamW state.

    AdamW is elementwise, so the kept runs continue exactly as before.
    """
    def cut(t: torch.Tensor) -> torch.Tensor:
        t = t[keep]
        return t[..., :width].contiguous() if t.dim() > 1 else t

    new_params = [cut(p.detach()).requires_grad_() for p in params]
    new_optimizer = torch.optim.AdamW(new_params, **{k: optimizer.defaults[k] for k in ("lr", "weight_decay", "fused")})
    for old, new in zip(params, new_params):
        new_optimizer.state[new] = {k: v.clone() if k == "step" else cut(v) for k, v in optimizer.state[old].items()}
    return new_params, new_optimizer


def _heads(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-head projections: x (R, ell, d_model), w (R, h, d_model, width) -> (R, h, ell, width)."""
    return torch.matmul(x[:, None], w)


def _context_projections(queries: torch.Tensor, keys: torch.Tensor, ctx: torch.Tensor
                         ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Chunks of contexts ctx (R, N, ell) with their per-head projections gathered from all items.

    queries, keys (R, h, m, width) -> yields (c (R, n, ell), q, k (R * n, h, ell, width)).
    """
    num_runs, h, _, width = queries.shape
    ell = ctx.shape[2]
    runs = torch.arange(num_runs)[:, None, None]
    chunk = max(1, _EVAL_ELEMENTS // (num_runs * h * ell * (2 * width + ell)))
    for start in range(0, ctx.shape[1], chunk):
        c = ctx[:, start:start + chunk]
        q = queries[runs, :, c].permute(0, 1, 3, 2, 4).reshape(-1, h, ell, width)
        k = keys[runs, :, c].permute(0, 1, 3, 2, 4).reshape(-1, h, ell, width)
        yield c, q, k


@torch.no_grad()
def _evaluate(wq: torch.Tensor, wk: torch.Tensor, tau: torch.Tensor, embeddings: torch.Tensor,
              neighbors: torch.Tensor, run_seed: torch.Tensor, contexts: torch.Tensor,
              aggregation: str = "max", head_dim: Optional[torch.Tensor] = None) -> list[EdgeCounts]:
    """Edge counts per run over all ordered pairs of its seed's contexts (S, N, ell).

    Queries and keys of all m items are projected once. Max-over-heads scores of a pair do
    not depend on the rest of the context, so when m^2 <= N ell^2 the full (m, m) decision
    matrix is computed once and gathered; otherwise (and always for softmax, which normalises
    over the context) each context is scored on its own. Max decisions come from the fused
    kernel when one is built (``factkernels._ops``). head_dim (R,): true d_k (softmax only).
    """
    num_runs, m = wq.shape[0], embeddings.shape[1]
    queries, keys = _heads(embeddings[run_seed], wq), _heads(embeddings[run_seed], wk)  # (R, h, m, width)
    ctx = contexts[run_seed]  # (R, N, ell)
    n_total, ell = ctx.shape[1:]
    runs = torch.arange(num_runs)[:, None, None]
    truth = _labels(neighbors[run_seed][runs, ctx], ctx)  # (R, N, ell, ell)
    if aggregation == "max" and m * m <= n_total * ell * ell:
        decision_all = max_head_scores(queries, keys, tau, decision_only=True)  # (R, m, m)
        decision = decision_all[runs[..., None], ctx[..., None], ctx[:, :, None, :]]  # (R, N, ell, ell)
    else:
        chunks = []
        for c, q, k in _context_projections(queries, keys, ctx):
            taus = tau.repeat_interleave(c.shape[1])
            if aggregation == "softmax-sum":
                d = softmax_head_scores(q, k, taus, head_dim=head_dim.repeat_interleave(c.shape[1]))[1]
            else:
                d = max_head_scores(q, k, taus, decision_only=True)
            chunks.append(d.view(num_runs, c.shape[1], ell, ell))
        decision = torch.cat(chunks, dim=1)
    tp, fp, fn = ((a & b).sum(dim=(1, 2, 3)).tolist() for a, b in ((decision, truth), (decision, ~truth),
                                                                       (~decision, truth)))
    return [EdgeCounts(*counts, decision[0].numel()) for counts in zip(tp, fp, fn)]


@torch.no_grad()
def _evaluate_messages(wq: torch.Tensor, wk: torch.Tensor, embeddings: torch.Tensor, messages: torch.Tensor,
                       neighbors: torch.Tensor, run_seed: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
    """Message-retrieval MSE per run (R,): eq. (4) over all valid positions of its seed's contexts (S, N, ell)."""
    num_runs = wq.shape[0]
    queries, keys = _heads(embeddings[run_seed], wq), _heads(embeddings[run_seed], wk)
    ctx = contexts[run_seed]
    runs = torch.arange(num_runs)[:, None, None]
    total, count = torch.zeros(num_runs), torch.zeros(num_runs)
    for c, q, k in _context_projections(queries, keys, ctx):
        labels = _labels(neighbors[run_seed][runs, c], c).flatten(0, 1)  # (R * n, ell, ell)
        error, valid = _message_errors(max_head_scores(q, k), labels, messages[run_seed][runs, c].flatten(0, 1))
        total += (error * valid).view(num_runs, -1).sum(dim=1)
        count += valid.view(num_runs, -1).sum(dim=1)
    return total / count.clamp_min(1)


# ----------------------------------------------------------------------------- budget search


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): mean +- t_{(1+c)/2, n-1} s / sqrt(n). With one value, low = high = mean."""
    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if v.size < 2:
        return mean, mean, mean
    half = float(stats.t.ppf((1 + confidence) / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return mean, mean - half, mean + half


@dataclass
class ConfigResult:
    """All seeds of one (h, d_k) configuration."""

    num_heads: int
    head_dim: int
    test_f1: list  # per seed, in seed order
    seeds: list
    steps: list

    @property
    def key_budget(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def interval(self) -> tuple[float, float, float]:
        return t_interval(self.test_f1)

    def to_dict(self) -> dict:
        mean, low, high = self.interval
        return {"num_heads": self.num_heads, "head_dim": self.head_dim, "key_budget": self.key_budget,
                "seeds": self.seeds, "test_f1": self.test_f1, "steps": self.steps,
                "mean_f1": mean, "ci_low": low, "ci_high": high}


@dataclass
class BudgetPoint:
    """D_K* for one (m, d_model): central, conservative upper and optimistic lower estimates."""

    m: int
    d_model: int
    configs: list  # ConfigResult
    key_budget: Optional[int]  # central: min D_K with mean F1 >= 0.99
    key_budget_upper: Optional[int]  # min D_K with CI low >= 0.99
    key_budget_lower: Optional[int]  # min D_K with CI high >= 0.99
    best_heads: Optional[int]  # h* attaining the central D_K*
    heads_range: Optional[tuple]  # (min, max) head counts not significantly worse (App. A.2)

    @property
    def scaling_x(self) -> float:
        """m log2(m) / d_model, the abscissa of the capacity law."""
        return self.m * math.log2(self.m) / self.d_model

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "configs"}
        d["configs"] = [c.to_dict() for c in self.configs]
        d["scaling_x"] = self.scaling_x
        d["compression"] = self.m / self.d_model
        return d


def _min_budget(configs: list, which: int) -> Optional[ConfigResult]:
    """Config with the smallest D_K whose interval[which] >= PASS_F1; ties: larger mean F1."""
    passing = [c for c in configs if c.interval[which] >= PASS_F1]
    return min(passing, key=lambda c: (c.key_budget, -c.interval[0])) if passing else None


def summarize_budget(m: int, d_model: int, configs: Sequence[ConfigResult]) -> BudgetPoint:
    """D_K* (central / upper / lower), h* and its interval from trained configurations (App. A.2).

    h* interval: h* and every head count with a tested D_K within 10% of D_K* whose per-seed
    F1 there (its best such configuration) is not significantly different from h*'s (paired
    two-sided t-test, p > 0.05; identical F1s count as not different).
    """
    configs = list(configs)
    central, upper, lower = (_min_budget(configs, w) for w in (0, 1, 2))
    heads_range = None
    if central is not None:
        kept = [central.num_heads]
        for h in {c.num_heads for c in configs} - {central.num_heads}:
            near = [c for c in configs if c.num_heads == h and c.seeds == central.seeds
                    and abs(c.key_budget - central.key_budget) <= 0.1 * central.key_budget]
            if near and _paired_p_value(max(near, key=lambda c: c.interval[0]).test_f1, central.test_f1) > 0.05:
                kept.append(h)
        heads_range = (min(kept), max(kept))
    return BudgetPoint(m, d_model, configs, central and central.key_budget, upper and upper.key_budget,
                       lower and lower.key_budget, central and central.num_heads, heads_range)


def _paired_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided paired t-test p-value; a constant difference gives 1 (if zero) or 0."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if np.all(diff == diff[0]):
        return 1.0 if diff[0] == 0 else 0.0
    return float(stats.ttest_rel(a, b).pvalue)


def seed_law(m: int, d_model: int) -> float:
    """The seed's fitted capacity law D_K* ~ 1.19 m log2(m) / d_model."""
    return SEED_FITS["key_budget_slope"] * m * math.log2(m) / d_model


LADDER_RATIO = 1.25
LADDER_RUNGS = (-7, 5)  # rung k: D_K ~ centre * 1.25^k for k in [-7, 5), i.e. 0.21x to 2.4x the centre


def rung_head_dim(centre: float, num_heads: int, rung: int) -> int:
    """d_k of ladder rung ``rung`` with h heads: round(centre * 1.25^rung / h), at least 1."""
    return max(1, round(centre * LADDER_RATIO ** rung / num_heads))


def bracket_budget(head_counts: Sequence[int], evaluate: Callable[[int, int], ConfigResult], centre: float,
                   compression: float, *, start_rung: int = -1, known_upper: Optional[int] = None
                   ) -> list[ConfigResult]:
    """The configurations that decide the App. A.2 estimates, found on the ladder around ``centre``.

    ``evaluate(h, d_k)`` trains (or looks up) one configuration over its seeds. Head counts run
    nearest to ``compression`` (r m / d_model, the construction's head count) first. Per h, from
    ``start_rung`` (lowered below 1.1x the best conservative D_K so far): down while the F1
    interval's high end still reaches 0.99, then up while its low end does not. No D_K above
    1.1x the best conservative D_K is tried: such a configuration cannot be any estimate nor in
    the h* test's 10% pool. Assumes F1 grows with D_K at fixed h, as the seed's definition does.
    ``known_upper``: a conservative D_K* found earlier (by other head counts).
    """
    head_counts = _check_int_list("head_counts", head_counts, 1)
    order = sorted(head_counts, key=lambda h: (abs(math.log2(h) - math.log2(compression)), -h))
    low_rung, high_rung = LADDER_RUNGS
    best_upper = math.inf if known_upper is None else known_upper
    done: list[ConfigResult] = []

    def budget(h: int, rung: int) -> int:
        return h * rung_head_dim(centre, h, rung)

    def bounds(h: int, rung: int) -> tuple[float, float]:
        nonlocal best_upper
        config = evaluate(h, rung_head_dim(centre, h, rung))
        done.append(config)
        _, low, high = config.interval
        if low >= PASS_F1:
            best_upper = min(best_upper, config.key_budget)
        return low, high

    for h in order:
        start = start_rung
        while start > low_rung and budget(h, start) > 1.1 * best_upper:
            start -= 1
        if budget(h, start) > 1.1 * best_upper:
            continue
        first_low, high = bounds(h, start)
        rung = start
        while high >= PASS_F1 and rung - 1 >= low_rung and budget(h, rung - 1) < budget(h, rung):
            rung -= 1
            _, high = bounds(h, rung)
        rung, low = start, first_low
        while low < PASS_F1 and rung + 1 < high_rung and budget(h, rung + 1) <= 1.1 * best_upper:
            rung += 1
            if budget(h, rung) > budget(h, rung - 1):
                low, _ = bounds(h, rung)
    return done


def search_budget(m: int, d_model: int, head_counts: Sequence[int], seeds: Sequence[int],
                  config: TrainingConfig = TrainingConfig(), *, known_upper: Optional[int] = None,
                  quiet: bool = False) -> BudgetPoint:
    """D_K* estimates and h* of one (m, d_model) (App. A.2) by ``bracket_budget`` around the seed's law
    (times r for an r-regular graph), each configuration trained for all seeds as one batch."""
    def evaluate(h: int, d_k: int) -> ConfigResult:
        runs = train_runs(m, d_model, h, [d_k], seeds, config, quiet=quiet)
        return ConfigResult(h, d_k, [r.test_f1 for r in runs], [r.seed for r in runs], [r.steps for r in runs])

    configs = bracket_budget(head_counts, evaluate, config.degree * seed_law(m, d_model),
                             config.degree * m / d_model, known_upper=known_upper)
    return summarize_budget(m, d_model, configs)


@dataclass(frozen=True)
class LinearFit:
    """y ~ slope x + intercept with its coefficient of determination."""

    slope: float
    intercept: float
    r2: float
    points: int


def fit_key_budget(points: Sequence[BudgetPoint]) -> Optional[LinearFit]:
    """D_K* ~ c m log2(m) / d_model, least squares through the origin.

    R^2 = 1 - SS_res / sum(y^2), the uncentred form for a fit without intercept; with log
    base 2 this is the convention that reproduces the seed's 1.19 and R^2 = 0.944 from its
    own Fig. 8 thresholds. Points without a D_K* are left out; None if none remain.
    """
    return fit_through_origin([p.scaling_x for p in points], [p.key_budget for p in points])


def fit_through_origin(x: Sequence[float], y: Sequence[Optional[float]]) -> Optional[LinearFit]:
    """y ~ c x by least squares with the uncentred R^2; pairs with y None are left out (None if all are)."""
    pts = [(a, b) for a, b in zip(x, y) if b is not None]
    if not pts:
        return None
    xs, ys = np.asarray(pts, dtype=float).T
    c = float(xs @ ys / (xs @ xs))
    res = ys - c * xs
    return LinearFit(c, 0.0, float(1 - res @ res / (ys @ ys)), len(pts))


def fit_head_count(points: Sequence[BudgetPoint]) -> Optional[LinearFit]:
    """h* ~ a m / d_model + b, ordinary least squares; R^2 centred. None with fewer than 2 points."""
    pts = [(p.m / p.d_model, p.best_heads) for p in points if p.best_heads is not None]
    if len({x for x, _ in pts}) < 2:
        return None
    x, y = np.asarray(pts, dtype=float).T
    a, b = np.polyfit(x, y, 1)
    res = y - (a * x + b)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return LinearFit(float(a), float(b), float(1 - res @ res / ss_tot) if ss_tot > 0 else 1.0, len(pts))


# ----------------------------------------------------------------------------- lower bound


def lower_bound(m: int, m_edges: int, d_model: int, bits: float = 32.0) -> float:
    """Bit-budget lower bound on D_K (Sec. 9): 2^{b (2 d_model D_K + 1)} >= C(m(m-1), m').

    D_K >= (log2 C(m(m-1), m') / b - 1) / (2 d_model), for parameters of b effective bits
    (default 32, float32). Asymptotically Omega(m'/d_model log(m^2/m')). Returns the real
    bound (round up for an integer D_K); it can be <= 0 when the graph family is tiny.
    """
    for name, v, low in (("m", m, 2), ("m_edges", m_edges, 0), ("d_model", d_model, 1)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if v < low:
            raise ValueError(f"{name} must be at least {low}, got {v}")
    pairs = m * (m - 1)
    if m_edges > pairs:
        raise ValueError(f"m_edges must be at most m(m-1) = {pairs} ordered loop-free pairs, got {m_edges}")
    if not bits > 0:
        raise ValueError(f"bits must be positive, got {bits}")
    log2_binom = (math.lgamma(pairs + 1) - math.lgamma(m_edges + 1) - math.lgamma(pairs - m_edges + 1)) / math.log(2)
    return (log2_binom / bits - 1) / (2 * d_model)
