"""Tests of factkernels.ustar: decodability and margin-optimal outputs against exact small solves."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize, nnls

from factkernels import _ops, corral, geometry, ustar
from factkernels.embeddings import spherical
from factkernels.host_reads import HostReadCounter
from helpers import direct_margins

def _star_np(V: np.ndarray, i: int) -> np.ndarray:
    X = V[i] - np.delete(V, i, axis=0)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _ref_min_norm(V: np.ndarray, i: int, seed: int = 0):
    """Exact small solve of min ||sum_j l_j x_ij|| over the simplex (SLSQP, several starts).

    Returns (rho_i, u_i) with rho_i = ||p*|| (0 when p* = 0) and u_i = p*/||p*||.
    """
    X = _star_np(V, i)
    k = X.shape[0]
    Q = X @ X.T
    rng = np.random.default_rng(seed)
    starts = [np.full(k, 1.0 / k), rng.dirichlet(np.ones(k))]
    best = None
    for l0 in starts:
        res = minimize(
            lambda lam: lam @ Q @ lam,
            l0,
            jac=lambda lam: 2.0 * Q @ lam,
            bounds=[(0.0, None)] * k,
            constraints=[{"type": "eq", "fun": lambda lam: lam.sum() - 1.0, "jac": lambda lam: np.ones(k)}],
            method="SLSQP",
            options={"ftol": 1e-16, "maxiter": 2000},
        )
        lam = np.clip(res.x, 0.0, None)
        lam /= lam.sum()
        val = lam @ Q @ lam
        if best is None or val < best[0]:
            best = (val, lam)
    p = X.T @ best[1]
    rho = float(np.linalg.norm(p))
    return rho, (p / rho if rho > 0 else p)


def _ref_nnls(V: np.ndarray, i: int):
    """Min-norm point by NNLS with a heavily weighted sum-to-one row (Lawson-Hanson).

    Returns the margin of the reference direction, a lower bound of rho_i that is
    exact when the direction is, and the direction.
    """
    X = _star_np(V, i)
    big = 1e3
    A = np.vstack([X.T, big * np.ones((1, X.shape[0]))])
    b = np.zeros(A.shape[0])
    b[-1] = big
    lam, _ = nnls(A, b, maxiter=50 * A.shape[1])
    p = X.T @ lam
    if np.linalg.norm(p) < 1e-9:  # 0 is in the hull: not decodable
        return 0.0, p
    u = p / np.linalg.norm(p)
    return float((X @ u).min()), u


def _values(kind: str, n: int, d: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "sphere":
        V = spherical(n, d, generator=g, dtype=torch.float64)
    elif kind == "gauss":
        V = torch.randn(n, d, generator=g, dtype=torch.float64)
    elif kind == "aniso":
        V = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.logspace(0, 1.5, d, dtype=torch.float64)
    elif kind == "lattice":  # duplicates, collinear and co-circular points
        V = torch.randint(-2, 3, (n, d), generator=g).to(torch.float64)
    else:
        raise AssertionError(kind)
    return V.to(dtype)


@pytest.mark.parametrize(
    "kind,n,d,seed",
    [
        ("sphere", 6, 2, 0),
        ("sphere", 12, 3, 1),
        ("sphere", 16, 5, 2),
        ("sphere", 14, 8, 3),
        ("gauss", 10, 3, 4),
        ("gauss", 16, 8, 5),
        ("aniso", 14, 4, 6),
        ("gauss", 16, 2, 7),
    ],
)
def test_matches_exact_small_solve(kind, n, d, seed):
    V = _values(kind, n, d, seed)
    U, rho, radii = ustar.margin_optimal_outputs(V, return_radii=True)
    Vn = V.numpy()
    n_pos = 0
    for i in range(n):
        rho_ref, u_ref = _ref_min_norm(Vn, i)
        if rho_ref > 1e-3:
            n_pos += 1
            assert abs(radii[i].item() - rho_ref) < 1e-4, (i, radii[i].item(), rho_ref)
            assert np.linalg.norm(U[i].numpy() - u_ref) < 1e-3, i
        else:  # not decodable: no unit output has a positive margin
            assert radii[i].item() <= 1e-6, (i, radii[i].item(), rho_ref)
    assert n_pos > 0
    assert rho == pytest.approx(radii.min().item(), abs=0)
    assert ustar.decodability(V) == pytest.approx(rho, abs=1e-9)


def test_larger_random_certificate():
    """n=300 spherical values in d=16: every value is decodable and certified optimal."""
    V = _values("sphere", 300, 16, 11)
    U, lo, hi = ustar._margin_optimal(V, 1e-6, 200)
    assert bool((lo > 0).all())
    assert bool((hi - lo <= 1e-6 * hi).all())
    # against an exact active-set solve (scipy NNLS) on a few rows
    for i in (0, 77, 150, 299):
        rho_ref, u_ref = _ref_nnls(V.numpy(), i)
        assert lo[i].item() == pytest.approx(rho_ref, abs=1e-7)
        assert np.linalg.norm(U[i].numpy() - u_ref) < 1e-5


def test_float32_input_and_chunking(monkeypatch):
    V = _values("sphere", 120, 10, 12, dtype=torch.float32)
    U, rho, radii = ustar.margin_optimal_outputs(V, return_radii=True)
    assert U.dtype == torch.float32 and radii.dtype == torch.float32 and isinstance(rho, float)
    assert U.shape == V.shape
    # the same problem solved in chunks of 32 rows
    monkeypatch.setitem(ustar._WORK_BYTES["cpu"], "pairs", 8 * 32 * 120)
    U2, rho2, radii2 = ustar.margin_optimal_outputs(V, return_radii=True)
    assert torch.allclose(radii, radii2, atol=1e-6)
    assert torch.allclose(U, U2, atol=1e-4)
    assert rho2 == pytest.approx(rho, abs=1e-6)


def test_paper_1d_example():
    V = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    U, rho, radii = ustar.margin_optimal_outputs(V, return_radii=True)
    assert torch.allclose(U[0], torch.tensor([-1.0, 0.0, 0.0]), atol=1e-6)
    assert torch.allclose(U[1], torch.tensor([1.0, 0.0, 0.0]), atol=1e-6)
    assert rho == pytest.approx(1.0, abs=1e-6)
    # u = v decodes v_1 = e1 with negative margin (<e1, v_1 - v_2> = -1)
    assert geometry.output_margins(V, V)[0].item() == pytest.approx(-1.0, abs=1e-6)


def test_middle_of_segment_not_decodable():
    V = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)
    _, rho, radii = ustar.margin_optimal_outputs(V, return_radii=True)
    assert radii[0].item() == pytest.approx(1.0) and radii[2].item() == pytest.approx(1.0)
    assert radii[1].item() <= 0.0
    assert rho <= 0.0


def test_invariances():
    V = _values("gauss", 40, 6, 21)
    V = V / V.norm(dim=1, keepdim=True) * (1 + 0.2 * torch.rand(40, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    rho = ustar.decodability(V)
    assert rho > 0
    g = torch.Generator().manual_seed(22)
    c = torch.randn(6, generator=g, dtype=torch.float64) * 5
    R, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    assert ustar.decodability(V + c) == pytest.approx(rho, abs=1e-7)
    assert ustar.decodability(3.7 * V) == pytest.approx(rho, abs=1e-7)
    assert ustar.decodability(1e-3 * V) == pytest.approx(rho, abs=1e-7)
    assert ustar.decodability(V @ R.T) == pytest.approx(rho, abs=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_linear_conditioning_bound(seed):
    g = torch.Generator().manual_seed(100 + seed)
    V = spherical(60, 5, generator=g, dtype=torch.float64)
    T = torch.randn(5, 5, generator=g, dtype=torch.float64) + 2 * torch.eye(5, dtype=torch.float64)
    s = torch.linalg.svdvals(T)
    kappa = (s[0] / s[-1]).item()
    rho = ustar.decodability(V)
    rho_t = ustar.decodability(V @ T.T)  # rows v_i -> T v_i
    assert rho > 0
    assert rho / kappa - 1e-9 <= rho_t <= kappa * rho + 1e-9


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(2, 14),
    d=st.integers(1, 6),
    kind=st.sampled_from(["sphere", "gauss", "aniso", "lattice"]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_certificate_random(seed, n, d, kind, dtype):
    V = _values(kind, n, d, seed, dtype=dtype)
    U, rho, radii = ustar.margin_optimal_outputs(V, return_radii=True)
    assert U.shape == V.shape and U.dtype == dtype
    assert bool(torch.isfinite(U).all()) and bool(torch.isfinite(radii).all())
    assert torch.allclose(U.double().norm(dim=1), torch.ones(n, dtype=torch.float64), atol=1e-5)
    # the radii are the margins achieved by the returned outputs
    m = geometry.output_margins(V, U)
    atol = 1e-5 if dtype == torch.float32 else 1e-9
    assert torch.allclose(m.double(), radii.double(), atol=atol)
    assert rho == pytest.approx(radii.min().item(), abs=1e-6 if dtype == torch.float32 else 0.0)
    assert bool((radii >= -1).all()) and bool((radii <= 1).all())
    # lower bound (achieved margin) <= upper bound (hull point norm), gap certified
    _, lo, hi = ustar._margin_optimal(V, 1e-6, 200)
    pos = lo > 1e-3
    assert bool((lo[pos] <= hi[pos] + 1e-9).all())
    assert bool((hi[pos] - lo[pos] <= 1e-5 * hi[pos]).all())
    # duplicated values are never decodable
    Vn = V.double()
    dup = ((Vn[:, None, :] - Vn[None, :, :]).abs().sum(-1) == 0).sum(1) > 1
    assert bool((radii[dup] <= 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_duplicates(dtype):
    V = spherical(50, 8, generator=torch.Generator().manual_seed(5), dtype=dtype)
    V[17] = V[3]
    assert ustar.decodability(V) <= 1e-6
    U, rho, radii = ustar.margin_optimal_outputs(V, return_radii=True)
    assert bool(torch.isfinite(U).all())
    assert rho <= 1e-6
    assert radii[3].item() <= 1e-6 and radii[17].item() <= 1e-6
    others = torch.ones(50, dtype=torch.bool)
    others[[3, 17]] = False
    assert bool((radii[others] > 0).all())  # the other values stay decodable


def test_all_values_equal():
    V = torch.ones(5, 3)
    U, rho, radii = ustar.margin_optimal_outputs(V, return_radii=True)
    assert rho == 0.0 and bool((radii == 0).all())
    assert bool(torch.isfinite(U).all())
    assert torch.allclose(U.norm(dim=1), torch.ones(5))


def test_near_duplicates_are_exact():
    g = torch.Generator().manual_seed(9)
    V = spherical(12, 3, generator=g, dtype=torch.float64)
    V[5] = V[2] + 1e-7 * torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    U, rho, radii = ustar.margin_optimal_outputs(V, return_radii=True)
    Vn = V.numpy()
    for i in (2, 5, 0):
        rho_ref, u_ref = _ref_min_norm(Vn, i)
        if rho_ref > 1e-3:
            assert radii[i].item() == pytest.approx(rho_ref, abs=1e-5)
        else:
            assert radii[i].item() <= 1e-6
    assert np.allclose(geometry.output_margins(V, U).numpy(), direct_margins(Vn, U.numpy()), atol=1e-7)


def test_degenerate_lattice_matches_exact_solve():
    """Distinct points of {-2..2}^3: many coplanar stars (affinely dependent corrals)."""
    g = torch.Generator().manual_seed(3)
    V = torch.unique(torch.randint(-2, 3, (132, 3), generator=g), dim=0).to(torch.float64)
    U, lo, hi = ustar._margin_optimal(V, 1e-6, 200)
    Vn = V.numpy()
    checked = 0
    for i in range(V.shape[0]):
        rho_ref, _ = _ref_nnls(Vn, i)
        if rho_ref > 1e-3:
            checked += 1
            assert lo[i].item() == pytest.approx(rho_ref, abs=1e-7), i
        else:
            assert lo[i].item() <= 1e-6
    assert checked > 5
    pos = lo > 1e-3
    assert bool((hi[pos] - lo[pos] <= 1e-6 * hi[pos]).all())


@pytest.mark.parametrize("kind,n,d", [("sphere", 200, 12), ("aniso", 120, 6), ("lattice", 150, 3), ("gauss", 40, 60)])
def test_active_set_matches_dense(kind, n, d):
    V = _values(kind, n, d, 21)
    U0, lo0, hi0 = ustar._margin_optimal(V, 1e-6, 200, method="dense")
    U1, lo1, hi1 = ustar._margin_optimal(V, 1e-6, 200, method="active_set")
    pos = lo0 > 1e-3
    assert pos.any()
    assert torch.allclose(lo1[pos], lo0[pos], atol=1e-9)  # same radii where a value is decodable
    assert bool((lo1[~pos] <= 1e-6).all())  # the others (no unique best direction) stay undecodable
    assert lo1.min().item() <= 1e-6 if lo0.min() <= 1e-3 else lo1.min().item() == pytest.approx(lo0.min().item())
    assert (U1[pos] - U0[pos]).norm(dim=1).max().item() < 1e-6  # same U* where it is unique
    assert bool((hi1[pos] - lo1[pos] <= 1e-6 * hi1[pos]).all())  # certified
    # the radii are the margins the returned outputs achieve
    assert torch.allclose(geometry.output_margins(V, U1), lo1, atol=1e-9)


def test_drop_dependent_finds_a_rectangles_null_vector():
    """Four coplanar star points at a rectangle's corners (the lattice case): the dependence (1, -1, -1, 1) is
    orthogonal to any arithmetic start vector; the step must still find it, keep the hull point and free a slot."""
    s = 2**-0.5
    X = torch.tensor([[-s, 0, -s], [-s, s, 0], [s, 0, -s], [s, s, 0]], dtype=torch.float64)
    lam = torch.full((1, 4), 0.25, dtype=torch.float64)
    new = corral._drop_dependent((X @ X.T)[None], lam, torch.ones(1, 4, dtype=torch.bool))
    assert int((new > 0).sum()) <= 3 and float(new.sum()) == pytest.approx(1.0)
    assert torch.allclose(new @ X, lam @ X, atol=1e-12)


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_active_set_on_a_lattice_with_rectangular_corrals_finishes(backend):
    """150 lattice points in 3-d (seed 153): one value's corral was four corners of a rectangle, full and
    dependent; the solver could not free a slot and every round ran to max_iter (over 120 s). Now a few passes,
    and the dense solver's certificates."""
    V = _values("lattice", 150, 3, 153)
    _, lo0, _ = ustar._margin_optimal(V, 1e-6, 200, method="dense")
    W = geometry.normalized_values(V)
    U, lo, hi, passes = ustar._solve_active_set(W, W, 1e-6, 200, 16, 6, 3, backend, 16, 12)
    assert passes <= 10
    pos = lo0 > 1e-3
    assert pos.any() and torch.allclose(lo[pos], lo0[pos], atol=1e-9) and bool((lo[~pos] <= 1e-6).all())
    assert bool((hi[pos] - lo[pos] <= 1e-6 * hi[pos]).all())


