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

The solver (:mod:`factkernels.corral`) handles all ``n`` problems at once, per chunk of rows:
a batched minimum-norm-point method in the spirit of Wolfe's algorithm (corrals of star points,
one certificate GEMM, batched Cholesky solves per iteration); exact up to rounding, and a row is
never reported better than its certificate.

Active-set (cutting-plane) method for large ``n``
-------------------------------------------------
The dense solve touches all ``n^2`` pairs every iteration.  Where the rounds
below run in a kernel (C++ or CUDA), and elsewhere for ``n > _DENSE_MAX`` (``method="auto"``), each
value instead keeps a list of *active constraints* (value indices).  One round
solves every value's problem restricted to its active list (explicit star
vectors of the candidates, warm-started from the previous round's corral): on a
CPU with the extension one C++ task per value (:func:`factkernels._ops.corral_solve`; on a GPU
with ``backend="kernels"`` its CUDA kernel, a warp per value, one launch per round),
elsewhere the same batched solver; then one streaming pass over ``V`` (:func:`factkernels._ops.star_topk`: tiles,
running top-k, no ``n x n`` matrix, in the input precision) finds every
value's most violated constraints; they are re-scored in float64 from
explicit differences, and the next active list is the corral followed by them
(the corral's optimum stays feasible, so the hull norm only decreases; a
dropped constraint that becomes violated again comes back with a later pass).
After a round, a value whose direction moved less from the one its last pass streamed than that
pass's last (k-th) score exceeds its hull norm is done without a pass (a score moves by at most the
move of the unit direction, so no constraint off its list can be violated), on a CPU, where
dropping rows costs no host round trip.  A value is done when no constraint is violated beyond
``tol``: its restricted hull point norm is an upper bound of ``rho_i`` and the float64 minimum over
the streamed candidates its achieved margin.  Extra memory is ``O(n d)`` for
the lists and corrals plus one bounded chunk.

When ``rho_i <= 0`` (a duplicated value, or ``v_i`` inside the convex hull of
the others) no output decodes ``v_i``: the minimum-norm point is ~0, the
returned ``u_i`` is the best direction seen and its radius is its achieved
margin (``<= 0``; exactly ``0`` for duplicated values).  Callers that need a
decodable set should reject ``rho <= 0``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import _ops, corral
from .corral import ZERO_NORM2, solve_candidates, solve_rows, star_rows
from .geometry import normalized_values
from .validation import check_choice, check_matrix as _check_matrix

__all__ = ["checked_margin_optimal_outputs", "decodability", "margin_optimal_outputs"]

# Bytes that one chunk of rows may hold in float64 work arrays, by kind: its n-wide star rows ("pairs"), its
# candidate stars ("candidates") and its corral buffers with their factorisation copies ("corrals").  On
# SYNC_FREE_DEVICES few, large chunks keep the launches per round few; on a CPU chunks near the caches run
# fastest (with 512 MB chunks 8,192 x 128 took 1.9x the time it took with 64 MB ones).
_WORK_BYTES = {"sync_free": {"pairs": 1 << 33, "candidates": 1 << 33, "corrals": 1 << 33},
               "cpu": {"pairs": 1 << 25, "candidates": 1 << 24, "corrals": 1 << 27}}
# Up to this many values "auto" solves densely (every value against all others per iteration) where the rounds'
# corral solves run in torch; above it, and at every size where they run in a kernel (_ops.corral_solve: in C++
# 1.7-2.8x less CPU time than dense from 256 x 16 to 4,096 x 128, one thread), by active-set cutting planes.
_DENSE_MAX = 4096
_METHODS = ("auto", "dense", "active_set")
# Constraints per value, in units of d, that the active-set method's first streaming pass ranks and that
# each later pass brings: a wider net means fewer passes (each a full n x n score sweep). At |V| = 16,384,
# d = 128, later passes of 0.5 d took 6 passes (a third round for 1,913 values), 0.75 d 4 (3 values), 1.0 d 3,
# in about the same CPU seconds (wider lists, fewer rounds).
_FIRST_PER_DIM = 1.5
_PASS_PER_DIM = 0.75


