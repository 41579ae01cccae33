"""Explicit QK constructions for relational graph recognition (seed 002, Sec. 4, 8, App. B).

Every construction is the same template: cut E into matchings ("blocks", one per
head), give every target j a random signature w_j (a row of W_sig, (m, d_k)), and set,
for head k with block {(s, pi_k(s))},

    W_Q^(k) = X_inv[:, sources] @ W_sig[targets]      W_K^(k) = X_inv[:, targets] @ W_sig[targets]

so q_i . k_j ~ w_pi(i) . w_j: d_k-ish on an edge, O(sqrt(d_k log m)) elsewhere.

  method         seed part            embeddings X        X_inv     blocks (one per head)      signatures
  "one-hot"      Constr. I, App. B.1  identity (m x m)    I         Delta colour classes       Rademacher (Bernoulli p=1/4)
  "compressive"  Constr. II, Alg. 1   Gaussian unit-norm  X^T       h = ceil(m/d_model)        Rademacher
  "generalized"  Constr. III, Alg. 4  any                 X^T / mu  h = ceil(m/B), B = d/ln m  Bernoulli p=1/20 (Rademacher)
  "general"      Constr. IV, Alg. 5   Gaussian unit-norm  X^T       König + Lemma B.8          Rademacher
  "softmax"      Sec. 8, Alg. 2       Gaussian unit-norm  X^T       as "compressive"           Rademacher

The softmax variant sums per-head softmaxes over the context (logits / sqrt(d_k)); the
others take the max over heads.

Thresholds are the seed's: tau = d_k/2 (Rademacher), tau = (p + p^2)/2 d_k (Bernoulli(p)),
tau = 1/2 (softmax). Budgets: the seed proves d_k = C log m with C "sufficiently large";
it makes C explicit only for Theorem B.1. Defaults here (``default_head_dim``):

    d_k = ceil(C_sig (1 + B/d_model)^2 ln m)      [one-hot: (1 + 0)^2]
    C_sig = 40                         Rademacher: Hoeffding P(w.w' >= d_k/2) <= exp(-d_k/8),
                                       union over m^2 pairs at failure m^-3 (as Thm B.1 does)
    C_sig = max(3/c1, 2/c2)            Bernoulli(p): Theorem B.1, c1 = p(1-p)^2/8, c2 = p(1-p)^2/(2(1+3p))
    (1 + B/d_model)^2                  variance proxy of Signal + N1 + N2 + N3 in the proof of
                                       Thm 4.1 (leakage mass B/d_model per block, Lemma B.3);
                                       it gives eq. (2)'s d_k ~ (B/d_model)^2 log m for large B
    softmax: d_k = ceil(4 ln(7m)^2)    Theorem 8.1's Theta(log^2 m) with Lemma 8.2's constant: a logit gap
                                       sqrt(d_k)/2 gives owner mass >= 7/8 against ell - 1 < m distractors.
                                       Not more: leakage puts d_k <x_i, x_s> into non-owner scores, i.e.
                                       sqrt(d_k) <x_i, x_s> into their logits, and a wider head lets a
                                       non-owner softmax concentrate on a distractor (seen at m = 1024).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from .graphs import RelationGraph, _generator, check_graph, pack_matchings
from .scores import max_head_scores, softmax_head_scores

METHODS = ("one-hot", "compressive", "generalized", "general", "softmax")
SIGNATURES = ("rademacher", "bernoulli")
AGGREGATIONS = ("max", "softmax-sum")
RADEMACHER_LOG_FACTOR = 40.0
ONE_HOT_SPARSITY = 0.25  # Algorithm 3's example p
GENERALIZED_SPARSITY = 0.05  # Algorithm 4: p <= 1/20
EVAL_CHUNK_ELEMENTS = 1 << 24  # scores held at once when evaluating (batch * h * ell_q * ell_k)


# ----------------------------------------------------------------------------- the heads


@dataclass(frozen=True, eq=False)
class AttentionHeads:
    """h QK heads with a global threshold: the parameters an RGR construction or training yields.

    Attributes:
        query_weights: W_Q (h, d_model, d_k).
        key_weights:   W_K (h, d_model, d_k).
        threshold:     tau; edge (p, q) iff the aggregated score exceeds it.
        aggregation:   "max" (max over heads, Sec. 3) or "softmax-sum" (Sec. 8).
        method:        which construction made them ("trained" for learned heads).
        details:       construction settings (signature, block size, seed, ...).
    """

    query_weights: torch.Tensor
    key_weights: torch.Tensor
    threshold: float
    aggregation: str = "max"
    method: str = "custom"
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        wq, wk = self.query_weights, self.key_weights
        for name, w in (("query_weights", wq), ("key_weights", wk)):
            if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point or w.dim() != 3:
                raise ValueError(f"{name} must be a floating tensor of shape (h, d_model, d_k)")
        if wq.shape != wk.shape or min(wq.shape) < 1:
            raise ValueError(f"query_weights {tuple(wq.shape)} and key_weights {tuple(wk.shape)} must have the "
                             "same non-empty shape (h, d_model, d_k)")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be finite, got {self.threshold}")

    @property
    def num_heads(self) -> int:
        """h."""
        return int(self.query_weights.shape[0])

    @property
    def model_dim(self) -> int:
        """d_model."""
        return int(self.query_weights.shape[1])

    @property
    def head_dim(self) -> int:
        """d_k."""
        return int(self.query_weights.shape[2])

    @property
    def key_budget(self) -> int:
        """The total key dimension D_K = h * d_k."""
        return self.num_heads * self.head_dim

    def project(self, x: torch.Tensor, which: str) -> torch.Tensor:
        """Per-head queries or keys of embeddings x (batch, ell, d_model) -> (batch, h, ell, d_k)."""
        if which not in ("queries", "keys"):
            raise ValueError(f"which must be 'queries' or 'keys', got {which!r}")
        w = self.query_weights if which == "queries" else self.key_weights
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.model_dim:
            raise ValueError(f"embeddings must have shape (batch, ell, d_model={self.model_dim}), "
                             f"got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        return torch.einsum("bld,hdk->bhlk", x.to(w.dtype), w)

    def aggregate(self, queries: torch.Tensor, keys: torch.Tensor, decide: bool = False, *, backend: str = "auto"):
        """Aggregated scores (batch, ell_q, ell_k) of projected Q, K; with ``decide``, (scores, scores > tau).

        ``backend`` picks the fused max-over-heads kernel or its torch twin (``factkernels._ops``).
        """
        tau = self.threshold if decide else None
        if self.aggregation == "max":
            return max_head_scores(queries, keys, tau, backend=backend)
        return softmax_head_scores(queries, keys, tau)

    def decisions(self, queries: torch.Tensor, keys: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
        """Edge decisions (batch, ell_q, ell_k) bool of projected Q, K; the max kernel then writes no scores."""
        if self.aggregation == "max":
            return max_head_scores(queries, keys, self.threshold, decision_only=True, backend=backend)
        return softmax_head_scores(queries, keys, self.threshold)[1]

    def scores(self, x: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
        """Aggregated scores of contexts x (batch, ell, d_model) -> (batch, ell, ell), sources x targets."""
        return self.aggregate(self.project(x, "queries"), self.project(x, "keys"), backend=backend)

    def decide(self, x: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
        """Edge decisions (batch, ell, ell) bool for contexts x (batch, ell, d_model)."""
        return self.decisions(self.project(x, "queries"), self.project(x, "keys"), backend=backend)

    def __repr__(self) -> str:
        return (f"AttentionHeads(method={self.method!r}, h={self.num_heads}, d_k={self.head_dim}, "
                f"D_K={self.key_budget}, d_model={self.model_dim}, tau={self.threshold:.4g}, "
                f"aggregation={self.aggregation!r})")


# ----------------------------------------------------------------------------- embeddings


def gaussian_unit_norm(m: int, d_model: int, *, seed: Optional[int] = 0,
                       generator: Optional[torch.Generator] = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Gaussian unit-norm embeddings X (m, d_model): rows x~ ~ N(0, I/d_model), then x = x~/||x~||."""
    _check_sizes(m, d_model)
    x = torch.randn(m, d_model, generator=_generator(seed, generator), dtype=torch.float64) / math.sqrt(d_model)
    return (x / x.norm(dim=1, keepdim=True)).to(dtype)


