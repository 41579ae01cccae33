"""Baselines: NTK (Alg. 5), naïve (B.3.1), GD MLP, GD encoder/decoder hybrids, the training loop."""

import importlib
import math

import numpy as np
import pytest
import torch

from factkernels import FactMLP, baselines
from factkernels.baselines import gd_swiglu
from factkernels.baselines.batched_adam import fit
from factkernels.baselines.stacked_swiglu import all_decoded, all_decoded_near, batched_cross_entropy, decoding_radii
from factkernels.baselines.ntk import hermite_coefficient, normalized_hermite
from factkernels.embeddings import random_fact_set

ntk_module = importlib.import_module("factkernels.baselines.ntk")  # the package's name ntk is the function

# Fast GD settings for tests: a larger learning rate than the seed's 1e-3 reaches 100% in ~100 steps.
FAST_GD = dict(lr=1e-2, final_lr=1e-4, steps=2000)


def accuracy(module, K, V, f) -> float:
    return float((module.predict(K, V) == f).float().mean())


# ----------------------------------------------------------------------------- NTK


def test_normalized_hermite_is_orthonormal():
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    z = torch.from_numpy(nodes)
    basis = torch.stack([normalized_hermite(z, k) for k in range(7)]).numpy()  # (7, nodes)
    gram = (basis * weights) @ basis.T / math.sqrt(2 * math.pi)
    assert np.allclose(gram, np.eye(7), atol=1e-10)


def test_silu_hermite_coefficients():
    # SiLU(z) − z/2 = (z/2) tanh(z/2) is even: c_1 = 1/2 and every higher odd coefficient vanishes.
    assert hermite_coefficient("silu", 1) == pytest.approx(0.5, abs=1e-12)
    assert abs(hermite_coefficient("silu", 3)) < 1e-12 and abs(hermite_coefficient("silu", 5)) < 1e-12
    assert hermite_coefficient("silu", 2) > 0.2 and hermite_coefficient("silu", 4) < 0


@pytest.mark.parametrize("margin_optimal", [False, True])
def test_ntk_stores_every_fact(tiny, margin_optimal):
    K, V, f = tiny
    mlp = baselines.ntk(K, V, f, hidden=2048, margin_optimal=margin_optimal)
    assert isinstance(mlp, FactMLP) and accuracy(mlp, K, V, f) == 1.0
    assert mlp.num_parameters == 3 * 2048 * 16  # gate, up, down; no biases
    assert mlp.gate_bias is None and mlp.up_bias is None and mlp.down_bias is None


@pytest.mark.parametrize("block_units", [None, 7])  # one block of every unit; blocks of 7 (the last one short)
def test_ntk_follows_algorithm_5(tiny, monkeypatch, block_units):
    K, V, f = tiny
    if block_units:
        monkeypatch.setattr(ntk_module, "_BLOCK_ELEMENTS", block_units * K.shape[0])
    h = 300
    mlp = baselines.ntk(K, V, f, hidden=h, degree=2)
    P = mlp.down_weight  # (d, h) with unit-norm columns
    assert torch.allclose(P.norm(dim=0), torch.ones(h), atol=1e-6)
    H = normalized_hermite(K @ mlp.gate_weight.T, 2)  # (F, h)
    A = V[f] @ P  # (F, h)
    up = torch.einsum("ir,ir,ic->rc", H, A, K) / h  # W_up[r] = (1/h) Σ_i H_ir A_ir k_i
    assert torch.allclose(mlp.up_weight, up, atol=1e-6)
    assert mlp.activation == "silu"
    # same seed, same MLP; another seed, another gate
    assert torch.equal(baselines.ntk(K, V, f, hidden=h, degree=2).up_weight, mlp.up_weight)
    assert not torch.equal(baselines.ntk(K, V, f, hidden=h, seed=1).gate_weight, mlp.gate_weight)


def test_ntk_negative_hermite_coefficient_keeps_the_sign(tiny):
    """For c_4 < 0 the output still points at the value (W_up carries sign(c_k))."""
    K, V, f = tiny
    mlp = baselines.ntk(K, V, f, hidden=4096, degree=4)
    assert float((mlp(K) * V[f]).sum(1).mean()) > 0


