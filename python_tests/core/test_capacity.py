"""Fact-storage cost: the search finds the boundary, the registry, per-method parameter counts, bad input."""

import functools
import math

import pytest
import torch
from torch import nn

from factkernels import construct, geometry, ustar
from factkernels.capacity import Method, encoder_width_method, fact_storage_cost, methods, sampled_storage_cost
from factkernels.embeddings import family_fact_set, random_fact_set


class ToyModule(nn.Module):
    """Gets the first ``F − failures`` facts right and the rest wrong; 10 parameters per size unit."""

    def __init__(self, size: int, failures: int) -> None:
        super().__init__()
        self.size, self.failures = size, failures

    @property
    def num_parameters(self) -> int:
        return 10 * self.size

    def predict(self, K, V):
        f = self.facts.clone()
        if self.failures:
            f[-self.failures:] = (f[-self.failures:] + 1) % V.shape[0]
        return f


def toy_method(threshold_by_seed, failures_below=None):
    """A deterministic method: stores every fact iff size >= threshold_by_seed[seed]."""

    def build(K, V, f, size, seed):
        threshold = threshold_by_seed[seed]
        failures = 0 if size >= threshold else (failures_below(size) if failures_below else 1)
        module = ToyModule(size, failures)
        module.facts = f
        return module

    return build


def test_search_finds_the_boundary_of_a_deterministic_method(tiny):
    K, V, f = tiny
    cost = fact_storage_cost(toy_method({0: 37, 1: 37, 2: 37}), K, V, f, progress=False)
    assert cost.size == 37 and cost.parameters == 370 and cost.accuracies == [1.0, 1.0, 1.0]
    tried = {t.size: t.stored for t in cost.trace}
    assert tried[37] and not tried[36]  # the size found stores, size − 1 fails
    assert [t.size for t in cost.trace][:7] == [1, 2, 4, 8, 16, 32, 64]  # doubling, then bisection
    assert cost.seeds == [0, 1, 2] and cost.size_name == "size"


def test_success_is_the_minimum_over_seeds(tiny):
    K, V, f = tiny
    cost = fact_storage_cost(toy_method({0: 10, 1: 23, 2: 17}), K, V, f, start=8, progress=False)
    assert cost.size == 23
    failed = next(t for t in cost.trace if t.size == 22)
    assert not failed.stored and failed.accuracies == [1.0, 1 - 1 / 24]  # stops at the first failing seed


def test_eps_acc_tolerates_a_fraction_of_failures(tiny):
    K, V, f = tiny
    method = toy_method({0: 30}, failures_below=lambda size: 30 - size)  # 30 − size facts fail below 30
    assert fact_storage_cost(method, K, V, f, seeds=1, progress=False).size == 30
    cost = fact_storage_cost(method, K, V, f, seeds=1, eps_acc=3 / 24, progress=False)
    assert cost.size == 27 and cost.accuracies == [1 - 3 / 24]


def test_search_reports_when_no_size_stores(tiny):
    K, V, f = tiny
    cost = fact_storage_cost(toy_method({0: 100}), K, V, f, seeds=[0], max_size=40, progress=False)
    assert cost.size is None and cost.parameters is None and cost.accuracies == []
    assert [t.size for t in cost.trace] == [1, 2, 4, 8, 16, 32, 40]


def test_ours_boundary_over_m(tiny):
    K, V, f = tiny
    cost = fact_storage_cost("ours", K, V, f, seeds=1, progress=False)
    assert cost.method == "ours" and cost.size_name == "m" and cost.accuracies == [1.0]
    m = cost.size
    stored = construct(K, V, f, m=m, seed=0, verify="report", progress=False)
    below = construct(K, V, f, m=m - 1, seed=0, verify="report", progress=False)
    assert stored.report.accuracy == 1.0 and below.report.accuracy < 1.0
    assert cost.parameters == stored.num_parameters
    assert stored.num_parameters == 3 * stored.hidden_size * 16 + 2 * stored.hidden_size + 16


def test_ntk_cost_and_its_parameter_count(tiny):
    K, V, f = tiny
    cost = fact_storage_cost("ntk_u*", K, V, f, seeds=1, start=64, progress=False)
    assert cost.size_name == "hidden" and cost.parameters == 3 * cost.size * 16
    assert not next(t for t in cost.trace if t.size == cost.size - 1).stored


def test_naive_is_evaluated_once(tiny):
    K, V, f = tiny
    cost = fact_storage_cost("naive", K, V, f, progress=False)
    assert cost.size == 24 and cost.parameters == 2 * 16 * 24 + 24 and len(cost.trace) == 1


