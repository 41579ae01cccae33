"""construct(): storage with every solver, the Gram identity, whitening, verification, bad input."""

import importlib

import pytest
import torch

import factkernels
from factkernels import FactStorageError, construct
from factkernels.embeddings import random_fact_set
from factkernels.encoder import augment, sample_gate
from factkernels.solvers import GadgetOperator
from factkernels import _ops
from factkernels.host_reads import HostReadCounter


@pytest.mark.parametrize("solver", ["cholesky", "cg", "per_gadget"])
@pytest.mark.parametrize("outputs", ["values", "margin_optimal"])
def test_every_solver_stores_all_facts(request, solver, outputs):
    # per_gadget solves one small system per gadget (many small ops: minutes at F = 96 on two busy threads)
    K, V, f = request.getfixturevalue("tiny" if solver == "per_gadget" else "small_facts")
    mlp = construct(K, V, f, solver=solver, outputs=outputs, progress=False)
    assert torch.equal(mlp.predict(K, V), f)
    r = mlp.report
    assert r.accuracy == 1.0 and r.failed == 0 and r.min_margin > 0
    assert r.solver == solver and r.m_search.startswith("auto") and r.residual < 1e-3
    assert mlp(K).shape == K.shape


def test_float32_with_fewer_facts_than_key_features():
    # 8 keys in d = 16 (the toy LM's constructed expert): the whitening of a rank-deficient key covariance
    # must keep float32's digits (a 1e-12 ridge lost 4-5 of 8 facts)
    K, V, f = random_fact_set(8, 16, 16, seed=0)
    assert torch.equal(construct(K, V, f, progress=False).predict(K, V), f)


def test_float32_medium_with_auto_m(medium_facts):
    K, V, f = medium_facts
    mlp = construct(K, V, f, outputs="values", progress=False)
    assert torch.equal(mlp.predict(K, V), f)
    assert mlp.report.m_search.startswith("auto")
    # the smallest verified m is far below the worst-case bound of Thm B.5.3
    from factkernels.decoder import jl_bound
    assert mlp.report.m < jl_bound(mlp.report.rho, V.shape[0]) / 10


def test_kernels_and_torch_backends_build_the_same_mlp(small_facts):
    K, V, f = small_facts
    a = construct(K, V, f, m=64, solver="cholesky", backend="kernels", progress=False)
    b = construct(K, V, f, m=64, solver="cholesky", backend="torch", progress=False)
    assert torch.allclose(a(K), b(K), atol=1e-8)
    c = construct(K, V, f, m=64, solver="cholesky", backend="kernels", progress=False)
    assert torch.equal(a.up_weight, c.up_weight)  # same seed, same MLP


def test_hadamard_gram_identity():
    """M Mᵀ = (Σ Σᵀ) ∘ (K̃ K̃ᵀ) for the explicit face-splitting matrix M."""
    gen = torch.Generator().manual_seed(0)
    K = torch.randn(30, 5, generator=gen, dtype=torch.float64)
    G, b = sample_gate(K, 7, gen)
    S, P = _ops.activate(K @ G.T + b, "silu"), augment(K)
    M = (S.unsqueeze(2) * P.unsqueeze(1)).reshape(30, -1)
    assert torch.allclose(M @ M.T, _ops.hadamard_gram(S, P), atol=1e-10)
    op = GadgetOperator(S, P, torch.eye(7, dtype=K.dtype), torch.eye(6, dtype=K.dtype))
    y = torch.randn(30, 3, generator=gen, dtype=torch.float64)
    assert torch.allclose(op.matmul(y), (M @ M.T + 1) @ y, atol=1e-9)
    assert torch.allclose(op.dense(), M @ M.T + 1, atol=1e-10)


def test_whitened_operator_fits_the_same_targets(small_facts):
    K, _, _ = small_facts
    gen = torch.Generator().manual_seed(1)
    G, b = sample_gate(K, 8, gen)
    S, P = _ops.activate(K @ G.T + b, "silu"), augment(K)
    op = GadgetOperator.whitened(S, P)
    targets = torch.randn(K.shape[0], 4, generator=gen, dtype=K.dtype)
    alpha = torch.linalg.solve(op.dense(), targets)
    coef, out_bias = op.unknowns(alpha)
    fitted = torch.einsum("ir,ic,jrc->ij", S, P, coef) + out_bias
    assert torch.allclose(fitted, targets, atol=1e-6)