def test_ntk_rejects_bad_options(tiny):
    K, V, f = tiny
    with pytest.raises(ValueError, match=r"degree=3 .*silu.*\[1, 2, 4"):
        baselines.ntk(K, V, f, hidden=64, degree=3)
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        baselines.ntk(K, V, f, hidden=0)
    with pytest.raises(ValueError, match="degree must be a non-negative int"):
        baselines.ntk(K, V, f, hidden=64, degree=-1)
    with pytest.raises(ValueError, match="ReLU is not analytic"):
        baselines.ntk(K, V, f, hidden=64, activation="relu")
    with pytest.raises(ValueError, match="f must have shape"):
        baselines.ntk(K, V, f[:-1], hidden=64)


# ----------------------------------------------------------------------------- naïve


def test_naive_retrieves_values_exactly(tiny):
    K, V, f = tiny
    mlp = baselines.naive(K, V, f)
    assert torch.allclose(mlp(K), V[f], atol=1e-5)  # g(k_i) = v_f(i)
    assert accuracy(mlp, K, V, f) == 1.0 and bool((mlp.margins(K, V, f) > 0).all())
    F, d = K.shape
    assert mlp.hidden_size == F and mlp.num_parameters == 2 * d * F + F


def test_naive_margin_optimal_outputs_store_anisotropic_values():
    K, V, f = random_fact_set(32, 32, 8, seed=3, kappa=10)  # values not unit norm
    assert accuracy(baselines.naive(K, V, f), K, V, f) < 1.0  # some v_j is not its own best match
    assert accuracy(baselines.naive(K, V, f, outputs="margin_optimal"), K, V, f) == 1.0


def test_naive_rejects_dominated_keys_and_bad_outputs(tiny):
    K = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    V = torch.eye(3, 2) + torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="K row 0 is not its own best match"):
        baselines.naive(K, V, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="outputs must be one of"):
        baselines.naive(*tiny, outputs="u*")


# ----------------------------------------------------------------------------- the training loop


def test_fit_stops_each_model_before_the_step_that_would_follow_success():
    seen = []

    def objective(params, active):
        (x,) = params
        seen.append((active.tolist(), x.detach()[:, 0].tolist()))
        return (x - 1).square().sum(1), x.detach()[:, 0] < 1.5

    start = torch.tensor([[2.0], [3.0]])
    (final,), results = fit([start], objective, steps=1000, lr=0.1, final_lr=0.1, progress=False)
    assert all(r.solved and 0 < r.steps < 1000 for r in results) and results[0].steps < results[1].steps
    assert len(seen) == results[1].steps + 1 and seen[-1][0] == [1]  # model 0 left the batch when it finished
    assert float(final[0, 0]) == seen[results[0].steps][1][0] < 1.5  # no update after success
    assert float(final[1, 0]) == seen[-1][1][0] < 1.5

    (y,), results = fit([torch.tensor([[5.0]])], lambda p, a: (p[0].square().sum(1), torch.tensor([False])),
                        steps=50, lr=0.1, final_lr=1e-3, progress=False)
    assert not results[0].solved and results[0].steps == 50 and results[0].loss < 25.0