def _check_tol(tol: float, max_iter: int) -> None:
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (0.0 < float(tol) < 1.0):
        raise ValueError(f"tol must be a float in (0, 1), got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive int, got {max_iter!r}")


def _work_bytes(device: torch.device, kind: str) -> int:
    return _WORK_BYTES["sync_free" if device.type in corral.SYNC_FREE_DEVICES else "cpu"][kind]


def _unit_start(Wr: Tensor, P: Tensor) -> Tensor:
    """Unit rows of ``P`` (c, d); rows ~0 fall back to the value direction ``Wr`` (c, d) (``P`` itself may be
    ``Wr``: no fallback to compute), then to ``e_0``."""
    pn = P.norm(dim=1, keepdim=True)
    unit = P / pn.clamp_min(1e-300)
    if P is not Wr:
        unit = torch.where(pn > 1e-12, unit, Wr / Wr.norm(dim=1, keepdim=True).clamp_min(1e-300))
    unit[:, 0].masked_fill_((unit == 0).all(dim=1), 1.0)
    return unit


def _solve_dense(W: Tensor, tol: float, max_iter: int, n_init: int, n_add: int, n_fast: int, backend: str):
    """Every value against all ``n`` others per iteration (one chunk of rows at a time)."""
    n, d = W.shape
    sq = (W * W).sum(dim=1)
    U = torch.empty(n, d, dtype=torch.float64, device=W.device)
    lo = torch.empty(n, dtype=torch.float64, device=W.device)
    hi = torch.empty(n, dtype=torch.float64, device=W.device)
    k_est = min(n - 1, d + 1 + n_add)
    step = max(1, min(n, _work_bytes(W.device, "pairs") // (8 * n),
                      _work_bytes(W.device, "corrals") // (8 * k_est * (k_est + d + 2))))
    for s in range(0, n, step):
        rows = torch.arange(s, min(n, s + step), device=W.device)
        st = star_rows(W, sq, rows)
        # start: normalised centroid of the star (of a column subset when n is
        # large: it only seeds the first corral)
        sub = torch.arange(0, n, max(1, n // 256), device=W.device)
        inv_s = st.inv[:, sub]
        P = _unit_start(st.Wr, st.Wr * inv_s.sum(dim=1, keepdim=True) - inv_s @ W[sub])
        del inv_s
        U[rows], lo[rows], hi[rows], _ = solve_rows(
            st, W, P, tol=tol, max_iter=max_iter, n_init=n_init, n_add=n_add, n_fast=n_fast, backend=backend
        )
    return U, lo, hi


def _joined(parts: list, width: int = 0, fill: float = 0) -> Tensor:
    """One round's per-chunk pieces (r_c,) or (r_c, k_c) as one tensor, the 2-D ones padded with ``fill`` to
    ``width`` columns; a single piece as it is (no copy)."""
    parts = [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill) if t.dim() == 2 and t.shape[1] < width
             else t for t in parts]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


# Up to this many elements the (r, c, K) comparison of _outside runs on SYNC_FREE_DEVICES: 2 launches instead of the
# sort and binary search's ~7 (at |V| = 4,096, d = 128 a round's was 4,096 x 96 x 129, 51 MB of bools).
_COMPARE_ALL_MAX = 1 << 28


def _outside(cand: Tensor, active: Tensor) -> Tensor:
    """(r, c) bool: is ``cand[i, a]`` missing from ``active[i]`` (r, K)? On SYNC_FREE_DEVICES, up to _COMPARE_ALL_MAX
    pairs, by comparing all; elsewhere by a binary search in each sorted list (the r x c x K comparison was 0.5 of
    11.8 CPU s at |V| = 16,384, d = 128), in row chunks of about the work budget."""
    r, c = cand.shape
    if cand.device.type in corral.SYNC_FREE_DEVICES and r * c * active.shape[1] <= _COMPARE_ALL_MAX:
        return (cand[:, :, None] != active[:, None, :]).all(dim=2)
    step = max(1, _work_bytes(cand.device, "pairs") // max(1, 8 * (c + active.shape[1])))
    if step >= r:  # one chunk (on a GPU up to n = 2^23 / (c + K)): no copy into an output
        srt = active.sort(dim=1).values
        return srt.gather(1, torch.searchsorted(srt, cand).clamp_(max=srt.shape[1] - 1)) != cand
    out = torch.empty(r, c, dtype=torch.bool, device=cand.device)
    for s in range(0, r, step):  # the sort's int64 indices of all lists were 150 MB at n = 65,536, d = 256
        srt, q = active[s : s + step].sort(dim=1).values, cand[s : s + step].contiguous()
        pos = torch.searchsorted(srt, q).clamp_(max=srt.shape[1] - 1)
        out[s : s + step] = srt.gather(1, pos) != q
    return out


def _stream_floor(streamed: Tensor, d: int) -> Tensor:
    """(r,) float64 lower bound of the exact score of every constraint a streaming pass left out of a row's list:
    its k-th streamed score (r, k) less the pass's rounding (products of d terms of values of norm <= 1, and the
    distances of pairs just above ``_ops.STAR_CLOSE_REL``, the precision :func:`factkernels._ops.star_topk`
    documents); +inf where the list holds every other value."""
    last = streamed[:, -1].double()
    eps = torch.finfo(streamed.dtype).eps
    return last - (4 * d * eps + 3 * eps / _ops.STAR_CLOSE_REL[streamed.dtype] * last.abs().nan_to_num(posinf=0.0))


def _certified_by_floor(W: Tensor, U: Tensor, lo: Tensor, hi: Tensor, rs: Tensor, act: Tensor, floor: Tensor,
                        U_streamed: Tensor, tol: float, recheck: str) -> Tensor:
    """(r,) which rows ``rs`` are certified by their last pass without a new one, writing their margins into ``lo``.

    A score <x_ij, u> moves by at most |u - u'| (x_ij is unit), so every constraint left out of the list ``act``
    (r, K) by the pass at ``U_streamed`` (r, d) still scores at least ``floor - |u - U_streamed|`` at the solved
    u = ``U[rs]``; where that is at least the hull norm ``hi`` (an upper bound of rho_i) and no listed constraint is
    violated beyond ``tol`` (float64, explicit differences), u is optimal within ``tol`` over all values. At
    |V| = 4,096, d = 128 this spared 1,200 of the 1,689 rows of the third pass.
    """
    u = U[rs].double()
    u = u.div_(u.norm(dim=1, keepdim=True))
    near = (floor - (u - U_streamed.double()).norm(dim=1) >= hi[rs]).nonzero().squeeze(1)
    out = torch.zeros(rs.numel(), dtype=torch.bool, device=rs.device)
    if near.numel() == 0:
        return out
    g = _ops.exact_star_scores(W, u[near], rs[near], act[near], backend=recheck).min(dim=1).values
    ok = g >= hi[rs[near]] * (1.0 - tol)
    lo[rs[near[ok]]] = g[ok]
    out[near[ok]] = True
    return out


def _solve_active_set(
    W: Tensor, Wk: Tensor, tol: float, max_iter: int, n_init: int, n_add: int, n_fast: int, backend: str,
    n_first: int, n_pass: int,
):
    """Cutting planes: each value's problem on its active constraints, one streaming pass per round.

    ``W`` float64 centred values, ``Wk`` the same in the precision of the
    streaming pass; the first pass ranks ``n_first`` constraints per value, each
    later one ``n_pass``.  Returns ``(U, lower, upper, passes)``.
    """
    n, d = W.shape
    dev = W.device
    # Outputs are kept in the precision they are returned in (that of the pass): the margins certified below
    # are those of the returned U, and at n = 65,536, d = 256 a float64 copy was 134 MB of the peak.
    U = _unit_start(W, W).to(Wk.dtype)
    # every value is solved and re-checked in the first round, which fills these
    lo = torch.empty(n, dtype=torch.float64, device=dev)
    hi = torch.empty(n, dtype=torch.float64, device=dev)
    # value indices < n, as the lists (n x K, K ~ 400 at d = 256) are kept: on a CPU int32 halves them; on
    # SYNC_FREE_DEVICES int64, the solve's and the pass's index type (each conversion a launch on a GPU)
    sync_free = dev.type in corral.SYNC_FREE_DEVICES
    index_dtype = torch.int64 if sync_free else torch.int32
    # the twin's operand of Wk, built once for every pass (where the passes run the twin)
    operand = None if _ops.star_topk_runs_kernel(backend, n_pass, Wk) else _ops.star_operand(Wk)
    # pass 1 ranks the constraints of u_i = v_i / |v_i| (one GEMM tile per value tile)
    rows = torch.arange(n, device=dev)
    _, active = _ops.star_topk(Wk, n_first, rows=rows, backend=backend, check_rows=False, operand=operand)
    active = active.to(index_dtype)
    budget = max(_work_bytes(dev, "candidates"), 8 * n * d)
    kernel = _ops.uses_kernel(backend, "corral_solve", W)  # the rounds' corral solves whole, a task (warp) per row
    # the float64 re-check has no CUDA kernel (a gather per pair: its twin is a few batched ops there)
    recheck = "auto" if dev.type == "cuda" and backend == "kernels" else backend
    passes = 1
    # each row's corral (value indices, -1 for none, occupied first) and its weights, carried from round to round
    # for the rows still unfinished: the next round's active list is this corral followed by the constraints of the
    # last pass, and starts from this optimum (feasible there). Constraints that left the corral are dropped: a
    # later pass brings back any that the moving u_i violates again, and the lists stay O(d) wide (at |V| = 16,384,
    # d = 128 the second round's lists were 103 wide instead of 256).
    width = 0  # leading columns of active that hold the corral
    lam_rows = None  # (rows, >= width) float32 weights (they only start the next solve, which re-solves them exactly)
    start, h_start = U, None  # the rows' start directions and hull-norm bounds (the first round: every value, in order)
    # after a pass at given directions, every constraint outside a row's next list scores at least the pass's last
    # score there: the floor (and those directions) that certifies a row after its next solve without a pass
    # (_certified_by_floor). Not on SYNC_FREE_DEVICES: dropping those rows before the pass is a host round trip more.
    use_floor, floor = not sync_free, None
    while rows.numel() > 0:
        K = active.shape[1]
        # rows per chunk: the candidate star (K + 1 vectors per row) and the corral solver's buffers (X, the
        # Gram Q and its factorisation copies, k <= kc slots per row) within the budget; the kernel holds
        # those in per-task (per-warp) scratch, a chunk only its outputs (U, the corral's slots and weights)
        kc = min(K, d + 1 + n_add)
        if kernel:  # its inputs and outputs: the list (as int64), the start, U and the corral's slots and weights
            step = max(1, min(rows.numel(), _work_bytes(dev, "candidates") // (8 * (K + 2 * d + 2 * kc + 4))))
        else:
            step = max(1, min(rows.numel(), budget // (8 * (K + 1) * (2 * d + K + 2)),
                              _work_bytes(dev, "corrals") // (8 * kc * (d + 5 * kc + 2))))
        slots = torch.arange(width, device=dev) if width else None
        # per chunk of rows: U, the hull norm, the corral (values, weights), settled (a duplicate or stalled),
        # certified, the corral's size
        chunks = []
        for s in range(0, rows.numel(), step):
            rs, act = rows[s : s + step], active[s : s + step].long()
            warm = ((torch.where(act[:, :width] >= 0, slots, -1), lam_rows[s : s + step, :width].double())
                    if width else None)
            u, _, h, (cols, weights), dup = solve_candidates(W, rs, act, start[s : s + step].double(), tol=tol,
                                                             max_iter=max_iter, n_init=n_init, n_add=n_add,
                                                             n_fast=n_fast, corral=warm, backend=backend)
            # given violated constraints, an exact solve lowers the hull norm: one that did not is stalled (a
            # corral solve that did not converge) and would come back every round until max_iter, as would a
            # duplicate. The first round has no earlier hull norm (h_start +inf): nothing stalled. (h_old < inf:
            # isfinite is four launches on a GPU, and a hull norm is never -inf)
            settled = dup
            if passes > 1:
                h_old = h_start[s : s + step]
                settled = dup | ((h_old < math.inf) & (h >= h_old * (1.0 - 1e-14)))
                h = torch.minimum(h_old, h)
            u = u.to(U.dtype)
            if rs.numel() == n:  # every value, in order (rows are increasing): the solve's own outputs, no copies
                U, hi = u, h
            else:
                U[rs], hi[rs] = u, h
            occupied = cols >= 0
            members = torch.where(occupied, act.gather(1, cols.clamp(min=0)), -1).to(index_dtype)  # value indices
            certified = None if floor is None else _certified_by_floor(W, U, lo, hi, rs, act, floor[0][s : s + step],
                                                                       floor[1][s : s + step], tol, recheck)
            chunks.append((u, h, members, weights, settled, certified, occupied.sum(dim=1)))
        # the round's rows as one tensor each (on a GPU one chunk: the solve's own outputs, no copies); the corrals
        # padded to the widest this round returned (it comes trimmed to that, but on SYNC_FREE_DEVICES)
        solved_width = max(part[2].shape[1] for part in chunks)
        U_rows, h_rows, settled, corral_size = (_joined([part[i] for part in chunks]) for i in (0, 1, 4, 6))
        corral_rows = _joined([part[2] for part in chunks], solved_width, -1)
        lam_rows = _joined([part[3] for part in chunks], solved_width, 0.0)
        if floor is not None:
            certified = _joined([part[5] for part in chunks])
            if bool(certified.any()):  # done without a pass (their margins set from their lists)
                rest = (~certified).nonzero().squeeze(1)  # (one read for the seven selections below)
                rows, U_rows, h_rows, corral_rows, lam_rows, settled, corral_size = (
                    t[rest] for t in (rows, U_rows, h_rows, corral_rows, lam_rows, settled, corral_size))
                if rows.numel() == 0:
                    break
        del chunks
        # one streaming pass: the most violated constraints of every unfinished value (rows come from arange, in range)
        streamed, cand = _ops.star_topk(Wk, n_pass, U_rows, rows, backend=backend, check_rows=False,
                                       operand=operand)
        passes += 1
        # the returned directions' margins: unit in float64 (a float32 row's norm is 1 +- 6e-8); Ur also starts the
        # next round (the float32 rows in float64, as its solve takes them)
        Ur = U_rows.double()
        g = _ops.exact_star_scores(W, Ur / Ur.norm(dim=1, keepdim=True), rows, cand, backend=recheck)
        if rows.numel() == n:  # every value, in order
            lo = g.min(dim=1).values
        else:
            lo[rows] = g.min(dim=1).values
        # the streamed constraints outside the corral, -1 elsewhere (and for cand's own padding)
        # (the corrals with the columns no row of this round fills cut: 65 of 141 at 4,096 x 128, which _outside sorts)
        outside = _outside(cand.to(index_dtype), corral_rows)
        add = torch.where(outside, cand, -1)
        if passes > max_iter:
            break
        # a value goes on while a streamed constraint outside its corral is violated beyond tol (padding scores
        # +inf) and it is not a duplicate, stalled or at a hull norm ~0
        threshold = (h_rows * (1.0 - tol)).masked_fill_(settled | (h_rows <= math.sqrt(ZERO_NORM2)), -math.inf)
        keep = (outside & (g < threshold[:, None])).any(dim=1)
        # the values left and the widths of their next lists: one host read per round (over the kept rows, the
        # largest running count of kept rows is their number)
        new = add >= 0
        n_keep, width, n_new = (torch.stack([keep.cumsum(0), corral_size, new.sum(dim=1)], dim=1)
                                * keep[:, None]).amax(dim=0).tolist()
        if n_keep == 0:
            break
        keep = torch.nonzero_static(keep, size=n_keep).squeeze(1)  # (its size known: no second read)
        rows, add, corral_rows, lam_rows = rows[keep], add[keep], corral_rows[keep], lam_rows[keep].float()
        start, h_start = Ur[keep], h_rows[keep]
        if use_floor:
            floor = (_stream_floor(streamed[keep], d), start)
        del streamed, Ur
        # the next active lists: the corral, then every streamed constraint outside it in the pass's order (valid
        # ones first; the violated ones and those the moving u_i meets next: with only the violated ones taken, 13x
        # more values needed a third round at |V| = 4,096, d = 128), trimmed to the widest row
        add = add.gather(1, torch.argsort(add.clamp(max=0), dim=1, descending=True, stable=True))
        width = max(1, width)
        active = torch.cat([corral_rows[:, :width], add[:, :n_new].to(index_dtype)], dim=1)
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
        if method == "dense" or (method == "auto" and n <= _DENSE_MAX
                                 and not _ops.uses_kernel(backend, "corral_solve", W)):
            return _solve_dense(W, tol, max_iter, n_init, n_add, n_fast, backend)
        Wk = W.to(V.dtype) if V.dtype in (torch.float32, torch.float64) else W
        n_first = min(n - 1, max(2 * n_init, round(_FIRST_PER_DIM * d)))
        n_pass = min(n - 1, max(2 * n_add, round(_PASS_PER_DIM * d)))
        U, lo, hi, _ = _solve_active_set(W, Wk, tol, max_iter, n_init, n_add, n_fast, backend, n_first, n_pass)
    return U, lo, hi


# ----------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------

# Defaults of the public functions: the relative duality-gap tolerance per value and the outer iterations.
TOL = 1e-6
MAX_ITER = 200


def checked_margin_optimal_outputs(V: Tensor, *, backend: str = "auto") -> Tuple[Tensor, Tensor]:
    """:func:`margin_optimal_outputs` (default tolerance) of a ``V`` (n, d) whose entries the caller has checked
    finite: ``(U (n, d) in V's dtype, rho)`` with rho a 0-dim float64 tensor on V's device, not read back (the
    public functions' finiteness check and ``float(rho)`` are two host round trips on a GPU; construct settles
    its inputs first and reads rho with its other numbers)."""
    V = _check_matrix(V, "V", min_rows=2, finite=False)
    check_choice("backend", backend, _ops.BACKENDS)
    U, lo, _ = _margin_optimal(V, TOL, MAX_ITER, backend=backend)
    return U.to(V.dtype), lo.min()


def margin_optimal_outputs(
    V: Tensor, *, tol: float = TOL, max_iter: int = MAX_ITER, return_radii: bool = False, method: str = "auto",
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
            active lists) or "auto" (the active set where its rounds run in a kernel, else dense up to
            4,096 values).
        backend: "auto", "kernels" or "torch" for the streaming passes and the corral steps (see
            ``factkernels._ops``).

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


def decodability(V: Tensor, *, tol: float = TOL, max_iter: int = MAX_ITER, method: str = "auto",
                 backend: str = "auto") -> float:
    """Decodability ``rho(V)`` of value embeddings (Definition 3.1.1).

    ``rho(V) = min_i max_{||u||=1} min_{j != i} <v_i - v_j, u> / ||v_i - v_j||``.

    Args:
        V: (n, d) floating tensor, n >= 2, finite.
        tol: relative duality-gap tolerance (see :func:`margin_optimal_outputs`).
        max_iter: maximum number of outer iterations.
        method: "auto", "dense" or "active_set" (see :func:`margin_optimal_outputs`).
        backend: "auto", "kernels" or "torch" for the streaming passes and the corral steps.

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
