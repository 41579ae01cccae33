"""Relational graph recognition with multi-head QK attention (seed 002).

    from factkernels import attention
    g = attention.random_graph(m=1024, kind="permutation", seed=0)
    X = attention.gaussian_unit_norm(1024, 512, seed=1)
    heads = attention.construct(g, X, method="compressive")   # d_k, h from the seed's theorems
    attention.f1(heads, g, X)                                 # micro-F1 over all ordered pairs: 1.0
    heads.key_budget                                          # D_K = h d_k
    attention.lower_bound(m=1024, m_edges=1024, d_model=512)
    runs = attention.train_runs(128, 32, num_heads=4, head_dims=[8], seeds=[0, 1, 2])
    point = attention.search_budget(64, 16, head_counts=[1, 2, 4, 8], seeds=[0, 1, 2])
    attention.train_runs(128, 32, 4, [8], [0], attention.TrainingConfig(degree=4))           # r-regular (App. A.3)
    attention.train_runs(64, 16, 4, [8], [0], attention.TrainingConfig(objective="messages"))  # value channel (7.2)
    attention.train_block(512, 4, 64, seed=0, config=attention.BlockConfig(max_steps=2_000))  # pre-LN block (7.3)

Modules: ``graphs`` (RelationGraph, random families, König colouring), ``constructions``
(Constructions I-IV and the softmax variant, evaluation), ``scores`` (max-over-heads scores from
the fused kernel in ``factkernels._ops``, softmax-sum scores), ``train_heads`` (the seed's training
protocol on permutation and r-regular graphs, edge or message objective), ``key_budget`` (the D_K*
search of App. A.2), ``budget_fits`` (the seed's law, fits of D_K* and h*, the lower bound), ``block`` (pre-LN Transformer block on frozen real token embeddings). The
experiments live in ``factkernels.experiments.rgr_*``, the ``rgr-train`` command in ``factkernels.cli``.
"""

from .constructions import (
    AttentionHeads,
    EdgeCounts,
    construct,
    default_block_size,
    default_head_dim,
    edge_counts,
    f1,
    gaussian_unit_norm,
)
from .block import BlockConfig, BlockRun, PreLNBlock, RetrievalBatch, sample_retrieval, train_block
from .graphs import RelationGraph, konig_edge_coloring, matching_head_bound, pack_matchings, random_graph
from .scores import max_head_scores, softmax_head_scores
from .budget_fits import LinearFit, fit_head_count, fit_key_budget, fit_through_origin, lower_bound, seed_law
from .key_budget import (BudgetPoint, ConfigResult, bracket_budget, rung_head_dim, search_budget, summarize_budget,
                         t_interval)
from .train_heads import OBJECTIVES, RunData, RunResult, TrainingConfig, sample_contexts, step_cutoff, train_runs

__all__ = [
    # graphs
    "RelationGraph",
    "random_graph",
    "konig_edge_coloring",
    "pack_matchings",
    "matching_head_bound",
    # constructions and evaluation
    "AttentionHeads",
    "construct",
    "default_head_dim",
    "default_block_size",
    "gaussian_unit_norm",
    "EdgeCounts",
    "edge_counts",
    "f1",
    # scores
    "max_head_scores",
    "softmax_head_scores",
    # training and budget search
    "TrainingConfig",
    "RunData",
    "RunResult",
    "train_runs",
    "sample_contexts",
    "step_cutoff",
    "ConfigResult",
    "BudgetPoint",
    "seed_law",
    "rung_head_dim",
    "bracket_budget",
    "search_budget",
    "summarize_budget",
    "t_interval",
    "LinearFit",
    "fit_key_budget",
    "fit_head_count",
    "fit_through_origin",
    "lower_bound",
    # extensions: r-regular graphs, value channel, pre-LN block
    "OBJECTIVES",
    "BlockConfig",
    "BlockRun",
    "PreLNBlock",
    "RetrievalBatch",
    "sample_retrieval",
    "train_block",
]