def test_whitening_is_folded_into_the_weights():
    from factkernels.embeddings import random_fact_set

    K, V, f = random_fact_set(128, 128, 16, seed=4, kappa=30.0, dtype=torch.float64)
    mlp = construct(K, V, f, whiten=1.0, progress=False)
    assert torch.equal(mlp.predict(K, V), f)  # raw embeddings in, raw values out
    Kw, WK = factkernels.whiten(K, 1.0)
    Vw, WV = factkernels.whiten(V, 1.0)
    # the folded MLP on raw keys equals W_V · (MLP built for whitened embeddings)(K W_K)
    inner = factkernels.FactMLP(mlp.gate_weight @ torch.linalg.inv(WK), mlp.gate_bias,
                                mlp.up_weight @ torch.linalg.inv(WK), mlp.up_bias,
                                torch.linalg.inv(WV) @ mlp.down_weight, torch.linalg.inv(WV) @ mlp.down_bias)
    assert torch.allclose(mlp(K), (WV @ inner(Kw).T).T, atol=1e-6)
    assert torch.equal(inner.predict(Kw, Vw), f)
    assert mlp.report.whiten_alpha == 1.0


def test_verification_raises_with_count_and_cause(medium_facts):
    K, V, f = medium_facts
    with pytest.raises(FactStorageError, match=r"of 256 facts are not stored.*m=2 is too small") as err:
        construct(K, V, f, m=2, outputs="values", progress=False)
    assert err.value.report.failed > 0
    mlp = construct(K, V, f, m=2, outputs="values", verify="report", progress=False)
    assert 0 < mlp.report.failed < 256 and mlp.report.accuracy < 1
    unverified = construct(K, V, f, m=2, outputs="values", verify=False, progress=False)
    assert unverified.report.accuracy is None


def test_per_gadget_uses_one_gate_per_gadget(tiny):
    K, V, f = tiny
    mlp = construct(K, V, f, m=5, solver="per_gadget", verify=False, progress=False)
    assert mlp.gate_weight.shape[0] == mlp.hidden_size
    shared = construct(K, V, f, m=5, solver="cholesky", verify=False, progress=False)
    assert shared.gate_weight.shape[0] * 5 == shared.hidden_size
    assert shared.num_parameters == mlp.num_parameters


def test_hidden_and_bound_options(small_facts):
    K, V, f = small_facts
    mlp = construct(K, V, f, m=48, hidden=48 * 8, progress=False)
    assert mlp.hidden_size == 48 * 8 and torch.equal(mlp.predict(K, V), f)
    bound = construct(K, V, f, m="bound", outputs="margin_optimal", verify=False, progress=False)
    assert bound.report.m_search.startswith("Thm B.5.3") and bound.report.m > 100


@pytest.mark.parametrize("activation", ["gelu", "tanh", "sigmoid", "softplus"])
def test_other_analytic_activations(small_facts, activation):
    K, V, f = small_facts
    mlp = construct(K, V, f, activation=activation, progress=False)
    assert mlp.report.accuracy == 1.0


def _sphere(n, d, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen, dtype=torch.float64), dim=1)


