"""Solvers: CG agrees with Cholesky without an F×F matrix; per-gadget is Alg. 3 exactly."""

import pytest
import torch

from factkernels import _ops, solvers
from factkernels.encoder import augment, build_per_gadget, sample_gate
from factkernels.memory import dense_gram_bytes
from factkernels.solvers import (DENSE_MAX_FACTS, SCIPY_CHOLESKY_MAX_THREADS, GadgetOperator, _factor_solve, cholesky_factor,
                                pick_solver, solve_cg, solve_cholesky, whitening)


def _operator(num_facts=120, d=10, width=18, seed=0):
    gen = torch.Generator().manual_seed(seed)
    K = torch.nn.functional.normalize(torch.randn(num_facts, d, generator=gen, dtype=torch.float64), dim=1)
    G, b = sample_gate(K, width, gen)
    return GadgetOperator.whitened(_ops.activate(K @ G.T + b, "silu"), augment(K)), gen


def test_cg_matches_cholesky():
    op, gen = _operator()
    targets = torch.randn(op.size, 5, generator=gen, dtype=torch.float64)
    dense, info_dense = solve_cholesky(op, targets)
    iterative, info_cg = solve_cg(op, targets, tol=1e-10, max_iter=2000, progress=False)
    assert info_dense.residual < 1e-10 and info_cg.residual < 1e-9
    assert torch.allclose(dense, iterative, rtol=1e-5, atol=1e-6)
    assert 0 < info_cg.iterations < 2000


def test_cg_warm_start():
    op, gen = _operator()
    targets = torch.randn(op.size, 5, generator=gen, dtype=torch.float64)
    exact, _ = solve_cholesky(op, targets)
    _, at_solution = solve_cg(op, targets, tol=1e-6, max_iter=2000, progress=False, x0=exact)
    assert at_solution.iterations == 0
    changed = targets.clone()
    changed[:3] = torch.randn(3, 5, generator=gen, dtype=torch.float64)  # a few facts change
    cold, cold_info = solve_cg(op, changed, tol=1e-8, max_iter=2000, progress=False)
    warm, warm_info = solve_cg(op, changed, tol=1e-8, max_iter=2000, progress=False, x0=exact)
    assert warm_info.residual < 1e-7 and warm_info.iterations < cold_info.iterations
    torch.testing.assert_close(warm, cold, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="x0 must have the shape"):
        solve_cg(op, targets, progress=False, x0=exact[:-1])


def test_cg_warns_when_not_converged():
    op, gen = _operator()
    targets = torch.randn(op.size, 2, generator=gen, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="raise cg_max_iter"):
        solve_cg(op, targets, tol=1e-12, max_iter=3, progress=False)


def test_float32_cholesky_reports_its_precision():
    op, gen = _operator()
    op32 = GadgetOperator(*(t.float() for t in (op.gate_features, op.keys_aug, op.feature_transform, op.key_transform)))
    targets = torch.randn(op.size, 3, generator=gen)
    alpha, info = solve_cholesky(op32, targets)
    assert alpha.dtype == torch.float32
    assert info.precision.startswith("float32") or info.precision.startswith("float64")
    assert info.residual < 1e-4


def test_singular_system_names_the_fix():
    gen = torch.Generator().manual_seed(0)
    K = torch.randn(40, 3, generator=gen, dtype=torch.float64)
    G, b = sample_gate(K, 2, gen)  # 2 * (3 + 1) + 1 = 9 unknowns < 40 equations: rank deficient
    op = GadgetOperator(_ops.activate(K @ G.T + b, "silu"), augment(K), torch.eye(2, dtype=K.dtype),
                        torch.eye(4, dtype=K.dtype))
    with pytest.raises(RuntimeError, match="width_multiplier"):
        solve_cholesky(op, torch.randn(40, 1, generator=gen, dtype=torch.float64))


def test_per_gadget_fits_each_gadget_with_its_own_gate():
    gen = torch.Generator().manual_seed(1)
    K = torch.nn.functional.normalize(torch.randn(60, 8, generator=gen, dtype=torch.float64), dim=1)
    targets = torch.randn(60, 3, generator=gen, dtype=torch.float64)
    enc = build_per_gadget(K, targets, width_multiplier=1.5, activation="tanh", generator=gen, progress=False)
    width = enc.gadget_width
    assert enc.gate_weight.shape == (3 * width, 8)
    hidden = torch.tanh(K @ enc.gate_weight.T + enc.gate_bias) * (K @ enc.up_weight.T + enc.up_bias)
    outputs = hidden.view(60, 3, width).sum(2) + enc.output_bias
    assert torch.allclose(outputs, targets, atol=1e-8)
    assert not torch.equal(enc.gate_weight[:width], enc.gate_weight[width : 2 * width])


def test_auto_picks_cholesky_for_small_and_cg_for_huge():
    assert pick_solver(1024, torch.device("cpu")) == "cholesky"
    assert pick_solver(10**6, torch.device("cpu")) == "cg"


