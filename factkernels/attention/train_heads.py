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

The D_K* search is :mod:`factkernels.attention.key_budget`; fits and the lower bound are
:mod:`factkernels.attention.budget_fits`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import torch
import torch.nn.functional as F

from ..progress import progress_bar
from .constructions import AGGREGATIONS, AttentionHeads, EdgeCounts, gaussian_unit_norm
from .graphs import RelationGraph, random_graph
from .scores import max_head_scores, softmax_head_scores

DEFAULT_STEP_CUTOFF = 20_000
# Table 2: (m, d_model) -> training step cut-off; everything else gets DEFAULT_STEP_CUTOFF.
STEP_CUTOFFS = {(256, 16): 30_000, (512, 16): 80_000, (1024, 128): 80_000, (2048, 256): 80_000,
                (4096, 512): 200_000}
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


def check_int_list(name: str, values: Sequence[int], low: int) -> list[int]:
    values = list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
        raise ValueError(f"{name} must be a non-empty list of ints >= {low}, got {values!r}")
    return values


def train_runs(m: int, d_model: int, num_heads: int, head_dims: Sequence[int], seeds: Sequence[int],
               config: TrainingConfig = TrainingConfig(), *, quiet: bool = False) -> list[RunResult]:
    """Train one run per (d_k, seed) with h = ``num_heads`` heads, as one batch (module docstring).

    Returns the runs in order [(d_k, seed) for d_k in head_dims for seed in seeds].
    """
    with torch_threads(config.threads):
        return _train_runs(m, d_model, num_heads, head_dims, seeds, config, quiet)


@contextmanager
def torch_threads(threads: Optional[int]) -> Iterator[None]:
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
    head_dims, seeds = check_int_list("head_dims (d_k)", head_dims, 1), check_int_list("seeds", seeds, 0)
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