def test_active_set_stops_a_value_whose_round_makes_no_progress(monkeypatch):
    """A corral solve that cannot improve (here: dependent full corrals never freed) stops its value after the
    round that did not lower its hull norm, with the margin it achieved, instead of a round per pass."""
    V = _values("lattice", 150, 3, 153)
    _, lo0, _ = ustar._margin_optimal(V, 1e-6, 200, method="dense")
    monkeypatch.setattr(corral, "_drop_dependent", lambda Q, lam, m: lam)
    W = geometry.normalized_values(V)
    U, lo, hi, passes = ustar._solve_active_set(W, W, 1e-6, 20, 16, 6, 3, "torch", 16, 12)
    assert passes <= 10
    assert torch.allclose(geometry.output_margins(V, U.double()), lo, atol=1e-9)
    pos = lo0 > 1e-3
    assert bool((lo[pos] <= lo0[pos] + 1e-9).all()) and bool((lo[~pos] <= 1e-6).all())  # never better


def test_active_set_few_passes_and_public_api():
    V = _values("sphere", 400, 8, 4)
    W = geometry.normalized_values(V)
    U, lo, hi, passes = ustar._solve_active_set(W, W, 1e-6, 200, 16, 6, 3, "auto", 32, 12)
    assert passes <= 10  # a handful of streaming passes, not one per iteration
    rho_ref = ustar.decodability(V, method="dense")
    assert lo.min().item() == pytest.approx(rho_ref, abs=1e-9)
    U32, rho32 = ustar.margin_optimal_outputs(V.float(), method="active_set")  # float32 streaming passes
    assert U32.dtype == torch.float32 and rho32 == pytest.approx(rho_ref, abs=1e-5)


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_the_checked_entry_leaves_rho_on_the_device(monkeypatch, backend):
    """construct's U*: the same U and rho bit for bit, without the finiteness read and float(rho); on the GPU's
    code path (run here) one host read per round, its tolist, besides the streaming twin's redo check."""
    V = spherical(300, 16, generator=torch.Generator().manual_seed(4))
    U, rho = ustar.margin_optimal_outputs(V, backend=backend)
    with HostReadCounter() as checked:
        U_checked, rho_checked = ustar.checked_margin_optimal_outputs(V, backend=backend)
    with HostReadCounter() as public:
        ustar.margin_optimal_outputs(V, backend=backend)
    assert torch.equal(U_checked, U) and rho_checked.dtype == torch.float64 and float(rho_checked) == rho
    assert public.reads == ["__bool__"] + checked.reads + ["__float__"]
    monkeypatch.setattr(corral, "SYNC_FREE_DEVICES", {"cpu"})
    monkeypatch.setattr(ustar, "_DENSE_MAX", 8)  # the active set with the torch backend too
    with HostReadCounter() as sync_free:
        _, rho_free = ustar.checked_margin_optimal_outputs(V, backend=backend)
    assert float(rho_free) == pytest.approx(rho, rel=1e-6)  # within the duality-gap tolerance
    assert "__bool__" not in sync_free.reads and sync_free.reads.count("tolist") >= 1


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_active_lists_are_the_corral_and_the_last_pass(monkeypatch, backend):
    """Each round solves a value on its last corral and the constraints its last pass streamed (no list grows
    round over round): with 4 constraints per pass the rounds are many, every list holds at most d + 1 + n_add
    corral points and 4 new ones, and the result carries the dense solver's certificates."""
    V = _values("sphere", 500, 8, 7)
    W = geometry.normalized_values(V)
    widths = []
    real = ustar.solve_candidates

    def recording(W_, rows, cand, P, **kw):
        widths.append(cand.shape[1])
        return real(W_, rows, cand, P, **kw)

    monkeypatch.setattr(ustar, "solve_candidates", recording)
    n_add, n_pass = 6, 4
    U, lo, hi, passes = ustar._solve_active_set(W, W, 1e-6, 200, 16, n_add, 3, backend, n_pass, n_pass)
    assert passes >= 4 and max(widths[1:]) <= 8 + 1 + n_add + n_pass
    _, lo0, _ = ustar._margin_optimal(V, 1e-6, 200, method="dense")
    U0 = ustar._margin_optimal(V, 1e-6, 200, method="dense")[0]
    pos = lo0 > 1e-3
    assert pos.all()
    assert torch.allclose(lo, lo0, atol=1e-9) and (U.double() - U0).norm(dim=1).max().item() < 1e-6
    assert bool((hi - lo <= 1e-6 * hi).all())
    assert torch.allclose(geometry.output_margins(V, U.double()), lo, atol=1e-9)


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_rows_certified_by_their_last_pass_skip_the_next(monkeypatch, backend):
    """After a round, a value whose solved u moved less from the direction its last pass streamed than that pass's
    last score exceeds the hull norm (every constraint off its list still satisfied) is done without a pass: the
    passes stream fewer rows than with the floor off, and the result carries the dense solver's certificates."""
    V = _values("sphere", 500, 8, 7)
    W = geometry.normalized_values(V)
    streamed = []
    real = _ops.star_topk

    def recording(values, k, outputs=None, rows=None, **kw):
        if outputs is not None:
            streamed.append(outputs.shape[0])
        return real(values, k, outputs, rows, **kw)

    monkeypatch.setattr(_ops, "star_topk", recording)
    U, lo, hi, passes = ustar._solve_active_set(W, W, 1e-6, 200, 16, 6, 3, backend, 16, 8)
    with_floor = sum(streamed)
    U0, lo0, _ = ustar._margin_optimal(V, 1e-6, 200, method="dense")
    assert lo0.min() > 1e-3
    assert torch.allclose(lo, lo0, atol=1e-9) and (U.double() - U0).norm(dim=1).max().item() < 1e-6
    assert bool((hi - lo <= 1e-6 * hi).all())
    assert torch.allclose(geometry.output_margins(V, U.double()), lo, atol=1e-9)
    streamed.clear()
    monkeypatch.setattr(ustar, "_certified_by_floor", lambda W, U, lo, hi, rs, *a: torch.zeros_like(rs, dtype=torch.bool))
    _, lo_off, _, _ = ustar._solve_active_set(W, W, 1e-6, 200, 16, 6, 3, backend, 16, 8)
    assert with_floor < sum(streamed) and torch.allclose(lo_off, lo, atol=1e-9)


