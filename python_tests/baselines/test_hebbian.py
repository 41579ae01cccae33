"""Bilinear Hebbian MLPs (HazyResearch/hebbian-mlps) as capacity methods."""

import pytest
import torch

from factkernels.baselines import HebbianMLP, hebbian
from factkernels.capacity import fact_storage_cost, methods
from factkernels.cli import random_fact_set


@pytest.mark.parametrize("variant,facts,m", [("raw", 8, 512), ("ridge", 24, 64), ("data_dependent", 24, 32)])
def test_each_variant_stores_every_fact_of_a_small_case(variant, facts, m):
    K, V, f = random_fact_set(facts, facts, 16, seed=2, tied=True)
    mlp = hebbian(K, V, f, m, variant=variant, seed=1)
    assert isinstance(mlp, HebbianMLP) and torch.equal(mlp.predict(K, V), f)
    assert mlp.num_parameters == 2 * m * 16 + 16 * m and mlp(K).dtype == K.dtype


def test_ridge_readout_is_the_least_squares_fit_and_beats_raw():
    K, V, f = random_fact_set(48, 48, 16, seed=0, tied=True)
    raw, ridge = (hebbian(K, V, f, 64, variant=v, seed=0, ridge=0.0) for v in ("raw", "ridge"))
    assert torch.equal(raw.first, ridge.first)  # same random features
    features = ridge.features(K).double()
    expected = torch.linalg.lstsq(features, V.double()[f]).solution.T
    assert torch.allclose(ridge.readout.double(), expected, atol=1e-3)
    accuracy = [float((m.predict(K, V) == f).float().mean()) for m in (raw, ridge)]
    assert accuracy[1] == 1.0 > accuracy[0]


def test_data_dependent_features_store_more_than_random_ones_at_one_width():
    K, V, f = random_fact_set(64, 64, 16, seed=1, tied=True)
    accuracy = {v: float((hebbian(K, V, f, 16, variant=v).predict(K, V) == f).float().mean())
                for v in ("ridge", "data_dependent")}
    assert accuracy["data_dependent"] > accuracy["ridge"] + 0.3


def test_hebbian_cost_search_and_bad_arguments(tiny):
    K, V, f = tiny
    cost = fact_storage_cost("hebbian_ridge", K, V, f, seeds=2, progress=False)
    assert cost.size_name == "m" and cost.parameters == 3 * 16 * cost.size
    assert not next(t for t in cost.trace if t.size == cost.size - 1).stored
    assert {"hebbian_raw", "hebbian_ridge", "hebbian_data_dependent"} <= set(methods)
    with pytest.raises(ValueError, match="variant must be one of"):
        hebbian(K, V, f, 8, variant="whitened")
    with pytest.raises(ValueError, match="m must be a positive int"):
        hebbian(K, V, f, 0)
    with pytest.raises(ValueError, match="ridge must be a non-negative number"):
        hebbian(K, V, f, 8, ridge=-1.0)
