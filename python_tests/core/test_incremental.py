"""FactBuilder: incremental add / remove / update store the same facts as a fresh build."""

import pytest
import torch

from factkernels import construct
from factkernels.embeddings import random_fact_set
from factkernels.incremental import BorderedFactor, FactBuilder
from factkernels.memory import MemoryBudgetError
from factkernels.report import FactStorageError
from factkernels.solvers import GadgetOperator, solve_cg


@pytest.fixture(scope="module")
def fact_set():
    return random_fact_set(300, 160, 24, seed=1, dtype=torch.float64)


def _stores_all(builder):
    assert builder.failed == 0 and not builder.min_margin <= 0  # nan: the change touched no fact
    predicted = builder.mlp.predict(builder.keys, builder.values)
    assert torch.equal(predicted, builder.facts)
    fresh = construct(builder.keys, builder.values, builder.facts, m=builder.m, outputs="values", progress=False)
    assert torch.equal(fresh.predict(builder.keys, builder.values), predicted)


@pytest.mark.parametrize("solver", ["cholesky", "cg"])
def test_add_remove_update_match_a_fresh_build(fact_set, solver):
    K, V, f = fact_set
    first = f[:240] < 120
    builder = FactBuilder(K[:240][first], V[:120], f[:240][first], m=32, outputs="values", solver=solver)
    assert builder.solver == solver and (builder.last_solve.solver == "cg") == (solver == "cg")
    _stores_all(builder)
    before = builder.num_facts
    builder.add(K[240:], f[240:], V_new=V[120:])  # new keys, some mapped to new values
    assert builder.num_facts == before + 60 and builder.values.shape[0] == 160
    _stores_all(builder)
    removed_key = builder.keys[5]
    builder.remove([5, 17, builder.num_facts - 1])
    assert builder.num_facts == before + 57 and not (builder.keys == removed_key).all(1).any()
    _stores_all(builder)
    builder.update(torch.tensor([0, 1]), torch.tensor([150, 3]))
    assert builder.facts[:2].tolist() == [150, 3]
    _stores_all(builder)


def test_many_removals_compact_the_factor(fact_set):
    K, V, f = fact_set
    builder = FactBuilder(K[:100], V, f[:100], m=32, outputs="values")
    builder.remove(torch.arange(0, 60, 2))
    assert builder.rebuilds == 1 and builder.num_facts == 70
    _stores_all(builder)
    builder.add(K[100:110], f[100:110])
    _stores_all(builder)


def test_a_removed_key_can_come_back(fact_set):
    K, V, f = fact_set
    builder = FactBuilder(K[:100], V, f[:100], m=32, outputs="values")
    builder.remove([5])
    builder.add(K[5:6], torch.tensor([7]))  # its tombstone leaves the factor first (a singular border otherwise)
    assert builder.num_facts == 100 and builder.rebuilds == 1 and builder.facts[-1].item() == 7
    _stores_all(builder)
    with pytest.raises(ValueError, match="K has duplicate rows 4 and 101"):  # positions among the stored keys
        builder.add(torch.cat([K[200:201], K[4:5]]), f[:2])
    with pytest.raises(ValueError, match="K has duplicate rows 100 and 101"):
        builder.add(torch.cat([K[200:201], K[200:201]]), f[:2])


def test_bad_changes_are_rejected(fact_set):
    K, V, f = fact_set
    builder = FactBuilder(K[:50], V, f[:50], m=32, outputs="values")
    with pytest.raises(ValueError, match="K has duplicate rows"):
        builder.add(K[:1], f[:1])
    with pytest.raises(ValueError, match=r"f_new must index values in \[0, 160\)"):
        builder.add(K[60:61], torch.tensor([160]))
    with pytest.raises(ValueError, match=r"indices must be positions in \[0, 50\)"):
        builder.remove([50])
    with pytest.raises(ValueError, match="remove would leave no facts"):
        builder.remove(torch.arange(50))
    with pytest.raises(ValueError, match="f_changed must have shape"):
        builder.update([0, 1], torch.tensor([1]))
    with pytest.raises(ValueError, match="K_new must be torch.float64"):
        builder.add(K[60:61].float(), f[:1])
    with pytest.raises(MemoryBudgetError, match="FactBuilder"):
        FactBuilder(K[:50], V, f[:50], m=32, max_memory=1000)


