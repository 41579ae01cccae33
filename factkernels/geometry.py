"""Geometry of value embeddings: decodability, margin-optimal outputs, whitening.

This module implements the geometric quantities of seed 000 ("Constructing
Efficient Fact-Storing MLPs for Transformers"):

* the *decodability* ``rho(V)`` (Definition 3.1.1) and the *margin-optimal
  output embeddings* ``U*`` (Definition 3.2.1, Appendix A.1.3),
* the normalized worst margin of a given output set (``output_margins``),
* ZCA embedding whitening with strength ``alpha`` (Appendix A.1.3),
* anisotropic embeddings with a prescribed condition number (Appendix A.1.1),
* i.i.d. uniform spherical embeddings.

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

The solver handles all ``n`` problems at once (per chunk of rows).  It is a
batched minimum-norm-point method in the spirit of Wolfe's algorithm: every row
keeps a small *corral* (active set, at most ``d + 1`` points plus the points
being added).  One iteration

1. checks the optimality certificate of the current ``p_i`` against **all**
   ``j`` with one GEMM (``<x_ij, p_i> = (<v_i, p_i> - <v_j, p_i>) / ||v_i - v_j||``),
   retires the rows whose relative duality gap ``(||p||^2 - min_j <x_ij,p>)/||p||^2``
   is below ``tol``,
2. adds the most violating ``j`` of every remaining row to its corral,
3. solves the affine minimum-norm problem on every corral exactly with one
   batched Cholesky factorisation of ``X_S X_S^T + 1 1^T`` (positive definite
   iff the corral is affinely independent) and moves towards it, dropping the
   points whose weight becomes zero.

The first few iterations clip negative weights (one solve per iteration); the
later ones use Wolfe's line search (monotone decrease, finite termination),
so the method is exact up to rounding: on random data the certified gaps end
around ``1e-15``.  Work and memory per chunk are ``O(chunk * n)`` plus
``O(chunk * k * (k + d))`` for corrals of size ``k <= d + 1 + add``, never
``O(n^3)``.

When ``rho_i <= 0`` (a duplicated value, or ``v_i`` inside the convex hull of
the others) no output decodes ``v_i``: the minimum-norm point is ~0, the
returned ``u_i`` is the best direction seen and its radius is its achieved
margin (``<= 0``; exactly ``0`` for duplicated values).  Callers that need a
decodable set should reject ``rho <= 0``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union, overload

import torch
from torch import Tensor

__all__ = [
    "decodability",
    "margin_optimal_outputs",
    "output_margins",
    "whitening_transform",
    "whiten",
    "anisotropic",
    "spherical",
]

# Pairs closer than this (relative to the norms, after centring) get their
# distance and margins recomputed from explicit differences instead of the
# Gram identity ||a-b||^2 = |a|^2 + |b|^2 - 2<a,b>, which cancels badly there.
_CLOSE_REL = 1e-8
# ||p||^2 below this (the star vectors are unit) means the minimum-norm point
# is 0: rho_i <= 0 and there is nothing left to improve.
_ZERO_PP = 1e-20
# Corral weights at or below this are treated as zero (dropped).
_EPS_W = 1e-13
# Elements (rows * n) processed per chunk.
_CHUNK_ELEMS = 1 << 22
_DEBUG = False


# ----------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------


def _check_matrix(x: object, name: str, *, min_rows: int = 1) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of shape (n, d), got {type(x).__name__}; "
            f"convert with torch.as_tensor({name}, dtype=torch.float32)"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (float32 or float64), got {x.dtype}; "
            f"convert with {name}.float()"
        )
    if x.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor of shape (n, d), got shape {tuple(x.shape)}")
    if x.shape[0] < min_rows:
        what = "values" if min_rows >= 2 else "rows"
        raise ValueError(
            f"{name} must have at least {min_rows} rows ({what}), got {x.shape[0]}"
        )
    if x.shape[1] < 1:
        raise ValueError(f"{name} must have at least one column (d >= 1), got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or Inf entries; remove or replace them")
    return x


def _check_same(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    if a.device != b.device:
        raise ValueError(
            f"{name_b} is on {b.device} but {name_a} is on {a.device}; move both to one device"
        )
    if a.dtype != b.dtype:
        raise ValueError(
            f"{name_b} has dtype {b.dtype} but {name_a} has dtype {a.dtype}; use one dtype for both"
        )


def _check_tol(tol: float, max_iter: int) -> None:
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (0.0 < float(tol) < 1.0):
        raise ValueError(f"tol must be a float in (0, 1), got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive int, got {max_iter!r}")


# ----------------------------------------------------------------------------
# shared pair geometry for a chunk of rows
# ----------------------------------------------------------------------------


def _normalize_values(V: Tensor) -> Tensor:
    """Centre and rescale (rho is invariant, Lemma B.7.2) and go to float64."""
    W = V.detach().to(torch.float64)
    W = W - W.mean(dim=0, keepdim=True)
    scale = W.norm(dim=1).max()
    if float(scale) > 0:
        W = W / scale
    return W


class _Pairs:
    """Inverse pair distances of a chunk of rows against all values.

    ``inv[r, j] = 1 / ||v_rows[r] - v_j||`` (0 for j == row and for duplicates),
    ``excl[r, j]`` marks j == row and duplicates, ``dup_row[r]`` marks rows with
    a duplicate.  Pairs that are very close get exact distances, and their
    margins are recomputed from explicit differences by :meth:`fix`.
    """

    def __init__(self, W: Tensor, sq: Tensor, rows: Tensor) -> None:
        c = rows.numel()
        ar = torch.arange(c, device=W.device)
        Wr = W[rows]
        N2 = torch.addmm(sq[rows, None] + sq[None, :], Wr, W.T, beta=1.0, alpha=-2.0)
        N2.clamp_(min=0.0)
        close = N2 <= _CLOSE_REL * (sq[rows, None] + sq[None, :])
        close[ar, rows] = False
        inv = N2.rsqrt_()  # in place: N2 is not needed any more
        excl = torch.zeros(c, W.shape[0], dtype=torch.bool, device=W.device)
        excl[ar, rows] = True
        cr, cj = close.nonzero(as_tuple=True)
        self.cr = cr
        self.cj = cj
        self.cdiff = None
        if cr.numel() > 0:
            diff = Wr[cr] - W[cj]
            nrm = diff.norm(dim=1)
            dup = nrm == 0
            excl[cr[dup], cj[dup]] = True
            inv[cr, cj] = torch.where(dup, torch.zeros_like(nrm), 1.0 / nrm.clamp_min(1e-300))
            keep = ~dup
            self.cr, self.cj = cr[keep], cj[keep]
            self.cdiff = diff[keep] / nrm[keep, None]
        inv.masked_fill_(excl, 0.0)
        dup_row = excl.sum(dim=1) > 1
        self.W, self.rows, self.Wr = W, rows, Wr
        self.inv, self.excl, self.dup_row = inv, excl, dup_row

    def margins(self, R: Tensor, P: Tensor) -> Tensor:
        """``g[k, j] = <x_{R_k j}, P_k>`` for local rows ``R`` (+inf on excluded)."""
        g = (P * self.Wr[R]).sum(dim=1, keepdim=True) - P @ self.W.T
        g.mul_(self.inv[R])
        if self.cr.numel() > 0:
            self.fix(g, R, P)
        g.masked_fill_(self.excl[R], math.inf)
        return g

    def fix(self, g: Tensor, R: Tensor, P: Tensor) -> None:
        pos = torch.full((self.rows.numel(),), -1, dtype=torch.long, device=g.device)
        pos[R] = torch.arange(R.numel(), device=g.device)
        k = pos[self.cr]
        sel = k >= 0
        if bool(sel.any()):
            ks = k[sel]
            g[ks, self.cj[sel]] = (self.cdiff[sel] * P[ks]).sum(dim=1)

    def star(self, r: Tensor, j: Tensor) -> Tensor:
        """Star vectors ``x_{r_k, j_k}`` for local rows ``r`` and values ``j`` (both (m,)): (m, d)."""
        return (self.Wr[r] - self.W[j]) * self.inv[r, j][:, None]


# ----------------------------------------------------------------------------
# the batched minimum-norm-point solver
# ----------------------------------------------------------------------------


def _affine_min_norm(Q: Tensor, m: Tensor) -> Tuple[Tensor, Tensor]:
    """Affine minimum-norm weights on each corral.

    Q: (r, k, k) Gram matrices of the star vectors, m: (r, k) bool corral mask.
    Returns ``y`` (r, k) with ``sum(y) = 1`` minimising ``y^T Q y`` over the
    affine hull (0 off the corral) and ``ok`` (r,), False where the corral is
    numerically affinely dependent.  Solves ``(Q + 1 1^T) z = 1``,
    ``y = z / sum(z)``; ``Q + 1 1^T`` is positive definite on the corral iff the
    corral is affinely independent.
    """
    mf = m.to(Q.dtype)
    mm = mf[:, :, None] * mf[:, None, :]
    M = (Q + 1.0).mul_(mm)
    M.diagonal(dim1=1, dim2=2).add_(1.0 - mf)
    L, info = torch.linalg.cholesky_ex(M)
    bad = info != 0
    ok = ~bad
    if bool(bad.any()):
        # nearly affinely dependent corral: retry with a small ridge
        Mb = M[bad]
        Mb.diagonal(dim1=1, dim2=2).add_(1e-10 * mf[bad])
        Lb, infob = torch.linalg.cholesky_ex(Mb)
        L[bad] = Lb
        ok[bad] = infob == 0
    z = torch.cholesky_solve(mf[:, :, None], L).squeeze(2).mul_(mf)
    s = z.sum(dim=1, keepdim=True)
    ok &= torch.isfinite(s[:, 0]) & (s[:, 0] > 0)
    y = z / torch.where(ok[:, None], s, torch.ones_like(s))
    return y, ok


def _grow(t: Tensor, k: int, dims: Tuple[int, ...], fill: Union[float, Tensor] = 0.0) -> Tensor:
    """Pad tensor ``t`` along ``dims`` (slot dimensions) to size ``k``."""
    shape = list(t.shape)
    for dd in dims:
        shape[dd] = k
    out = torch.zeros(shape, dtype=t.dtype, device=t.device)
    if isinstance(fill, Tensor):
        out.copy_(fill.reshape([-1] + [1] * (len(shape) - 1)).expand(shape))
    sl = tuple(slice(0, t.shape[i]) for i in range(t.dim()))
    out[sl] = t
    return out


def _solve_chunk(
    W: Tensor,
    sq: Tensor,
    rows: Tensor,
    *,
    tol: float,
    max_iter: int,
    n_init: int,
    n_add: int,
    n_fast: int,
    topk: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Margin-optimal directions for ``rows``; returns (U, lower, upper) in float64.

    All per-row state is kept for the unconverged rows only and compacted when
    rows finish, so every iteration works on dense batched tensors.
    """
    dev, dt = W.device, W.dtype
    n, d = W.shape
    c = rows.numel()
    pairs = _Pairs(W, sq, rows)
    inv, Wr = pairs.inv, pairs.Wr
    n_other = int((~pairs.excl).sum(dim=1).max())
    # excluded pairs other than (i, i): duplicates (rare)
    xr, xj = pairs.excl.nonzero(as_tuple=True)
    xk = xj != rows[xr]
    xr, xj = xr[xk], xj[xk]
    cr, cj, cdiff = pairs.cr, pairs.cj, pairs.cdiff
    dup_row = pairs.dup_row
    del pairs

    # initial direction: normalised centroid of the star
    P = Wr * inv.sum(dim=1, keepdim=True) - inv @ W
    pn = P.norm(dim=1, keepdim=True)
    fallback = Wr / Wr.norm(dim=1, keepdim=True).clamp_min(1e-300)
    P = torch.where(pn > 1e-12, P / pn.clamp_min(1e-300), fallback)
    P[(P == 0).all(dim=1), 0] = 1.0

    kcap = max(1, min(n_other, d + 1 + n_add))  # a corral has <= d + 1 points
    kb = max(1, min(kcap, n_init + n_add))  # current slot buffer size
    selfj = rows.clone()  # value index of each active row
    gid = torch.arange(c, device=dev)  # chunk position of each active row
    idx = selfj[:, None].repeat(1, kb)  # free slots point at the row itself
    lam = torch.zeros(c, kb, dtype=dt, device=dev)
    X = torch.zeros(c, kb, d, dtype=dt, device=dev)
    Q = torch.zeros(c, kb, kb, dtype=dt, device=dev)
    cnt = torch.zeros(c, dtype=torch.long, device=dev)
    prev_pp = torch.full((c,), math.inf, dtype=dt, device=dev)

    best_lo = torch.full((c,), -math.inf, dtype=dt, device=dev)
    best_u = P.clone()
    best_hi = torch.full((c,), math.inf, dtype=dt, device=dev)

    it = 0
    while True:
        r = gid.numel()
        ar = torch.arange(r, device=dev)
        # ---- certificate against all j: g[k, j] = <x_{i_k j}, p_k>
        g = torch.mm(P, W.T)
        g.neg_().add_((P * Wr).sum(dim=1, keepdim=True)).mul_(inv)
        if cr.numel() > 0:
            g[cr, cj] = (cdiff * P[cr]).sum(dim=1)
        g[ar, selfj] = math.inf
        if xr.numel() > 0:
            g[xr, xj] = math.inf
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
            if bool(done.any()):
                keep = ~done
                kk = keep.nonzero(as_tuple=True)[0]
                pos = torch.full((r,), -1, dtype=torch.long, device=dev)
                pos[kk] = torch.arange(kk.numel(), device=dev)
                gid, selfj, P, Wr, inv, g = gid[kk], selfj[kk], P[kk], Wr[kk], inv[kk], g[kk]
                pp, prev_pp = pp[kk], prev_pp[kk]
                idx, lam, X, Q, cnt = idx[kk], lam[kk], X[kk], Q[kk], cnt[kk]
                if cr.numel() > 0:
                    sel = pos[cr] >= 0
                    cr, cj, cdiff = pos[cr][sel], cj[sel], cdiff[sel]
                if xr.numel() > 0:
                    sel = pos[xr] >= 0
                    xr, xj = pos[xr][sel], xj[sel]
                r = kk.numel()
                ar = torch.arange(r, device=dev)
        it += 1
        if _DEBUG:
            print("it", it, "rows", r, "cnt mean", float(cnt.float().mean()), "max", int(cnt.max()))

        # ---- add violating j outside the corral
        a = min(n_init if it == 1 else n_add, n_other)
        need = min(kcap, int(cnt.max()) + a)
        if need > kb:
            kb_new = min(kcap, max(need, kb + n_add))
            idx = _grow(idx, kb_new, (1,), fill=selfj)
            lam = _grow(lam, kb_new, (1,))
            X = _grow(X, kb_new, (1,))
            Q = _grow(Q, kb_new, (1, 2))
            kb = kb_new
        a = min(a, int((kb - cnt).min()))
        if a > 0:
            g.scatter_(1, idx, math.inf)
            if topk:
                vals, cand = torch.topk(g, a, dim=1, largest=False)
            else:
                # the most violating j of each of ``a`` column blocks (includes the
                # overall worst one), sorted: cheaper than an exact top-k
                bs = -(-n // a)
                gb = g if a * bs == n else torch.cat([g, g.new_full((r, a * bs - n), math.inf)], 1)
                vals, arg = gb.view(r, a, bs).min(dim=2)
                cand = arg + torch.arange(0, a * bs, bs, device=dev)[None, :]
                vals, order = vals.sort(dim=1)
                cand = cand.gather(1, order)
            thr = pp * (1.0 - 0.5 * tol) if it > 1 else torch.full_like(pp, math.inf)
            ok = vals < thr[:, None]  # a prefix of each row
            nadd = ok.sum(dim=1)
            cand = torch.where(ok, cand, selfj[:, None])
            sl = cnt[:, None] + torch.arange(a, device=dev)[None, :]
            xn = (Wr[:, None, :] - W[cand]) * inv.gather(1, cand)[:, :, None]
            idx.scatter_(1, sl, cand)
            lam.scatter_(1, sl, 0.0)
            X.scatter_(1, sl[:, :, None].expand(-1, -1, d), xn)
            if it == 1:
                lam[:, 0] = 1.0  # start from the single worst point
            cnt = cnt + nadd
            ke = int(cnt.max())
            kw = min(kb, ke + a)
            Qn = torch.bmm(xn, X[:, :kw].transpose(1, 2))  # (r, a, kw)
            Q[:, :, :kw].scatter_(1, sl[:, :, None].expand(-1, -1, kw), Qn)
            Q[:, :kw, :].scatter_(2, sl[:, None, :].expand(-1, kw, -1), Qn.transpose(1, 2))
        ke = int(cnt.max())
        if ke == 0:
            break

        # ---- minor cycles on every unconverged row (after clipped steps the
        # worst point can already be in the corral)
        fast = it <= n_fast
        slots = torch.arange(ke, device=dev)
        ls = lam[:, :ke].clone()
        ms = slots[None, :] < cnt[:, None]
        dropped = torch.zeros_like(ms)
        A = None  # None: all rows
        guard = 0
        while guard <= kcap + 2:
            guard += 1
            if A is None:
                m, Qa, l_old = ms, Q[:, :ke, :ke], ls
            else:
                m, Qa, l_old = ms[A], Q[A, :ke, :ke], ls[A]
            y, okA = _affine_min_norm(Qa, m)
            okA &= m.any(dim=1)
            neg = m & (y <= _EPS_W)
            if fast:  # one solve, clip the negative weights
                lnew = torch.where(neg, torch.zeros_like(y), y)
                drop = neg
                again = torch.zeros_like(okA)
            else:  # Wolfe: move towards y until the first weight hits 0
                again = neg.any(dim=1)
                ratio = torch.where(
                    neg, l_old / (l_old - y).clamp_min(1e-300), torch.full_like(y, math.inf)
                )
                theta = ratio.min(dim=1).values.clamp(0.0, 1.0)
                theta = torch.where(again, theta, torch.ones_like(theta))
                lnew = l_old + theta[:, None] * (y - l_old)
                drop = neg & (lnew <= _EPS_W)
                amin = ratio.argmin(dim=1)
                ka = again.nonzero(as_tuple=True)[0]
                drop[ka, amin[ka]] = True
                drop &= m
            lnew = torch.where(drop | ~m, torch.zeros_like(lnew), lnew.clamp_min(0.0))
            ssum = lnew.sum(dim=1, keepdim=True)
            lnew = lnew / torch.where(ssum > 0, ssum, torch.ones_like(ssum))
            # numerically dependent corral: keep the old weights
            lnew = torch.where(okA[:, None], lnew, l_old)
            drop &= okA[:, None]
            again &= okA
            if A is None:
                ls, ms, dropped = lnew, m & ~drop, drop
                A = again.nonzero(as_tuple=True)[0]
            else:
                ls[A] = lnew
                ms[A] = m & ~drop
                dropped[A] |= drop
                A = A[again]
            if A.numel() == 0:
                break

        # ---- compact the corrals that lost points, update p
        hasd = dropped.any(dim=1)
        if bool(hasd.any()):
            Dl = hasd.nonzero(as_tuple=True)[0]
            md = ms[Dl]
            perm = torch.argsort((~md).to(torch.int8), dim=1, stable=True)
            cd = md.sum(dim=1)
            ls[Dl] = ls[Dl].gather(1, perm)
            X[Dl, :ke] = X[Dl, :ke].gather(1, perm[:, :, None].expand(-1, -1, d))
            Qd = Q[Dl, :ke, :ke].gather(1, perm[:, :, None].expand(-1, -1, ke))
            Q[Dl, :ke, :ke] = Qd.gather(2, perm[:, None, :].expand(-1, ke, -1))
            idd = idx[Dl, :ke].gather(1, perm)
            idx[Dl, :ke] = torch.where(slots[None, :] < cd[:, None], idd, selfj[Dl][:, None])
            cnt[Dl] = cd
        lam[:, :ke] = ls
        P = torch.bmm(ls[:, None, :], X[:, :ke]).squeeze(1)

    # a duplicated value has margin 0 for every output
    zero = torch.zeros_like(best_lo)
    best_lo = torch.where(dup_row, torch.minimum(best_lo, zero), best_lo)
    best_hi = torch.where(dup_row, zero, best_hi)
    return best_u, best_lo, best_hi


def _chunk_rows(n: int, d: int) -> int:
    return max(1, min(n, _CHUNK_ELEMS // max(n, 1), max(64, (1 << 23) // (max(d, 1) * (d + 32)))))


def _margin_optimal(
    V: Tensor, tol: float, max_iter: int, n_init: int = 16, n_add: int = 16, n_fast: int = 4
) -> Tuple[Tensor, Tensor, Tensor]:
    """Float64 (U, lower radii, upper bounds) for validated V."""
    with torch.no_grad():
        W = _normalize_values(V)
        n, d = W.shape
        sq = (W * W).sum(dim=1)
        U = torch.empty(n, d, dtype=torch.float64, device=W.device)
        lo = torch.empty(n, dtype=torch.float64, device=W.device)
        hi = torch.empty(n, dtype=torch.float64, device=W.device)
        step = _chunk_rows(n, d)
        for s in range(0, n, step):
            rows = torch.arange(s, min(n, s + step), device=W.device)
            u, l, h = _solve_chunk(
                W, sq, rows, tol=tol, max_iter=max_iter, n_init=n_init, n_add=n_add, n_fast=n_fast
            )
            U[rows], lo[rows], hi[rows] = u, l, h
    return U, lo, hi


# ----------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------


@overload
def margin_optimal_outputs(
    V: Tensor, *, tol: float = ..., max_iter: int = ..., return_radii: "bool" = ...
) -> Union[Tuple[Tensor, float], Tuple[Tensor, float, Tensor]]: ...


def margin_optimal_outputs(
    V: Tensor, *, tol: float = 1e-6, max_iter: int = 200, return_radii: bool = False
) -> Union[Tuple[Tensor, float], Tuple[Tensor, float, Tensor]]:
    """Margin-optimal output embeddings ``U*`` (Definition 3.2.1).

    Args:
        V: (n, d) floating tensor of value embeddings, n >= 2, finite.
        tol: relative duality-gap tolerance per value: a row stops when
            ``(||p||^2 - min_j <x_ij, p>) / ||p||^2 <= tol`` for its hull point
            ``p``; then ``rho_i`` is within a relative ``tol`` of the optimum.
        max_iter: maximum number of (batched) outer iterations.
        return_radii: also return the per-value radii.

    Returns:
        ``(U, rho)`` or ``(U, rho, radii)`` where ``U`` is (n, d) with unit rows,
        same dtype/device as ``V``; ``radii`` is (n,) with
        ``radii[i] = min_{j != i} <v_i - v_j, u_i> / ||v_i - v_j||`` (the margin
        achieved by the returned ``u_i``; ``<= 0`` when value ``i`` cannot be
        decoded, exactly 0 for duplicated values) and ``rho = min(radii)``
        (a Python float, the decodability ``rho(V)``).
    """
    V = _check_matrix(V, "V", min_rows=2)
    _check_tol(tol, max_iter)
    U, lo, _ = _margin_optimal(V, float(tol), int(max_iter))
    rho = float(lo.min())
    U = U.to(V.dtype)
    if return_radii:
        return U, rho, lo.to(V.dtype)
    return U, rho


def decodability(V: Tensor, *, tol: float = 1e-6, max_iter: int = 200) -> float:
    """Decodability ``rho(V)`` of value embeddings (Definition 3.1.1).

    ``rho(V) = min_i max_{||u||=1} min_{j != i} <v_i - v_j, u> / ||v_i - v_j||``.

    Args:
        V: (n, d) floating tensor, n >= 2, finite.
        tol: relative duality-gap tolerance (see :func:`margin_optimal_outputs`).
        max_iter: maximum number of outer iterations.

    Returns:
        ``rho(V)`` as a float in [-1, 1]; ``<= 0`` when some value cannot be
        decoded by any output (e.g. duplicated values give exactly 0).
        Invariant to translation, positive scaling and rotation of ``V``.
    """
    V = _check_matrix(V, "V", min_rows=2)
    _check_tol(tol, max_iter)
    _, lo, _ = _margin_optimal(V, float(tol), int(max_iter))
    return float(lo.min())


def output_margins(V: Tensor, U: Tensor) -> Tensor:
    """Per-value normalized worst margin of outputs ``U`` for values ``V``.

    ``m_i = min_{j != i} <v_i - v_j, u_i> / (||v_i - v_j|| * ||u_i||)``.
    Pairs of identical values count as margin 0 (they cannot be separated).
    With ``U = V`` this is the margin of the plain construction ``u = v``.

    Args:
        V: (n, d) floating tensor of values, n >= 2.
        U: (n, d) tensor of outputs with nonzero rows, same dtype/device as V.

    Returns:
        (n,) tensor of margins (dtype of V); ``m.min()`` is the worst margin.
        Computed in float64, ``O(chunk * n)`` memory.
    """
    V = _check_matrix(V, "V", min_rows=2)
    U = _check_matrix(U, "U", min_rows=1)
    _check_same(V, U, "V", "U")
    if U.shape != V.shape:
        raise ValueError(f"U must have the same shape as V {tuple(V.shape)}, got {tuple(U.shape)}")
    with torch.no_grad():
        Ud = U.detach().to(torch.float64)
        un = Ud.norm(dim=1)
        if bool((un == 0).any()):
            raise ValueError("U has an all-zero row; every output needs a direction")
        Ud = Ud / un[:, None]
        W = V.detach().to(torch.float64)
        W = W - W.mean(dim=0, keepdim=True)
        n, d = W.shape
        sq = (W * W).sum(dim=1)
        out = torch.empty(n, dtype=torch.float64, device=W.device)
        step = max(1, min(n, _CHUNK_ELEMS // n))
        for s in range(0, n, step):
            rows = torch.arange(s, min(n, s + step), device=W.device)
            pairs = _Pairs(W, sq, rows)
            R = torch.arange(rows.numel(), device=W.device)
            g = pairs.margins(R, Ud[rows])
            dup = pairs.excl.clone()
            dup[R, rows] = False
            g.masked_fill_(dup, 0.0)
            out[rows] = g.min(dim=1).values
    return out.to(V.dtype)


def _check_alpha_eps(alpha: float, eps: float) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0.0 <= float(alpha) <= 1.0):
        raise ValueError(f"alpha must be a float in [0, 1] (whitening strength), got {alpha!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (float(eps) >= 0.0) or math.isinf(eps):
        raise ValueError(f"eps must be a finite float >= 0 (covariance ridge), got {eps!r}")


def whitening_transform(E: Tensor, alpha: float = 1.0, eps: float = 1e-6) -> Tensor:
    """ZCA whitening transform of strength ``alpha`` (Appendix A.1.3).

    ``Sigma = E^T E / F + eps I`` (second moment, as in the paper, no centring),
    ``Sigma = Q diag(lambda) Q^T`` and ``W = Q diag(lambda^(-alpha/2)) Q^T``,
    i.e. ``W = W_zca^alpha``.  ``alpha = 0`` gives the identity, ``alpha = 1``
    full whitening (``(E W)^T (E W) / F = I - eps Sigma^-1 ~ I``).

    Args:
        E: (F, d) floating tensor of embeddings (keys or values), finite.
        alpha: whitening strength in [0, 1].
        eps: ridge added to the covariance (>= 0).

    Returns:
        (d, d) symmetric positive definite tensor ``W`` (dtype/device of E).
        Apply as ``E @ W``; fold ``W^-1`` into the MLP output.
    """
    E = _check_matrix(E, "E", min_rows=1)
    _check_alpha_eps(alpha, eps)
    with torch.no_grad():
        Ed = E.detach().to(torch.float64)
        F, d = Ed.shape
        S = Ed.T @ Ed / F
        S.diagonal().add_(float(eps))
        S = 0.5 * (S + S.T)
        lam, Q = torch.linalg.eigh(S)
        if float(alpha) == 0.0:
            return torch.eye(d, dtype=E.dtype, device=E.device)
        if bool((lam <= 0).any()):
            raise ValueError(
                "E has a singular second-moment matrix (rank < d) and eps=0; pass eps > 0"
            )
        Wm = (Q * lam.pow(-0.5 * float(alpha))[None, :]) @ Q.T
        Wm = 0.5 * (Wm + Wm.T)
    return Wm.to(E.dtype)


def whiten(E: Tensor, alpha: float = 1.0, eps: float = 1e-6) -> Tuple[Tensor, Tensor]:
    """Whiten embeddings: returns ``(E @ W, W)`` with ``W = whitening_transform(E, alpha, eps)``.

    Args:
        E: (F, d) floating tensor.
        alpha: whitening strength in [0, 1].
        eps: covariance ridge.

    Returns:
        ``(E_white (F, d), W (d, d))``, dtype/device of ``E``.
    """
    W = whitening_transform(E, alpha=alpha, eps=eps)
    return E @ W, W


def anisotropic(E: Tensor, kappa: float) -> Tensor:
    """Rescale the singular values of ``E`` to condition number ``kappa`` (Appendix A.1.1).

    With ``E = A diag(s) B^T`` (thin SVD), the left and right singular vectors
    are kept and the singular values are rescaled log-affinely so that the
    largest is preserved and the smallest becomes ``s_max / kappa``::

        log s'_k = log s_max + (log s_k - log s_max) * log(kappa) / (log s_max - log s_min)

    (the relative order and the log-spacing pattern of the spectrum are kept).
    ``kappa = 1`` makes all singular values ``s_max``.  If all singular values
    are equal, they are spread log-linearly by index: ``s'_k = s_max kappa^(-k/(r-1))``.

    Args:
        E: (F, d) floating tensor of full rank ``r = min(F, d)``.
        kappa: target condition number ``s'_max / s'_min``, finite and >= 1.

    Returns:
        (F, d) tensor with the singular vectors of ``E`` and condition number
        ``kappa`` (dtype/device of E).
    """
    E = _check_matrix(E, "E", min_rows=1)
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not math.isfinite(kappa) or kappa < 1:
        raise ValueError(f"kappa must be a finite float >= 1 (target condition number), got {kappa!r}")
    with torch.no_grad():
        Ed = E.detach().to(torch.float64)
        A, s, Bh = torch.linalg.svd(Ed, full_matrices=False)
        r = s.numel()
        smax, smin = s[0], s[-1]
        if float(smin) <= float(smax) * 1e-15 or float(smax) == 0.0:
            raise ValueError(
                "E is rank deficient (its smallest singular value is 0); anisotropic needs full rank"
            )
        lk = math.log(float(kappa))
        spread = float(torch.log(smax) - torch.log(smin))
        if spread <= 1e-12:
            t = torch.arange(r, dtype=torch.float64, device=Ed.device) / max(r - 1, 1)
            logs = torch.log(smax) - t * lk
        else:
            logs = torch.log(smax) + (torch.log(s) - torch.log(smax)) * (lk / spread)
        out = (A * torch.exp(logs)[None, :]) @ Bh
    return out.to(E.dtype)


def spherical(
    n: int,
    d: int,
    *,
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``n`` i.i.d. points uniform on the unit sphere ``S^{d-1}``.

    Args:
        n: number of points (>= 1).
        d: dimension (>= 1).
        generator: optional ``torch.Generator`` (same seed, same result); the
            points are created on the generator's device.
        dtype: floating dtype of the result.

    Returns:
        (n, d) tensor with unit-norm rows.
    """
    for name, val in (("n", n), ("d", d)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    device = generator.device if generator is not None else torch.device("cpu")
    X = torch.randn(n, d, generator=generator, dtype=torch.float64, device=device)
    nrm = X.norm(dim=1, keepdim=True)
    while bool((nrm == 0).any()):  # probability 0, but never return a zero row
        zero = (nrm == 0)[:, 0]
        X[zero] = torch.randn(int(zero.sum()), d, generator=generator, dtype=torch.float64, device=device)
        nrm = X.norm(dim=1, keepdim=True)
    return (X / nrm).to(dtype)