def test_outside_the_corral_by_comparing_all_and_by_binary_search(monkeypatch):
    """Which streamed constraints lie outside each corral (padding -1 on both sides): the GPU's all-pairs comparison
    and the CPU's binary search in sorted lists (chunked too) agree with the definition."""
    gen = torch.Generator().manual_seed(3)
    cand = torch.randint(-1, 40, (50, 12), generator=gen)
    lists = torch.randint(-1, 40, (50, 9), generator=gen)
    expected = torch.tensor([[int(c) not in set(row.tolist()) for c in crow] for crow, row in zip(cand, lists)])
    assert expected.any() and not expected.all()
    assert torch.equal(ustar._outside(cand, lists), expected)
    monkeypatch.setitem(ustar._WORK_BYTES["cpu"], "pairs", 8 * 21 * 7)  # chunks of 7 rows
    assert torch.equal(ustar._outside(cand, lists), expected)
    monkeypatch.setattr(corral, "SYNC_FREE_DEVICES", {"cpu"})
    assert torch.equal(ustar._outside(cand, lists), expected)


def test_warm_corral_restarts_at_the_optimum():
    """A round of the active-set method starts from the previous round's corral: given the optimal corral of a
    candidate set, the solver returns the same optimum after one iteration; grown by more candidates, it
    reaches the cold solve's optimum of the larger set."""
    W = geometry.normalized_values(_values("sphere", 300, 10, 5))
    rows = torch.arange(40)
    _, cand = _ops.star_topk(W, 60, backend="torch")
    kw = dict(tol=1e-9, max_iter=200, n_init=8, n_add=4, n_fast=3)
    small = corral.candidate_star(W, rows, cand[:40, :30])
    U0, lo0, _, optimum = corral.solve_rows(small, W, W[rows], **kw)
    assert bool((optimum[0] < 30).all()) and torch.allclose(optimum[1].sum(1), torch.ones(40, dtype=torch.float64))
    U1, lo1, _, _ = corral.solve_rows(small, W, W[rows], **dict(kw, max_iter=1), corral=optimum)
    assert torch.allclose(lo1, lo0, atol=1e-9) and (U1 - U0).norm(dim=1).max().item() < 1e-6
    big = corral.candidate_star(W, rows, cand[:40])
    U2, lo2, _, _ = corral.solve_rows(big, W, W[rows], **kw, corral=optimum)
    U3, lo3, _, _ = corral.solve_rows(big, W, W[rows], **kw)
    assert torch.allclose(lo2, lo3, atol=1e-9) and (U2 - U3).norm(dim=1).max().item() < 1e-6