def test_bordered_factor_equals_the_full_cholesky():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(30, 40, dtype=torch.float64, generator=g)
    G = A @ A.T + 0.1 * torch.eye(30, dtype=torch.float64)
    factor = BorderedFactor(torch.linalg.cholesky(G[:20, :20]))
    factor.border(G[20:26, :20], G[20:26, 20:26])
    factor.border(G[26:, :26], G[26:, 26:])
    full = torch.linalg.cholesky(G)
    assert factor.size == 30 and [p.shape for p in factor.panels] == [(20, 20), (6, 26), (4, 30)]
    for start, panel in zip(factor.starts, factor.panels):  # the diagonal blocks' lower triangles are defined
        expected = full[start:start + panel.shape[0], :panel.shape[1]]
        torch.testing.assert_close(panel[:, :start], expected[:, :start])
        torch.testing.assert_close(panel[:, start:].tril(), expected[:, start:])
    rhs = torch.randn(30, 3, dtype=torch.float64, generator=g)
    y = factor.forward(rhs)
    torch.testing.assert_close(y, torch.linalg.solve_triangular(full, rhs, upper=False))
    torch.testing.assert_close(factor.forward(rhs, known=y[:26]), y)
    torch.testing.assert_close(factor.backward(y), torch.linalg.solve_triangular(full.T, y, upper=True))
    torch.testing.assert_close(factor.solve(rhs), torch.linalg.solve(G, rhs))
    with pytest.raises(ValueError, match="panel boundary"):
        factor.forward(rhs, known=y[:23])
    # the leading block of whole panels: the factor as it was before the last border
    torch.testing.assert_close(factor.backward(y[:26]), torch.linalg.solve_triangular(full[:26, :26].T, y[:26],
                                                                                     upper=True))
    with pytest.raises(ValueError, match="leading block of its panels"):
        factor.backward(y[:23])


def test_cg_builder_warm_starts_each_change(fact_set):
    K, V, f = fact_set
    builder = FactBuilder(K[:200], V, f[:200], m=32, outputs="values", solver="cg", cg_tol=1e-8)
    cold = builder.last_solve.iterations
    builder.update([0, 1], torch.tensor([5, 6]))  # two targets change: the last solution is nearly right
    assert 0 < builder.last_solve.iterations < cold and builder.last_solve.residual < 1e-7
    _stores_all(builder)
    builder.remove([3, 4])
    assert builder.rebuilds == 0 and builder.num_facts == 198  # no factor: removed rows are simply dropped
    _stores_all(builder)
    builder.add(K[200:210], f[200:210])  # new rows start at 0: the warm start saves little here
    targets = builder._decoder.codes[builder.facts]
    _, fresh = solve_cg(builder._op, targets, tol=1e-8, max_iter=2000, progress=False)
    assert builder.last_solve.iterations <= fresh.iterations
    _stores_all(builder)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_add_equals_a_fresh_solve_of_the_bordered_system(fact_set, dtype, monkeypatch):
    K, V, f = (t.to(dtype) if t.is_floating_point() else t for t in fact_set)
    builder = FactBuilder(K[:200], V, f[:200], m=32, outputs="values", width_multiplier=2.0)
    low_rank = []
    update = FactBuilder._bordered_weights
    monkeypatch.setattr(FactBuilder, "_bordered_weights", lambda self, k: low_rank.append(k) or update(self, k))
    builder.add(K[200:204], f[200:204])  # k < m: a rank-k change of the weights
    builder.add(K[204:230], f[204:230])
    builder.add(K[230:270], f[230:270])  # k >= m: all of α re-solved from the cached forward rows
    for i in range(270, 280):  # one fact at a time: rank-1 updates add up without drifting
        builder.add(K[i : i + 1], f[i : i + 1])
    assert 26 < builder.m <= 40 and low_rank == [4, 26] + [1] * 10 and builder.rebuilds == 0  # (m grew from 32)
    assert builder.checked == 1 and builder._factor.panels[0].dtype == dtype
    _equals_a_fresh_solve(builder, 1e-10 if dtype == torch.float64 else 1e-4)
    _stores_all(builder)