def test_registry_builders_return_storing_modules(tiny):
    K, V, f = tiny
    assert set(methods) == {"ours", "ntk", "ntk_u*", "gd", "gd+jl", "bin+gd", "gd+gd", "nongated", "naive", "hebbian_raw",
                            "hebbian_ridge", "hebbian_data_dependent"}
    sizes = {"ours": 24, "ntk": 2048, "ntk_u*": 2048, "gd": 8, "gd+jl": 24, "bin+gd": 6, "gd+gd": 6, "nongated": 24,
             "naive": 0, "hebbian_raw": 4096, "hebbian_ridge": 64, "hebbian_data_dependent": 48}
    options = {"gd": dict(lr=1e-2, final_lr=1e-4, steps=2000), "bin+gd": dict(decoder_steps=100),
               "gd+gd": dict(decoder_steps=100)}
    for name, method in methods.items():
        module = method(K, V, f, sizes[name], 0, **options.get(name, {}))
        assert torch.equal(module.predict(K, V), f), name
        assert module.num_parameters > 0


def test_encoder_width_step_of_the_two_step_search(tiny):
    K, V, f = tiny
    method = encoder_width_method("gd+gd", 6)
    cost = fact_storage_cost(method, K, V, f, seeds=1, start=6, max_size=8, progress=False, decoder_steps=50,
                             encoder_steps=200)
    assert cost.method == "gd+gd encoder width at m=6" and cost.size_name == "encoder hidden"
    assert cost.size is not None and cost.size <= 8
    assert cost.parameters == 3 * cost.size * 16 + 2 * cost.size + 16
    assert cost.size == 1 or not next(t for t in cost.trace if t.size == cost.size - 1).stored


def test_bad_arguments_are_rejected(tiny):
    K, V, f = tiny
    toy = toy_method({0: 3})
    with pytest.raises(ValueError, match="method must be one of"):
        fact_storage_cost("transformer", K, V, f)
    with pytest.raises(TypeError, match="method must be a name, a Method or a callable"):
        fact_storage_cost(3, K, V, f)
    with pytest.raises(TypeError, match="options .*steps.* can only be passed"):
        fact_storage_cost(toy, K, V, f, steps=3)
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        fact_storage_cost(toy, K, V, f, seeds=0)
    with pytest.raises(ValueError, match="seeds must be a positive int or a non-empty sequence"):
        fact_storage_cost(toy, K, V, f, seeds=[])
    with pytest.raises(ValueError, match="start must be a positive int"):
        fact_storage_cost(toy, K, V, f, start=0)
    with pytest.raises(ValueError, match="start=9 is above max_size=4"):
        fact_storage_cost(toy, K, V, f, start=9, max_size=4)
    with pytest.raises(ValueError, match=r"eps_acc must be in \[0, 1\)"):
        fact_storage_cost(toy, K, V, f, eps_acc=1.0)
    with pytest.raises(ValueError, match="V has duplicate rows"):
        fact_storage_cost(toy, K, torch.cat([V[:1], V[:-1]]), f)
    with pytest.raises(ValueError, match="name must be 'gd\\+jl' or 'gd\\+gd'"):
        encoder_width_method("ours", 4)
    with pytest.raises(ValueError, match="m must be a positive int"):
        encoder_width_method("gd+jl", 0)
    assert isinstance(methods["gd"], Method)


def test_sampled_cost_draws_one_fact_set_per_seed_and_takes_the_minimum():
    seen = []

    def build(K, V, f, size, seed):
        seen.append((seed, float(K[0, 0])))
        return toy_method({0: 5, 1: 9, 2: 7})(K, V, f, size, seed)

    def sample(seed):
        return random_fact_set(12, 12, 4, seed=seed, tied=True)

    cost = sampled_storage_cost(build, sample, seeds=3, progress=False)
    assert cost.size == 9 and cost.accuracies == [1.0, 1.0, 1.0]
    first_key = {seed: key for seed, key in seen}
    assert len(set(first_key.values())) == 3  # each seed built on its own fact set
    assert first_key[1] == float(sample(1).K[0, 0])


def test_prepare_runs_once_per_fact_set_and_given_options_win(tiny):
    K, V, f = tiny
    calls = []

    def prepare(K, V, f, options):
        calls.append(options)
        return {"scale": 2}

    def build(K, V, f, size, seed, scale):
        return toy_method({seed: 4 * scale})(K, V, f, size, seed)

    method = Method("toy", build, "size", start=1, prepare=prepare)
    assert fact_storage_cost(method, K, V, f, seeds=2, progress=False).size == 8 and len(calls) == 1
    assert fact_storage_cost(method, K, V, f, seeds=2, progress=False, scale=3).size == 12
    calls.clear()
    sampled_storage_cost(method, lambda seed: random_fact_set(8, 8, 4, seed=seed), seeds=3, progress=False)
    assert len(calls) == 3