def _check_sizes(m: int, d_model: int) -> None:
    for name, v, low in (("m", m, 2), ("d_model", d_model, 1)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if v < low:
            raise ValueError(f"{name} must be at least {low}, got {v}")


# ----------------------------------------------------------------------------- budgets


def signature_log_factor(signature: str, sparsity: float) -> float:
    """C_sig with d_k = C_sig ln m separating every signature pair w.h.p. (failure <= m^-3)."""
    if signature == "rademacher":
        return RADEMACHER_LOG_FACTOR
    c1 = sparsity * (1 - sparsity) ** 2 / 8
    c2 = sparsity * (1 - sparsity) ** 2 / (2 * (1 + 3 * sparsity))
    return max(3 / c1, 2 / c2)


def default_head_dim(m: int, *, signature: str = "rademacher", sparsity: float = ONE_HOT_SPARSITY,
                     leakage: float = 0.0, softmax: bool = False) -> int:
    """The per-head key width the seed's theorems call for, with their constants made explicit.

    d_k = ceil(C_sig (1 + leakage)^2 ln m), leakage = B / d_model (0 for one-hot inputs);
    for the softmax variant ceil(4 ln(7m)^2). See the module docstring.
    """
    if softmax:
        return math.ceil(4 * math.log(7 * m) ** 2)
    return math.ceil(signature_log_factor(signature, sparsity) * (1 + leakage) ** 2 * math.log(m))


def default_block_size(method: str, m: int, d_model: int) -> int:
    """Edges per head: d_model (m for one-hot), or floor(d_model / ln m) for "generalized".

    Theorem B.5 needs leakage rho <~ 1/log m at block size B; for Gaussian unit-norm and
    random binary embeddings (Corollaries B.6, B.7) rho ~ B/d_model, so B = d_model/ln m.
    """
    if method == "generalized":
        return max(1, int(d_model / math.log(m)))
    return d_model


def threshold_for(signature: str, sparsity: float, d_k: int) -> float:
    """tau = d_k / 2 (Rademacher) or (p + p^2)/2 d_k (Bernoulli(p)), Thm 4.1 / Thm B.1."""
    return d_k / 2 if signature == "rademacher" else (sparsity + sparsity ** 2) / 2 * d_k


# ----------------------------------------------------------------------------- construct


def _check_embeddings(x: torch.Tensor, m: int, method: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"X must be a torch.Tensor of shape (m, d_model), got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"X must be float32 or float64, got {x.dtype}")
    if x.dim() != 2 or x.shape[0] != m or x.shape[1] < 1:
        raise ValueError(f"X must have shape (m={m}, d_model), one row per item, got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("X contains NaN or Inf")
    zero = torch.nonzero(x.abs().sum(dim=1) == 0).flatten()
    if zero.numel():
        raise ValueError(f"row {int(zero[0])} of X is zero; every item needs a nonzero embedding for method={method!r}")
    return x


def _check_positive_int(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{name} must be at least 1, got {v}")


def construct(graph: RelationGraph, X: Optional[torch.Tensor] = None, *, method: str = "compressive",
              d_k: Optional[int] = None, h: Optional[int] = None, block_size: Optional[int] = None,
              signature: Optional[str] = None, sparsity: Optional[float] = None, seed: Optional[int] = 0,
              generator: Optional[torch.Generator] = None) -> AttentionHeads:
    """Build QK heads that recognise ``graph`` (see the module docstring for the methods).

    Args:
        graph: the relational graph. "compressive", "generalized" and "softmax" need a
            permutation graph (as in the seed); "one-hot" and "general" take any graph.
        X: item embeddings (m, d_model). Must be None or the identity for "one-hot"
            (d_model = m); required otherwise (``gaussian_unit_norm`` for the seed's setting,
            any nonzero rows for "generalized").
        d_k: per-head width; default ``default_head_dim`` for the method and block size.
        h: number of heads; default: Delta (one-hot), ceil(m / B) (compressive, softmax,
            generalized), at most ceil(m'/d_model) + Delta (general, Lemma B.8). With h given,
            exactly h blocks of near-equal size are used (h must lie in [Delta, m']).
        block_size: B, edges per head (instead of h); default d_model (m for one-hot;
            floor(d_model / ln m) for "generalized", the block size of Corollaries B.6/B.7).
        signature: "rademacher" or "bernoulli"; default Bernoulli for "generalized" (Alg. 4),
            Rademacher otherwise.
        sparsity: p of Bernoulli signatures; default 1/4 (one-hot, Alg. 3) or 1/20 (Alg. 4).
        seed / generator: the signature draw; same seed, same heads.

    Returns:
        AttentionHeads with W_Q, W_K (h, d_model, d_k), the seed's threshold and aggregation;
        ``key_budget`` is D_K = h d_k and ``details`` records every setting used.
    """
    check_graph(graph)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method in ("compressive", "generalized", "softmax") and not graph.is_permutation:
        raise ValueError(f"method={method!r} needs a permutation graph; use method='general' for other graphs")
    if graph.num_edges == 0:
        raise ValueError("graph has no edges; there is nothing to recognise")
    m = graph.num_items
    deembed, d_model, like = _deembedding(method, X, m)
    signature = signature or ("bernoulli" if method == "generalized" else "rademacher")
    if signature not in SIGNATURES:
        raise ValueError(f"signature must be one of {SIGNATURES}, got {signature!r}")
    if method == "softmax" and signature != "rademacher":
        raise ValueError("method='softmax' uses Rademacher signatures (Alg. 2)")
    p = sparsity if sparsity is not None else (ONE_HOT_SPARSITY if method == "one-hot" else GENERALIZED_SPARSITY)
    if signature == "bernoulli" and not (isinstance(p, (int, float)) and 0.0 < p < 0.5):
        raise ValueError(f"sparsity must lie in (0, 1/2) for Bernoulli signatures, got {p!r}")

    if h is not None and block_size is not None:
        raise ValueError("give h or block_size, not both")
    if h is not None:
        _check_positive_int("h", h)
        blocks = pack_matchings(graph, num_blocks=h)
    else:
        if block_size is not None:
            _check_positive_int("block_size", block_size)
        blocks = pack_matchings(graph, block_size=block_size or default_block_size(method, m, d_model))
    largest_block = max(int(b.shape[0]) for b in blocks)
    leakage = 0.0 if method == "one-hot" else largest_block / d_model
    if d_k is None:
        d_k = default_head_dim(m, signature=signature, sparsity=p, leakage=leakage, softmax=method == "softmax")
    _check_positive_int("d_k", d_k)

    gen = _generator(seed, generator)
    if signature == "rademacher":
        sig = torch.randint(0, 2, (m, d_k), generator=gen) * 2 - 1
    else:
        sig = torch.rand(m, d_k, generator=gen) < p
    wq, wk = _realize(blocks, sig.to(dtype=like.dtype, device=like.device), deembed, d_model)
    threshold = 0.5 if method == "softmax" else threshold_for(signature, p, d_k)
    details = {"signature": signature, "sparsity": p if signature == "bernoulli" else None,
               "block_size": largest_block, "leakage": leakage, "seed": seed if generator is None else None,
               "num_items": m, "num_edges": graph.num_edges, "max_degree": graph.max_degree}
    return AttentionHeads(wq, wk, float(threshold), "softmax-sum" if method == "softmax" else "max", method, details)


def _deembedding(method: str, X: Optional[torch.Tensor], m: int) -> tuple[Optional[torch.Tensor], int, torch.Tensor]:
    """(X_inv (d_model, m) or None for the identity, d_model, a tensor with the weights' dtype and device).

    One-hot: the identity (X must be None or I); "generalized": X^T / mu with mu the mean
    squared row norm (Def. B.4); otherwise X^T (Alg. 1).
    """
    if method == "one-hot":
        if X is not None and not (isinstance(X, torch.Tensor) and X.shape == (m, m)
                                  and torch.equal(X, torch.eye(m, dtype=X.dtype, device=X.device))):
            raise ValueError("method='one-hot' needs X = None or the (m, m) identity; "
                             "use method='generalized' for other embeddings")
        return None, m, X if X is not None else torch.empty(0)
    if X is None:
        raise ValueError(f"method={method!r} needs item embeddings X (m, d_model), e.g. gaussian_unit_norm(m, d_model)")
    X = _check_embeddings(X, m, method)
    scale = float((X.double() ** 2).sum(dim=1).mean()) if method == "generalized" else 1.0
    return X.t() / scale, X.shape[1], X


def _realize(blocks: list, signatures: torch.Tensor, deembed: Optional[torch.Tensor], d_model: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q^(k) = X_inv[:, sources] @ W_sig[targets], W_K^(k) = X_inv[:, targets] @ W_sig[targets].

    blocks: h tensors (k, 2) of (source, target); signatures W_sig (m, d_k) in the weights'
    dtype and device; deembed X_inv (d_model, m), None for the identity (then the products
    are row scatters). Returns W_Q, W_K (h, d_model, d_k).
    """
    wq = torch.zeros(len(blocks), d_model, signatures.shape[1], dtype=signatures.dtype, device=signatures.device)
    wk = torch.zeros_like(wq)
    for k, block in enumerate(blocks):
        sources, targets = block[:, 0].to(signatures.device), block[:, 1].to(signatures.device)
        if deembed is None:
            wq[k, sources] = signatures[targets]
            wk[k, targets] = signatures[targets]
        else:
            wq[k] = deembed[:, sources] @ signatures[targets]
            wk[k] = deembed[:, targets] @ signatures[targets]
    return wq, wk


# ----------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class EdgeCounts:
    """Micro-averaged confusion counts of edge decisions over ordered pairs."""

    true_positives: int
    false_positives: int
    false_negatives: int
    pairs: int

    @property
    def f1(self) -> float:
        """Micro-F1 = 2TP / (2TP + FP + FN); 1.0 when there is no edge to find and none is claimed."""
        denom = 2 * self.true_positives + self.false_positives + self.false_negatives
        return 1.0 if denom == 0 else 2 * self.true_positives / denom


def edge_counts(heads: AttentionHeads, graph: RelationGraph, X: Optional[torch.Tensor] = None,
                contexts: Optional[torch.Tensor] = None, *, backend: str = "auto") -> EdgeCounts:
    """Confusion counts of the heads' edge decisions against ``graph``.

    contexts None: every ordered pair (i, j) of items, i = j included, scored with the whole
    item set as the one context (for max-over-heads this is the strongest test: by
    monotonicity under context restriction it implies every context). Otherwise contexts
    (N, ell) int64 item indices: every ordered pair of positions in each context.
    X (m, d_model) defaults to the identity (one-hot heads). ``backend`` as in
    ``factkernels._ops.max_head_scores`` (the fused kernel by default).
    """
    check_graph(graph)
    if not isinstance(heads, AttentionHeads):
        raise TypeError(f"heads must be AttentionHeads (from construct or training), got {type(heads).__name__}")
    m = graph.num_items
    if X is None:
        X = torch.eye(m, dtype=heads.query_weights.dtype, device=heads.query_weights.device)
    X = _check_embeddings(X, m, heads.method)
    if X.shape[1] != heads.model_dim:
        raise ValueError(f"X has d_model={X.shape[1]} but the heads expect {heads.model_dim}")
    X = X.to(heads.query_weights.device)
    adjacency = graph.adjacency.to(X.device)
    tp = fp = fn = pairs = 0
    if contexts is None:
        keys = heads.project(X[None], "keys")
        rows = max(1, EVAL_CHUNK_ELEMENTS // (heads.num_heads * m))
        for start in range(0, m, rows):
            queries = heads.project(X[None, start:start + rows], "queries")
            decision = heads.decisions(queries, keys, backend=backend)[0]
            counts = _count(decision, adjacency[start:start + rows])
            tp, fp, fn, pairs = tp + counts[0], fp + counts[1], fn + counts[2], pairs + decision.numel()
        return EdgeCounts(tp, fp, fn, pairs)
    contexts = check_contexts(contexts, m).to(X.device)
    ell = contexts.shape[1]
    per_chunk = max(1, EVAL_CHUNK_ELEMENTS // (heads.num_heads * ell * ell))
    for chunk in torch.split(contexts, per_chunk):
        decision = heads.decide(X[chunk], backend=backend)
        counts = _count(decision, adjacency[chunk[:, :, None], chunk[:, None, :]])
        tp, fp, fn, pairs = tp + counts[0], fp + counts[1], fn + counts[2], pairs + decision.numel()
    return EdgeCounts(tp, fp, fn, pairs)


def _count(decision: torch.Tensor, truth: torch.Tensor) -> tuple[int, int, int]:
    return (int((decision & truth).sum()), int((decision & ~truth).sum()), int((~decision & truth).sum()))


def check_contexts(contexts: torch.Tensor, m: int) -> torch.Tensor:
    """Validate contexts (N, ell) of distinct item indices in [0, m); return them as int64."""
    if not isinstance(contexts, torch.Tensor) or contexts.dtype.is_floating_point or contexts.dtype == torch.bool:
        raise TypeError("contexts must be an integer tensor (N, ell) of item indices")
    if contexts.dim() != 2 or contexts.shape[0] == 0 or contexts.shape[1] == 0:
        raise ValueError(f"contexts must have shape (N, ell) with N, ell >= 1, got {tuple(contexts.shape)}")
    if int(contexts.min()) < 0 or int(contexts.max()) >= m:
        raise ValueError(f"contexts must hold item indices in [0, {m})")
    ordered = torch.sort(contexts, dim=1).values
    if bool((ordered[:, 1:] == ordered[:, :-1]).any()):
        raise ValueError("a context must hold distinct items")
    return contexts.long()


def f1(heads: AttentionHeads, graph: RelationGraph, X: Optional[torch.Tensor] = None,
       contexts: Optional[torch.Tensor] = None, *, backend: str = "auto") -> float:
    """Micro-F1 of edge recognition (all ordered pairs by default); see ``edge_counts``."""
    return edge_counts(heads, graph, X, contexts, backend=backend).f1