def _bad(**overrides):
    K, V = _sphere(20, 6, seed=0), _sphere(10, 6, seed=1)
    f = torch.arange(20) % 10
    args = {"K": K, "V": V, "f": f, "m": 4}
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        ({"K": torch.randn(20, 6, 1, dtype=torch.float64)}, ValueError, "K must be a non-empty 2-D"),
        ({"V": _sphere(10, 5, seed=2)}, None, None),  # different d_out is allowed
        ({"f": torch.arange(19)}, ValueError, r"f must have shape \(20,\)"),
        ({"f": torch.full((20,), 10)}, ValueError, r"f must index values in \[0, 10\)"),
        ({"f": torch.zeros(20)}, TypeError, "f must be an integer tensor"),
        ({"K": torch.randint(3, (20, 6))}, TypeError, "K must be float32 or float64"),
        ({"V": torch.randn(10, 6)}, TypeError, "V has dtype torch.float32 but K has torch.float64"),
        ({"K": torch.full((20, 6), float("nan"), dtype=torch.float64)}, ValueError, "K contains NaN or Inf"),
        ({"V": torch.ones(10, 6, dtype=torch.float64)}, ValueError, "V has duplicate rows 0 and 1"),
        ({"K": torch.zeros(20, 6, dtype=torch.float64)}, ValueError, "K has duplicate rows"),
        ({"m": 0}, ValueError, "m must be >= 1"),
        ({"m": 2.5}, TypeError, "m must be an int"),
        ({"activation": "relu"}, ValueError, "ReLU is not analytic"),
        ({"activation": "square"}, ValueError, "polynomial"),
        ({"width_multiplier": 0.5}, ValueError, "too few hidden units"),
        ({"hidden": 8}, ValueError, "too few hidden units for F=20"),
        ({"solver": "lu"}, ValueError, "solver must be one of"),
        ({"outputs": "codes"}, ValueError, "outputs must be one of"),
        ({"outputs": _sphere(10, 5, seed=3)}, ValueError, r"outputs given as a tensor must match V: shape \(10, 6\)"),
        ({"outputs": torch.full((10, 6), float("inf"), dtype=torch.float64)}, ValueError, "outputs contains NaN"),
        ({"outputs": -_sphere(10, 6, seed=1)}, ValueError, "not decodable with the given outputs"),
        ({"whiten": 2.0}, ValueError, "whiten must be a strength alpha"),
        ({"K": [[0.0] * 6] * 20}, TypeError, "K must be a torch.Tensor"),
    ],
)
def test_bad_input_is_rejected(overrides, error, match):
    args = _bad(**overrides)
    if error is None:
        construct(**args, progress=False, verify="report")
        return
    with pytest.raises(error, match=match):
        construct(**args, progress=False)


def test_values_inside_the_hull_are_rejected_for_value_outputs():
    # v_1 = (v_0 + v_2)/2 lies between its neighbours: no u = v_1 decodes it
    V = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]], dtype=torch.float64)
    K = torch.randn(3, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="not decodable"):
        construct(K, V, torch.arange(3), m=2, outputs="values", progress=False)


def test_cg_never_forms_an_f_by_f_matrix(small_facts, monkeypatch):
    K, V, f = small_facts

    def dense_gram(*args, **kwargs):
        raise AssertionError("solver='cg' must stay matrix-free")

    monkeypatch.setattr(_ops, "hadamard_gram", dense_gram)
    mlp = construct(K, V, f, solver="cg", progress=False)
    assert mlp.report.accuracy == 1.0 and mlp.report.cg_iterations > 0


@pytest.mark.parametrize("preconditioner", ["jacobi", "constant", "keys"])
def test_cg_preconditioners_store_every_fact(small_facts, preconditioner):
    K, V, f = small_facts
    report = construct(K, V, f, solver="cg", cg_preconditioner=preconditioner, progress=False).report
    assert report.accuracy == 1.0 and report.residual < 1e-3 and report.cg_preconditioner == preconditioner
    assert "preconditioner" in str(report)
    with pytest.raises(ValueError, match="cg_preconditioner must be one of"):
        construct(K, V, f, solver="cg", cg_preconditioner="ilu", progress=False)


def test_precomputed_outputs_build_the_same_mlp(small_facts):
    K, V, f = small_facts
    built = construct(K, V, f, seed=5, progress=False)
    outputs, rho = factkernels.ustar.margin_optimal_outputs(V)
    given = construct(K, V, f, outputs=outputs, seed=5, progress=False)
    assert given.report.outputs == "given" and given.report.rho == pytest.approx(rho) and given.report.m == built.report.m
    for name, param in built.named_parameters():
        torch.testing.assert_close(param, dict(given.named_parameters())[name])


def test_values_build_reads_back_once_the_input_checks_included():
    """GPU-first: the values build with a given m and the dense solve queues every phase, the input checks'
    too, without a host read (each would be a stream sync on a GPU) until the report's one transfer; the m
    search adds one read of rho (with the input checks) and one per batch of trials."""
    K, V, f = random_fact_set(300, 200, 24, seed=0)
    with HostReadCounter() as counter:
        mlp = construct(K, V, f, m=64, outputs="values", solver="cholesky", progress=False)
    assert mlp.report.failed == 0 and counter.reads == ["tolist"]
    decoder_module = importlib.import_module("factkernels.decoder")
    K, V, f = random_fact_set(600, 600, 48, seed=0)  # the search tries 31 -> 39 -> 49
    with HostReadCounter() as counter:
        mlp = construct(K, V, f, outputs="values", solver="cholesky", progress=False)
    trials = len(mlp.report.m_search.split("->"))
    assert 2 <= trials <= decoder_module.SEARCH_BATCH and 2 * decoder_module.SEARCH_SCREEN >= 600  # 1 batch, unscreened
    assert mlp.report.failed == 0 and counter.reads == ["tolist"] * 3


