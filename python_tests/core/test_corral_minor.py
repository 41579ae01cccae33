"""The corral kernels against their torch twins: ``_ops.corral_minor`` (U*'s per-row minimum-norm-point steps) and
``_ops.corral_solve`` (whole solves of candidate stars, the active-set rounds), on their own and inside U* (same
radii, same outputs, certified gaps)."""

import math

import pytest
import torch

from factkernels import _ops, corral, geometry, ustar
from helpers import DEVICES

needs_kernel = pytest.mark.skipif(not _ops.HAS_EXTENSION, reason="compiled extension not built")


def _corrals(r: int, k: int, d: int, seed: int, kind: str = "random"):
    """Random corral states: unit star vectors (r, k, d), their Gram, occupied slots, simplex weights."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(r, k, d, generator=g, dtype=torch.float64)
    if kind == "duplicates":  # two slots hold the same vector
        X[:, 1] = X[:, 0]
    elif kind == "collinear":  # opposite directions: 0 is in the hull
        X[:, 2] = -X[:, 3]
    elif kind == "shifted":  # every vector has a large common part: a flat, nearly dependent corral
        X = X * 1e-3 + torch.randn(r, 1, d, generator=g, dtype=torch.float64)
    X = X / X.norm(dim=2, keepdim=True)
    occ = torch.rand(r, k, generator=g) < 0.7
    occ[: r // 8] = False  # empty corrals
    lam = torch.rand(r, k, generator=g, dtype=torch.float64) * occ
    lam[:, -2:] = 0.0  # slots just added (weight 0)
    lam = lam / lam.sum(dim=1, keepdim=True).clamp_min(1e-300)
    frozen = torch.rand(r, generator=g) < 0.2
    return torch.bmm(X, X.transpose(1, 2)), lam, occ, frozen


@needs_kernel
@pytest.mark.parametrize("kind", ["random", "duplicates", "collinear", "shifted"])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("k,d", [(12, 16), (5, 8), (40, 8), (7, 3)])
def test_kernel_matches_twin(kind, fast, k, d):
    Q, lam, occ, frozen = _corrals(96, k, d, seed=k + d, kind=kind)
    steps = k + 2
    lt, mt, st = _ops.corral_minor(Q, lam, occ, frozen, fast=fast, max_steps=steps, backend="torch")
    lk, mk, sk = _ops.corral_minor(Q, lam, occ, frozen, fast=fast, max_steps=steps, backend="kernels")
    norm2 = lambda w: torch.einsum("ri,rij,rj->r", w, Q, w)  # noqa: E731  squared hull-point norms
    if k <= d + 1 and kind != "duplicates":  # affinely independent corrals (as Wolfe's): the same steps
        assert torch.equal(mk, mt) and torch.equal(sk, st)
        assert torch.allclose(lk, lt, atol=1e-7 if kind == "shifted" else 1e-9, rtol=0)
    elif not fast:  # dependent corrals: the ridge picks a minimiser, but a Wolfe cycle reaches the same norm
        assert torch.allclose(norm2(lk), norm2(lt), atol=1e-12, rtol=0)
    # every row's weights stay a simplex point on its corral, and frozen rows are untouched
    live = lam.sum(dim=1) > 0
    assert torch.allclose(lk[live].sum(dim=1), torch.ones(int(live.sum()), dtype=torch.float64), atol=1e-12)
    assert bool((lk >= 0).all()) and bool((lk[~mk] == 0).all())
    assert torch.equal(lk[frozen], lam[frozen]) and torch.equal(mk[frozen], occ[frozen]) and bool(sk[frozen].all())
    assert bool(sk[~occ.any(dim=1)].all())
    if not fast:  # a Wolfe cycle never raises the hull norm
        assert bool((norm2(lk) <= norm2(lam) + 1e-12)[live].all())


@needs_kernel
def test_kernel_finds_the_affine_optimum():
    """An affinely independent corral whose affine optimum is interior: one Wolfe step lands on it."""
    Q, lam, occ, frozen = _corrals(32, 6, 12, seed=5)
    occ[:] = True
    lam = torch.full_like(lam, 1.0 / 6)
    frozen[:] = False
    y, ok = _ops.affine_min_norm(Q, occ)
    interior = ok & (y > 1e-6).all(dim=1)
    lk, mk, sk = _ops.corral_minor(Q, lam, occ, frozen, fast=False, max_steps=8, backend="kernels")
    assert int(interior.sum()) > 0
    assert torch.allclose(lk[interior], y[interior], atol=1e-12) and bool(sk[interior].all())
    assert bool(mk[interior].all())


def _values(kind: str, n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "sphere":
        V = torch.randn(n, d, generator=g, dtype=torch.float64)
        return V / V.norm(dim=1, keepdim=True)
    if kind == "duplicates":
        V = torch.randn(n, d, generator=g, dtype=torch.float64)
        V[n // 2 :: 7] = V[: n // 2 : 7][: V[n // 2 :: 7].shape[0]]
        return V
    if kind == "collinear":  # a line of values through a random cloud
        V = torch.randn(n, d, generator=g, dtype=torch.float64)
        V[: n // 4] = torch.linspace(-2.0, 2.0, n // 4, dtype=torch.float64)[:, None] * V[0]
        return V
    if kind == "simplex_ties":  # d + 1 vertices of a regular simplex (every star has d tied constraints), then more
        E = torch.eye(d + 1, dtype=torch.float64) - 1.0 / (d + 1)
        basis = torch.linalg.svd(E).Vh[:d]  # the simplex lives in a d-dimensional subspace
        V = torch.randn(n, d, generator=g, dtype=torch.float64) * 0.1
        V[: d + 1] = E @ basis.T
        return V
    if kind == "lattice":
        return torch.randint(-2, 3, (n, d), generator=g).to(torch.float64)
    raise AssertionError(kind)


@needs_kernel
@pytest.mark.parametrize("kind,n,d", [("sphere", 300, 16), ("duplicates", 120, 6), ("collinear", 160, 5),
                                      ("simplex_ties", 90, 8), ("lattice", 60, 3), ("sphere", 400, 24)])
@pytest.mark.parametrize("method", ["dense", "active_set"])
def test_ustar_kernel_matches_twin(kind, n, d, method, monkeypatch):
    """U* with the kernel's corral steps and with the twin's: same rho, radii and outputs where rho_i > 0 (a
    value inside the others' hull has no unique best direction), and every radius the margin its output achieves."""
    if method == "active_set":
        monkeypatch.setattr(ustar, "_DENSE_MAX", 8)
    V = _values(kind, n, d, seed=n + d)
    Ut, rt, at = ustar.margin_optimal_outputs(V, method="auto", backend="torch", return_radii=True)
    Uk, rk, ak = ustar.margin_optimal_outputs(V, method="auto", backend="kernels", return_radii=True)
    pos = at > 1e-6  # rho_i > 0: the optimum is unique (below, only rho_i <= 0 itself is guaranteed)
    assert rk == pytest.approx(rt, abs=1e-9) if rt > 1e-6 else rk <= 0.0
    assert torch.allclose(ak[pos], at[pos], atol=1e-9, rtol=0) and bool((ak[~pos] <= 1e-6).all())
    assert torch.allclose(Uk[pos], Ut[pos], atol=1e-6, rtol=0)
    assert torch.allclose(geometry.output_margins(V, Uk), ak, atol=1e-9)


@needs_kernel
def test_ustar_kernel_certificates():
    """The radii the kernel path reports are certified: within tol of the exact optimum (upper bound = hull
    norm), as the twin's."""
    V = _values("sphere", 500, 12, seed=3)
    W = geometry.normalized_values(V)
    for backend in ("torch", "kernels"):
        U, lo, hi = ustar._margin_optimal(V, 1e-9, 200, method="dense", backend=backend)
        gap = (hi**2 - lo * hi) / hi**2  # relative duality gap (||p||^2 - min <x, p>) / ||p||^2
        assert bool((gap <= 1e-9 + 1e-12).all())
        assert math.isclose(float(lo.min()), float(ustar.decodability(V, tol=1e-9, backend="torch")), abs_tol=1e-9)
    assert W.shape == V.shape


def test_bad_arguments():
    Q, lam, occ, frozen = _corrals(4, 5, 3, seed=0)
    with pytest.raises(ValueError, match="float64"):
        _ops.corral_minor(Q.float(), lam, occ, frozen, fast=True, max_steps=1)
    with pytest.raises(ValueError, match="lam and occ"):
        _ops.corral_minor(Q, lam[:, :4], occ, frozen, fast=True, max_steps=1)
    with pytest.raises(ValueError, match="max_steps"):
        _ops.corral_minor(Q, lam, occ, frozen, fast=False, max_steps=0)


def test_stale_extension_runs_the_twin(monkeypatch):
    """An extension built before corral_minor existed: "auto" runs the twin, "kernels" says to rebuild."""
    Q, lam, occ, frozen = _corrals(16, 6, 8, seed=2)
    expected = _ops.corral_minor(Q, lam, occ, frozen, fast=False, max_steps=8, backend="torch")
    monkeypatch.setattr(_ops, "_C", object())
    got = _ops.corral_minor(Q, lam, occ, frozen, fast=False, max_steps=8)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    with pytest.raises(RuntimeError, match="rebuild"):
        _ops.corral_minor(Q, lam, occ, frozen, fast=False, max_steps=8, backend="kernels")


def _candidate_problem(kind: str, n: int, d: int, K: int, seed: int):
    """Centred values, 40 rows and K candidates each (the K best-ranked constraints of their start, then random
    padding with -1), as an active-set round sees them."""
    W = geometry.normalized_values(_values(kind, n, d, seed))
    rows = torch.arange(0, n, max(1, n // 40))[:40]
    _, cand = _ops.star_topk(W, K, W[rows], rows, backend="torch")
    cand[::5, -3:] = -1  # padding
    return W, rows, cand, ustar._unit_start(W[rows], W[rows].clone())


_SOLVE = dict(tol=1e-9, max_iter=200, n_init=8, n_add=4, n_fast=3)


@needs_kernel
@pytest.mark.parametrize("kind,n,d,K", [("sphere", 300, 16, 40), ("sphere", 500, 24, 60), ("duplicates", 120, 6, 20),
                                        ("collinear", 160, 5, 30), ("simplex_ties", 90, 8, 25), ("lattice", 150, 3, 30)])
def test_solve_kernel_matches_twin(kind, n, d, K):
    """One C++ solve per row against the batched torch solver on the same candidate stars, cold and warm started
    from a corral: same margins and hull norms where the optimum is positive, same outputs, a simplex corral."""
    W, rows, cand, P = _candidate_problem(kind, n, d, K, seed=n + d)
    Ut, lt, ht, (ct, wt), dt = corral.solve_candidates(W, rows, cand, P, backend="torch", **_SOLVE)
    Uk, lk, hk, (ck, wk), dk = corral.solve_candidates(W, rows, cand, P, backend="kernels", **_SOLVE)
    assert torch.equal(dk, dt)
    pos = (lt > 1e-6) & ~dt
    assert torch.allclose(lk[pos], lt[pos], atol=1e-9, rtol=0) and bool((lk[~pos] <= 1e-6).all())
    assert torch.allclose(hk[pos], ht[pos], atol=1e-9, rtol=0) and bool((hk[pos] - lk[pos] <= 1e-8).all())
    assert torch.allclose(Uk[pos], Ut[pos], atol=1e-6, rtol=0)
    # the returned margins are those of the returned outputs over the candidates
    X = corral.candidate_star(W, rows, cand)
    g = X.margins(W, Uk)[:, :-1].min(dim=1).values
    assert torch.allclose(torch.where(dk, torch.minimum(g, torch.zeros_like(g)), g.clamp(-1, 1)), lk, atol=1e-12)
    # the corral: positions into cand, simplex weights, its hull point at the reported norm
    assert bool(((ck >= -1) & (ck < K)).all()) and bool((wk[ck < 0] == 0).all()) and bool((wk >= 0).all())
    live = (ck >= 0).any(dim=1)
    assert torch.allclose(wk[live].sum(dim=1), torch.ones(int(live.sum()), dtype=torch.float64), atol=1e-12)
    p = (wk[:, :, None] * X.vectors(W, ck.clamp(min=0))).sum(dim=1)
    assert torch.allclose(p.norm(dim=1)[pos], hk[pos], atol=1e-9)
    # warm: the optimum of the first K - 8 candidates starts the solve over all K, as a later round does
    sub = cand[:, : K - 8]
    _, _, _, warm, _ = corral.solve_candidates(W, rows, sub, P, backend="kernels", **_SOLVE)
    Uw, lw, hw, _, _ = corral.solve_candidates(W, rows, cand, P, corral=warm, backend="kernels", **_SOLVE)
    Ut2, lt2, _, _, _ = corral.solve_candidates(W, rows, cand, P, corral=warm, backend="torch", **_SOLVE)
    assert torch.allclose(lw[pos], lt[pos], atol=1e-9, rtol=0) and torch.allclose(lt2[pos], lt[pos], atol=1e-9)
    assert torch.allclose(Uw[pos], Ut[pos], atol=1e-6, rtol=0)


@needs_kernel
def test_solve_kernel_certifies_against_the_exact_solve():
    """Rows whose candidates are every other value: the kernel's radii are the dense solver's (exact) radii."""
    V = _values("sphere", 120, 6, seed=9)
    W = geometry.normalized_values(V)
    rows = torch.arange(120)
    cand = torch.stack([torch.cat([torch.arange(i), torch.arange(i + 1, 120)]) for i in range(120)])
    _, lo, hi, _, _ = corral.solve_candidates(W, rows, cand, W.clone(), backend="kernels", **_SOLVE)
    _, lo0, _ = ustar._margin_optimal(V, 1e-9, 200, method="dense", backend="torch")
    assert torch.allclose(lo, lo0, atol=1e-9) and bool((hi - lo <= 1e-8).all())


def _corral_weights(cols: torch.Tensor, lam: torch.Tensor, K: int) -> torch.Tensor:
    """(r, K): each row's corral weights by candidate position (0 off the corral), whatever the slots' order."""
    dense = torch.zeros(cols.shape[0], K + 1, dtype=torch.float64)
    return dense.scatter_add_(1, torch.where(cols >= 0, cols, K), lam)[:, :K]


@needs_kernel
def test_solve_kernel_warm_corral_with_a_dependent_point():
    """A warm corral is factored whole; one listing the same star point twice (a candidate repeated: affinely
    dependent) is bordered point by point instead, the copy left out: the same optimum as the warm start without it."""
    W, rows, cand, P = _candidate_problem("sphere", 300, 16, 40, seed=316)
    kw = dict(tol=1e-9, max_iter=200, n_init=8, n_add=4, zero_norm2=corral.ZERO_NORM2)
    _, _, _, (cols, lam), _ = _ops.corral_solve(W, rows, cand, P, **kw)
    U0, lo0, hi0, _, _ = _ops.corral_solve(W, rows, cand, P, (cols, lam), **kw)
    first = cols[:, :1]
    twice = torch.cat([cand, cand.gather(1, first)], dim=1)  # column K repeats each row's first corral member
    cols2 = torch.cat([cols, torch.full_like(first, cand.shape[1])], dim=1)
    lam2 = torch.cat([lam, torch.zeros_like(lam[:, :1])], dim=1)
    U1, lo1, hi1, (c1, _), _ = _ops.corral_solve(W, rows, twice, P, (cols2, lam2), **kw)
    assert torch.allclose(lo1, lo0, atol=1e-12, rtol=0) and torch.allclose(hi1, hi0, atol=1e-12, rtol=0)
    assert torch.allclose(U1, U0, atol=1e-9, rtol=0)
    members = twice.gather(1, c1.clamp(min=0)).masked_fill(c1 < 0, -1)
    assert all(len(set(r) - {-1}) == sum(x >= 0 for x in r) for r in members.tolist())  # no value twice


@needs_kernel
def test_solve_kernel_counts_its_steps():
    """The steps corral_solve counts per row (_ops.CORRAL_SOLVE_STEPS) add up: the final corral holds the points
    added less those dropped, the largest corral bounds it (at most d + 1), a drop takes fewer rotations than the
    corral has members; a warm start from the optimum counts its corral and takes fewer major cycles."""
    W, rows, cand, P = _candidate_problem("sphere", 300, 16, 40, seed=316)
    kw = dict(tol=1e-9, max_iter=200, n_init=8, n_add=4, zero_norm2=corral.ZERO_NORM2)
    cold = torch.full((rows.numel(), len(_ops.CORRAL_SOLVE_STEPS)), -1, dtype=torch.int64)
    _, _, _, (cols, lam), _ = _ops.corral_solve(W, rows, cand, P, steps=cold, **kw)
    c = dict(zip(_ops.CORRAL_SOLVE_STEPS, cold.T))
    size = (cols >= 0).sum(dim=1)
    assert torch.equal(c["added"] - c["drops"], size) and bool((c["added"] >= size).all())
    assert bool((c["largest_corral"] >= size).all()) and bool((c["largest_corral"] <= 17).all())
    assert bool((c["major_cycles"] >= 2).all()) and bool((c["minor_steps"] >= 1).all())
    assert bool((c["solve_rows"] >= c["minor_steps"]).all()) and bool((c["rotations"] <= 16 * c["drops"]).all())
    assert bool((c["warm_corral"] == 0).all()) and int(c["drops"].sum()) > 0
    warm = torch.zeros_like(cold)
    _ops.corral_solve(W, rows, cand, P, (cols, lam), steps=warm, **kw)
    w = dict(zip(_ops.CORRAL_SOLVE_STEPS, warm.T))
    assert torch.equal(w["warm_corral"], size) and bool((w["added"] >= size).all())
    assert float(w["major_cycles"].double().mean()) < float(c["major_cycles"].double().mean())
    with pytest.raises(ValueError, match="steps"):
        _ops.corral_solve(W, rows, cand, P, steps=cold[:, :3], **kw)


needs_cuda_kernel = pytest.mark.skipif(not (torch.cuda.is_available() and _ops.build_info()["cuda"]),
                                       reason="needs a GPU and the CUDA kernels")


@pytest.mark.cuda
@needs_cuda_kernel
@pytest.mark.parametrize("few_warps", [False, True])
@pytest.mark.parametrize("kind,n,d,K", [("sphere", 300, 16, 40), ("sphere", 500, 24, 60), ("duplicates", 120, 6, 20),
                                        ("collinear", 160, 5, 30), ("simplex_ties", 90, 8, 25), ("lattice", 150, 3, 30),
                                        ("sphere", 400, 130, 150)])
def test_cuda_solve_kernel_matches_cpu_kernel(kind, n, d, K, few_warps, monkeypatch):
    """The CUDA kernel (a warp per row) against the C++ one on identical inputs, cold and warm: the same duplicates,
    margins, hull norms and outputs where the optimum is positive (elsewhere the direction at a ~0 hull point is
    rounding noise in both), the same corrals on generic values (a lattice's optimum can have several supports), a
    simplex corral everywhere. ``few_warps``: one warp takes every row in turn (its scratch reused)."""
    W, rows, cand, P = _candidate_problem(kind, n, d, K, seed=n + d)
    kw = dict(tol=1e-9, max_iter=200, n_init=8, n_add=4, zero_norm2=corral.ZERO_NORM2)
    sub = cand[:, : K - 8]
    _, _, _, warm, _ = _ops.corral_solve(W, rows, sub, P, **kw)
    if few_warps:
        monkeypatch.setattr(_ops, "CORRAL_SOLVE_WORK_BYTES", 1)
    for start in (None, warm):
        Uc, lc, hc, (cc, wc), dc = _ops.corral_solve(W, rows, cand, P, start, **kw)
        cuda_start = None if start is None else tuple(t.cuda() for t in start)
        out = _ops.corral_solve(W.cuda(), rows.cuda(), cand.cuda(), P.cuda(), cuda_start, **kw)
        Ug, lg, hg = (t.cpu() for t in out[:3])
        cg, wg = (t.cpu() for t in out[3])
        dg = out[4].cpu()
        assert torch.equal(dg, dc)
        pos = lc > 1e-6  # (raw margins: a duplicated value's is that of its other candidates)
        assert int(pos.sum()) > 0
        assert torch.allclose(lg[pos], lc[pos], atol=1e-9, rtol=0) and bool((lg[~pos] <= 1e-6).all())
        assert torch.allclose(hg[pos], hc[pos], atol=1e-9, rtol=0)
        assert torch.allclose(Ug[pos], Uc[pos], atol=1e-9, rtol=0)
        assert torch.allclose(Ug.norm(dim=1), torch.ones(rows.numel(), dtype=torch.float64), atol=1e-12)
        assert torch.equal(torch.isinf(hg), torch.isinf(hc))
        if kind == "sphere":  # the same corral and weights (a member at weight ~0 may differ by rounding)
            lam_g, lam_c = _corral_weights(cg, wg, K), _corral_weights(cc, wc, K)
            assert torch.equal(lam_g > 1e-9, lam_c > 1e-9) and torch.allclose(lam_g, lam_c, atol=1e-9, rtol=0)
        assert bool(((cg >= -1) & (cg < K)).all()) and bool((wg[cg < 0] == 0).all()) and bool((wg >= 0).all())
        live = (cg >= 0).any(dim=1)
        assert torch.allclose(wg[live].sum(dim=1), torch.ones(int(live.sum()), dtype=torch.float64), atol=1e-12)


@pytest.mark.cuda
@needs_cuda_kernel
def test_cuda_solve_kernel_with_corrals_past_128_members():
    """Vertices of a (slightly perturbed) regular simplex in d = 150 against all other values: each vertex's optimal
    corral holds the other 150 (the kernel's blocked solves, rotations and row shifts past 128 entries); the CUDA
    kernel matches the C++ one."""
    d = 150
    g = torch.Generator().manual_seed(5)
    E = torch.eye(d + 1, dtype=torch.float64) - 1.0 / (d + 1)
    V = torch.cat([E @ torch.linalg.svd(E).Vh[:d].T, 0.05 * torch.randn(20, d, generator=g, dtype=torch.float64)])
    V[: d + 1] += 1e-3 * torch.randn(d + 1, d, generator=g, dtype=torch.float64)
    W = geometry.normalized_values(V)
    n = W.shape[0]
    rows = torch.tensor([0, 1, 2, 160])
    cand = torch.stack([torch.cat([torch.arange(i), torch.arange(i + 1, n)]) for i in rows.tolist()])
    P = ustar._unit_start(W[rows], W[rows].clone())
    kw = dict(tol=1e-9, max_iter=400, n_init=16, n_add=8, zero_norm2=corral.ZERO_NORM2)
    Uc, lc, hc, (cc, _), _ = _ops.corral_solve(W, rows, cand, P, **kw)
    out = _ops.corral_solve(W.cuda(), rows.cuda(), cand.cuda(), P.cuda(), **kw)
    Ug, lg, hg = (t.cpu() for t in out[:3])
    cg = out[3][0].cpu()
    assert bool(((cc[:3] >= 0).sum(dim=1) == d).all()) and bool((lc > 0).all())  # the vertices' corrals: the others
    assert bool(((cg[:3] >= 0).sum(dim=1) == d).all())
    assert torch.allclose(lg, lc, atol=1e-9, rtol=0) and torch.allclose(hg, hc, atol=1e-9, rtol=0)
    assert torch.allclose(Ug, Uc, atol=1e-9, rtol=0)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,n,d", [("sphere", 300, 16), ("duplicates", 120, 6), ("collinear", 160, 5),
                                      ("simplex_ties", 90, 8), ("lattice", 60, 3), ("sphere", 600, 40)])
def test_ustar_with_the_solve_kernel_matches_the_dense_solver(kind, n, d, device, monkeypatch):
    """U* with backend="kernels" (its active-set rounds through corral_solve: the C++ kernel, or the CUDA one on a
    GPU) against the dense batched torch solver on the CPU: the same rho, radii and outputs where rho_i > 0,
    certified gaps, and every radius the margin its output achieves."""
    if device == "cuda" and not _ops.build_info()["cuda"]:
        pytest.skip("the extension was built without CUDA kernels")
    V = _values(kind, n, d, seed=n + d)
    devices = []
    solve = _ops.corral_solve
    monkeypatch.setattr(_ops, "corral_solve", lambda W, *a, **k: devices.append(W.device.type) or solve(W, *a, **k))
    U0, r0, a0 = ustar.margin_optimal_outputs(V, method="dense", backend="torch", return_radii=True)
    Uk, rk, ak = ustar.margin_optimal_outputs(V.to(device), backend="kernels", return_radii=True)
    assert devices and set(devices) == {device}  # the rounds ran the device's kernel
    Uk, ak = Uk.cpu(), ak.cpu()
    pos = a0 > 1e-6
    assert rk == pytest.approx(r0, abs=1e-9) if r0 > 1e-6 else rk <= 0.0
    assert torch.allclose(ak[pos], a0[pos], atol=1e-9, rtol=0) and bool((ak[~pos] <= 1e-6).all())
    assert torch.allclose(Uk[pos], U0[pos], atol=1e-6, rtol=0)
    assert torch.allclose(geometry.output_margins(V, Uk), ak, atol=1e-9)
    _, lo, hi = ustar._margin_optimal(V.to(device), 1e-9, 200, backend="kernels")
    lo, hi = lo.cpu(), hi.cpu()
    ok = lo > 1e-6
    assert bool(((hi[ok] ** 2 - lo[ok] * hi[ok]) / hi[ok] ** 2 <= 1e-9 + 1e-12).all())


@needs_kernel
def test_solve_kernel_bad_arguments():
    W, rows, cand, P = _candidate_problem("sphere", 60, 4, 10, seed=0)
    kw = dict(tol=1e-6, max_iter=10, n_init=4, n_add=2, zero_norm2=1e-20)
    with pytest.raises(ValueError, match="float64"):
        _ops.corral_solve(W.float(), rows, cand, P.float(), **kw)
    with pytest.raises(ValueError, match="cand"):
        _ops.corral_solve(W, rows, cand.int(), P, **kw)
    with pytest.raises(ValueError, match="cand entries"):
        _ops.corral_solve(W, rows, cand + 100, P, **kw)
    with pytest.raises(ValueError, match="rows"):
        _ops.corral_solve(W, rows + 1000, cand, P, **kw)
    with pytest.raises(ValueError, match="start"):
        _ops.corral_solve(W, rows, cand, P[:3], **kw)
    with pytest.raises(ValueError, match="W's device"):
        _ops.corral_solve(W, rows, cand.to("meta"), P, **kw)