def test_fit_takes_torch_adams_steps_with_a_cosine_rate():
    x0 = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    (ours,), _ = fit([x0], lambda p, a: ((p[0] ** 4).sum(1), torch.zeros(3, dtype=torch.bool)), steps=30, lr=0.05,
                     final_lr=1e-3, progress=False)
    x = x0.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([x], lr=0.05)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=30, eta_min=1e-3)
    for _ in range(30):
        optimizer.zero_grad()
        (x ** 4).sum().backward()
        optimizer.step()
        schedule.step()
    assert torch.allclose(ours, x.detach(), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- GD MLP


def test_cross_entropy_matches_torch_in_value_gradient_and_hit_test():
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 7, generator=generator, dtype=torch.float64) * 4).requires_grad_(True)
    targets = torch.randint(0, 7, (3, 5), generator=generator)
    targets[0] = logits[0].argmax(1)  # some rows hit, the rest (mostly) miss
    loss, hit = batched_cross_entropy(logits, targets)
    expected = torch.nn.functional.cross_entropy(logits.reshape(15, 7), targets.reshape(15), reduction="none")
    assert torch.allclose(loss, expected.view(3, 5), atol=1e-12)
    assert torch.equal(hit, logits.argmax(2) == targets) and bool(hit[0].all()) and not bool(hit.all())
    weights = torch.rand(3, 5, generator=generator, dtype=torch.float64)
    (ours,) = torch.autograd.grad((loss * weights).sum(), logits)
    (theirs,) = torch.autograd.grad((expected.view(3, 5) * weights).sum(), logits)
    assert torch.allclose(ours, theirs, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: batched_cross_entropy(x, targets)[0], (logits,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cross_entropy_of_far_apart_logits_matches_torch(dtype):
    # trained logits sit hundreds apart; below _ops.XENT_EXP_FLOOR under the row max ours counts them at the floor
    generator = torch.Generator().manual_seed(1)
    logits = (torch.randn(4, 6, 9, generator=generator, dtype=dtype) * 200).requires_grad_(True)
    targets = torch.randint(0, 9, (4, 6), generator=generator)
    loss, _ = batched_cross_entropy(logits, targets)
    expected = torch.nn.functional.cross_entropy(logits.reshape(24, 9), targets.reshape(24), reduction="none")
    assert torch.allclose(loss, expected.view(4, 6), rtol=1e-6, atol=1e-12)
    (ours,) = torch.autograd.grad(loss.sum(), logits)
    (theirs,) = torch.autograd.grad(expected.sum(), logits)
    assert float((logits.detach().amax(2, keepdim=True) - logits.detach() > 90).float().mean()) > 0.5
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-30)


def test_decoding_radii_are_the_distance_to_the_nearest_decoding_boundary():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(2, 12, 5, generator=generator)
    values[1, 3] = values[1, 7]  # a duplicate value: a tie, radius 0
    values[1, 5] = values[1, 6] * 0.5  # v_5 = v_6 / 2 never wins its own argmax: radius < 0
    targets = torch.randint(0, 12, (2, 9), generator=generator)
    targets[1, :3] = torch.tensor([3, 5, 6])
    radii = decoding_radii(values, targets)
    for b in range(2):
        for i, t in enumerate(targets[b].tolist()):
            v = values[b].double()
            others = [j for j in range(12) if j != t]
            expected = min(float(v[t] @ (v[t] - v[j]) / (v[t] - v[j]).norm()) if (v[t] - v[j]).norm() > 0 else 0.0
                           for j in others)
            assert float(radii[b, i]) == pytest.approx(expected, abs=1e-5)
    assert float(radii[1, 0]) == 0.0 and float(radii[1, 1]) < 0 < float(radii[1, 2])


def test_all_decoded_near_agrees_with_the_full_logits():
    generator = torch.Generator().manual_seed(1)
    values = torch.nn.functional.normalize(torch.randn(3, 40, 6, generator=generator), dim=2)
    targets = torch.stack([torch.randperm(40, generator=generator)[:30] for _ in range(3)])
    wanted = torch.gather(values, 1, targets.unsqueeze(2).expand(-1, -1, 6))
    radii = decoding_radii(values, targets)
    seen = set()
    for noise in (0.0, 0.05, 0.2, 0.5, 1.0, 3.0):  # from every row settled by its radius to most rows failing
        for trial in range(20):
            outputs = wanted + noise * torch.randn(wanted.shape, generator=generator)
            errors = (outputs - wanted).square().sum(2)
            full = all_decoded(outputs, values, targets)
            assert torch.equal(all_decoded_near(outputs, values, targets, errors, radii), full)
            seen.update(full.tolist())
    assert seen == {True, False}


def test_gd_mlp_stores_and_stops_early(tiny):
    K, V, f = tiny
    mlp = baselines.gd_mlp(K, V, f, hidden=8, progress=False, **FAST_GD)
    assert isinstance(mlp, FactMLP) and accuracy(mlp, K, V, f) == 1.0
    result = mlp.fit_results["mlp"]
    assert result.solved and result.steps < FAST_GD["steps"]
    d = K.shape[1]
    assert mlp.num_parameters == 3 * 8 * d + 2 * 8 + d
    assert not any(p.requires_grad for p in mlp.parameters())


def test_gd_mlp_loss_kernel_trains_the_twins_model(tiny):
    # the compiled cross-entropy and its torch twin differ by exp rounding: the same steps, nearly the same weights
    K, V, f = tiny
    kernel, twin = (baselines.gd_mlp(K, V, f, hidden=6, steps=300, lr=1e-2, seed=0, progress=False, backend=b)
                    for b in ("kernels", "torch"))
    assert kernel.fit_results["mlp"].steps == twin.fit_results["mlp"].steps
    for a, b in zip(kernel.parameters(), twin.parameters()):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4)
    with pytest.raises(ValueError, match="backend must be one of"):
        baselines.gd_mlp(K, V, f, hidden=6, steps=3, progress=False, backend="cuda")


