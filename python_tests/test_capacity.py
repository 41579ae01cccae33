"""Fact-storage cost: the search finds the boundary, the registry, per-method parameter counts, bad input."""

import pytest
import torch
from torch import nn

from factkernels import construct
from factkernels.capacity import Method, encoder_width_method, fact_storage_cost, methods
from factkernels.cli import random_fact_set


pytestmark = pytest.mark.usefixtures("one_thread")


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
    assert set(methods) == {"ours", "ntk", "ntk_u*", "gd", "gd+jl", "bin+gd", "gd+gd", "naive"}
    sizes = {"ours": 24, "ntk": 2048, "ntk_u*": 2048, "gd": 8, "gd+jl": 24, "bin+gd": 6, "gd+gd": 6, "naive": 0}
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
