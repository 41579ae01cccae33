"""Two-hot fact MLPs (seed 000, Construction 4.1): exact encoder, every fact stored, parameter count."""

import pytest
import torch

from factkernels import embeddings, ustar
from factkernels.twohot import TwoHotMLP, construct_two_hot, two_hot_keys


@pytest.mark.parametrize("tied", [True, False])
def test_two_hot_mlp_stores_every_fact(tied):
    dim = 8
    keys, _ = two_hot_keys(dim, dtype=torch.float64)
    values = keys if tied else embeddings.spherical(56, 12, generator=torch.Generator().manual_seed(0),
                                                  dtype=torch.float64)
    f = torch.randperm(56, generator=torch.Generator().manual_seed(1))
    mlp = construct_two_hot(values, f, dim)
    assert torch.equal(mlp.predict(keys, values), f) and float(mlp.margins(keys, values, f).min()) > 0
    assert mlp.num_parameters == mlp.m * dim * dim + values.shape[1] * mlp.m * dim
    assert mlp.m_search.startswith("auto")


def test_two_hot_codes_are_exact_so_storage_is_the_decoders():
    dim, m = 6, 40
    keys, _ = two_hot_keys(dim, dtype=torch.float64)
    values = embeddings.spherical(30, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    f = torch.randperm(30, generator=torch.Generator().manual_seed(3))
    mlp = construct_two_hot(values, f, dim, m=m, seed=4)
    outputs, _ = ustar.margin_optimal_outputs(values)
    projection = mlp.down_weight[:, ::dim]  # D: every d-th column of D·E
    torch.testing.assert_close(mlp(keys), outputs[f] @ projection @ projection.T, rtol=1e-10, atol=1e-12)


def test_two_hot_rejects_bad_input():
    keys, _ = two_hot_keys(4)
    with pytest.raises(ValueError, match=r"f must have shape \(12,\)"):
        construct_two_hot(keys, torch.arange(11), 4)
    with pytest.raises(ValueError, match="m must be a positive int or None"):
        construct_two_hot(keys, torch.arange(12), 4, m=0)
    with pytest.raises(ValueError, match="outputs must be one of"):
        construct_two_hot(keys, torch.arange(12), 4, outputs="codes")
    with pytest.raises(ValueError, match="up_weight must be"):
        TwoHotMLP(torch.zeros(7, 4), torch.zeros(4, 7))