def test_ours_prepares_the_outputs_of_the_whitened_values():
    K, V, f = family_fact_set("anisotropic-256", 48, 8, seed=0, dtype=torch.float64)
    prepared = methods["ours"].prepared(K, V, f, {"whiten": 1.0})
    torch.testing.assert_close(prepared["outputs"], ustar.margin_optimal_outputs(geometry.whiten(V, 1.0)[0])[0])
    plain = fact_storage_cost("ours", K, V, f, seeds=1, progress=False)
    whitened = fact_storage_cost("ours", K, V, f, seeds=1, whiten=1.0, progress=False)
    assert whitened.parameters < plain.parameters  # kappa = 256: whitening lowers the cost
    for cost, alpha in ((plain, 0.0), (whitened, 1.0)):
        mlp = construct(K, V, f, m=cost.size, whiten=alpha, seed=0, verify="report", progress=False)
        assert mlp.report.accuracy == 1.0 and mlp.num_parameters == cost.parameters


def test_sampled_cost_rejects_bad_samplers():
    with pytest.raises(TypeError, match="sample must be a callable"):
        sampled_storage_cost("ours", "spherical")
    with pytest.raises(ValueError, match="one size F"):
        sampled_storage_cost(toy_method({0: 1, 1: 1}), lambda seed: random_fact_set(8 + seed, 8 + seed, 4, seed=seed),
                             seeds=2, progress=False)


def test_nongated_cost_and_its_parameter_count(tiny):
    K, V, f = tiny
    cost = fact_storage_cost("nongated", K, V, f, seeds=1, progress=False)
    hidden = 2 * cost.size * math.ceil(1.5 * 24 / 17)
    assert cost.size_name == "m" and cost.parameters == 2 * hidden * 16 + hidden + 16
    assert not next(t for t in cost.trace if t.size == cost.size - 1).stored


def test_batched_gd_search_finds_the_size_of_the_one_at_a_time_search(tiny):
    K, V, f = tiny
    options = dict(lr=1e-2, final_lr=1e-4, steps=300)
    batched = fact_storage_cost("gd", K, V, f, seeds=2, start=2, progress=False, **options)
    looped = fact_storage_cost("gd", K, V, f, seeds=2, start=2, progress=False, batch=False, **options)
    assert batched.size == looped.size and batched.parameters == looped.parameters
    assert [t.size for t in batched.trace] == [t.size for t in looped.trace]
    for ours, theirs in zip(batched.trace, looped.trace):  # the loop skips the seeds after the first failure
        assert ours.stored == theirs.stored and ours.accuracies[:len(theirs.accuracies)] == theirs.accuracies


def threshold_method(f, batches, lookahead=True):
    """A batch-building method that stores every fact from size 13 on; ``batches`` records each batch's sizes."""

    class Threshold(torch.nn.Module):
        def __init__(self, size):
            super().__init__()
            self.size, self.num_parameters = size, 10 * size

        def predict(self, K, V):
            return f.clone() if self.size >= 13 else (f + 1) % V.shape[0]

    def build_batch(fact_sets, sizes, seeds, options):
        batches.append(sorted(set(sizes)))
        return [Threshold(size) for size in sizes]

    return Method("threshold", lambda K, V, f, size, seed: Threshold(size), "size", start=2, build_batch=build_batch,
                  lookahead=lookahead)


def test_batched_search_trains_the_sizes_ahead_in_few_rounds(tiny):
    K, V, f = tiny
    batches = []
    spec = threshold_method(f, batches)
    batched = fact_storage_cost(spec, K, V, f, seeds=2, progress=False)
    looped = fact_storage_cost(spec, K, V, f, seeds=2, progress=False, batch=False)
    assert batched.size == looped.size == 13 and batched.parameters == 130
    assert [t.size for t in batched.trace] == [t.size for t in looped.trace] == [2, 4, 8, 16, 12, 14, 13]
    assert batches == [[2, 4, 8], [16, 32, 64], [9, 10, 11, 12, 13, 14, 15]]  # 3 rounds for 7 sizes


def test_auto_batches_small_models_and_trains_large_ones_one_at_a_time(tiny, monkeypatch):
    import factkernels.capacity as capacity_module

    K, V, f = tiny
    batches = []
    searched = fact_storage_cost(threshold_method(f, batches), K, V, f, seeds=2, progress=False)  # batch="auto"
    assert searched.size == 13 and len(batches) == 3  # F·|V| = 24·24: batched, with lookahead
    monkeypatch.setattr(capacity_module, "SERIAL_LOGITS", K.shape[0] * V.shape[0])  # as if these were large
    batches.clear()
    serial = fact_storage_cost(threshold_method(f, batches), K, V, f, seeds=2, progress=False)
    assert batches == [] and [t.size for t in serial.trace] == [t.size for t in searched.trace]
    assert [len(t.accuracies) for t in serial.trace if not t.stored] == [1, 1, 1, 1]  # stops at the first failing seed
    sampled = sampled_storage_cost(threshold_method(f, batches), lambda seed: (K, V, f), seeds=2, progress=False)
    assert sampled.size == 13 and batches == [] and len(sampled.trace[0].accuracies) == 1
    with pytest.raises(ValueError, match="batch must be True, False or 'auto'"):
        fact_storage_cost("gd", K, V, f, seeds=1, progress=False, batch="yes")
    assert capacity_module._batches("auto", K.to("meta"), V.to("meta"))  # on a GPU (any device but the CPU): batched