def test_whitening_is_a_cholesky_inverse_with_the_same_gram():
    g = torch.Generator().manual_seed(0)
    features = torch.randn(200, 12, dtype=torch.float64, generator=g) @ torch.randn(12, 12, dtype=torch.float64, generator=g)
    cov = features.T @ features / 200
    w = whitening(cov)
    torch.testing.assert_close(w.T @ cov @ w, torch.eye(12, dtype=torch.float64))
    torch.testing.assert_close(w @ w.T, torch.linalg.inv(cov))  # so the whitened Gram equals the eigh one's
    singular = whitening(cov[:, :1] @ cov[:1, :])  # rank 1: factored thanks to the ridge, finite
    assert torch.isfinite(singular).all()


def test_auto_solver_keeps_the_dense_path_on_a_gpu_while_it_fits():
    big = DENSE_MAX_FACTS * 2
    assert pick_solver(big, torch.device("cuda"), budget=1 << 40) == "cholesky"
    assert pick_solver(big, torch.device("cpu"), budget=1 << 40) == "cg"
    assert pick_solver(big, torch.device("cuda"), budget=1 << 30) == "cg"  # the Gram does not fit


@pytest.mark.parametrize("free_gib, dtype, expected", [(79, torch.float32, "cholesky"), (40, torch.float32, "cg"),
                                                       (40, torch.float64, "cholesky"), (20, torch.float64, "cg")])
def test_auto_solver_on_a_gpu_reads_its_free_memory(monkeypatch, free_gib, dtype, expected):
    """F = 32,768 on a GPU (no GPU needed: torch.cuda.mem_get_info is faked): the dense path's peak is 24 bytes a
    Gram entry in float32 (the float64 redo), 16 in float64, and it must fit in half the free memory."""
    calls = []

    def mem_get_info(device=None):
        calls.append(device)
        return free_gib << 30, 80 << 30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert pick_solver(32768, torch.device("cuda"), dtype=dtype) == expected and len(calls) == 1
    assert dense_gram_bytes(32768, dtype) == (24 if dtype == torch.float32 else 16) * 32768**2
    assert pick_solver(32768, torch.device("cpu"), dtype=dtype, budget=free_gib << 30) == "cg"  # F > DENSE_MAX_FACTS


