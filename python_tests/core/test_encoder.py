"""encoder.py: two-hot gadgets (Construction 4.1), one assembly for every builder, given gate features, the
encoder's outputs at its keys (verification and the deferred residual)."""

import pytest
import torch

from factkernels import _ops
from factkernels.decoder import code_margins, jl_decoder, verify_margins
from factkernels.encoder import (assemble, augment, build_shared_gate, encoder_codes, sample_gate, two_hot_gadgets,
                                 two_hot_keys)


def test_two_hot_keys_are_every_ordered_pair():
    keys, pairs = two_hot_keys(4)
    assert keys.shape == (12, 4) and pairs.shape == (12, 2)
    assert torch.equal(keys.sum(1), torch.zeros(12)) and torch.equal(keys.abs().sum(1), torch.full((12,), 2.0))
    assert len({tuple(p) for p in pairs.tolist()}) == 12 and all(i != j for i, j in pairs.tolist())
    rows = keys[torch.arange(12), pairs[:, 0]], keys[torch.arange(12), pairs[:, 1]]
    assert torch.equal(rows[0], torch.ones(12)) and torch.equal(rows[1], -torch.ones(12))


def test_two_hot_gadgets_hit_any_targets_exactly():
    dim, m = 6, 3
    keys, _ = two_hot_keys(dim, dtype=torch.float64)
    targets = torch.randn(dim * (dim - 1), m, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    up = two_hot_gadgets(targets, dim)  # (m, d, d)
    assert up.shape == (m, dim, dim) and torch.equal(up.diagonal(dim1=1, dim2=2), torch.zeros(m, dim))
    codes = torch.einsum("kp,jpq,kq->kj", torch.relu(keys), up, keys)  # 1ᵀ[ReLU(x) ⊙ A_j x]
    torch.testing.assert_close(codes, targets, rtol=0, atol=1e-12)


def test_two_hot_inputs_are_checked():
    with pytest.raises(ValueError, match="dim must be an int >= 2"):
        two_hot_keys(1)
    with pytest.raises(ValueError, match=r"targets must have shape \(12, m\)"):
        two_hot_gadgets(torch.zeros(11, 2), 4)


def test_given_gate_and_features_are_used(small_facts):
    K, V, f = small_facts
    targets = torch.randn(K.shape[0], 4, generator=torch.Generator().manual_seed(1), dtype=K.dtype)
    gate = sample_gate(K, 12, torch.Generator().manual_seed(2))
    features = torch.tanh(K @ gate[0].T) + 0.5  # any generic features of that gate
    enc = build_shared_gate(K, targets, width_multiplier=1.5, activation="silu", solver="cholesky",
                            generator=torch.Generator(), gate=gate, features=features)
    assert enc.gadget_width == 12 and torch.equal(enc.gate_weight, gate[0])
    fitted = _ops.gadget_matvec(features, augment(K), enc.coefficients) + enc.output_bias
    torch.testing.assert_close(fitted, targets, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="pass that gate too"):
        build_shared_gate(K, targets, width_multiplier=1.5, activation="silu", solver="cholesky",
                          generator=torch.Generator(), features=features)
    with pytest.raises(ValueError, match=r"features must have shape \(96, 12\)"):
        build_shared_gate(K, targets, width_multiplier=1.5, activation="silu", solver="cholesky",
                          generator=torch.Generator(), gate=gate, features=features[:, :5])


def test_assemble_is_decoder_times_encoder_with_whitening_folded(small_facts):
    K, V, f = small_facts
    gen = torch.Generator().manual_seed(3)
    decoder = jl_decoder(V, 8, gen)
    enc = build_shared_gate(K, decoder.codes[f], width_multiplier=1.5, activation="silu", solver="cholesky",
                            generator=gen)
    mlp = assemble(enc, decoder.projection, activation="silu")
    codes = _ops.gadget_matvec(_ops.activate(K @ enc.gate_weight.T, "silu"), augment(K), enc.coefficients)
    torch.testing.assert_close(mlp(K), (codes + enc.output_bias) @ decoder.projection.T)
    w_key = torch.diag(torch.linspace(0.5, 2.0, K.shape[1], dtype=K.dtype))
    w_value = torch.diag(torch.linspace(1.0, 3.0, V.shape[1], dtype=K.dtype))
    folded = assemble(enc, decoder.projection, activation="silu", key_transform=w_key, value_transform=w_value)
    torch.testing.assert_close(folded(K @ torch.linalg.inv(w_key)), mlp(K) @ w_value.T)


def test_encoder_codes_are_the_mlp_outputs_before_the_projection(small_facts):
    K, V, f = small_facts
    gen = torch.Generator().manual_seed(4)
    decoder = jl_decoder(V, 8, gen)
    enc = build_shared_gate(K, decoder.codes[f], width_multiplier=1.5, activation="gelu", solver="cholesky",
                            generator=gen, codes=True)
    mlp = assemble(enc, decoder.projection, activation="gelu")
    for chunk in (7, 4096):  # chunked or not, the same outputs
        codes = encoder_codes(enc, K, activation="gelu", chunk=chunk)
        torch.testing.assert_close(codes @ decoder.projection.T, mlp(K))
    torch.testing.assert_close(enc.codes, codes)
    torch.testing.assert_close(enc.codes, decoder.codes[f], rtol=1e-8, atol=1e-8)  # float64 keys: stored exactly


def test_a_deferred_solve_measures_its_residual_on_the_weights(medium_facts):
    # ||enc(K) − O|| / ||O|| is the dual residual ||Gα − O|| / ||O|| in exact arithmetic: float32 keeps both small
    K, V, f = medium_facts
    gen = torch.Generator().manual_seed(5)
    targets = jl_decoder(V, 24, gen).codes[f]
    gate = sample_gate(K, 12, gen)
    enc = build_shared_gate(K, targets, width_multiplier=1.5, activation="silu", solver="cholesky",
                            generator=gen, gate=gate, deferred=True)
    assert bool(enc.solve.accepted) and enc.codes.shape == targets.shape
    residual = float(enc.solve.residual)
    torch.testing.assert_close(residual, float((enc.codes - targets).norm() / targets.norm()))
    exact = build_shared_gate(K.double(), targets.double(), width_multiplier=1.5, activation="silu",
                              solver="cholesky", generator=gen, gate=(gate[0].double(), gate[1].double()))
    assert exact.solve.residual < 1e-10 and 0 < residual < 1e-4


@pytest.mark.parametrize("m", [8, 40])  # scores in the code space (m < d_out = 16), or in the value space
def test_code_margins_are_the_margins_of_the_assembled_mlp(small_facts, m):
    K, V, f = small_facts
    gen = torch.Generator().manual_seed(6)
    decoder = jl_decoder(V, m, gen)
    enc = build_shared_gate(K, decoder.codes[f], width_multiplier=1.5, activation="silu", solver="cholesky",
                            generator=gen, codes=True)
    w_value = torch.diag(torch.linspace(1.0, 3.0, V.shape[1], dtype=K.dtype))
    for transform in (None, w_value):
        mlp = assemble(enc, decoder.projection, activation="silu", value_transform=transform)
        projection = decoder.projection if transform is None else transform @ decoder.projection
        margins = code_margins(enc.codes, projection, V, f)
        torch.testing.assert_close(margins, verify_margins(mlp, K, V, f))
    nan_codes = enc.codes.clone()
    nan_codes[0, 0] = float("nan")
    assert not bool(code_margins(nan_codes, decoder.projection, V, f)[0] > 0)  # NaN is never stored
