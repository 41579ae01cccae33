"""factkernels.attention (seed 002): graphs, constructions, scores, training harness, budget search, CLI."""

import json
import math

import networkx as nx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from factkernels import attention
from factkernels.cli import main
from factkernels.experiments import engine

# ----------------------------------------------------------------------------- graphs


@pytest.mark.parametrize("kind", ["permutation", "r-regular", "erdos-renyi"])
def test_random_graphs_are_seeded_and_have_their_degrees(kind):
    g = attention.random_graph(64, kind, seed=3)
    again = attention.random_graph(64, kind, seed=3)
    other = attention.random_graph(64, kind, seed=4)
    assert torch.equal(g.edges, again.edges) and not torch.equal(g.edges, other.edges)
    if kind == "permutation":
        assert g.is_permutation and g.num_edges == 64
        assert torch.equal(torch.sort(g.successor).values, torch.arange(64))
    elif kind == "r-regular":
        assert (g.out_degree == 2).all() and (g.in_degree == 2).all()
        assert not bool((g.edges[:, 0] == g.edges[:, 1]).any())
    else:
        assert not bool((g.edges[:, 0] == g.edges[:, 1]).any())
        assert 64 <= g.num_edges <= 3 * 64  # expected out-degree 2
    assert torch.equal(attention.RelationGraph.from_networkx(g.to_networkx()).edges, g.edges)


def test_dense_regular_graph():
    g = attention.random_graph(20, "r-regular", degree=12, seed=0)
    assert (g.out_degree == 12).all() and (g.in_degree == 12).all() and g.num_edges == 240


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12).flatmap(lambda m: st.tuples(
    st.just(m), st.sets(st.tuples(st.integers(0, m - 1), st.integers(0, m - 1)), min_size=1, max_size=m * m))))
def test_konig_coloring_uses_delta_matchings(case):
    m, edges = case
    g = attention.RelationGraph.from_edges(sorted(edges), m)
    classes = attention.konig_edge_coloring(g)
    assert len(classes) == g.max_degree  # König: exactly Delta colours (every class is used)
    for c in classes:
        assert len(set(c[:, 0].tolist())) == len(c) == len(set(c[:, 1].tolist()))  # a matching
    assert sorted(map(tuple, torch.cat(classes).tolist())) == sorted(edges)


def test_pack_matchings_respects_lemma_b8():
    g = attention.random_graph(50, "erdos-renyi", degree=3, seed=1)
    for block in (1, 4, 7, 50):
        blocks = attention.pack_matchings(g, block_size=block)
        assert len(blocks) <= attention.matching_head_bound(g, block)
        assert max(len(b) for b in blocks) <= block
        assert sorted(map(tuple, torch.cat(blocks).tolist())) == list(map(tuple, g.edges.tolist()))
        assert all(len(set(b[:, 0].tolist())) == len(b) == len(set(b[:, 1].tolist())) for b in blocks)
    exact = attention.pack_matchings(g, num_blocks=g.max_degree + 5)
    assert len(exact) == g.max_degree + 5
    sizes = [len(b) for b in exact]
    assert max(sizes) <= math.ceil(g.num_edges / len(exact)) + g.max_degree