def test_active_set_duplicates_and_nonpositive():
    V = spherical(60, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    V[10] = V[4]
    V[20] = 0.25 * (V[1] + V[2] + V[3] + V[5]) * 0.1  # deep inside the hull: rho_i < 0
    _, lo0, _ = ustar._margin_optimal(V, 1e-6, 200, method="dense")
    U, lo, _ = ustar._margin_optimal(V, 1e-6, 200, method="active_set")
    assert lo[4].item() <= 0 and lo[10].item() <= 0 and lo[20].item() < 0
    assert torch.isfinite(U).all()
    ok = lo0 > 1e-3
    assert torch.allclose(lo[ok], lo0[ok], atol=1e-9)


@pytest.mark.parametrize(
    "bad,exc",
    [
        ([[0.0, 1.0], [1.0, 0.0]], TypeError),
        (torch.tensor([[0, 1], [1, 0]]), TypeError),
        (torch.ones(4), ValueError),
        (torch.ones(2, 3, 4), ValueError),
        (torch.ones(1, 3), ValueError),
        (torch.ones(3, 0), ValueError),
        (torch.tensor([[0.0, 1.0], [math.nan, 0.0]]), ValueError),
        (torch.tensor([[0.0, 1.0], [math.inf, 0.0]]), ValueError),
    ],
)
def test_bad_values(bad, exc):
    with pytest.raises(exc, match="V"):
        ustar.decodability(bad)
    with pytest.raises(exc, match="V"):
        ustar.margin_optimal_outputs(bad)


def test_bad_options():
    V = spherical(5, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="tol"):
        ustar.decodability(V, tol=0.0)
    with pytest.raises(ValueError, match="max_iter"):
        ustar.margin_optimal_outputs(V, max_iter=0)
    with pytest.raises(ValueError, match="method"):
        ustar.margin_optimal_outputs(V, method="fast")
    with pytest.raises(ValueError, match="backend"):
        ustar.decodability(V, backend="cuda")


class _NoKernels:
    """Stands in for the compiled module: any kernel call fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"kernel {name} called with backend='torch'")


def test_torch_backend_never_calls_a_kernel(monkeypatch):
    import factkernels

    K, V, f = (t.double() if t.is_floating_point() else t
               for t in factkernels.embeddings.random_fact_set(48, 48, 8, seed=3))
    expected = ustar.margin_optimal_outputs(V, method="dense", return_radii=True)[2]
    monkeypatch.setattr(_ops, "_C", _NoKernels())
    monkeypatch.setattr(ustar, "_DENSE_MAX", 8)  # construct's U* takes the streaming active-set path
    _, _, radii = ustar.margin_optimal_outputs(V, return_radii=True, backend="torch")
    assert torch.allclose(radii, expected, atol=1e-9)
    assert ustar.decodability(V, backend="torch") == pytest.approx(float(expected.min()), abs=1e-9)
    mlp = factkernels.construct(K, V, f, backend="torch", progress=False)
    assert mlp.report.rho == pytest.approx(float(expected.min()), abs=1e-9)
    if _ops.HAS_EXTENSION:  # the stand-in does catch a kernel call
        with pytest.raises(AssertionError, match="star_topk"):
            ustar.margin_optimal_outputs(V, backend="kernels")


@pytest.mark.parametrize("kind,n,d", [("sphere", 300, 16), ("lattice", 150, 3), ("gauss", 40, 60)])
def test_sync_free_path_matches_the_dense_certificates(monkeypatch, kind, n, d):
    """The GPU's code path (fixed shapes between convergence checks), run on the CPU: same radii and U*."""
    V = _values(kind, n, d, 31)
    U0, lo0, hi0 = ustar._margin_optimal(V, 1e-6, 200, method="dense")
    monkeypatch.setattr(corral, "SYNC_FREE_DEVICES", {"cpu"})
    pos = lo0 > 1e-3
    for method in ("dense", "active_set"):
        U1, lo1, hi1 = ustar._margin_optimal(V, 1e-6, 200, method=method)
        assert torch.allclose(lo1[pos], lo0[pos], atol=1e-9) and bool((lo1[~pos] <= 1e-6).all())
        assert (U1[pos] - U0[pos]).norm(dim=1).max().item() < 1e-6
        assert bool((hi1[pos] - lo1[pos] <= 1e-6 * hi1[pos]).all())
        assert torch.allclose(geometry.output_margins(V, U1), lo1, atol=1e-9)