def _equals_a_fresh_solve(builder, tol):
    """The builder's up weights and biases match the minimum-norm solution of its stored facts' gadget system
    (same gate and whitening, tombstones left out) solved afresh in float64, to ``tol`` relative."""
    op, alive = builder._op, builder._alive
    kept = GadgetOperator(*(t.double() for t in (op.gate_features[alive], op.keys_aug[alive], op.feature_transform,
                                                 op.key_transform)))
    alpha = torch.linalg.solve(kept.dense(), builder._decoder.codes[builder.facts].double())
    coef, out_bias = kept.unknowns(alpha)
    fresh = torch.cat([coef[:, :, :-1].reshape(-1, builder.keys.shape[1]), coef[:, :, -1].reshape(-1, 1)], dim=1)
    incremental = torch.cat([builder.mlp.up_weight.detach(), builder.mlp.up_bias.detach()[:, None]], dim=1).double()
    assert (incremental - fresh).norm() <= tol * fresh.norm()
    fresh_bias = builder._decoder.projection.double() @ out_bias  # the gadgets' output biases, through D
    assert (builder.mlp.down_bias.detach().double() - fresh_bias).norm() <= tol * fresh_bias.norm()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_adds_after_removals_equal_a_fresh_solve(fact_set, dtype):
    K, V, f = (t.to(dtype) if t.is_floating_point() else t for t in fact_set)
    builder = FactBuilder(K[:200], V, f[:200], m=32, outputs="values", width_multiplier=2.0)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    builder.remove([3, 50, 199])  # tombstones: the kept system is solved through the r x r Schur complement
    _equals_a_fresh_solve(builder, tol)
    builder.add(K[200:205], f[200:205])  # k < m beside tombstones
    builder.add(K[205:245], f[205:245])  # k >= m
    builder.remove([0, builder.num_facts - 1])  # one of the old rows, one of the last panel's
    builder.add(K[245:250], f[245:250])
    builder.update([7, 8], torch.tensor([1, 2]))
    assert builder.rebuilds == 0 and builder.num_facts == 245 and int((~builder._alive).sum()) == 5
    _equals_a_fresh_solve(builder, tol)
    _stores_all(builder)


def test_add_verifies_the_new_facts_and_catches_one_not_stored(fact_set):
    K, V, f = fact_set
    old = f[:200] < 150
    builder = FactBuilder(K[:200][old], V, f[:200][old], m=32, outputs="values")
    builder.add(K[200:203], f[200:203])
    assert builder.checked == 3 and builder.failed == 0
    report = builder.mlp.report  # construct's schema, over the facts this change checked
    alone = construct(K[:50], V, f[:50], m=32, outputs="values", verify="report", progress=False).report
    assert report.to_dict().keys() == alone.to_dict().keys()
    assert (report.checked, report.failed, report.accuracy, report.num_facts) == (3, 0, 1.0, builder.num_facts)
    assert report.m == builder.m and report.min_margin == builder.min_margin
    assert report.m_search == "given" if builder.m == 32 else report.m_search.startswith("grown: 32 -> ")
    # value 155 is used by no stored fact; give it value 3's code, so a key mapped to 155 decodes as 3
    builder._decoder.codes[155] = builder._decoder.codes[3]
    with pytest.raises(FactStorageError, match="1 of the 1 facts checked are not stored") as raised:
        builder.add(K[203:204], torch.tensor([155]))
    assert (raised.value.report.failed, raised.value.report.accuracy) == (1, 0.0)
    everything = FactBuilder(K[:200][old], V, f[:200][old], m=32, outputs="values", verify="report", verify_scope="all")
    everything._decoder.codes[155] = everything._decoder.codes[3]
    everything.add(K[203:206], torch.tensor([155, 1, 2]))
    assert everything.checked == everything.num_facts and everything.failed == 1
    assert everything.mlp.report.accuracy == 1.0 - 1 / everything.num_facts
    assert everything.mlp.predict(K[203:204], V).item() == 3
    with pytest.raises(ValueError, match="verify_scope"):
        FactBuilder(K[:50], V, f[:50], m=32, verify_scope="new")
