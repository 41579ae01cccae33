"""Margin-optimal output embeddings ``U*`` and the decodability ``rho(V)`` (seed 000).

Definition 3.1.1 (decodability) and Definition 3.2.1 / Appendix A.1.3 (margin-optimal
outputs) of "Constructing Efficient Fact-Storing MLPs for Transformers".

Margin-optimal outputs
----------------------
For values ``V = (v_1, ..., v_n)`` and a value ``i`` let
``x_ij = (v_i - v_j) / ||v_i - v_j||`` for ``j != i`` (the "star" of ``v_i``).
The margin-optimal output is the spherical Chebyshev centre of the star::

    u_i* = argmax_{||u|| <= 1} min_{j != i} <x_ij, u>,   rho_i = that maximum,

and ``rho(V) = min_i rho_i``.  By convex duality, when ``rho_i > 0`` the
maximum equals the minimum norm of a point of ``conv{x_ij : j != i}``::

    p_i* = argmin_{lambda in simplex} || sum_j lambda_j x_ij ||,
    rho_i = ||p_i*||,   u_i* = p_i* / ||p_i*||.

Any simplex point ``p`` certifies ``rho_i <= ||p||`` and any unit ``u`` certifies
``rho_i >= min_j <x_ij, u>``; ``p`` is optimal iff ``min_j <x_ij, p> >= ||p||^2``.

The solver handles all ``n`` problems at once (per chunk of rows): a batched
minimum-norm-point method in the spirit of Wolfe's algorithm.  Every row keeps
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
   whose weight reaches zero.

The first iterations clip negative weights (one factorisation each); the later
ones use Wolfe's line search (monotone decrease, finite termination).  The
solution is exact up to rounding (certified gaps ~1e-12 on random data), and a
row is never reported better than its certificate: the returned radius is the
margin actually achieved by the returned ``u_i``.  Work and memory per chunk
are ``O(chunk * n)`` plus ``O(chunk * k * (k + d))`` for corrals of size
``k <= d + 1 + added``, never ``O(n^3)``; about 8 iterations suffice for
``n = 1024, d = 64`` random values.

Active-set (cutting-plane) method for large ``n``
-------------------------------------------------
The dense iteration above touches all ``n^2`` pairs every iteration.  For
``n > _DENSE_MAX`` (``method="auto"``) each value instead keeps a list of
*active constraints* (value indices).  One round solves every value's problem
restricted to its active list with the same batched solver (explicit star
vectors of the candidates, warm-started from the previous round's corral,
which stays feasible since constraints are only appended), then
one streaming pass over ``V`` (:func:`factkernels._ops.star_topk`: tiles,
running top-k, no ``n x n`` matrix, in the input precision) finds every
value's most violated constraints; they are re-scored in float64 from
explicit differences and appended.  A value is done when no constraint is
violated beyond ``tol``: its restricted hull point norm is an upper bound of
``rho_i`` and the float64 minimum over the streamed candidates its achieved
margin.  Extra memory is ``O(n K)`` for the lists plus one bounded chunk.

When ``rho_i <= 0`` (a duplicated value, or ``v_i`` inside the convex hull of
the others) no output decodes ``v_i``: the minimum-norm point is ~0, the
returned ``u_i`` is the best direction seen and its radius is its achieved
margin (``<= 0``; exactly ``0`` for duplicated values).  Callers that need a
decodable set should reject ``rho <= 0``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from . import _ops
from .geometry import exact_star_scores, normalized_values
from .validation import check_choice, check_matrix as _check_matrix

__all__ = ["decodability", "margin_optimal_outputs"]

_CLOSE_REL = 1e-6
# ||p||^2 below this (star vectors are unit) means the minimum-norm point is 0:
# rho_i <= 0 and there is nothing left to improve.
_ZERO_PP = 1e-20
# Corral weights at or below this count as zero (the point leaves the corral).
_EPS_W = 1e-13
# Ridge of the corral systems (relative to entries of size O(1)).
_RIDGE = 1e-11
# Rows * values handled per chunk (float64 work arrays of this many entries).
_CHUNK_ELEMS = 1 << 22
# Bytes allowed for the corral buffers (X and its Gram) of one chunk.
_CORRAL_BYTES = 1 << 27
# Bytes for the candidate stars and corrals of one chunk of the active-set
# method: at least this, else about the size of the float64 values themselves
# (extra memory O(n d), never O(n^2)).
_ACTIVE_BYTES = 1 << 24
# Up to this many values "auto" solves densely (every value against all others
# per iteration, fastest for small sets); above it, by active-set cutting planes.
_DENSE_MAX = 4096
_METHODS = ("auto", "dense", "active_set")


def _check_tol(tol: float, max_iter: int) -> None:
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (0.0 < float(tol) < 1.0):
        raise ValueError(f"tol must be a float in (0, 1), got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive int, got {max_iter!r}")


# ----------------------------------------------------------------------------
# pair geometry of a chunk of rows
# ----------------------------------------------------------------------------


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
        sc = pos[self.close_r] >= 0
        sd = pos[self.dup_r] >= 0
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


def _cand_star(W: Tensor, rows: Tensor, cand: Tensor) -> _CandStar:
    """Candidate star of ``rows`` (r,) towards ``cand`` (r, K) value indices, -1 for padding."""
    r, K = cand.shape
    diff = W[rows][:, None, :] - W[cand.clamp(min=0)]
    nrm = diff.norm(dim=2)
    real = cand >= 0
    valid = real & (nrm > 0)
    X = torch.zeros(r, K + 1, W.shape[1], dtype=W.dtype, device=W.device)
    X[:, :K] = diff.div_(nrm.clamp_min(1e-300)[:, :, None]).mul_(valid[:, :, None])
    valid = torch.cat([valid, valid.new_zeros(r, 1)], dim=1)
    self_j = torch.full((r,), K, dtype=torch.long, device=W.device)
    return _CandStar(X, valid, self_j, (real & (nrm == 0)).any(dim=1), K)


def _star(W: Tensor, sq: Tensor, rows: Tensor) -> _Star:
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


# ----------------------------------------------------------------------------
# the batched minimum-norm-point solver
# ----------------------------------------------------------------------------


def _affine_min_norm(Q: Tensor, m: Tensor, refine: bool = True) -> Tuple[Tensor, Tensor]:
    """Affine minimum-norm weights of each corral.

    Q: (r, k, k) Gram matrices of the star vectors, m: (r, k) bool corral
    mask.  Returns ``y`` (r, k) with ``sum(y) = 1`` minimising ``y^T Q y`` over
    the affine hull (0 off the corral) and ``ok`` (r,), False where the system
    could not be solved.  Solves ``(Q + 1 1^T) z = 1``, ``y = z / sum(z)``:
    ``Q + 1 1^T`` is positive definite on the corral iff the corral is
    affinely independent; a tiny ridge makes numerically dependent corrals
    give the small-norm minimiser instead of garbage.
    """
    mf = m.to(Q.dtype)
    M = (Q + 1.0).mul_(mf[:, :, None] * mf[:, None, :])
    M.diagonal(dim1=1, dim2=2).add_(1.0 - mf + _RIDGE * mf)
    L, info = torch.linalg.cholesky_ex(M)
    bad = info != 0
    ok = ~bad
    if bool(bad.any()):
        Mb = M[bad]
        Mb.diagonal(dim1=1, dim2=2).add_(1e-8 * mf[bad])
        Lb, infob = torch.linalg.cholesky_ex(Mb)
        L[bad] = Lb
        ok[bad] = infob == 0
    rhs = mf[:, :, None]
    z = torch.cholesky_solve(rhs, L).mul_(rhs)
    if refine:  # one step of iterative refinement against the unregularised system
        M.diagonal(dim1=1, dim2=2).sub_(_RIDGE * mf)
        z += torch.cholesky_solve(rhs - _batched_matvec(M, z.squeeze(2))[:, :, None], L).mul_(rhs)
    z = z.squeeze(2)
    s = z.sum(dim=1, keepdim=True)
    ok &= torch.isfinite(s[:, 0]) & (s[:, 0] > 0)
    y = z / torch.where(ok[:, None], s, torch.ones_like(s))
    return y, ok


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
    w = mf * torch.linspace(1.0, 2.0, m.shape[1], dtype=Q.dtype, device=Q.device)[None, :]
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


def _solve_chunk(
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
) -> Tuple[Tensor, Tensor, Tensor, Tuple[Tensor, Tensor]]:
    """Margin-optimal directions of the rows of star ``st`` (float64 ``W``, centred).

    ``P`` (c, d) holds unit start directions; ``corral`` optionally a warm start
    instead: ``(columns (c, k) long, -1 for none; weights (c, k))``, a simplex
    point of each row's star (e.g. the corral this function returned for a
    smaller candidate set of the same rows).  Returns ``(U, lower, upper,
    corral)``: unit directions (c, d), their achieved margins (c,), the smallest
    hull-point norm seen (c,), an upper bound of ``rho_i`` when ``rho_i > 0``,
    and the final corral in the same format.  The state of unconverged rows only
    is kept (compacted when rows finish); corral slots freed by dropped points
    are reused, so corrals never need compaction.
    """
    dev, dt = W.device, W.dtype
    d = W.shape[1]
    c = P.shape[0]
    dup_row, n_other = st.dup_row, st.n_other

    kcap = max(1, min(n_other, d + 1 + n_add))  # corral (<= d + 1) + additions
    k0 = 0 if corral is None else corral[0].shape[1]
    kb = max(1, min(kcap, max(n_init + 4 * n_add, k0 + 2 * n_add)))  # current slot buffer size
    gid = torch.arange(c, device=dev)  # chunk position of each unconverged row
    idx = st.self_j[:, None].repeat(1, kb)  # corral members; free slots hold the row itself
    occ = torch.zeros(c, kb, dtype=torch.bool, device=dev)  # slot in use
    lam = torch.zeros(c, kb, dtype=dt, device=dev)  # simplex weights
    X = torch.zeros(c, kb, d, dtype=dt, device=dev)  # star vectors of the slots
    Q = torch.zeros(c, kb, kb, dtype=dt, device=dev)  # their Gram matrix
    prev_pp = torch.full((c,), math.inf, dtype=dt, device=dev)
    warm = k0 > 0
    if warm:
        cols, weights = corral
        occ[:, :k0] = cols >= 0
        idx[:, :k0] = torch.where(occ[:, :k0], cols, st.self_j[:, None])
        lam[:, :k0] = weights * occ[:, :k0]
        X[:, :k0] = st.vectors(W, idx[:, :k0])
        Q[:, :k0, :k0] = torch.bmm(X[:, :k0], X[:, :k0].transpose(1, 2))
        P = torch.where(occ[:, :1], torch.bmm(lam[:, None, :k0], X[:, :k0]).squeeze(1), P)
    out_idx = torch.full((c, kcap), -1, dtype=torch.long, device=dev)
    out_lam = torch.zeros(c, kcap, dtype=dt, device=dev)

    def save(rows: Tensor, ids: Tensor) -> None:
        """Keep the corral of the chunk rows ``ids`` (their state rows ``rows``) for the caller."""
        k = idx.shape[1]
        out_idx[ids, :k] = torch.where(occ[rows], idx[rows], -1)
        out_lam[ids, :k] = lam[rows] * occ[rows]

    best_lo = torch.full((c,), -math.inf, dtype=dt, device=dev)
    best_u = P / P.norm(dim=1, keepdim=True).clamp_min(1e-300)
    best_hi = torch.full((c,), math.inf, dtype=dt, device=dev)

    it = 0
    while True:
        # ---- certificate against all j (one GEMM): g[k, j] = <x_{i_k j}, p_k>
        g = st.margins(W, P)
        pp = (P * P).sum(dim=1)
        gmin = g.min(dim=1).values
        pnr = pp.sqrt()
        lo = torch.where(pnr > 0, gmin / pnr.clamp_min(1e-300), torch.full_like(gmin, -math.inf))
        lo = torch.where(torch.isfinite(gmin), lo, torch.ones_like(lo))  # no other value
        better = lo > best_lo[gid]
        best_lo[gid] = torch.where(better, lo, best_lo[gid])
        best_u[gid] = torch.where(better[:, None], P / pnr.clamp_min(1e-300)[:, None], best_u[gid])
        if it > 0:
            best_hi[gid] = torch.minimum(best_hi[gid], pnr)
            done = (pp - gmin <= tol * pp) | (pp <= _ZERO_PP) | ~torch.isfinite(gmin)
            if it > n_fast:  # the Wolfe phase is monotone: stop rows that stall
                done |= pp >= prev_pp * (1.0 - 1e-14)
            prev_pp = pp
            if it >= max_iter or bool(done.all()):
                break
            # drop finished rows once enough of them finished (a finished row
            # that is carried along stays finished; compaction copies all state)
            nd = int(done.sum())
            if nd * 8 >= done.numel():
                fin = done.nonzero(as_tuple=True)[0]
                save(fin, gid[fin])
                kk = (~done).nonzero(as_tuple=True)[0]
                st = st.subset(kk)
                gid, P, g, pp, prev_pp = gid[kk], P[kk], g[kk], pp[kk], prev_pp[kk]
                idx, occ, lam, X, Q = idx[kk], occ[kk], lam[kk], X[kk], Q[kk]
        it += 1
        r = gid.numel()
        cnt = occ.sum(dim=1)
        full = (cnt >= d + 1).nonzero(as_tuple=True)[0]
        if full.numel() > 0:  # make room in affinely dependent full corrals
            kf = int(occ[full].any(dim=0).nonzero()[-1]) + 1
            mf_ = occ[full, :kf]
            lf = _drop_dependent(Q[full, :kf, :kf], lam[full, :kf], mf_)
            mf_ = mf_ & (lf > 0)
            lam[full, :kf] = lf
            occ[full, :kf] = mf_
            idx[full, :kf] = torch.where(mf_, idx[full, :kf], st.self_j[full][:, None])
            cnt = occ.sum(dim=1)

        # ---- add the most violating j outside the corral
        first = it == 1 and not warm
        a = min(n_init if first else n_add, n_other)
        need = min(kcap, int(cnt.max()) + a)
        if need > kb:
            kb_new = min(kcap, max(need, kb + 2 * n_add))
            idx = _grow(idx, kb_new, (1,), fill=st.self_j)
            occ = _grow(occ, kb_new, (1,))
            lam = _grow(lam, kb_new, (1,))
            X = _grow(X, kb_new, (1,))
            Q = _grow(Q, kb_new, (1, 2))
            kb = kb_new
        a = min(a, int((kb - cnt).min()))
        if a > 0:
            g.scatter_(1, idx, math.inf)
            vals, cand = torch.topk(g, a, dim=1, largest=False)
            thr = torch.full_like(pp, math.inf) if first else pp * (1.0 - 0.5 * tol)
            # Wolfe's corrals are affinely independent: at most d + 1 points
            t = torch.arange(a, device=dev)
            ok = (vals < thr[:, None]) & (t[None, :] < (d + 1 - cnt)[:, None])
            cand = torch.where(ok, cand, st.self_j[:, None])
            sl = torch.argsort(occ.to(torch.int8), dim=1, stable=True)[:, :a]  # free slots
            xn = st.vectors(W, cand)
            ri = torch.arange(r, device=dev)[:, None].expand(-1, a)
            idx[ri, sl] = cand
            lam[ri, sl] = 0.0
            occ[ri, sl] = ok
            X[ri, sl] = xn
            if first:
                lam[:, 0] = ok[:, 0].to(dt)  # start from the worst point (slot 0)
            # Gram rows of the new points against every slot in use
            in_use = occ.any(dim=0).nonzero()  # empty when no row has a valid candidate
            kw = max(int(sl.max()), int(in_use[-1]) if in_use.numel() else 0) + 1
            Qn = torch.bmm(xn, X[:, :kw].transpose(1, 2))  # (r, a, kw)
            Q[ri, sl, :kw] = Qn
            Q[ri, :kw, sl] = Qn
        used = occ.any(dim=0).nonzero(as_tuple=True)[0]
        if used.numel() == 0:
            break
        ke = int(used[-1]) + 1

        # ---- minor cycles on every unconverged row (after clipped steps the
        # worst point can already be in the corral)
        fast = it <= n_fast
        ls = lam[:, :ke].clone()
        ms = occ[:, :ke].clone()
        A: Optional[Tensor] = None  # None: all rows
        for _ in range(kcap + 2):
            if A is None:
                m, Qa, l_old = ms, Q[:, :ke, :ke], ls
            else:
                m, Qa, l_old = ms[A], Q[A, :ke, :ke], ls[A]
            y, okA = _affine_min_norm(Qa, m, refine=not fast)
            okA &= m.any(dim=1)
            neg = m & (y <= _EPS_W)
            if fast:  # one solve, clip the negative weights
                lnew = torch.where(neg, torch.zeros_like(y), y)
                drop = neg
                again = torch.zeros_like(okA)
            else:  # Wolfe: move towards y until the first weight hits 0
                again = neg.any(dim=1)
                ratio = torch.where(neg, l_old / (l_old - y).clamp_min(1e-300), torch.full_like(y, math.inf))
                theta = ratio.min(dim=1).values.clamp(0.0, 1.0)
                theta = torch.where(again, theta, torch.ones_like(theta))
                lnew = l_old + theta[:, None] * (y - l_old)
                drop = neg & (lnew <= _EPS_W)
                ka = again.nonzero(as_tuple=True)[0]
                drop[ka, ratio.argmin(dim=1)[ka]] = True
                drop &= m
            lnew = torch.where(drop | ~m, torch.zeros_like(lnew), lnew.clamp_min(0.0))
            ssum = lnew.sum(dim=1, keepdim=True)
            lnew = lnew / torch.where(ssum > 0, ssum, torch.ones_like(ssum))
            # unsolvable system: keep the old weights
            lnew = torch.where(okA[:, None], lnew, l_old)
            drop &= okA[:, None]
            again &= okA
            if A is None:
                ls, ms = lnew, m & ~drop
                A = again.nonzero(as_tuple=True)[0]
            else:
                ls[A] = lnew
                ms[A] = m & ~drop
                A = A[again]
            if A.numel() == 0:
                break
        lam[:, :ke] = ls
        occ[:, :ke] = ms
        idx[:, :ke] = torch.where(ms, idx[:, :ke], st.self_j[:, None])
        P = torch.bmm(ls[:, None, :], X[:, :ke]).squeeze(1)

    save(torch.arange(gid.numel(), device=dev), gid)
    best_lo.clamp_(-1.0, 1.0)  # margins are cosines; drop rounding excess
    # a duplicated value has margin 0 for every output
    zero = torch.zeros_like(best_lo)
    best_lo = torch.where(dup_row, torch.minimum(best_lo, zero), best_lo)
    best_hi = torch.where(dup_row, zero, best_hi)
    # occupied slots first, trimmed to the largest corral
    order = torch.argsort((out_idx < 0).to(torch.int8), dim=1, stable=True)
    width = max(1, int((out_idx >= 0).sum(dim=1).max()))
    order = order[:, :width]
    return best_u, best_lo, best_hi, (out_idx.gather(1, order), out_lam.gather(1, order))


def _unit_start(Wr: Tensor, P: Tensor) -> Tensor:
    """Unit rows of ``P`` (c, d); rows ~0 fall back to the value direction, then to ``e_0``."""
    pn = P.norm(dim=1, keepdim=True)
    fallback = Wr / Wr.norm(dim=1, keepdim=True).clamp_min(1e-300)
    P = torch.where(pn > 1e-12, P / pn.clamp_min(1e-300), fallback)
    P[(P == 0).all(dim=1), 0] = 1.0
    return P


def _solve_dense(W: Tensor, tol: float, max_iter: int, n_init: int, n_add: int, n_fast: int):
    """Every value against all ``n`` others per iteration (one chunk of rows at a time)."""
    n, d = W.shape
    sq = (W * W).sum(dim=1)
    U = torch.empty(n, d, dtype=torch.float64, device=W.device)
    lo = torch.empty(n, dtype=torch.float64, device=W.device)
    hi = torch.empty(n, dtype=torch.float64, device=W.device)
    k_est = min(n - 1, d + 1 + n_add)
    step = max(1, min(n, _CHUNK_ELEMS // n, _CORRAL_BYTES // (8 * k_est * (k_est + d + 2))))
    for s in range(0, n, step):
        rows = torch.arange(s, min(n, s + step), device=W.device)
        st = _star(W, sq, rows)
        # start: normalised centroid of the star (of a column subset when n is
        # large: it only seeds the first corral)
        sub = torch.arange(0, n, max(1, n // 256), device=W.device)
        inv_s = st.inv[:, sub]
        P = _unit_start(st.Wr, st.Wr * inv_s.sum(dim=1, keepdim=True) - inv_s @ W[sub])
        del inv_s
        U[rows], lo[rows], hi[rows], _ = _solve_chunk(
            st, W, P, tol=tol, max_iter=max_iter, n_init=n_init, n_add=n_add, n_fast=n_fast
        )
    return U, lo, hi


def _pad_columns(t: Tensor, width: int, fill: float) -> Tensor:
    """Pad the columns of ``t`` (r, k) to ``width`` with ``fill``."""
    return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)


def _members(cand: Tensor, active: Tensor) -> Tensor:
    """(r, c) bool: is ``cand[i, a]`` among ``active[i]`` (r, K)? Compared in row chunks of about
    ``_CHUNK_ELEMS`` pairs: the whole r x c x K comparison was the peak memory at large n
    (1.2 GB at n = 65,536, d = 256)."""
    r, c = cand.shape
    out = torch.empty(r, c, dtype=torch.bool, device=cand.device)
    step = max(1, _CHUNK_ELEMS // max(1, c * active.shape[1]))
    for s in range(0, r, step):
        out[s : s + step] = (cand[s : s + step, :, None] == active[s : s + step, None, :]).any(dim=2)
    return out


def _solve_active_set(
    W: Tensor, Wk: Tensor, tol: float, max_iter: int, n_init: int, n_add: int, n_fast: int, backend: str
):
    """Cutting planes: each value's problem on its active constraints, one streaming pass per round.

    ``W`` float64 centred values, ``Wk`` the same in the precision of the
    streaming pass.  Returns ``(U, lower, upper, passes)``.
    """
    n, d = W.shape
    dev = W.device
    # Outputs are kept in the precision they are returned in (that of the pass): the margins certified below
    # are those of the returned U, and at n = 65,536, d = 256 a float64 copy was 134 MB of the peak.
    U = _unit_start(W, W.clone()).to(Wk.dtype)
    lo = torch.full((n,), -math.inf, dtype=torch.float64, device=dev)
    hi = torch.full((n,), math.inf, dtype=torch.float64, device=dev)
    # pass 1 ranks the constraints of u_i = v_i / |v_i| (one GEMM tile per value tile)
    _, active = _ops.star_topk(Wk, min(n - 1, 2 * n_init), backend=backend)
    active = active.to(torch.int32)  # value indices < n: int32 halves the lists (n x K, K ~ 400 at d = 256)
    rows = torch.arange(n, device=dev)
    budget = max(_ACTIVE_BYTES, 8 * n * d)
    passes = 1
    # each value's corral (positions in its active list, -1 for none) and weights, by value index: the next
    # round starts from the last optimum, which stays feasible because constraints are only appended. Written
    # in place, chunk by chunk, and never compacted: copies of these (n x ~d) arrays set the peak memory.
    widest = min(n - 1, d + 1 + n_add)  # the widest corral _solve_chunk returns
    corral_idx = torch.full((n, widest), -1, dtype=torch.int32, device=dev)  # positions < K: int32
    # weights only start the next round's corral solve (which re-solves them exactly): float32 is enough
    corral_lam = torch.zeros(n, widest, dtype=torch.float32, device=dev)
    width = 0  # columns in use
    while rows.numel() > 0:
        K = active.shape[1]
        # rows per chunk: the candidate star (K + 1 vectors per row) within the budget, and the corral
        # solver's buffers (X, the Gram Q and ~4 factorisation copies of it, k <= kc slots per row) within
        # _CORRAL_BYTES: at d = 256 the latter dominate (kc = 282: ~3.7 MB per row)
        kc = min(K, d + 1 + n_add)
        step = max(1, min(rows.numel(), budget // (8 * (K + 1) * (2 * d + K + 2)),
                          _CORRAL_BYTES // (8 * kc * (d + 5 * kc + 2))))
        dup = torch.zeros(rows.numel(), dtype=torch.bool, device=dev)
        new_width = width
        for s in range(0, rows.numel(), step):
            rs = rows[s : s + step]
            st = _cand_star(W, rs, active[s : s + step].long())
            warm = (corral_idx[rs, :width].long(), corral_lam[rs, :width].double()) if width else None
            u, _, h, (cols, weights) = _solve_chunk(st, W, U[rs].double(), tol=tol, max_iter=max_iter, n_init=n_init,
                                                    n_add=n_add, n_fast=n_fast, corral=warm)
            U[rs], hi[rs], dup[s : s + step] = u.to(U.dtype), torch.minimum(hi[rs], h), st.dup_row
            corral_idx[rs] = _pad_columns(cols.to(torch.int32), widest, -1)
            corral_lam[rs] = _pad_columns(weights.float(), widest, 0.0)
            new_width = max(new_width, cols.shape[1])
        width = new_width
        # one streaming pass: the most violated constraints of every unfinished value
        _, cand = _ops.star_topk(Wk, min(n - 1, 2 * n_add), U[rows], rows, backend=backend)
        passes += 1
        g = exact_star_scores(W, U[rows].double(), rows, cand)
        lo[rows] = g.min(dim=1).values
        known = _members(cand.to(torch.int32), active)
        new = (g < hi[rows, None] * (1.0 - tol)) & (cand >= 0) & ~known
        done = ~new.any(dim=1) | dup | (hi[rows] <= math.sqrt(_ZERO_PP)) | (passes > max_iter)
        keep = ~done
        rows, active, new, cand = rows[keep], active[keep], new[keep], cand[keep]
        if rows.numel() == 0:
            break
        # append the new constraints, valid ones first, trimmed to the widest row
        add = torch.where(new, cand, torch.full_like(cand, -1)).to(torch.int32)
        add = add.gather(1, torch.argsort((~new).to(torch.int8), dim=1, stable=True))
        active = torch.cat([active, add[:, : int(new.sum(dim=1).max())]], dim=1)
    lo.clamp_(-1.0, 1.0)
    return U, lo, hi, passes


def _margin_optimal(
    V: Tensor,
    tol: float,
    max_iter: int,
    *,
    method: str = "auto",
    n_init: Optional[int] = None,
    n_add: Optional[int] = None,
    n_fast: int = 3,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor, Tensor]:
    """Float64 ``(U, lower radii, upper bounds)`` for a validated ``V`` (n, d).

    ``n_init`` points seed every corral, ``n_add`` are added per iteration and
    the first ``n_fast`` iterations clip instead of line-searching.
    """
    with torch.no_grad():
        W = normalized_values(V)
        n, d = W.shape
        n_init = max(16, d // 4) if n_init is None else n_init
        n_add = max(6, d // 10) if n_add is None else n_add
        if method == "dense" or (method == "auto" and n <= _DENSE_MAX):
            return _solve_dense(W, tol, max_iter, n_init, n_add, n_fast)
        Wk = W.to(V.dtype) if V.dtype in (torch.float32, torch.float64) else W
        U, lo, hi, _ = _solve_active_set(W, Wk, tol, max_iter, n_init, n_add, n_fast, backend)
    return U, lo, hi


# ----------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------


def margin_optimal_outputs(
    V: Tensor, *, tol: float = 1e-6, max_iter: int = 200, return_radii: bool = False, method: str = "auto",
    backend: str = "auto",
) -> Union[Tuple[Tensor, float], Tuple[Tensor, float, Tensor]]:
    """Margin-optimal output embeddings ``U*`` (Definition 3.2.1).

    ``u_i* = argmax_{||u|| = 1} min_{j != i} <v_i - v_j, u> / ||v_i - v_j||``, solved
    for all values at once by the batched minimum-norm-point method described
    in the module docstring (float64 internally; about 8 batched iterations
    for ``n = 1024, d = 64`` random values).

    Args:
        V: (n, d) floating tensor of value embeddings, n >= 2, finite.
        tol: relative duality-gap tolerance per value: a value is done when
            ``(||p||^2 - min_j <x_ij, p>) / ||p||^2 <= tol`` for its hull point
            ``p``, so its radius is within a relative ``tol`` of the optimum
            (in practice the solve is exact up to ~1e-12).
        max_iter: maximum number of batched outer iterations.
        return_radii: also return the per-value radii.
        method: "dense" (every pair each iteration), "active_set" (cutting
            planes with streaming passes, ``O(n d)`` extra memory beyond the
            active lists) or "auto" (dense up to 4,096 values).
        backend: "auto", "kernels" or "torch" for the streaming passes (see ``factkernels._ops``).

    Returns:
        ``(U, rho)`` or ``(U, rho, radii)`` where ``U`` is (n, d) with unit rows,
        same dtype/device as ``V``; ``radii`` is (n,) with
        ``radii[i] = min_{j != i} <v_i - v_j, u_i> / ||v_i - v_j||`` (the margin
        achieved by the returned ``u_i``; ``<= 0`` when value ``i`` cannot be
        decoded, exactly 0 for duplicated values) and ``rho = min(radii)``
        (a Python float, the decodability ``rho(V)``).  The radii equal
        ``output_margins(V, U)``.  For a value with ``rho_i <= 0`` the returned
        ``u_i`` is the best direction the solver met (the problem on the
        sphere is not convex there); only ``rho <= 0`` itself is guaranteed.
    """
    V = _check_matrix(V, "V", min_rows=2)
    _check_tol(tol, max_iter)
    check_choice("method", method, _METHODS)
    check_choice("backend", backend, _ops.BACKENDS)
    U, lo, _ = _margin_optimal(V, float(tol), int(max_iter), method=method, backend=backend)
    rho = float(lo.min())
    U = U.to(V.dtype)
    if return_radii:
        return U, rho, lo.to(V.dtype)
    return U, rho


def decodability(V: Tensor, *, tol: float = 1e-6, max_iter: int = 200, method: str = "auto",
                 backend: str = "auto") -> float:
    """Decodability ``rho(V)`` of value embeddings (Definition 3.1.1).

    ``rho(V) = min_i max_{||u||=1} min_{j != i} <v_i - v_j, u> / ||v_i - v_j||``.

    Args:
        V: (n, d) floating tensor, n >= 2, finite.
        tol: relative duality-gap tolerance (see :func:`margin_optimal_outputs`).
        max_iter: maximum number of outer iterations.
        method: "auto", "dense" or "active_set" (see :func:`margin_optimal_outputs`).
        backend: "auto", "kernels" or "torch" for the streaming passes.

    Returns:
        ``rho(V)`` as a float in [-1, 1]; ``<= 0`` when some value cannot be
        decoded by any output (e.g. duplicated values give exactly 0).
        Invariant to translation, positive scaling and rotation of ``V``.
    """
    V = _check_matrix(V, "V", min_rows=2)
    _check_tol(tol, max_iter)
    check_choice("method", method, _METHODS)
    check_choice("backend", backend, _ops.BACKENDS)
    _, lo, _ = _margin_optimal(V, float(tol), int(max_iter), method=method, backend=backend)
    return float(lo.min())