@pytest.fixture
def torch_threads():
    """Restores torch's thread count after a test changes it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scipy_factor_matches_torchs(dtype, torch_threads):
    # One torch thread on a CPU: LAPACK's potrf through scipy, in place on the lower triangle.
    torch.set_num_threads(1)
    op, gen = _operator(num_facts=300, d=12, width=40)
    gram = op.dense().to(dtype)
    expected, expected_info = torch.linalg.cholesky_ex(gram)
    lower_only = op.dense(lower=True).to(dtype)
    factor, info = cholesky_factor(lower_only, overwrite=True)
    assert int(info) == int(expected_info) == 0 and factor.data_ptr() == lower_only.data_ptr()  # no copy
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(factor.tril(), expected, rtol=tol, atol=tol * float(expected.abs().max()))
    kept = gram.clone()
    factor, _ = cholesky_factor(kept)  # overwrite=False leaves the Gram as it was
    assert torch.equal(kept, gram) and factor.data_ptr() != kept.data_ptr()
    targets = torch.randn(300, 4, generator=gen, dtype=dtype)
    torch.testing.assert_close(torch.cholesky_solve(targets, expected), _factor_solve(factor, targets), rtol=tol * 100,
                               atol=tol * 100)


def test_scipy_factor_reports_a_failure_like_torch(torch_threads):
    torch.set_num_threads(1)
    gram = torch.eye(5, dtype=torch.float64)
    gram[3, 3] = -1.0  # the leading minor of order 4 is not positive
    _, info = cholesky_factor(gram.clone())
    assert int(info) == int(torch.linalg.cholesky_ex(gram)[1]) == 4


@pytest.mark.parametrize("threads", [1, SCIPY_CHOLESKY_MAX_THREADS])
def test_scipys_openblas_factors_on_one_thread(threads, torch_threads, monkeypatch):
    torch.set_num_threads(threads)
    seen = []
    funcs = solvers.lapack.get_lapack_funcs

    def recorded(*args):
        potrf = funcs(*args)

        def run(*a, **k):
            seen.extend(lib["num_threads"] for lib in solvers._blas_threads().info() if lib["internal_api"] == "openblas")
            return potrf(*a, **k)

        return run

    monkeypatch.setattr(solvers.lapack, "get_lapack_funcs", recorded)
    gram = _operator()[0].dense()
    factor, info = cholesky_factor(gram)
    assert int(info) == 0 and seen and set(seen) == {1}
    torch.testing.assert_close(factor.tril(), torch.linalg.cholesky_ex(gram)[0], rtol=1e-4, atol=1e-4)


def test_more_threads_factor_with_torch(torch_threads):
    torch.set_num_threads(SCIPY_CHOLESKY_MAX_THREADS + 1)
    op, _ = _operator()
    gram = op.dense()
    factor, info = cholesky_factor(gram)
    assert int(info) == 0 and torch.equal(factor, torch.linalg.cholesky_ex(gram)[0])  # upper triangle zero


def test_the_deferred_solve_agrees_on_both_factorizations(torch_threads):
    op, gen = _operator(num_facts=300, d=12, width=40)
    targets = torch.randn(300, 6, generator=gen, dtype=torch.float64)
    solutions = []
    for threads in (1, SCIPY_CHOLESKY_MAX_THREADS + 1):  # scipy's potrf, then torch's
        torch.set_num_threads(threads)
        alpha, info = solve_cholesky(op, targets, deferred=True)
        assert bool(info.accepted)
        solutions.append(alpha)
    torch.testing.assert_close(solutions[0], solutions[1], rtol=1e-9, atol=1e-9)


def test_the_lower_gram_gets_the_bias_column_in_its_lower_triangle():
    op, _ = _operator(num_facts=1100, d=6, width=400)  # more rows than one block of the lower-triangle add
    full, lower = op.dense(), op.dense(lower=True)
    torch.testing.assert_close(lower.tril(), full.tril(), rtol=0, atol=0)


@pytest.mark.parametrize("preconditioner, rank", [("keys", 11), ("constant", 1)])
def test_deflated_cg_matches_cholesky(preconditioner, rank):
    op, gen = _operator()
    targets = torch.randn(op.size, 5, generator=gen, dtype=torch.float64)
    dense, _ = solve_cholesky(op, targets)
    deflated, info = solve_cg(op, targets, tol=1e-10, max_iter=2000, progress=False, preconditioner=preconditioner)
    assert info.residual < 1e-9 and info.preconditioner == preconditioner and info.setup_columns == rank / 2
    torch.testing.assert_close(deflated, dense, rtol=1e-5, atol=1e-6)


def test_deflated_preconditioner_moves_the_keys_span_to_one():
    """On span U the preconditioned scaled Gram is the identity (Ritz values mapped to 1); Jacobi is the diagonal."""
    op, gen = _operator()
    precond = solvers.deflated_preconditioner(op, chunk=4)
    basis, scale = precond.basis, precond.scale
    torch.testing.assert_close(basis.T @ basis, torch.eye(basis.shape[1], dtype=basis.dtype), atol=1e-10, rtol=0)
    scaled = scale * op.dense() * scale.T  # A = D^-1/2 G D^-1/2
    assert (basis.T @ scaled @ basis).diagonal().max() > 5.0  # the outlier along the constant vector is in span U
    # P⁻¹ = D^-1/2 (I + U (Θ⁻¹ − I) Uᵀ) D^-1/2, so D^1/2 P⁻¹ G D^-1/2 = (I + U (Θ⁻¹ − I) Uᵀ) A is I on span U
    moved = precond.apply(op.dense(), op) / scale * scale.T
    torch.testing.assert_close(basis.T @ moved @ basis, torch.eye(basis.shape[1], dtype=basis.dtype), atol=1e-8, rtol=0)
    r = torch.randn(op.size, 3, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(solvers.jacobi_preconditioner(op).apply(r, op), r / op.diagonal().unsqueeze(1))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float64, 1e-10)])
def test_deflated_cg_needs_fewer_iterations_than_jacobi(dtype, tol):
    """F/(d+1) = 60: the constant vector and the keys' span are outliers of the Jacobi-scaled Gram (seed 0: float32
    334 -> 226 iterations, float64 683 -> 514), setup included."""
    op, gen = _operator(num_facts=1024, d=16, width=91)
    op = GadgetOperator(*(t.to(dtype) for t in (op.gate_features, op.keys_aug, op.feature_transform, op.key_transform)))
    targets = torch.randn(op.size, 5, generator=gen, dtype=dtype)
    _, jacobi = solve_cg(op, targets, tol=tol, max_iter=2000, progress=False, preconditioner="jacobi")
    _, constant = solve_cg(op, targets, tol=tol, max_iter=2000, progress=False, preconditioner="constant")
    _, keys = solve_cg(op, targets, tol=tol, max_iter=2000, progress=False, preconditioner="keys")
    assert max(info.residual for info in (jacobi, constant, keys)) < 2 * tol
    assert keys.iterations + keys.setup_columns / targets.shape[1] < 0.8 * jacobi.iterations
    assert keys.iterations < constant.iterations < jacobi.iterations


def test_auto_preconditioner_deflates_the_keys_span_where_it_stands_out():
    assert solvers.auto_preconditioner(2**18, 1025, 79) == "keys"  # F = 256 (d+1) at d = 1,024: setup 6.5 iterations
    assert solvers.auto_preconditioner(4096, 129, 32) == "constant"  # F = 32 (d+1): the keys' cluster is in the bulk
    assert solvers.auto_preconditioner(2**18, 1025, 32) == "constant"  # setup 16 iterations
    op, gen = _operator()
    targets = torch.randn(op.size, 2, generator=gen, dtype=torch.float64)
    _, info = solve_cg(op, targets, tol=1e-6, progress=False)
    assert info.preconditioner == "constant" and info.setup_columns == 0.5
    with pytest.raises(ValueError, match="preconditioner must be one of"):
        solve_cg(op, targets, progress=False, preconditioner="ilu")
