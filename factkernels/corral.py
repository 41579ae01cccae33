"""The batched minimum-norm-point solver behind U* (:mod:`factkernels.ustar`): corrals of star points.

For a chunk of rows (values ``i``), each with its star ``x_ij = (v_i - v_j) / ||v_i - v_j||`` (every
``j``, or a candidate list), find the minimum-norm point of ``conv{x_ij}``, all rows at once: a batched minimum-norm-point method in the spirit of Wolfe's algorithm.  Every row keeps
a small *corral* (active set of at most ``d + 1`` affinely independent star
points, typically 20-50 for random values).  One iteration

1. checks the optimality certificate of the current ``p_i`` against **all**
   ``j`` with one GEMM, ``<x_ij, p_i> = (<v_i, p_i> - <v_j, p_i>) / ||v_i - v_j||``,
   and retires the rows whose relative duality gap
   ``(||p_i||^2 - min_j <x_ij, p_i>) / ||p_i||^2`` is at most ``tol``,
2. adds the few most violating ``j`` of every remaining row to its corral
   (their Gram rows are one small bmm),
3. solves the affine minimum-norm problem of every corral with one batched
   Cholesky factorisation of ``X_S X_S^T + 1 1^T`` (positive definite iff the
   corral is affinely independent) and moves towards it, dropping the points
   whose weight reaches zero (:func:`factkernels._ops.corral_minor`: on a CPU
   a C++ kernel, one row per task, that updates the factor as points leave).
   (:func:`solve_candidates` can instead solve each row whole in a kernel: a C++ task or a CUDA warp per row.)

The first iterations clip negative weights (one factorisation each); the later
ones use Wolfe's line search (monotone decrease, finite termination).  The
solution is exact up to rounding (certified gaps ~1e-12 on random data), and a
row is never reported better than its certificate: the returned radius is the
margin actually achieved by the returned ``u_i``.  Work and memory per chunk
are ``O(chunk * n)`` plus ``O(chunk * k * (k + d))`` for corrals of size
``k <= d + 1 + added``, never ``O(n^3)``; about 8 iterations suffice for
``n = 1024, d = 64`` random values.

On ``SYNC_FREE_DEVICES`` (a GPU) every iteration has fixed shapes and no host round trip: insertions go
to free slots under masks, finished rows are frozen by a device-side mask, and the host looks at the
state only every ``_CHECK_EVERY`` iterations (stop, drop finished rows, widen the slot buffer, make room
in dependent full corrals).  Elsewhere (a CPU, where a round trip costs nothing) the corral steps
gather the rows and slots still moving.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from . import _ops

__all__ = ["SYNC_FREE_DEVICES", "candidate_star", "solve_candidates", "solve_rows", "star_rows", "ZERO_NORM2"]

# Pairs closer than sqrt(_CLOSE_REL) times their norms get distances and
# margins from explicit differences instead of the Gram identity
# ||a - b||^2 = |a|^2 + |b|^2 - 2<a, b>, which cancels badly there.
_CLOSE_REL = 1e-6
# ||p||^2 below this (star vectors are unit) means the minimum-norm point is 0:
# rho_i <= 0 and there is nothing left to improve.
ZERO_NORM2 = 1e-20
# Device types on which the solver keeps fixed shapes between convergence checks (no host round trip: on a GPU
# each one stalls the launch queue); elsewhere it gathers the rows and slots still moving at every corral step.
SYNC_FREE_DEVICES = {"cuda"}
# A chunk's solve looks at its state on the host (stop, drop finished rows) only every this many
# iterations after the clipped phase: the iterations in between are fixed-shape device work.
_CHECK_EVERY = 3
# Wolfe line-search steps per iteration; a row whose minor cycle is not finished goes on in the next one.
_MINOR_STEPS = 1


def _batched_matvec(A: Tensor, x: Tensor) -> Tensor:
    """``A[r] @ x[r]`` for A (r, k, d), x (r, d) -> (r, k).  As a row times Aᵀ: CPU ``bmm`` with one
    output column runs ~4x slower than with one output row."""
    return torch.bmm(x[:, None, :], A.transpose(1, 2)).squeeze(1)


class _Star(NamedTuple):
    """Star geometry of a chunk of rows against all ``n`` values (float64).

    ``inv[k, j] = 1 / ||v_{i_k} - v_j||`` (0 for ``j = i_k`` and duplicates);
    ``self_j[k] = i_k``; ``(dup_r, dup_j)`` the duplicated pairs; ``(close_r,
    close_j, close_x)`` the very close pairs with their exact unit difference.
    """

    Wr: Tensor
    inv: Tensor
    self_j: Tensor
    dup_r: Tensor
    dup_j: Tensor
    close_r: Tensor
    close_j: Tensor
    close_x: Tensor
    dup_row: Tensor
    n_other: int

    def margins(self, W: Tensor, P: Tensor) -> Tensor:
        """``g[k, j] = <x_{i_k j}, P_k>`` (r, n); +inf for ``j = i_k`` and duplicates."""
        g = torch.addmm((P * self.Wr).sum(dim=1, keepdim=True), P, W.T, beta=1.0, alpha=-1.0).mul_(self.inv)
        if self.close_r.numel() > 0:
            g[self.close_r, self.close_j] = (self.close_x * P[self.close_r]).sum(dim=1)
        g[torch.arange(P.shape[0], device=P.device), self.self_j] = math.inf
        if self.dup_r.numel() > 0:
            g[self.dup_r, self.dup_j] = math.inf
        return g

    def vectors(self, W: Tensor, cand: Tensor) -> Tensor:
        """Unit star vectors ``x_{i_k j}`` for the columns ``cand`` (r, a) -> (r, a, d)."""
        xn = (self.Wr[:, None, :] - W[cand]) * self.inv.gather(1, cand)[:, :, None]
        if self.close_r.numel() > 0:  # exact directions for very close pairs
            pr, pt = (cand[self.close_r] == self.close_j[:, None]).nonzero(as_tuple=True)
            xn[self.close_r[pr], pt] = self.close_x[pr]
        return xn

    def subset(self, keep: Tensor) -> "_Star":
        """Restrict the star geometry to the rows ``keep`` (indices)."""
        r = self.inv.shape[0]
        pos = torch.full((r,), -1, dtype=torch.long, device=keep.device)
        pos[keep] = torch.arange(keep.numel(), device=keep.device)
        # boolean masks wait for the device: only where there are close or duplicated pairs at all
        sc = pos[self.close_r] >= 0 if self.close_r.numel() else slice(None)
        sd = pos[self.dup_r] >= 0 if self.dup_r.numel() else slice(None)
        return _Star(
            self.Wr[keep], self.inv[keep], self.self_j[keep],
            pos[self.dup_r][sd], self.dup_j[sd],
            pos[self.close_r][sc], self.close_j[sc], self.close_x[sc],
            self.dup_row[keep], self.n_other,
        )  # fmt: skip


class _CandStar(NamedTuple):
    """Star of a chunk of rows restricted to candidate columns, as explicit vectors (float64).

    ``X[k, c]`` is the unit star vector of row ``k`` towards its candidate ``c``
    (c < K), zero in the extra column ``K`` that free corral slots point at
    (``self_j``) and for padding or duplicated candidates (``valid`` False);
    ``dup_row`` marks rows with a duplicated candidate.
    """

    X: Tensor
    valid: Tensor
    self_j: Tensor
    dup_row: Tensor
    n_other: int

    def margins(self, W: Tensor, P: Tensor) -> Tensor:
        g = _batched_matvec(self.X, P)
        return g.masked_fill_(~self.valid, math.inf)

    def vectors(self, W: Tensor, cand: Tensor) -> Tensor:
        return self.X[torch.arange(cand.shape[0], device=cand.device)[:, None], cand]

    def subset(self, keep: Tensor) -> "_CandStar":
        return _CandStar(self.X[keep], self.valid[keep], self.self_j[keep], self.dup_row[keep], self.n_other)


def candidate_star(W: Tensor, rows: Tensor, cand: Tensor) -> _CandStar:
    """Candidate star of ``rows`` (r,) towards ``cand`` (r, K) value indices, -1 for padding."""
    r, K = cand.shape
    real = cand >= 0
    # one gather of v_j for every column, the row's own value in the free-slot column K and for padding (a zero
    # difference), then in place: difference, norm, scale (the (r, K+1, d) array is the round's largest)
    idx = torch.cat([torch.where(real, cand, rows[:, None]), rows[:, None]], dim=1)
    X = W[idx].sub_(W[rows][:, None, :])  # v_j - v_i
    nrm = torch.linalg.vector_norm(X, dim=2)
    valid = torch.cat([real, real.new_zeros(r, 1)], dim=1) & (nrm > 0)
    X.mul_(torch.where(valid, -1.0 / nrm.clamp_min(1e-300), 0.0)[:, :, None])  # unit v_i - v_j, 0 where invalid
    self_j = torch.full((r,), K, dtype=torch.long, device=W.device)
    return _CandStar(X, valid, self_j, (real & (nrm[:, :K] == 0)).any(dim=1), K)


def star_rows(W: Tensor, sq: Tensor, rows: Tensor) -> _Star:
    c = rows.numel()
    ar = torch.arange(c, device=W.device)
    Wr = W[rows]
    base = sq[rows, None] + sq[None, :]
    N2 = torch.addmm(base, Wr, W.T, beta=1.0, alpha=-2.0).clamp_(min=0.0)
    close = N2 <= base.mul_(_CLOSE_REL)
    del base
    close[ar, rows] = False
    inv = N2.rsqrt_()  # in place: N2 is not needed any more
    inv[ar, rows] = 0.0
    cr, cj = close.nonzero(as_tuple=True)
    del close
    empty = torch.zeros(0, dtype=torch.long, device=W.device)
    dr, dj, cx = empty, empty, W.new_zeros(0, W.shape[1])
    if cr.numel() > 0:
        diff = Wr[cr] - W[cj]
        nrm = diff.norm(dim=1)
        dup = nrm == 0
        dr, dj = cr[dup], cj[dup]
        inv[dr, dj] = 0.0
        keep = ~dup
        cr, cj = cr[keep], cj[keep]
        inv[cr, cj] = 1.0 / nrm[keep]
        cx = diff[keep] / nrm[keep, None]
    dup_row = torch.zeros(c, dtype=torch.bool, device=W.device)
    dup_row[dr] = True
    n_dup = torch.zeros(c, dtype=torch.long, device=W.device).index_add_(0, dr, torch.ones_like(dr))
    n_other = int((W.shape[0] - 1 - n_dup).max())
    return _Star(Wr, inv, rows.clone(), dr, dj, cr, cj, cx, dup_row, n_other)


def _drop_dependent(Q: Tensor, lam: Tensor, m: Tensor) -> Tensor:
    """Carathéodory step for corrals that are affinely dependent.

    Q: (r, k, k) Gram, lam: (r, k) simplex weights, m: (r, k) corral mask.
    For every corral with an affine dependence ``mu`` (``sum mu = 0``,
    ``sum mu_k x_k = 0``, found by inverse iteration) moves ``lam - t mu`` until
    a weight hits zero: the hull point ``p`` is unchanged and one point leaves.
    Returns the new weights (0 marks the removed point); independent corrals
    are returned unchanged.  (Adding several points at once can create such
    corrals in degenerate geometry, e.g. lattice points; Wolfe's single-point
    additions never do.)
    """
    mf = m.to(Q.dtype)
    mm = mf[:, :, None] * mf[:, None, :]
    M0 = (Q + 1.0).mul_(mm)
    M = M0.clone()
    M.diagonal(dim1=1, dim2=2).add_(1.0 - mf + 1e-10 * mf)
    L, info = torch.linalg.cholesky_ex(M)
    ok = info == 0
    # a generic start: an arithmetic one (linspace) is orthogonal to null vectors of lattice stars, e.g. the
    # (1, -1, -1, 1) of a rectangle's corners, and inverse iteration never found them
    start = torch.rand(m.shape[1], generator=torch.Generator().manual_seed(0), dtype=Q.dtype).add_(1.0)
    w = mf * start.to(Q.device)[None, :]
    for _ in range(2):  # inverse iteration towards the null space of M0
        w = torch.cholesky_solve(w[:, :, None], L).squeeze(2).mul_(mf)
        w = w / w.norm(dim=1, keepdim=True).clamp_min(1e-300)
    res = (w * _batched_matvec(M0, w)).sum(dim=1)
    dep = ok & (res <= 1e-9) & torch.isfinite(w).all(dim=1)
    w = torch.where((w > 0).any(dim=1, keepdim=True), w, -w)
    ratio = torch.where(m & (w > 0), lam / w.clamp_min(1e-300), torch.full_like(lam, math.inf))
    t, kmin = ratio.min(dim=1)
    new = (lam - t[:, None] * w).clamp_min(0.0) * mf
    new[torch.arange(m.shape[0], device=m.device), kmin] = 0.0
    new = new / new.sum(dim=1, keepdim=True).clamp_min(1e-300)
    return torch.where(dep[:, None] & torch.isfinite(t)[:, None], new, lam)


def _grow(t: Tensor, k: int, dims: Tuple[int, ...], fill: Optional[Tensor] = None) -> Tensor:
    """Pad ``t`` along the slot dimensions ``dims`` to size ``k`` (zeros, or ``fill`` per row)."""
    shape = list(t.shape)
    for dd in dims:
        shape[dd] = k
    if fill is None:
        out = t.new_zeros(shape)
    else:
        out = fill.reshape([-1] + [1] * (len(shape) - 1)).expand(shape).clone()
    out[tuple(slice(0, s) for s in t.shape)] = t
    return out


class _Corrals:
    """Corral state of the unfinished rows of a chunk, ``kb`` slots each (float64).

    ``gid`` (r,) chunk position of each row; ``idx`` (r, kb) star columns (free
    slots hold the row's own column ``self_j``, a zero vector); ``occ`` (r, kb)
    slot in use; ``lam`` (r, kb) simplex weights; ``X`` (r, kb, d) star vectors;
    ``Q`` (r, kb, kb) their Gram matrix.
    """

    def __init__(self, st, W: Tensor, c: int, kb: int, corral: Optional[Tuple[Tensor, Tensor]]):
        dev, dt = W.device, W.dtype
        self.gid = torch.arange(c, device=dev)
        self.idx = st.self_j[:, None].repeat(1, kb)
        self.occ = torch.zeros(c, kb, dtype=torch.bool, device=dev)
        self.lam = torch.zeros(c, kb, dtype=dt, device=dev)
        self.X = torch.zeros(c, kb, W.shape[1], dtype=dt, device=dev)
        self.Q = torch.zeros(c, kb, kb, dtype=dt, device=dev)
        if corral is not None and corral[0].shape[1] > 0:
            cols, weights = corral
            k0 = cols.shape[1]
            self.occ[:, :k0] = cols >= 0
            self.idx[:, :k0] = torch.where(self.occ[:, :k0], cols, st.self_j[:, None])
            self.lam[:, :k0] = weights * self.occ[:, :k0]
            self.X[:, :k0] = st.vectors(W, self.idx[:, :k0])
            self.Q[:, :k0, :k0] = torch.bmm(self.X[:, :k0], self.X[:, :k0].transpose(1, 2))

    def keep(self, rows: Tensor) -> None:
        for name in ("gid", "idx", "occ", "lam", "X", "Q"):
            setattr(self, name, getattr(self, name)[rows])

    def grow(self, kb: int, self_j: Tensor) -> None:
        """Widen the slot buffer to ``kb`` (the factorisations cost O(kb^3) per row, so it follows the
        corrals instead of starting at their worst-case size)."""
        self.idx = _grow(self.idx, kb, (1,), fill=self_j)
        self.occ, self.lam = _grow(self.occ, kb, (1,)), _grow(self.lam, kb, (1,))
        self.X, self.Q = _grow(self.X, kb, (1,)), _grow(self.Q, kb, (1, 2))

    def add(self, st, W: Tensor, g: Tensor, a: int, thr: Tensor, room: Tensor, first: bool) -> None:
        """Put each row's ``a`` most violating columns of ``g`` (r, N) below ``thr`` (r,) into free slots
        (at most ``room`` (r,) of them), with fixed shapes: candidates that find no free slot wait."""
        r, dev = g.shape[0], g.device
        g.scatter_(1, self.idx, math.inf)
        vals, cand = torch.topk(g, a, dim=1, largest=False)
        sl = torch.argsort(self.occ.to(torch.int8), dim=1, stable=True)[:, :a]  # free slots first
        ri = torch.arange(r, device=dev)[:, None].expand(-1, a)
        t = torch.arange(a, device=dev)
        ok = (vals < thr[:, None]) & (t[None, :] < room[:, None]) & ~self.occ[ri, sl]
        cand = torch.where(ok, cand, st.self_j[:, None])
        self.idx[ri, sl] = torch.where(ok, cand, self.idx[ri, sl])
        self.lam[ri, sl] = torch.where(ok, 0.0, self.lam[ri, sl])
        self.occ[ri, sl] |= ok
        Xn = torch.where(ok[:, :, None], st.vectors(W, cand), self.X[ri, sl])  # (r, a, d): the slots' vectors
        self.X[ri, sl] = Xn
        if first:
            self.lam[:, 0] = ok[:, 0].to(self.lam.dtype)  # start from the worst point (slot 0)
        # the slots' Gram rows, written whole: where a slot kept its vector they are its old rows up to rounding
        Qn = torch.bmm(Xn, self.X.transpose(1, 2))  # (r, a, kb)
        self.Q[ri, sl] = Qn
        self.Q.transpose(1, 2)[ri, sl] = Qn

    def minor(self, fast: bool, frozen: Tensor, backend: str) -> Tensor:
        """Corral steps on every row not ``frozen`` (r,): a clipped affine solve (``fast``) or Wolfe's line
        search towards it (:func:`factkernels._ops.corral_minor`).  Returns (r,) True where the minor cycle
        is finished.  On ``SYNC_FREE_DEVICES`` every row takes ``_MINOR_STEPS`` steps (fixed shapes, no host
        round trip; an unfinished row goes on in the next iteration); elsewhere (a CPU, where a round trip
        costs nothing) rows step until their cycles finish, on the slots in use only."""
        if self.Q.device.type not in SYNC_FREE_DEVICES:  # only the slots in use
            ke = int(self.occ.any(dim=0).nonzero()[-1]) + 1 if bool(self.occ.any()) else 1
            ls, ms, settled = _ops.corral_minor(self.Q[:, :ke, :ke], self.lam[:, :ke], self.occ[:, :ke], frozen,
                                                fast=fast, max_steps=ke + 2, backend=backend)
            self.lam[:, :ke], self.occ[:, :ke] = ls, ms
        else:
            self.lam, self.occ, settled = _ops.corral_minor(self.Q, self.lam, self.occ, frozen, fast=fast,
                                                            max_steps=_MINOR_STEPS, backend=backend)
        return settled

    def point(self) -> Tensor:
        return torch.bmm(self.lam[:, None, :], self.X).squeeze(1)


def solve_rows(
    st: Union[_Star, _CandStar],
    W: Tensor,
    P: Tensor,
    *,
    tol: float,
    max_iter: int,
    n_init: int,
    n_add: int,
    n_fast: int,
    corral: Optional[Tuple[Tensor, Tensor]] = None,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor, Tensor, Tuple[Tensor, Tensor]]:
    """Margin-optimal directions of the rows of star ``st`` (float64 ``W``, centred).

    ``P`` (c, d) holds unit start directions; ``corral`` optionally a warm start
    instead: ``(columns (c, k) long, -1 for none; weights (c, k))``, a simplex
    point of each row's star (e.g. the corral this function returned for a
    smaller candidate set of the same rows).  Returns ``(U, lower, upper,
    corral)``: unit directions (c, d), their achieved margins (c,), the smallest
    hull-point norm seen (c,), an upper bound of ``rho_i`` when ``rho_i > 0``,
    and the final corral in the same format.  ``backend`` picks the corral steps' kernel or twin
    (:func:`factkernels._ops.corral_minor`).

    Every iteration has fixed shapes and no host round trip: finished rows are
    frozen by a device-side mask.  The host looks at the state only every
    ``_CHECK_EVERY`` iterations (stop when every row is done, drop finished
    rows, make room in dependent full corrals, widen the slot buffer).
    """
    dev, dt = W.device, W.dtype
    d = W.shape[1]
    c = P.shape[0]
    dup_row, n_other = st.dup_row, st.n_other
    kcap = max(1, min(n_other, d + 1 + n_add))  # corral (<= d + 1) + additions
    warm = corral is not None and corral[0].shape[1] > 0
    k0 = corral[0].shape[1] if warm else 0
    every = _CHECK_EVERY if dev.type in SYNC_FREE_DEVICES else 1  # round trips cost nothing on a CPU
    kb = max(1, min(kcap, max(n_init, k0) + every * n_add))
    cr = _Corrals(st, W, c, kb, corral if warm else None)
    if warm:
        P = torch.where(cr.occ[:, :1], cr.point(), P)
    out_idx = torch.full((c, kcap), -1, dtype=torch.long, device=dev)
    out_lam = torch.zeros(c, kcap, dtype=dt, device=dev)

    def save(rows: Tensor) -> None:
        """Keep the corrals of the state rows ``rows`` for the caller."""
        k = cr.idx.shape[1]
        out_idx[cr.gid[rows], :k] = torch.where(cr.occ[rows], cr.idx[rows], -1)
        out_lam[cr.gid[rows], :k] = cr.lam[rows] * cr.occ[rows]

    best_lo = torch.full((c,), -math.inf, dtype=dt, device=dev)
    best_u = P / P.norm(dim=1, keepdim=True).clamp_min(1e-300)
    best_hi = torch.full((c,), math.inf, dtype=dt, device=dev)
    done = torch.zeros(c, dtype=torch.bool, device=dev)  # certified (or stalled): frozen from here on
    settled = torch.ones(c, dtype=torch.bool, device=dev)  # last minor cycle finished
    prev_pp = torch.full((c,), math.inf, dtype=dt, device=dev)
    check = 2 if every > 1 else 1
    it = 0
    while True:
        # ---- certificate against all j (one GEMM): g[k, j] = <x_{i_k j}, p_k>
        g = st.margins(W, P)
        pp = (P * P).sum(dim=1)
        gmin = g.min(dim=1).values
        pnr = pp.sqrt()
        lo = torch.where(pnr > 0, gmin / pnr.clamp_min(1e-300), torch.full_like(gmin, -math.inf))
        lo = torch.where(torch.isfinite(gmin), lo, torch.ones_like(lo))  # no other value
        gid = cr.gid
        better = lo > best_lo[gid]
        best_lo[gid] = torch.where(better, lo, best_lo[gid])
        best_u[gid] = torch.where(better[:, None], P / pnr.clamp_min(1e-300)[:, None], best_u[gid])
        if it > 0:
            best_hi[gid] = torch.minimum(best_hi[gid], pnr)
            fin = (pp - gmin <= tol * pp) | (pp <= ZERO_NORM2) | ~torch.isfinite(gmin)
            if it > n_fast + 1:  # the Wolfe phase is monotone: stop rows that stall (a full corral waits for room)
                fin |= settled & (cr.occ.sum(dim=1) <= d) & (pp >= prev_pp * (1.0 - 1e-14))
            done |= fin
            prev_pp = pp
            if it >= max_iter:
                break
            if it >= check:  # the only host round trip of the loop
                check = it + every
                cnt = cr.occ.sum(dim=1)
                full = (cnt >= d + 1) & ~done
                n_done, k_max, n_full = torch.stack([done.sum(), cnt.max(), full.sum()]).tolist()
                if n_done == done.numel():
                    break
                if n_done * (2 if every > 1 else 8) >= done.numel():  # drop finished rows (copies all state)
                    order = torch.argsort(done.to(torch.int8), stable=True)  # the counts are known: no nonzero
                    kk, fin = order[: done.numel() - n_done], order[done.numel() - n_done :]
                    save(fin)
                    st = st.subset(kk)
                    cr.keep(kk)
                    P, g, pp, prev_pp, done, settled, full = P[kk], g[kk], pp[kk], prev_pp[kk], done[kk], settled[kk], full[kk]
                if n_full:  # make room in affinely dependent full corrals
                    fr = full.nonzero(as_tuple=True)[0]
                    lf = _drop_dependent(cr.Q[fr], cr.lam[fr], cr.occ[fr])
                    cr.lam[fr], cr.occ[fr] = lf, cr.occ[fr] & (lf > 0)
                if k_max + every * n_add > kb and kb < kcap:  # room for the additions until the next check
                    kb = min(kcap, k_max + 2 * every * n_add)
                    cr.grow(kb, st.self_j)
        it += 1
        # ---- add the most violating j outside the corral (Wolfe's corrals hold at most d + 1 points)
        first = it == 1 and not warm
        a = min(n_init if first else n_add, n_other, kb)
        thr = torch.full_like(pp, math.inf) if first else pp * (1.0 - 0.5 * tol)
        # (as in Wolfe's method, only rows whose minor cycle finished take new points)
        if a > 0:
            cr.add(st, W, g, a, torch.where(done | ~settled, -math.inf, thr), d + 1 - cr.occ.sum(dim=1), first)
        # ---- corral steps on every unfinished row (after clipped steps the worst point can already be in it)
        fast = it <= n_fast
        settled = cr.minor(fast, done, backend)
        cr.idx = torch.where(cr.occ, cr.idx, st.self_j[:, None])
        P = cr.point()

    save(torch.arange(cr.gid.numel(), device=dev))
    return _finish(best_u, best_lo, best_hi, dup_row, out_idx, out_lam)


def _finish(U: Tensor, lo: Tensor, hi: Tensor, dup_row: Tensor, cols: Tensor, lam: Tensor, trim: bool = True,
            occupied_first: bool = False):
    """A solve's outputs as :func:`solve_rows` returns them: margins clamped to cosines, duplicated values at
    margin 0, the corral's occupied slots first (``occupied_first``: they are already, as the kernel returns them),
    trimmed to the largest corral unless not ``trim`` (its width is a read back from the device)."""
    lo = lo.clamp(-1.0, 1.0)  # margins are cosines; drop rounding excess
    lo = torch.where(dup_row, lo.clamp(max=0.0), lo)  # a duplicated value has margin 0 for every output
    hi = hi.masked_fill(dup_row, 0.0)
    if occupied_first:  # (the stable sort below would leave them as they are: 0.016 of a default build's CPU s)
        if trim:
            width = max(1, int((cols >= 0).sum(dim=1).max()))
            cols, lam = cols[:, :width], lam[:, :width]
        return U, lo, hi, (cols, lam)
    order = torch.argsort((cols < 0).to(torch.int8), dim=1, stable=True)
    if trim:
        order = order[:, : max(1, int((cols >= 0).sum(dim=1).max()))]
    return U, lo, hi, (cols.gather(1, order), lam.gather(1, order))


def solve_candidates(
    W: Tensor,
    rows: Tensor,
    cand: Tensor,
    P: Tensor,
    *,
    tol: float,
    max_iter: int,
    n_init: int,
    n_add: int,
    n_fast: int,
    corral: Optional[Tuple[Tensor, Tensor]] = None,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor, Tensor, Tuple[Tensor, Tensor], Tensor]:
    """:func:`solve_rows` on the candidate star of ``rows`` (r,) towards ``cand`` (r, K) value indices (-1
    padding), plus (r,) whether a candidate duplicates the row's value.  Where the kernel runs, each row is solved
    whole (:func:`factkernels._ops.corral_solve`: on a CPU a C++ task per row, on a GPU a warp per row and one
    launch for all rows, the star, corral and factor in per-row scratch), a few hundred small torch ops fewer per
    chunk; elsewhere the batched torch solver runs (``n_fast`` clipped iterations first; the kernel runs Wolfe's
    line search throughout). On ``SYNC_FREE_DEVICES`` the kernel's corral comes back untrimmed (d + 1 wide)."""
    if _ops.uses_kernel(backend, "corral_solve", W):
        U, lo, hi, (cols, lam), dup = _ops.corral_solve(W, rows, cand, P, corral, tol=tol, max_iter=max_iter,
                                                         n_init=n_init, n_add=n_add, zero_norm2=ZERO_NORM2)
        return (*_finish(U, lo, hi, dup, cols, lam, trim=W.device.type not in SYNC_FREE_DEVICES, occupied_first=True),
                dup)
    st = candidate_star(W, rows, cand)
    U, lo, hi, out = solve_rows(st, W, P, tol=tol, max_iter=max_iter, n_init=n_init, n_add=n_add, n_fast=n_fast,
                                corral=corral, backend=backend)
    return U, lo, hi, out, st.dup_row