def test_gd_mlp_mse_pulls_outputs_onto_the_values(tiny):
    K, V, f = tiny
    mlp = baselines.gd_mlp(K, V, f, hidden=8, loss="mse", progress=False, **FAST_GD)
    assert accuracy(mlp, K, V, f) == 1.0 and mlp.fit_results["mlp"].solved
    start = baselines.gd_mlp(K, V, f, hidden=8, loss="mse", steps=1, progress=False)
    assert (mlp(K) - V[f]).norm() < 0.5 * (start(K) - V[f]).norm()


def test_gd_mlp_trained_until_converged_runs_its_schedule_past_storage(tiny, monkeypatch):
    K, V, f = tiny
    stored = baselines.gd_mlp(K, V, f, hidden=8, loss="mse", progress=False, **FAST_GD)
    converged = baselines.gd_mlp(K, V, f, hidden=8, loss="mse", until="converged", progress=False, **FAST_GD)
    first, last = stored.fit_results["mlp"], converged.fit_results["mlp"]
    assert first.steps < FAST_GD["steps"] and last.steps == FAST_GD["steps"]  # the loss never reaches 1e-7 here
    assert last.solved and accuracy(converged, K, V, f) == 1.0  # "solved" still says: stores every fact
    assert last.loss < 0.8 * first.loss  # width 8 cannot reach the values exactly, but gets closer
    # a loss at or below the cutoff stops a model at once, and then it stores nothing: solved is False
    monkeypatch.setattr(gd_swiglu, "CONVERGED_LOSS", 1e9)
    for loss in ("ce", "mse"):
        stopped = baselines.gd_mlp(K, V, f, hidden=8, loss=loss, until="converged", progress=False, **FAST_GD)
        assert stopped.fit_results["mlp"].steps == 0 and not stopped.fit_results["mlp"].solved
    with pytest.raises(ValueError, match="until"):
        baselines.gd_mlp(K, V, f, hidden=8, until="forever", progress=False)


def test_gd_mlp_is_seeded_and_follows_the_input_dtype(tiny):
    K, V, f = (t.double() if t.is_floating_point() else t for t in tiny)
    a, b, c = (baselines.gd_mlp(K, V, f, hidden=8, steps=5, seed=s, progress=False) for s in (0, 0, 1))
    assert torch.equal(a.up_weight, b.up_weight) and not torch.equal(a.up_weight, c.up_weight)
    assert a.up_weight.dtype == torch.float64 and a.fit_results["mlp"].steps == 5


@pytest.mark.cuda
def test_gd_mlp_runs_on_the_inputs_device(tiny):
    K, V, f = (t.cuda() for t in tiny)
    mlp = baselines.gd_mlp(K, V, f, hidden=8, progress=False, **FAST_GD)
    assert mlp.up_weight.is_cuda and accuracy(mlp, K, V, f) == 1.0