def test_unscreened_m_search_finds_the_same_mlp_with_one_read_less(monkeypatch):
    """Where a round trip costs more than a full decode (decoder.UNSCREENED_PAIRS: a GPU, small builds), the m search
    decodes every used value for each trial at once instead of a sample first: the same m and MLP bit for bit,
    without the full check's read of the sample's winner."""
    decoder_module = importlib.import_module("factkernels.decoder")
    K, V, f = random_fact_set(1300, 1300, 32, seed=0)  # every value used, more than two samples: screened on a CPU
    with HostReadCounter() as screened_reads:
        screened = construct(K, V, f, outputs="values", progress=False)
    monkeypatch.setitem(decoder_module.UNSCREENED_PAIRS, "cpu", 1 << 24)
    with HostReadCounter() as unscreened_reads:
        unscreened = construct(K, V, f, outputs="values", progress=False)
    assert unscreened.report.m_search == screened.report.m_search and screened.report.failed == 0
    assert screened_reads.reads == ["tolist", "tolist", "__int__", "tolist"] and unscreened_reads.reads == ["tolist"] * 3
    for name, param in screened.named_parameters():
        assert torch.equal(param, dict(unscreened.named_parameters())[name])


@pytest.mark.parametrize("m, order", [(64, ["factor", "checks", "outputs"]), (None, ["checks", "outputs", "factor"])])
def test_with_m_given_the_factorization_is_queued_before_the_checks_and_outputs(monkeypatch, m, order):
    """GPU-first: the Gram's factorization needs neither the input checks, the outputs nor the decoder, so with m
    given it is queued first (a GPU factors while the host queues the rest), with the same MLP bit for bit; the m
    search needs rho (read back) before it draws the gate."""
    construct_module = importlib.import_module("factkernels.construct")
    solvers_module = importlib.import_module("factkernels.solvers")
    calls = []

    def traced(module, name, label):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: (calls.append(label), original(*a, **k))[1])

    K, V, f = random_fact_set(300, 200, 24, seed=0)
    before = construct(K, V, f, m=m, outputs="values", solver="cholesky", progress=False)
    traced(solvers_module, "cholesky_factor", "factor")
    traced(construct_module, "input_problems", "checks")
    traced(construct_module, "output_embeddings", "outputs")
    mlp = construct(K, V, f, m=m, outputs="values", solver="cholesky", progress=False)
    assert calls == order and mlp.report.failed == 0 and ("factor" in mlp.report.timings) == (m is not None)
    for name, param in mlp.named_parameters():
        assert torch.equal(param, dict(before.named_parameters())[name])


def test_the_cg_build_reads_back_once_per_iteration():
    """The matrix-free solve decides when to stop on the host: one read per iteration (its residual), the
    initial one, the final residual and the report's transfer; the progress bar shows the value already read."""
    K, V, f = random_fact_set(600, 600, 32, seed=0)
    with HostReadCounter() as counter:
        mlp = construct(K, V, f, 64, outputs="values", solver="cg", progress=False)
    assert mlp.report.failed == 0 and mlp.report.cg_iterations > 10
    assert counter.count == mlp.report.cg_iterations + 3 and counter.reads[-1] == "tolist"


@pytest.mark.parametrize("problem", ["nan_key", "inf_value", "fact_range", "negative_fact", "equal_values",
                                     "equal_keys", "nan_outputs", "zero_output"])
@pytest.mark.parametrize("m, whiten", [(64, 0.0), (None, 0.0), (64, 0.5)])
def test_input_problems_read_with_the_build_raise_the_checks_errors(problem, m, whiten):
    K, V, f = random_fact_set(120, 80, 16, seed=1)
    outputs = "values"
    if problem == "nan_key":
        K[7, 3] = float("nan")
    elif problem == "inf_value":
        V[5, 0] = float("inf")
    elif problem in ("fact_range", "negative_fact"):
        f[9] = 80 if problem == "fact_range" else -1
    elif problem == "equal_values":
        V[11] = V[3]
    elif problem == "equal_keys":
        K[40] = K[2]
    else:
        outputs = V.clone()
        outputs[4] = float("nan") if problem == "nan_outputs" else 0.0
    expected = {"nan_key": "K contains NaN", "inf_value": "V contains NaN", "fact_range": r"f must index values",
                "negative_fact": r"f must index values", "equal_values": "V has duplicate rows 3 and 11",
                "equal_keys": "K has duplicate rows 2 and 40", "nan_outputs": "outputs contains NaN",
                "zero_output": "all-zero row"}[problem]
    with pytest.raises(ValueError, match=expected):
        construct(K, V, f, m=m, outputs=outputs, solver="cholesky", whiten=whiten, progress=False)


