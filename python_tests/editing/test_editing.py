"""ROME / MEMIT / AlphaEdit update rules and the fact-editing protocol (seed 000 App. A.3.4)."""

import pytest
import torch

from factkernels import editing as rules
from factkernels.transformer import editing
from factkernels.transformer.lm import AuthorsBooks, AuthorsLM


def _problem(h=24, d_out=8, n=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(d_out, h, generator=gen, dtype=torch.float64)
    keys = torch.randn(n, h, generator=gen, dtype=torch.float64)
    values = torch.randn(n, d_out, generator=gen, dtype=torch.float64)
    a = torch.randn(h, h, generator=gen, dtype=torch.float64)
    cov = a @ a.T / h + 0.1 * torch.eye(h, dtype=torch.float64)
    return weight, keys, values, cov


def test_rome_inserts_key_exactly_and_spares_c_orthogonal_keys():
    weight, keys, values, cov = _problem(n=1)
    new = rules.rome_update(weight, keys, values, cov)
    assert torch.allclose(keys @ new.T, values, atol=1e-10)
    # keys k with k^T C^-1 k* = 0 keep their outputs
    u = torch.linalg.solve(cov, keys[0])
    other = torch.randn(6, weight.shape[1], generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    other = other - (other @ u)[:, None] * u / (u @ u)
    assert torch.allclose(other @ new.T, other @ weight.T, atol=1e-10)
    assert torch.linalg.matrix_rank(new - weight) == 1


def test_rome_sequential_edits_hit_the_last_key_exactly():
    weight, keys, values, cov = _problem(n=4)
    new = rules.rome_update(weight, keys, values, cov)
    assert torch.allclose(keys[-1] @ new.T, values[-1], atol=1e-10)
    assert not torch.allclose(new, weight)


def test_memit_small_lambda_recovers_least_squares_and_large_lambda_keeps_weight():
    weight, keys, values, cov = _problem(n=5)
    exact = rules.memit_update(weight, keys, values, cov, lam=1e-6)
    assert torch.allclose(keys @ exact.T, values, atol=1e-6)  # n < h: the edits are fit exactly
    # equals the minimum C-norm solution of (W + Δ) K = V*
    residual = values - keys @ weight.T
    cinv_k = torch.linalg.solve(cov, keys.T)  # (h, n)
    delta = residual.T @ torch.linalg.solve(keys @ cinv_k, cinv_k.T)
    assert torch.allclose(exact, weight + delta, atol=1e-5)
    kept = rules.memit_update(weight, keys, values, cov, lam=1e9)
    assert torch.allclose(kept, weight, atol=1e-6)


def test_memit_with_rank_deficient_cov_is_the_minimum_norm_edit_and_stable():
    # C from 6 keys in h = 24 and 3 edited keys: λC + KᵀK is singular, as with key statistics of a few texts
    gen = torch.Generator().manual_seed(7)
    h, d_out = 24, 8
    weight = torch.randn(d_out, h, generator=gen)
    seen = torch.randn(6, h, generator=gen)
    keys = torch.randn(3, h, generator=gen)
    values = torch.randn(3, d_out, generator=gen)
    cov = seen.T @ seen / 6
    new = rules.memit_update(weight, keys, values, cov, lam=1.0)
    # the minimum-norm minimiser Δ = Rᵀ K S⁺, S = λC + KᵀK, from float64 inputs (S's null space exact there)
    seen64, keys64, weight64 = seen.double(), keys.double(), weight.double()
    system = seen64.T @ seen64 / 6 + keys64.T @ keys64
    residual = values.double() - keys64 @ weight64.T
    expected = weight64 + residual.T @ keys64 @ torch.linalg.pinv(system, hermitian=True)
    assert torch.allclose(new.double(), expected, atol=1e-3)
    # directions neither C nor the edited keys reach are left alone
    span = torch.cat([seen, keys]).double()
    outside = torch.randn(5, h, generator=gen, dtype=torch.float64)
    outside -= outside @ torch.linalg.pinv(span) @ span
    assert ((new.double() - weight.double()) @ outside.T).abs().max() < 1e-4
    # and rounding-size changes of C (another thread count) move the edit by rounding size, not by 1/rounding
    jitter = 1e-8 * cov.abs().max() * torch.randn(h, h, generator=gen)
    moved = rules.memit_update(weight, keys, values, cov + (jitter + jitter.T) / 2, lam=1.0)
    assert (moved - new).abs().max() < 1e-3 * (new - weight).abs().max()


def test_memit_rejects_mismatched_shapes():
    weight, keys, values, cov = _problem()
    with pytest.raises(ValueError, match="values must be"):
        rules.memit_update(weight, keys, values[:, :3], cov, lam=1.0)
    with pytest.raises(ValueError, match="lam"):
        rules.memit_update(weight, keys, values, cov, lam=-1.0)


def test_alphaedit_leaves_preserved_keys_unchanged():
    weight, keys, values, _ = _problem(h=32, n=4)
    preserved = torch.randn(10, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    cov = preserved.T @ preserved / 10  # rank 10: a 22-dimensional null space
    projector = rules.null_space_projector(cov, threshold=1e-8)
    assert torch.allclose(projector @ projector, projector, atol=1e-10)
    assert round(float(projector.trace())) == 22
    new = rules.alphaedit_update(weight, keys, values, projector)
    assert (preserved @ new.T - preserved @ weight.T).abs().max() < 1e-5
    # the edits move the keys' outputs toward the targets
    before = (keys @ weight.T - values).norm()
    assert (keys @ new.T - values).norm() < 0.9 * before


def test_harmonic_mean():
    assert editing.harmonic_mean(1.0, 1.0, 1.0) == 1.0
    assert editing.harmonic_mean(0.5, 1.0, 0.0) == 0.0
    assert editing.harmonic_mean(0.5, 1.0, 1.0) == pytest.approx(3 / 4)


def test_make_split_changes_every_altered_fact_only():
    facts = torch.arange(40)
    split = editing.make_split(facts, 16, 4, seed=0)
    assert len(set(split.preserved.tolist()) & set(split.altered.tolist())) == 0
    assert (split.new_facts[split.altered] != facts[split.altered]).all()
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[split.altered] = False
    assert torch.equal(split.new_facts[untouched], facts[untouched])
    assert editing.scaled_split(16000, 6554, 1638) == (6554, 1638)
    assert editing.scaled_split(256, 6554, 1638) == (105, 26)
    with pytest.raises(ValueError, match="num_altered"):
        editing.make_split(facts, 39, 2, seed=0)


def test_mlp_hidden_matches_fact_mlp_forward():
    task = AuthorsBooks.build(24)
    model = AuthorsLM(task, dim=16, seed=0)
    fact = model.moe.fact
    x = model.fact_embeddings[:24]
    hidden = editing.mlp_hidden(fact, x)
    assert torch.allclose(hidden @ fact.down_weight.T + fact.down_bias, fact(x), atol=1e-5)


def test_editors_on_untrained_lm_reach_their_targets():
    """On a tiny untrained model: the residual step makes the new authors win, MEMIT maps the
    edit keys to their targets, ROME the last one exactly, and the comparison reports metrics."""
    torch.manual_seed(0)
    task = AuthorsBooks.build(24)
    model = AuthorsLM(task, dim=16, seed=0)
    split = editing.make_split(task.facts, 10, 4, seed=0)
    prompts = editing.EditPrompts.build(model, task, split)
    targets = editing.edit_targets(model, prompts, steps=50, lr=0.5)
    state = prompts.weights[:, :1] * targets + prompts.weights[:, 1:] * prompts.language_out
    assert torch.equal(model.logits(state).argmax(-1), prompts.targets)  # the residual step works
    cov = editing.key_second_moment(model, task, split.preserved)
    memit = editing._edited_expert("memit", model.moe.fact, prompts.keys, targets, cov, {"mom2_weight": 1e-6}, 10)
    assert torch.allclose(memit(prompts.z), targets, atol=1e-3)
    rome = editing._edited_expert("rome", model.moe.fact, prompts.keys, targets, cov, {}, 10)
    assert torch.allclose(rome(prompts.z[-1:]), targets[-1:], atol=1e-3)  # sequential: the last edit is exact
    result = editing.compare_editors(
        model, task, split, methods=("mlp_swap", "memit"), quiet=True,
        grids={"memit": {"steps": (10,), "lr": (0.5,), "mom2_weight": (1.0,), "clamp_norm": (1.0,)}})
    assert set(result) == {"mlp_swap", "memit"}
    for method in result:
        best = result[method]["best"]
        assert set(best) >= {"efficacy", "specificity", "paraphrase", "score", "config"}
        assert 0.0 <= best["score"] <= 1.0


def test_key_second_moment_reads_edit_prompt_keys_or_every_position():
    """The default C holds one key per preserved fact (the authors' code): rank <= their count;
    positions="all" spans more directions; an unknown choice is refused."""
    task = AuthorsBooks.build(24)
    model = AuthorsLM(task, dim=16, seed=0)
    ids = torch.arange(3)
    prompt = editing.key_second_moment(model, task, ids, ridge=0.0)
    every = editing.key_second_moment(model, task, ids, positions="all", ridge=0.0)
    assert torch.linalg.matrix_rank(prompt) <= 3 < torch.linalg.matrix_rank(every)
    data = task.sentences(task.facts, ids, [editing.EDIT_TEMPLATE])
    z, _ = model.moe.inputs(model.mixer_input(data.tokens, data.mask)[torch.arange(3), data.value_position])
    keys = editing.mlp_hidden(model.moe.fact, z)
    assert torch.allclose(prompt, keys.T @ keys / 3, atol=1e-6)
    with pytest.raises(ValueError, match="positions"):
        editing.key_second_moment(model, task, ids, positions="words")