def test_bad_graphs_are_rejected():
    with pytest.raises(ValueError, match="at least 2"):
        attention.random_graph(1)
    with pytest.raises(ValueError, match="kind"):
        attention.random_graph(8, "tree")
    with pytest.raises(ValueError, match="twice"):
        attention.RelationGraph.from_edges([[0, 1], [0, 1]], 4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        attention.RelationGraph.from_edges([[0, 4]], 4)
    with pytest.raises(TypeError, match="integer"):
        attention.RelationGraph(4, torch.tensor([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="num_edges, 2"):
        attention.RelationGraph(4, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="exactly once"):
        attention.RelationGraph.from_permutation(torch.tensor([0, 0, 1]))
    with pytest.raises(TypeError, match="RelationGraph"):
        attention.construct(nx.DiGraph([(0, 1)]), method="one-hot")
    with pytest.raises(ValueError, match="permutation graph"):
        attention.random_graph(8, "r-regular", seed=0).successor


# ----------------------------------------------------------------------------- constructions


def test_one_hot_rademacher_recognises_every_pair():
    g = attention.random_graph(256, "permutation", seed=0)
    heads = attention.construct(g, method="one-hot", seed=0)
    assert heads.num_heads == 1 and heads.head_dim == math.ceil(40 * math.log(256))  # Hoeffding + union bound
    assert heads.threshold == heads.head_dim / 2 and heads.key_budget == heads.head_dim
    assert attention.f1(heads, g) == 1.0
    assert attention.f1(heads, g, torch.eye(256)) == 1.0


def test_one_hot_bernoulli_uses_theorem_b1_constants():
    g = attention.random_graph(128, "permutation", seed=1)
    heads = attention.construct(g, method="one-hot", signature="bernoulli", seed=1)
    p = 0.25
    c1, c2 = p * (1 - p) ** 2 / 8, p * (1 - p) ** 2 / (2 * (1 + 3 * p))
    assert heads.head_dim == math.ceil(max(3 / c1, 2 / c2) * math.log(128))
    assert heads.threshold == pytest.approx((p + p * p) / 2 * heads.head_dim)
    assert attention.f1(heads, g) == 1.0


@pytest.mark.parametrize("kind", ["r-regular", "erdos-renyi"])
def test_one_hot_general_graphs_use_delta_heads(kind):
    g = attention.random_graph(128, kind, degree=3, seed=2)
    heads = attention.construct(g, method="one-hot", seed=2)
    assert heads.num_heads == g.max_degree
    assert attention.f1(heads, g) == 1.0


def test_compressive_construction_at_its_budget():
    m, d_model = 1024, 512
    g = attention.random_graph(m, "permutation", seed=0)
    X = attention.gaussian_unit_norm(m, d_model, seed=10)
    heads = attention.construct(g, X, method="compressive", seed=0)
    assert heads.num_heads == m // d_model
    assert heads.head_dim == math.ceil(40 * (1 + 1) ** 2 * math.log(m))  # leakage B/d_model = 1
    assert heads.key_budget == heads.num_heads * heads.head_dim
    assert attention.f1(heads, g, X) == 1.0
    # a sampled context sees the same decisions (monotonicity under context restriction)
    ctx = attention.sample_contexts(g.successor, 50, 16, 0.5, torch.Generator().manual_seed(0))
    assert attention.f1(heads, g, X, ctx) == 1.0


def test_general_construction_on_a_regular_graph():
    m, d_model = 1024, 512
    g = attention.random_graph(m, "r-regular", degree=2, seed=0)
    X = attention.gaussian_unit_norm(m, d_model, seed=10)
    heads = attention.construct(g, X, method="general", seed=0)
    assert heads.num_heads <= attention.matching_head_bound(g, d_model)
    assert attention.f1(heads, g, X) == 1.0


def test_generalized_construction_with_blocks():
    m, d_model = 256, 256
    g = attention.random_graph(m, "permutation", seed=0)
    X = attention.gaussian_unit_norm(m, d_model, seed=1)
    heads = attention.construct(g, X, method="generalized", seed=0)
    block = int(d_model / math.log(m))
    assert heads.details["block_size"] <= block and heads.num_heads == math.ceil(m / block)
    assert heads.details["signature"] == "bernoulli"
    assert attention.f1(heads, g, X) == 1.0


def test_softmax_construction():
    m, d_model = 1024, 512
    g = attention.random_graph(m, "permutation", seed=0)
    X = attention.gaussian_unit_norm(m, d_model, seed=10)
    heads = attention.construct(g, X, method="softmax", seed=0)
    assert heads.aggregation == "softmax-sum" and heads.threshold == 0.5
    assert heads.head_dim == math.ceil(4 * math.log(7 * m) ** 2)  # Theta(log^2 m)
    assert attention.f1(heads, g, X) == 1.0


def test_constructions_are_seeded_and_take_h():
    g = attention.random_graph(64, "permutation", seed=0)
    X = attention.gaussian_unit_norm(64, 16, seed=0)
    a = attention.construct(g, X, method="compressive", h=6, d_k=12, seed=5)
    b = attention.construct(g, X, method="compressive", h=6, d_k=12, seed=5)
    assert torch.equal(a.query_weights, b.query_weights) and a.num_heads == 6 and a.key_budget == 72
    c = attention.construct(g, X, method="compressive", h=6, d_k=12, seed=6)
    assert not torch.equal(a.key_weights, c.key_weights)


def test_bad_construction_inputs():
    g = attention.random_graph(16, "permutation", seed=0)
    X = attention.gaussian_unit_norm(16, 8, seed=0)
    with pytest.raises(ValueError, match="d_k must be at least 1"):
        attention.construct(g, X, d_k=0)
    with pytest.raises(ValueError, match="method"):
        attention.construct(g, X, method="magic")
    with pytest.raises(ValueError, match="needs item embeddings X"):
        attention.construct(g, method="compressive")
    with pytest.raises(ValueError, match="identity"):
        attention.construct(g, X, method="one-hot")
    with pytest.raises(ValueError, match=r"shape \(m=16, d_model\)"):
        attention.construct(g, X[:8], method="compressive")
    with pytest.raises(ValueError, match="method='general'"):
        attention.construct(attention.random_graph(16, "r-regular", seed=0), X, method="compressive")
    with pytest.raises(ValueError, match=r"\[Delta, m'\]"):
        attention.construct(attention.random_graph(16, "r-regular", degree=3, seed=0), X, method="general", h=2)
    with pytest.raises(ValueError, match="row 3 of X is zero"):
        attention.construct(g, X.index_fill(0, torch.tensor([3]), 0.0), method="compressive")


# ----------------------------------------------------------------------------- scores


def test_max_head_scores_match_a_loop_over_heads():
    gen = torch.Generator().manual_seed(0)
    Q = torch.randn(3, 5, 7, 4, generator=gen, dtype=torch.float64)
    K = torch.randn(3, 5, 9, 4, generator=gen, dtype=torch.float64)
    S = attention.max_head_scores(Q, K)
    loop = torch.stack([Q[:, k] @ K[:, k].transpose(-1, -2) for k in range(5)]).amax(dim=0)
    assert S.shape == (3, 7, 9) and torch.allclose(S, loop)
    tau = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64)
    S2, decision = attention.max_head_scores(Q, K, tau)
    assert torch.equal(S2, S) and torch.equal(decision, S > tau.view(3, 1, 1))
    assert torch.equal(attention.max_head_scores(Q, K, 0.5)[1], S > 0.5)


def test_max_head_scores_are_differentiable():
    Q = torch.randn(2, 3, 4, 2, dtype=torch.float64, requires_grad=True)
    K = torch.randn(2, 3, 5, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(attention.max_head_scores, (Q, K))


def test_softmax_head_scores_sum_heads():
    Q, K = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    A = attention.softmax_head_scores(Q, K)
    assert torch.allclose(A.sum(dim=-1), torch.full((2, 6), 3.0))
    ref = sum(torch.softmax(Q[:, k] @ K[:, k].transpose(-1, -2) / 2.0, dim=-1) for k in range(3))
    assert torch.allclose(A, ref, atol=1e-6)


def test_scores_reject_bad_shapes():
    Q = torch.randn(2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"\(batch, h, ell, d_k\)"):
        attention.max_head_scores(Q[0], Q[0])
    with pytest.raises(ValueError, match="agree in batch, h and d_k"):
        attention.max_head_scores(Q, torch.randn(2, 2, 4, 5))
    with pytest.raises(TypeError, match="floating-point"):
        attention.max_head_scores(Q.long(), Q.long())
    with pytest.raises(ValueError, match="tau"):
        attention.max_head_scores(Q, Q, torch.zeros(5))


def test_context_scores_are_submatrices_of_all_pairs():
    g = attention.random_graph(32, "permutation", seed=0)
    X = attention.gaussian_unit_norm(32, 8, seed=0)
    heads = attention.construct(g, X, method="compressive", d_k=6, seed=0)
    full = heads.scores(X[None])[0]
    ctx = torch.tensor([[3, 17, 5, 30], [0, 1, 2, 31]])
    assert torch.allclose(heads.scores(X[ctx]), full[ctx[:, :, None], ctx[:, None, :]], atol=1e-6)
    counts = attention.edge_counts(heads, g, X, ctx)
    truth = g.adjacency[ctx[:, :, None], ctx[:, None, :]]
    decision = full[ctx[:, :, None], ctx[:, None, :]] > heads.threshold
    assert counts.true_positives == int((truth & decision).sum()) and counts.pairs == 32


# ----------------------------------------------------------------------------- lower bound


def test_lower_bound_is_the_bit_budget_formula():
    for m, edges, d_model in [(8, 8, 4), (16, 40, 8), (64, 64, 16)]:
        expected = (math.log2(math.comb(m * (m - 1), edges)) / 32 - 1) / (2 * d_model)
        assert attention.lower_bound(m=m, m_edges=edges, d_model=d_model) == pytest.approx(expected, rel=1e-9)
    assert attention.lower_bound(4096, 4096, 512, bits=1) > attention.lower_bound(4096, 4096, 512)
    with pytest.raises(ValueError, match="m must be at least 2"):
        attention.lower_bound(m=1, m_edges=0, d_model=4)
    with pytest.raises(ValueError, match="m_edges must be at most"):
        attention.lower_bound(m=4, m_edges=13, d_model=4)
    with pytest.raises(ValueError, match="d_model"):
        attention.lower_bound(m=4, m_edges=3, d_model=0)


# ----------------------------------------------------------------------------- training harness

TINY = attention.TrainingConfig(context_length=8, check_every=100, patience=2, val_contexts=100, test_contexts=200,
                                max_steps=400, lr=1e-2)


def test_sample_contexts_follow_the_target_rate():
    g = attention.random_graph(256, "permutation", seed=0)
    ctx = attention.sample_contexts(g.successor, 2000, 16, 0.5, torch.Generator().manual_seed(1))
    assert ctx.shape == (2000, 16) and int(ctx.min()) >= 0 and int(ctx.max()) < 256
    assert bool((torch.sort(ctx, dim=1).values.diff(dim=1) > 0).all())  # distinct items
    positives = (g.successor[ctx][:, :, None] == ctx[:, None, :]).sum(dim=(1, 2)).float().mean()
    assert 0.3 * 16 < positives < 0.5 * 16  # most of the ~rho * ell sources keep their target
    none = attention.sample_contexts(g.successor, 2000, 16, 0.0, torch.Generator().manual_seed(1))
    assert (g.successor[none][:, :, None] == none[:, None, :]).sum(dim=(1, 2)).float().mean() < 1.5
    again = attention.sample_contexts(g.successor, 2000, 16, 0.5, torch.Generator().manual_seed(1))
    assert torch.equal(ctx, again)


def test_harness_learns_a_tiny_graph_and_reports_consistent_f1():
    runs = attention.train_runs(12, 12, 2, [6], [0, 1], TINY, quiet=True)
    for run in runs:
        assert run.early_stopped and run.steps < 400 and run.test_f1 > 0.99 and run.key_budget == 12
        data = attention.RunData.make(run.seed, 12, 12, TINY)
        assert run.heads.head_dim == 6 and run.heads.num_heads == 2 and run.heads.method == "trained"
        assert attention.f1(run.heads, data.graph, data.embeddings, data.test) == pytest.approx(run.test_f1)


def test_batched_runs_match_runs_trained_alone():
    both = attention.train_runs(12, 12, 2, [1, 6], [0], TINY, quiet=True)
    alone = attention.train_runs(12, 12, 2, [1], [0], TINY, quiet=True) + \
        attention.train_runs(12, 12, 2, [6], [0], TINY, quiet=True)
    assert not both[0].early_stopped and both[1].early_stopped  # the batch shrank mid-training
    for a, b in zip(both, alone):
        assert a.test_f1 == pytest.approx(b.test_f1, abs=1e-3) and a.steps == b.steps
        assert torch.allclose(a.heads.query_weights, b.heads.query_weights, atol=1e-3)


def test_training_rejects_bad_settings():
    with pytest.raises(ValueError, match="head_dims"):
        attention.train_runs(12, 12, 2, [0], [0], TINY)
    with pytest.raises(ValueError, match="m must be an int >= 2"):
        attention.train_runs(1, 12, 2, [4], [0], TINY)
    with pytest.raises(ValueError, match="context_length"):
        attention.train_runs(4, 12, 2, [4], [0], TINY)
    with pytest.raises(ValueError, match="target_rate"):
        attention.TrainingConfig(target_rate=1.5)


def test_step_cutoffs_follow_table_2():
    assert attention.step_cutoff(64, 16) == 20_000 and attention.step_cutoff(512, 16) == 80_000
    assert attention.step_cutoff(4096, 512) == 200_000


# ----------------------------------------------------------------------------- budget search and fits


def _config(h, d_k, f1s):
    return attention.ConfigResult(h, d_k, list(f1s), list(range(len(f1s))), [1000] * len(f1s))


def test_t_interval_matches_scipy():
    values = [0.97, 0.99, 1.0, 0.995]
    mean, low, high = attention.t_interval(values)
    ref = stats.t.interval(0.95, 3, loc=sum(values) / 4, scale=stats.sem(values))
    assert mean == pytest.approx(sum(values) / 4) and (low, high) == pytest.approx(ref)
    assert attention.t_interval([0.5]) == (0.5, 0.5, 0.5)


def test_budget_estimates_follow_appendix_a2():
    configs = [
        _config(1, 8, [0.90, 0.92, 0.91]),
        _config(1, 16, [0.995, 0.992, 0.990]),  # D_K 16: mean passes, CI low does not
        _config(1, 32, [1.0, 1.0, 1.0]),
        _config(2, 6, [0.985, 0.99, 1.0]),  # D_K 12: mean passes, CI low does not
        _config(4, 3, [0.97, 0.96, 0.99]),  # D_K 12: mean fails, CI high passes
        _config(4, 4, [1.0, 1.0, 1.0]),  # D_K 16 passes conservatively
    ]
    point = attention.summarize_budget(64, 16, configs)
    assert point.key_budget == 12 and point.best_heads == 2
    assert point.key_budget_lower == 12 and point.key_budget_upper == 16
    # h=4 tested D_K 12 too, and its F1 there is not significantly below h*'s (paired t, p ~ 0.09)
    assert point.heads_range == (2, 4)
    assert point.scaling_x == pytest.approx(64 * 6 / 16)
    same = attention.summarize_budget(64, 16, [_config(1, 4, [1.0, 1.0]), _config(2, 2, [1.0, 1.0])])
    assert same.key_budget == 4 and same.heads_range == (1, 2)


def test_key_budget_fit_reproduces_the_seeds_constants():
    # central D_K* of the seed's Fig. 8 / Table 1 (h* d_k*); the (4096, 512) centre is not in the
    # text extraction, only its range [72, 120], and is taken as 96.
    table = {(64, 16): 20, (64, 32): 6, (64, 64): 5, (128, 16): 88, (128, 32): 21, (128, 64): 7,
             (256, 16): 192, (256, 32): 64, (256, 64): 24, (512, 16): 448, (512, 32): 144, (512, 64): 56,
             (1024, 32): 320, (1024, 128): 60, (2048, 256): 66, (4096, 512): 96}
    points = [attention.BudgetPoint(m, d, [], dk, None, None, None, None) for (m, d), dk in table.items()]
    fit = attention.fit_key_budget(points)
    assert fit.slope == pytest.approx(1.19, abs=0.01) and fit.r2 == pytest.approx(0.944, abs=0.002)
    assert fit.points == 16


def test_head_count_fit_is_least_squares():
    points = [attention.BudgetPoint(m, d, [], 10, None, None, int(1.5 * m / d - 2), None)
              for m, d in [(64, 16), (128, 16), (256, 16), (64, 32)]]
    fit = attention.fit_head_count(points)
    assert (fit.slope, fit.intercept, fit.r2) == pytest.approx((1.5, -2.0, 1.0))
    assert attention.fit_head_count(points[:1]) is None


def test_search_budget_brackets_the_threshold_on_the_ladder():
    point = attention.search_budget(12, 12, [1, 2], [0, 1], TINY, quiet=True)
    # h = m / d_model = 1 first, at rung -1 of the ladder around the seed's law
    first = point.configs[0]
    assert (first.num_heads, first.head_dim) == (1, attention.rung_head_dim(attention.seed_law(12, 12), 1, -1))
    assert point.key_budget_lower <= point.key_budget <= (point.key_budget_upper or math.inf)
    assert all(len(c.test_f1) == 2 for c in point.configs)

def test_cli_rgr_train_writes_json(tmp_path, capsys):
    out = tmp_path / "train.json"
    assert main(["rgr-train", "--m", "12", "--d-model", "12", "--heads", "2", "--d-k", "2,6", "--seeds", "2",
                     "--steps", "300", "--context-length", "8", "--json", str(out), "--quiet"]) == 0
    payload = json.loads(out.read_text())
    assert [r["head_dim"] for r in payload["runs"]] == [2, 2, 6, 6]
    assert payload["config"]["training"]["max_steps"] == 300 and "torch" in payload["environment"]
    assert "mean test F1" in capsys.readouterr().out