def test_gd_rejects_bad_options(tiny):
    K, V, f = tiny
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        baselines.gd_mlp(K, V, f, hidden=0)
    with pytest.raises(ValueError, match="loss must be one of"):
        baselines.gd_mlp(K, V, f, hidden=8, loss="hinge")
    with pytest.raises(ValueError, match="steps must be a positive int"):
        baselines.gd_mlp(K, V, f, hidden=4, steps=0)
    with pytest.raises(ValueError, match="final_lr must be in"):
        baselines.gd_mlp(K, V, f, hidden=4, lr=1e-3, final_lr=1e-2)
    with pytest.raises(ValueError, match="K contains NaN"):
        baselines.gd_mlp(torch.full_like(K, math.nan), V, f, hidden=4)
    with pytest.raises(ValueError, match=r"targets must be a \(24, m\) tensor"):
        baselines.gd_encoder(K, torch.zeros(23, 4), hidden=4)
    with pytest.raises(ValueError, match="key_noise must be a non-negative number"):
        baselines.gd_encoder(K, torch.zeros(24, 4), hidden=4, key_noise=-1.0)
    with pytest.raises(ValueError, match=r"used must be a non-empty 1-D tensor of value indices in \[0, 24\)"):
        baselines.gd_decoder(V, torch.tensor([0, 24]), 4)


# ----------------------------------------------------------------------------- GD encoder / decoder


def test_gd_decoder_decodes_every_used_value(tiny):
    _, V, f = tiny
    used = torch.unique(f)
    decoder, result = baselines.gd_decoder(V, used, 4, steps=100, progress=False)
    assert decoder.projection.shape == (16, 4) and decoder.codes.shape == (24, 4)
    assert torch.allclose(decoder.codes.norm(dim=1), torch.ones(24), atol=1e-5)
    decoded = (decoder.codes[used] @ decoder.projection.T @ V.T).argmax(1)
    assert torch.equal(decoded, used) and result.steps == 100


def test_gd_encoder_fits_codes(tiny):
    K, _, _ = tiny
    targets = torch.randn(24, 3, generator=torch.Generator().manual_seed(0))
    encoder, result = baselines.gd_encoder(K, targets, hidden=32, steps=200, progress=False)
    assert encoder(K).shape == (24, 3) and result.steps == 200 and not result.solved
    assert float((encoder(K) - targets).square().sum(1).mean()) < 1e-3 * float(targets.square().sum(1).mean())


@pytest.mark.parametrize("encoder,decoder,m", [("bin", "jl", 24), ("gd", "jl", 24), ("bin", "gd", 6),
                                               ("gd", "gd", 6)])
def test_hybrids_store_every_fact(tiny, encoder, decoder, m):
    K, V, f = tiny
    mlp = baselines.encoder_decoder(K, V, f, m, encoder=encoder, decoder=decoder, decoder_steps=100, progress=False)
    assert isinstance(mlp, FactMLP) and accuracy(mlp, K, V, f) == 1.0
    F, d = K.shape
    if encoder == "gd":  # h = ⌈m F/d⌉, down = D·E folded into (d, h)
        h = math.ceil(m * F / d)
        assert mlp.hidden_size == h and mlp.num_parameters == 3 * h * d + 2 * h + d
        assert mlp.fit_results["encoder"].solved
    if decoder == "gd":
        assert mlp.fit_results["decoder"].steps == 100


def test_hybrid_encoder_width(tiny):
    K, V, f = tiny
    mlp = baselines.encoder_decoder(K, V, f, 6, encoder_hidden=20, encoder_steps=5, progress=False)
    assert mlp.hidden_size == 20
    mlp = baselines.encoder_decoder(K, V, f, 6, width_multiplier=2.0, encoder_steps=5, progress=False)
    assert mlp.hidden_size == math.ceil(2.0 * 6 * 24 / 16)


def test_hybrids_reject_bad_options(tiny):
    K, V, f = tiny
    with pytest.raises(ValueError, match="encoder must be one of"):
        baselines.encoder_decoder(K, V, f, 8, encoder="ntk")
    with pytest.raises(ValueError, match="decoder must be one of"):
        baselines.encoder_decoder(K, V, f, 8, decoder="bin")
    with pytest.raises(ValueError, match="m must be a positive int"):
        baselines.encoder_decoder(K, V, f, 0)
    with pytest.raises(ValueError, match="encoder_hidden sets the GD encoder's width"):
        baselines.encoder_decoder(K, V, f, 8, encoder="bin", encoder_hidden=10)
    with pytest.raises(ValueError, match="width_multiplier must be a positive number"):
        baselines.encoder_decoder(K, V, f, 8, width_multiplier=-1.0)


