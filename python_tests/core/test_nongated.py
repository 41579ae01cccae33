"""Non-gated gadgets (Alg. 8): storage, the finite-difference structure, the derivative, bad input."""

import math

import pytest
import torch

from factkernels import construct
from factkernels.encoder import gadget_width
from factkernels.nongated import NonGatedMLP, activation_derivative, construct_nongated


@pytest.mark.parametrize("activation", ["silu", "tanh", "softplus"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nongated_mlp_stores_every_fact(small_facts, activation, dtype):
    K, V, f = (t.to(dtype) if t.is_floating_point() else t for t in small_facts)
    mlp = construct_nongated(K, V, f, 24, activation=activation)
    assert isinstance(mlp, NonGatedMLP) and torch.equal(mlp.predict(K, V), f)
    assert bool((mlp.margins(K, V, f) > 0).all())
    h = 2 * 24 * gadget_width(96, 16, 1.5)  # two σ units per σ' unit of the gated gadgets
    assert mlp.hidden_size == h and mlp.num_parameters == 2 * h * 16 + h + 16


def test_finite_differences_approach_the_gated_derivative_gadget(small_facts):
    K, V, f = small_facts
    coarse = construct_nongated(K, V, f, 16, tol=1e-3)
    fine = construct_nongated(K, V, f, 16, tol=1e-7)
    assert 0 < fine.approximation_error < 1e-5 < coarse.approximation_error
    # units come in pairs (g + εa, g − εa) around the shared gate, with output weights ±1/(2ε)
    half = coarse.hidden_size // 2
    centre = (coarse.up_weight[:half] + coarse.up_weight[half:]) / 2
    width = gadget_width(96, 16, 1.5)
    assert torch.allclose(centre, centre[:width].repeat(16, 1), atol=1e-12)
    assert torch.allclose(coarse.down_weight[:, :half], -coarse.down_weight[:, half:])
    # same seed, same MLP
    assert torch.equal(construct_nongated(K, V, f, 16, tol=1e-3).up_weight, coarse.up_weight)


def test_activation_derivative_matches_closed_forms():
    z = torch.linspace(-4, 4, 41, dtype=torch.float64)
    s = torch.sigmoid(z)
    assert torch.allclose(activation_derivative(z, "softplus"), s, atol=1e-14)
    assert torch.allclose(activation_derivative(z, "tanh"), 1 - torch.tanh(z) ** 2, atol=1e-14)
    assert torch.allclose(activation_derivative(z, "silu"), s * (1 + z * (1 - s)), atol=1e-14)


def test_nongated_matches_the_gated_construction_in_storage(small_facts):
    K, V, f = small_facts
    gated = construct(K, V, f, m=24, progress=False)
    nongated = construct_nongated(K, V, f, 24)
    assert torch.equal(gated.predict(K, V), nongated.predict(K, V))


def test_nongated_rejects_bad_input(small_facts):
    K, V, f = small_facts
    with pytest.raises(ValueError, match="m must be a positive int"):
        construct_nongated(K, V, f, 0)
    with pytest.raises(ValueError, match="outputs must be one of"):
        construct_nongated(K, V, f, 8, outputs="u*")
    with pytest.raises(ValueError, match="ReLU is not analytic"):
        construct_nongated(K, V, f, 8, activation="relu")
    with pytest.raises(ValueError, match="width_multiplier must be >= 1"):
        construct_nongated(K, V, f, 8, width_multiplier=0.5)
    with pytest.raises(ValueError, match="tol must be a positive number"):
        construct_nongated(K, V, f, 8, tol=0.0)
    with pytest.raises(ValueError, match="f must have shape"):
        construct_nongated(K, V, f[:5], 8)
    K32, V32 = K.float(), V.float()
    with pytest.raises(RuntimeError, match="use float64"):
        construct_nongated(K32, V32, f, 8, tol=1e-12)
    assert math.isfinite(construct_nongated(K32, V32, f, 8, tol=1e-3).approximation_error)