def test_a_deferred_solve_that_misses_the_residual_is_redone_on_the_host(monkeypatch):
    K, V, f = random_fact_set(300, 200, 24, seed=0)
    encoder_module = importlib.import_module("factkernels.encoder")
    solve = encoder_module.solve_cholesky

    def strict(op, targets, *, deferred=False):  # no float32 solve meets tol 0: refinement, then float64
        alpha, info = solve(op, targets, tol=0.0, deferred=deferred)
        calls.append(deferred)
        infos.append(info)
        return alpha, info

    calls, infos = [], []
    monkeypatch.setattr(encoder_module, "solve_cholesky", strict)
    monkeypatch.setattr(encoder_module, "RESIDUAL_TOL", 0.0)  # the deferred solve's residual, judged on the weights
    mlp = construct(K, V, f, m=64, outputs="values", solver="cholesky", progress=False)
    assert calls == [True, False]
    assert 0 < infos[0].residual.item() < 1e-4 and not bool(infos[0].accepted)  # factored, missed tol 0
    assert mlp.report.precision == "float64 (float32 fallback)" and mlp.report.failed == 0
    assert isinstance(mlp.report.residual, float) and mlp.report.residual < 1e-10


def test_the_m_search_screens_on_a_sample_and_finds_the_same_m(monkeypatch):
    decoder_module = importlib.import_module("factkernels.decoder")
    _, V, _ = random_fact_set(600, 600, 48, seed=0)  # the search tries 31 -> 39 -> 49
    out, rho = decoder_module.output_embeddings(V, "values")
    failures = decoder_module.failure_count
    found = {}
    for screen in (10**9, 16):  # no screening (the sample would be everything), then a sample of ~16
        calls = []

        def counted(decoder, values, used, backend):
            calls.append(used.numel())
            return failures(decoder, values, used, backend)

        monkeypatch.setattr(decoder_module, "SEARCH_SCREEN", screen)
        monkeypatch.setattr(decoder_module, "failure_count", counted)
        decoder, how = decoder_module.choose_m(None, out, V, torch.arange(600), float(rho),
                                               torch.Generator().manual_seed(0), "auto")
        found[screen] = (decoder.m, how, decoder.projection, calls)
    (m_full, how_full, d_full, calls_full), (m_screen, how_screen, d_screen, calls_screen) = found[10**9], found[16]
    assert (m_full, how_full) == (m_screen, how_screen) and torch.equal(d_full, d_screen)
    assert len(how_full.split("->")) >= 2  # some m was rejected
    # the unscreened search decodes all 600 values for each m; screened, some m are rejected on 17 of them
    assert set(calls_full) == {600} and calls_screen.count(600) < len(calls_full) and min(calls_screen) == 17


@pytest.mark.cuda
def test_the_gpu_first_build_stores_every_fact_like_the_cpu_build():
    # the device path: host draws copied from pinned memory, CUDA-event phase times, one read back at the report
    K, V, f = random_fact_set(400, 300, 32, seed=0)
    for options in (dict(m=64, outputs="values", solver="cholesky"), dict(outputs="values", solver="cg"), {}):
        gpu = construct(K.cuda(), V.cuda(), f.cuda(), progress=False, **options)
        cpu = construct(K, V, f, progress=False, **options)
        assert gpu.report.failed == 0 and gpu.report.solver == cpu.report.solver
        assert gpu.report.m == cpu.report.m or "m" not in options  # a searched m may round differently
        assert abs(gpu.report.rho - cpu.report.rho) < 1e-4 and isinstance(gpu.report.residual, float)
        assert {"outputs", "m_search", "solve", "verify", "total"} <= set(gpu.report.timings)
        assert all(seconds >= 0 for seconds in gpu.report.timings.values())
        assert torch.equal(gpu.predict(K.cuda(), V.cuda()).cpu(), f)
    builder = factkernels.FactBuilder(K[:300].cuda(), V.cuda(), f[:300].cuda(), m=64, outputs="values")
    builder.add(K[300:320].cuda(), f[300:320].cuda())
    assert builder.failed == 0 and builder.checked == 20