def test_batched_search_without_lookahead_trains_only_the_sizes_it_asks_for(tiny):
    K, V, f = tiny
    batches = []
    searched = fact_storage_cost(threshold_method(f, batches, lookahead=False), K, V, f, seeds=2, progress=False)
    assert searched.size == 13 and [t.size for t in searched.trace] == [2, 4, 8, 16, 12, 14, 13]
    assert batches == [[2], [4], [8], [16], [12], [14], [13]]  # one size (both seeds) per round
    assert not methods["gd+jl"].lookahead and not methods["bin+gd"].lookahead and methods["gd"].lookahead


@pytest.mark.parametrize("batch", [True, False])
def test_jl_hybrid_search_solves_u_star_once_per_fact_set(monkeypatch, batch):
    import factkernels.baselines.gd_hybrids as gd_hybrids
    import factkernels.capacity as capacity_module
    solved, solve = [], ustar.margin_optimal_outputs

    def counting(values):
        solved.append(values.shape)
        return solve(values)

    monkeypatch.setattr(capacity_module, "margin_optimal_outputs", counting)
    monkeypatch.setattr(gd_hybrids.ustar, "margin_optimal_outputs", counting)
    sample = functools.partial(family_fact_set, "spherical", 24, 16)
    cost = sampled_storage_cost("gd+jl", sample, seeds=2, progress=False, batch=batch, encoder_steps=200)
    assert len(cost.trace) >= 3 and len(solved) == 2  # one per seed's fact set, however many sizes were tried
    assert cost.size is not None


def test_checkpointed_search_resumes_without_training_again(tiny, tmp_path):
    # A search stopped part-way (here: its builder raises at the fifth size) keeps the trials it finished;
    # run again with the same checkpoint it trains only the sizes it had not tried and finds the same size.
    K, V, f = tiny
    built = []

    def build(K, V, f, size, seed):
        if stop_after is not None and len(built) >= stop_after:
            raise KeyboardInterrupt  # the session ends
        built.append(size)
        return toy_method({0: 37, 1: 37})(K, V, f, size, seed)

    path = tmp_path / "partial" / "cell.json"
    stop_after = 4  # four failing sizes (one at a time, a size stops at its first failing seed)
    with pytest.raises(KeyboardInterrupt):
        fact_storage_cost(build, K, V, f, seeds=2, progress=False, checkpoint=path)
    first = list(built)
    assert sorted(set(first)) == [1, 2, 4, 8] and path.exists()
    built.clear()
    stop_after = None
    resumed = fact_storage_cost(build, K, V, f, seeds=2, progress=False, checkpoint=path)
    fresh = fact_storage_cost(toy_method({0: 37, 1: 37}), K, V, f, seeds=2, progress=False)
    assert resumed.size == fresh.size == 37
    assert resumed.trace == fresh.trace
    assert not set(built) & {1, 2, 4, 8}  # nothing the first run finished was trained again
    # another search (other options) in the same file keeps its own trials
    other = fact_storage_cost("ours", K, V, f, seeds=1, progress=False, checkpoint=path, width_multiplier=2.0)
    again = fact_storage_cost("ours", K, V, f, seeds=1, progress=False, checkpoint=path, width_multiplier=2.0)
    assert other.size == again.size and other.trace == again.trace
    assert other.size == fact_storage_cost("ours", K, V, f, seeds=1, progress=False, width_multiplier=2.0).size


def test_batched_checkpointed_search_skips_the_sizes_it_has(tiny, tmp_path):
    K, V, f = tiny
    batches = []
    spec = threshold_method(f, batches)
    path = tmp_path / "trials.json"
    first = fact_storage_cost(spec, K, V, f, seeds=2, progress=False, checkpoint=path)
    assert batches == [[2, 4, 8], [16, 32, 64], [9, 10, 11, 12, 13, 14, 15]]
    batches.clear()
    again = fact_storage_cost(spec, K, V, f, seeds=2, progress=False, checkpoint=path)
    assert batches == [] and again.size == first.size == 13 and again.trace == first.trace