# ----------------------------------------------------------------------------- batches == loops


def _fact_sets(count: int):
    return [tuple(t.double() if t.is_floating_point() else t for t in random_fact_set(24, 24, 16, seed=s, tied=True))
            for s in range(count)]


def test_gd_mlp_batch_trains_the_models_one_call_each_trains():
    sets = _fact_sets(3)
    hiddens, seeds = [6, 10, 8], [0, 1, 0]  # widths differ: the batch pads them to 10
    batch = baselines.gd_mlp_batch(sets, hiddens, seeds, progress=False, **FAST_GD)
    for (K, V, f), hidden, seed, mlp in zip(sets, hiddens, seeds, batch):
        alone = baselines.gd_mlp(K, V, f, hidden, seed=seed, progress=False, **FAST_GD)
        assert mlp.fit_results["mlp"].steps == alone.fit_results["mlp"].steps
        assert mlp.fit_results["mlp"].solved == alone.fit_results["mlp"].solved
        assert mlp.up_weight.shape == (hidden, 16) and mlp.down_weight.shape == (16, hidden)
        for ours, theirs in zip(mlp.parameters(), alone.parameters()):
            assert torch.allclose(ours, theirs, rtol=1e-8, atol=1e-10)
        assert torch.equal(mlp.predict(K, V), alone.predict(K, V))
    assert len({m.fit_results["mlp"].steps for m in batch}) > 1  # the models did stop at different steps


@pytest.mark.parametrize("encoder,decoder", [("gd", "jl"), ("bin", "gd"), ("gd", "gd")])
def test_hybrid_batch_builds_the_models_one_call_each_builds(encoder, decoder):
    sets, seeds = _fact_sets(2), [4, 5]
    options = dict(encoder=encoder, decoder=decoder, encoder_steps=300, decoder_steps=60, progress=False)
    ms = [6, 4]  # code dimensions differ: GD encoders and decoders pad them to 6
    batch = baselines.encoder_decoder_batch(sets, ms, seeds, **options)
    for (K, V, f), m, seed, mlp in zip(sets, ms, seeds, batch):
        alone = baselines.encoder_decoder(K, V, f, m, seed=seed, **options)
        assert {k: r.steps for k, r in mlp.fit_results.items()} == {k: r.steps for k, r in alone.fit_results.items()}
        for ours, theirs in zip(mlp.parameters(), alone.parameters()):
            assert torch.allclose(ours, theirs, rtol=1e-7, atol=1e-9)
        assert torch.equal(mlp.predict(K, V), alone.predict(K, V))


def test_gd_decoder_batch_pads_code_dimensions():
    sets = _fact_sets(2)
    batch = baselines.gd_decoder_batch([V for _, V, _ in sets], [f[:20] for _, _, f in sets], [4, 7], [0, 1], steps=40,
                                       progress=False)
    for (_, V, f), m, seed, (dec, result) in zip(sets, [4, 7], [0, 1], batch):
        alone, _ = baselines.gd_decoder(V, f[:20], m, steps=40, seed=seed, progress=False)
        assert dec.codes.shape == (24, m) and result.steps == 40
        assert torch.allclose(dec.codes, alone.codes, atol=1e-10) and torch.allclose(dec.projection, alone.projection,
                                                                                    atol=1e-10)


def test_batches_reject_mismatched_arguments():
    sets = _fact_sets(2)
    with pytest.raises(ValueError, match=r"hidden must be an int or one int per model \(2\)"):
        baselines.gd_mlp_batch(sets, [4], [0, 1])
    with pytest.raises(ValueError, match=r"seeds must be one int per model \(2\)"):
        baselines.gd_mlp_batch(sets, 4, [0])
    with pytest.raises(ValueError, match="fact_sets must share one shape"):
        baselines.gd_mlp_batch([sets[0], random_fact_set(24, 24, 8, seed=0)], 4, [0, 1])
    with pytest.raises(ValueError, match=r"m must be an int or one int per model \(2\)"):
        baselines.encoder_decoder_batch(sets, [4, 5, 6], [0, 1])
