"""Solvers for the stacked gated gadgets (Alg. 2/3/6/7 of seed 000).

All m gadgets share one gate, so each is the linear system

    M̃ θ_j = o_j,   row i of M̃ = [Σ_i ⊗ K̃_i, 1],   j = 1..m

with gate features Σ = σ(K G̃ᵀ + b_G) (F, h̃), augmented keys K̃ = [K, 1] (F, d+1)
and unknowns θ_j = (vec A_j, b_E[j]). The minimum-norm solution is
θ_j = M̃ᵀ α_j with (M̃ M̃ᵀ) α = O, and M̃ M̃ᵀ = (Σ Σᵀ) ∘ (K̃ K̃ᵀ) + 1 1ᵀ, so M̃ is
never formed. :class:`GadgetOperator` is that Gram as a linear operator (dense
or matrix-free); ``solve_cholesky`` factors it once for all m right-hand sides;
``solve_cg`` runs batched preconditioned CG on the matrix-free operator, with
O(F (h̃ + d)) memory and no F×F matrix.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from scipy.linalg import lapack
from threadpoolctl import ThreadpoolController

from .progress import progress_bar

from . import _ops
from .memory import available_memory, dense_gram_bytes
from .validation import check_choice

SOLVERS = ("auto", "cholesky", "cg", "per_gadget")
# CG preconditioners (Preconditioner): the Gram's diagonal ("jacobi"), plus the deflation of the constant vector
# ("constant", rank 1) or of the keys' span [K, 1] ("keys", rank d+1); "auto" picks one by auto_preconditioner.
PRECONDITIONERS = ("auto", "jacobi", "constant", "keys")
# "auto" deflates the keys' span when their cluster stands out of the bulk (F >= KEYS_DEFLATION_FACTS_PER_DIM (d+1):
# its top ~0.05-0.09 F/(d+1) against a bulk edge ~4, benchmarks/results/cg_precond-*.json) and its setup ((d+1)/2
# columns of Gram products) costs at most KEYS_DEFLATION_MAX_SETUP CG iterations of m columns; else the constant
# vector alone (half a column). At F/(d+1) = 16 (d = 1,024) the keys' setup cost more than they saved.
KEYS_DEFLATION_FACTS_PER_DIM = 64
KEYS_DEFLATION_MAX_SETUP = 16
# Above this many facts the O(F³) Cholesky is slower than CG on a CPU even when the Gram fits.
DENSE_MAX_FACTS = 16384
# Share of the free memory the dense path's peak (dense_gram_bytes plus the rest of the build) may take:
# room for the estimate's error (a model, accurate to a small factor) and the allocator's cached blocks.
DENSE_MEMORY_SHARE = 0.5

# Relative residual ||Gα − O|| / ||O|| above which a float32 solve is refined or
# redone in float64.
RESIDUAL_TOL = 1e-4
# Rows per block when adding to the lower triangle of the dense Gram (GadgetOperator.dense(lower=True)).
_ADD_ROWS = 512


def whitening(cov: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """W (k, k) in ``dtype`` with Wᵀ cov W ≈ I for a (k, k) second-moment matrix: W = L⁻ᵀ for cov = L Lᵀ.

    One Cholesky and one triangular solve in float64 (not an eigendecomposition: on a GPU an
    eigh is a chain of small launches and host round trips). A ridge keeps a rank-deficient cov (fewer
    rows than features) factorable without a check: max(1e-12, eps of ``dtype``) of the mean diagonal,
    since W scales the null directions by ridge^(-1/2) and a product with W in float32 must keep its digits
    (a 1e-12 ridge cast to float32 lost 4 of 8 facts at F = 8, d = 16). The ridge only conditions the
    system: the unknowns map back through the same W.
    """
    cov = cov.double()
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    # cov + ridge I in one operator (on a GPU a launch each: this is queued before the Gram's factorization)
    ridged = cov.addcmul(eye, cov.diagonal().mean().clamp_min(1e-300), value=max(1e-12, torch.finfo(dtype).eps))
    return torch.linalg.solve_triangular(torch.linalg.cholesky_ex(ridged)[0], eye, upper=False).T.to(dtype)


def _whitening(features: torch.Tensor) -> torch.Tensor:
    """:func:`whitening` of ``featuresᵀ features / n`` for an (n, k) matrix: (k, k) in the features' dtype."""
    return whitening((features.T @ features).double() / features.shape[0], features.dtype)


@dataclass
class GadgetOperator:
    """The Gram ``M̃ M̃ᵀ`` of the shared-gate gadget system, in a whitened basis.

    Rows of M̃ are ``[Σ_i ⊗ K̃_i, 1]``. With whitening transforms W_s, W_p of Σ and K̃
    (W_sᵀ Cov(Σ) W_s = I, :func:`whitening`), ``M̃' = [ΣW_s ⊗ K̃W_p, 1]`` spans the same space,
    so it fits the same targets, but its Gram ``(ΣW_sW_sᵀΣᵀ) ∘ (K̃W_pW_pᵀK̃ᵀ) + 1 1ᵀ`` is ~30x
    better conditioned (it removes the mean of σ and the anisotropy of the features). That
    matters for CG iterations and float32 accuracy; the unknowns map back by θ_j = W_s θ'_j W_pᵀ.

    gate_features: (F, h̃) Σ W_s;  keys_aug: (F, d+1) K̃ W_p;  transforms (h̃, h̃), (d+1, d+1).
    reduce: when the rows are one shard of the facts (torch.distributed), the in-place sum of a
        tensor over all shards; ``M̃ᵀ y`` and every sum over rows then cover all facts.
    """

    gate_features: torch.Tensor
    keys_aug: torch.Tensor
    feature_transform: torch.Tensor
    key_transform: torch.Tensor
    backend: str = "auto"
    reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def total(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of ``t`` over all shards (``t`` itself in one process)."""
        return t if self.reduce is None else self.reduce(t)

    @classmethod
    def whitened(cls, gate_features: torch.Tensor, keys_aug: torch.Tensor, backend: str = "auto") -> "GadgetOperator":
        """Operator for raw features Σ (F, h̃) and augmented keys K̃ (F, d+1)."""
        ws, wp = _whitening(gate_features), _whitening(keys_aug)
        return cls(gate_features @ ws, keys_aug @ wp, ws, wp, backend)

    @property
    def size(self) -> int:
        return self.gate_features.shape[0]

    def dense(self, lower: bool = False) -> torch.Tensor:
        """(F, F) Gram, formed by the fused Hadamard-Gram kernel; ``lower``: only its lower triangle is
        defined (all a Cholesky factorization reads)."""
        gram = _ops.hadamard_gram(self.gate_features, self.keys_aug, lower=lower, backend=self.backend)
        if not lower or gram.device.type != "cpu":  # a GPU adds in one launch
            return gram.add_(1.0)  # the output-bias column of M̃: 1 1ᵀ, every entry
        # The lower triangle alone, by blocks of rows: the kernels never wrote the upper one, and on a CPU
        # touching it (fresh pages) cost 4x the add itself (0.016 of 0.019 CPU s at F = 4,096).
        for start in range(0, gram.shape[0], _ADD_ROWS):
            gram[start : start + _ADD_ROWS, : start + _ADD_ROWS].add_(1.0)
        return gram

    def diagonal(self) -> torch.Tensor:
        """(F,) diagonal ||Σ'_i||² ||K̃'_i||² + 1, the Jacobi preconditioner."""
        return self.gate_features.square().sum(1) * self.keys_aug.square().sum(1) + 1.0

    def transpose_matmul(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``M̃'ᵀ y`` for m columns: y (F, m) -> (coefficients (m, h̃, d+1), output bias (m,))."""
        coef = _ops.gadget_rmatvec(self.gate_features, self.keys_aug, y, backend=self.backend)
        if self.reduce is None:
            return coef, y.sum(0)
        packed = self.reduce(torch.cat([coef.flatten(), y.sum(0)]))  # the one all-reduce of a product
        return packed[: coef.numel()].view_as(coef), packed[coef.numel() :]

    def matmul(self, y: torch.Tensor) -> torch.Tensor:
        """Matrix-free ``M̃' M̃'ᵀ y``: y (F, m) -> (F, m)."""
        coef, out_bias = self.transpose_matmul(y)
        return _ops.gadget_matvec(self.gate_features, self.keys_aug, coef, backend=self.backend) + out_bias

    def unknowns(self, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Weights from dual variables α (F, m): up-projection coefficients (m, h̃, d+1) in the
        original basis, A_j = W_s (M̃'ᵀα_j) W_pᵀ, and output biases (m,)."""
        coef, out_bias = self.transpose_matmul(alpha)
        return self.feature_transform @ coef @ self.key_transform.T, out_bias


@dataclass
class SolveInfo:
    """How a gadget system was solved."""

    solver: str
    precision: str
    residual: float
    iterations: int = 0
    # A deferred solve (no host sync) holds its residual as a 0-dim tensor (measured on the weights by
    # build_shared_gate) and here whether it passed (factored and residual <= tol); the caller settles
    # both with its final report.
    accepted: Optional[torch.Tensor] = None
    # CG only: its preconditioner (Preconditioner.name) and the columns of Gram products its setup took.
    preconditioner: str = ""
    setup_columns: float = 0.0


def relative_residual(op: GadgetOperator, alpha: torch.Tensor, targets: torch.Tensor,
                      gram: Optional[torch.Tensor] = None) -> float:
    """||M̃ M̃ᵀ α − O|| / ||O||, with the dense Gram when given (in its own precision)."""
    if gram is not None:
        r = targets - gram @ alpha.to(gram.dtype)
        return float(r.norm() / targets.norm().clamp_min(1e-300))
    r = targets - op.matmul(alpha)
    sums = op.total(torch.stack([r.square().sum(), targets.square().sum()]))
    return float(sums[0].sqrt() / sums[1].sqrt().clamp_min(1e-300))


# Most torch threads at which a CPU Cholesky goes to LAPACK's potrf through scipy (OpenBLAS, one thread) instead of
# torch's.
SCIPY_CHOLESKY_MAX_THREADS = 2


def cholesky_factor(gram: torch.Tensor, *, overwrite: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, info) as ``torch.linalg.cholesky_ex``: the lower factor (F, F) of a symmetric positive definite
    ``gram`` (F, F), of which only the lower triangle is read, and a 0-dim int tensor, 0 when it factored.

    On a CPU with at most SCIPY_CHOLESKY_MAX_THREADS torch threads, LAPACK's potrf through scipy (OpenBLAS run
    on one thread) on the row-major lower triangle seen as a column-major upper one: no copy into column order
    and no pass zeroing the other triangle, which torch makes. Float32, AMD EPYC, F = 4,096: one thread 0.26 vs
    0.43 CPU s (1.4-2.0x at F = 1,024-8,192, benchmarks/results/ustar_cpu-s23-values.json). At two torch
    threads OpenBLAS's own two were fastest on a quiet machine (0.15 s wall, torch's 0.24,
    ustar_cpu-s23-end-quiet.json) but have a heavy tail under load, where its spinning threads wait on a
    descheduled one (load 5 on 2 cores, ustar_cpu-s24-cholesky-2threads-loaded.json: F = 4,096 0.78-0.99 s,
    torch's two 0.68-0.75, its one 0.40-0.59; F = 2,048 0.93-2.56, 0.17-0.18, 0.11-0.14): one OpenBLAS thread
    is never far behind (quiet ~0.26 s at 4,096) and ahead under load, and the rule does not guess the load (the factor's bits would depend on it). Above two
    threads (not measured here) torch keeps the case, and every GPU. On the scipy path L's strict upper
    triangle is left as ``gram``'s (unspecified): use L through lower-triangular solves only. overwrite: L may
    take ``gram``'s memory.
    """
    if gram.device.type != "cpu" or torch.get_num_threads() > SCIPY_CHOLESKY_MAX_THREADS or gram.requires_grad:
        return torch.linalg.cholesky_ex(gram)
    work = gram if overwrite else gram.clone()
    potrf = lapack.get_lapack_funcs("potrf", (work.numpy(),))
    with _blas_threads().limit(limits=1, user_api="blas"):  # OpenBLAS reads its own count from the env
        upper, info = potrf(work.numpy().T, lower=0, clean=0, overwrite_a=1)  # in place on a column-major view
    return torch.from_numpy(upper.T), torch.tensor(info, dtype=torch.int32)


@functools.lru_cache(maxsize=1)
def _blas_threads() -> ThreadpoolController:
    """The BLAS libraries loaded in this process (scipy's OpenBLAS among them), found once (~ms)."""
    return ThreadpoolController()


def _factor_solve(factor: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """G⁻¹ rhs for G = L Lᵀ (only L's lower triangle is read): two triangular solves (on a CPU 1.7x faster
    than torch.cholesky_solve at F = 4,096, m = 96, which copies its operands into another layout first)."""
    return torch.linalg.solve_triangular(factor.mH, torch.linalg.solve_triangular(factor, rhs, upper=False), upper=True)


def solve_cholesky(op: GadgetOperator, targets: Union[torch.Tensor, Callable[[], torch.Tensor]], *,
                   tol: float = RESIDUAL_TOL, deferred: bool = False) -> tuple[torch.Tensor, SolveInfo]:
    """One Cholesky of the (F, F) Gram, m right-hand sides.

    targets: (F, m) codes o_j as columns -> α (F, m); or a function returning them, called once the
    factorization is queued (neither the Gram nor its factor needs them: a GPU factors while the host
    queues the targets' work). In float32, a residual
    above ``tol`` is refined against the float64 residual and, if still too
    large (or the factorization fails), the solve is redone in float64.
    deferred: decide nothing on the host: return the first solve with ``info.accepted`` (a 0-dim
    tensor) whether it factored, and no residual (nan): the caller measures it on the weights it
    forms anyway (:func:`factkernels.encoder.build_shared_gate`), folds ``residual <= tol`` into
    ``accepted`` and, finding it not accepted when it reads its report, solves again without ``deferred``.
    """
    gram = op.dense(lower=deferred)  # the deferred solve only factors it (in place)
    precision = str(gram.dtype).replace("torch.", "")
    factor, info = cholesky_factor(gram, overwrite=deferred)
    if callable(targets):
        targets = targets()
    if deferred:
        return _factor_solve(factor, targets), SolveInfo("cholesky", precision, float("nan"), accepted=info == 0)
    alpha = None
    if int(info) == 0:
        alpha = _factor_solve(factor, targets)
        residual = relative_residual(op, alpha, targets, gram)
        if residual > tol and gram.dtype == torch.float32:
            for _ in range(3):  # iterative refinement: float32 factor, float64 residual
                r = (targets.double() - gram.double() @ alpha.double()).to(gram.dtype)
                alpha = alpha + _factor_solve(factor, r)
                residual = relative_residual(op, alpha, targets, gram)
                precision = "float32+refinement"
                if residual <= tol:
                    break
        if residual <= tol or gram.dtype == torch.float64:
            return alpha, SolveInfo("cholesky", precision, residual)
    if gram.dtype == torch.float64:
        raise RuntimeError(
            "the gadget Gram is not positive definite even in float64: the keys are not in general "
            "position (duplicate keys?) or the hidden width is too small; raise width_multiplier"
        )
    gram64 = gram.double()
    factor64, info = cholesky_factor(gram64)
    if int(info) != 0:
        raise RuntimeError(
            "the gadget Gram is singular in float64: duplicate or degenerate keys, or width_multiplier "
            "too close to 1; raise width_multiplier (1.25-2 is well conditioned)"
        )
    alpha64 = _factor_solve(factor64, targets.double())
    residual = relative_residual(op, alpha64, targets, gram64)
    return alpha64.to(targets.dtype), SolveInfo("cholesky", "float64 (float32 fallback)", residual)


@dataclass
class Preconditioner:
    """z = P⁻¹ r for CG on the Gram G (F, F), in the Jacobi-scaled Gram A = D^-1/2 G D^-1/2 (D = diag G):

        P⁻¹ = D^-1/2 (I + U (Θ⁻¹ − I) Uᵀ) D^-1/2

    with U (F, k) orthonormal Ritz vectors of A and Θ their Ritz values: A's eigenvalues on span U move to 1,
    the mean of its spectrum; without U it is Jacobi. What CG spends its iterations on (the Lanczos estimate
    from its coefficients, benchmarks/cg_precond.py): A's spectrum is a Marchenko–Pastur-like bulk in about
    [0.02, 4] plus outliers along the keys' span [K, 1], the constant vector (every row of M̃ shares the
    mean of σ and the bias column: eigenvalue ~25 at F = 4,096, ~66 at 16,384) and a cluster of d along the
    keys (~c·F/d: ~11 at F/d = 128). In float32 the big outlier also costs its "ghost" copies. Deflating the
    d+1 directions of [K, 1] removes them; the bulk is left to CG (no cheap preconditioner narrows a
    Marchenko–Pastur bulk: the top k eigenvalues of a bulk barely move its condition number).

    scale: (F, 1) D^-1/2;  basis: (F, k) U or None;  shrink: (k, 1) Θ⁻¹ − 1;
    setup_columns: Gram products the setup took, in columns of a CG iteration's products (k/2; 0 for Jacobi);  name: its PRECONDITIONERS entry.
    """

    scale: torch.Tensor
    basis: Optional[torch.Tensor] = None
    shrink: Optional[torch.Tensor] = None
    setup_columns: float = 0.0
    name: str = "jacobi"

    def apply(self, r: torch.Tensor, op: "GadgetOperator") -> torch.Tensor:
        """P⁻¹ r for r (F, m); with a sharded ``op``, Uᵀ r is all-reduced ((k, m))."""
        y = self.scale * r
        if self.basis is not None:
            y = y.addmm(self.basis, self.shrink * op.total(self.basis.T @ y))
        return self.scale * y


def jacobi_preconditioner(op: GadgetOperator) -> Preconditioner:
    """The Gram's diagonal alone."""
    return Preconditioner(op.diagonal().rsqrt().unsqueeze(1))


def deflated_preconditioner(op: GadgetOperator, chunk: int, keys: bool = True) -> Preconditioner:
    """Jacobi plus the deflation of span [K, 1] (the whitened augmented keys' d+1 columns; ``keys=False``: the
    constant vector alone), see :class:`Preconditioner`: one Rayleigh–Ritz step on the orthonormalized basis Q
    (F, k): Qᵀ A Q from the products M̃ᵀ D^-1/2 Q (k columns in chunks of ``chunk``, a CG iteration's width and
    memory, plus their k × h̃(d+1) coefficients: memory.estimate_build's "CG deflation"), then a k×k eigenproblem
    in float64. Works on a sharded ``op``.
    Setup: k/(2m) CG iterations of Gram products (one of an iteration's two); ``setup_columns`` counts k/2."""
    scale = op.diagonal().rsqrt().unsqueeze(1)
    keys_aug = op.keys_aug
    basis = keys_aug if keys else torch.ones_like(keys_aug[:, :1])
    for _ in range(2):  # Cholesky QR twice (once would do for whitened keys: keysᵀ keys ≈ F·I)
        factor = torch.linalg.cholesky(op.total(basis.T @ basis).double()).to(basis.dtype)
        basis = torch.linalg.solve_triangular(factor.mT, basis, upper=True, left=False)  # (F, k)
    # Qᵀ A Q = ||M̃ᵀ D^-1/2 Q||², the Gram of the transposed products' coefficients: half a product per column.
    rank, chunk = basis.shape[1], max(chunk, 1)
    coef = basis.new_empty(rank, op.gate_features.shape[1] * keys_aug.shape[1])
    out_bias = basis.new_empty(rank)
    for j in range(0, rank, chunk):
        part, out_bias[j : j + chunk] = op.transpose_matmul(scale * basis[:, j : j + chunk])
        coef[j : j + chunk] = part.flatten(1)
    ritz = (coef @ coef.T).double() + torch.outer(out_bias, out_bias).double()
    del coef
    theta, vectors = torch.linalg.eigh((ritz + ritz.T) / 2)
    basis = basis @ vectors.to(basis.dtype)
    return Preconditioner(scale, basis, (1.0 / theta.clamp_min(1e-12) - 1.0).to(basis.dtype).unsqueeze(1),
                          basis.shape[1] / 2, "keys" if keys else "constant")


def auto_preconditioner(num_facts: int, key_columns: int, columns: int) -> str:
    """"keys" when F >= KEYS_DEFLATION_FACTS_PER_DIM x (d+1) and (d+1)/2 <= KEYS_DEFLATION_MAX_SETUP x m
    (``key_columns`` = d+1, ``columns`` = m), else "constant"."""
    if num_facts >= KEYS_DEFLATION_FACTS_PER_DIM * key_columns and key_columns <= 2 * KEYS_DEFLATION_MAX_SETUP * columns:
        return "keys"
    return "constant"


def solve_cg(
    op: GadgetOperator,
    targets: torch.Tensor,
    *,
    tol: float = RESIDUAL_TOL,
    max_iter: int = 1000,
    progress: bool = True,
    x0: Optional[torch.Tensor] = None,
    preconditioner: str = "auto",
) -> tuple[torch.Tensor, SolveInfo]:
    """Batched preconditioned CG on the matrix-free Gram, all m columns at once.

    targets: (F, m) -> α (F, m). Memory O(F (h̃ + d) + m h̃ d); no F×F matrix.
    x0: (F, m) start instead of 0 (a warm start, e.g. the solution before a few facts changed).
    preconditioner: "jacobi" (the diagonal), "constant" or "keys" (the diagonal plus the constant vector or the
        keys' span deflated, see :class:`Preconditioner`), or "auto" (:func:`auto_preconditioner`). Measured on
        CPU (benchmarks/results/cg_precond-cpu.json, F = 16,384, setup included): "keys" 1.5x and 2.1x fewer
        products than Jacobi at F/(d+1) = 127 and 252; at 16 "constant" 1.2x, and "keys" loses to both.
    Stops when every column's relative residual is below ``tol``. With a sharded ``op``
    (``op.reduce``), each rank holds its rows of targets and α; an iteration all-reduces the
    product ``M̃ᵀ p`` (which also gives pᵀ M̃ M̃ᵀ p = ||M̃ᵀ p||²), 2m scalars and, deflated, a (k, m) block.
    """
    check_choice("preconditioner", preconditioner, PRECONDITIONERS)
    if preconditioner == "auto":
        preconditioner = auto_preconditioner(op.size if op.reduce is None else int(op.total(
            torch.tensor(float(op.size), dtype=torch.float64, device=targets.device))), op.keys_aug.shape[1],
            targets.shape[1])
    precond = (jacobi_preconditioner(op) if preconditioner == "jacobi"
               else deflated_preconditioner(op, chunk=targets.shape[1], keys=preconditioner == "keys"))
    if x0 is None:
        alpha, r = torch.zeros_like(targets), targets.clone()
    else:
        if x0.shape != targets.shape:
            raise ValueError(f"x0 must have the shape of targets {tuple(targets.shape)}, got {tuple(x0.shape)}")
        alpha = x0.to(targets.dtype).clone()
        r = targets - op.matmul(alpha)
    z = precond.apply(r, op)
    p = z.clone()
    rz, rr, bb = op.total(torch.stack([(r * z).sum(0), r.square().sum(0), targets.square().sum(0)]))
    bnorm = bb.sqrt().clamp_min(1e-30)
    bar = progress_bar(total=max_iter, desc="cg", enabled=progress, leave=False)
    it = 0
    rel = float((rr.sqrt() / bnorm).max())  # the iteration's one read back from the device
    while it < max_iter and rel > tol:
        coef, out_bias = op.transpose_matmul(p)
        ap = _ops.gadget_matvec(op.gate_features, op.keys_aug, coef, backend=op.backend) + out_bias
        step = rz / (coef.square().sum((1, 2)) + out_bias.square()).clamp_min(1e-300)  # pᵀ G p = ||M̃ᵀ p||²
        alpha.addcmul_(p, step)
        r.addcmul_(ap, step, value=-1.0)
        z = precond.apply(r, op)
        rz_new, rr = op.total(torch.stack([(r * z).sum(0), r.square().sum(0)]))
        p = z + p * (rz_new / rz.clamp_min(1e-300))
        rz = rz_new
        it += 1
        rel = float((rr.sqrt() / bnorm).max())
        bar.update(1)
        bar.set_postfix(residual=f"{rel:.1e}")
    bar.close()
    residual = relative_residual(op, alpha, targets)
    if residual > tol * 10:
        warnings.warn(
            f"CG stopped after {it} iterations at relative residual {residual:.2e} > tol={tol:.0e}; "
            "raise cg_max_iter, raise width_multiplier (better conditioned), or use solver='cholesky'",
            RuntimeWarning,
            stacklevel=3,
        )
    return alpha, SolveInfo("cg", str(targets.dtype).replace("torch.", ""), residual, it,
                            preconditioner=precond.name, setup_columns=precond.setup_columns)


def pick_solver(num_facts: int, device: torch.device, *, dtype: torch.dtype = torch.float32, other_bytes: int = 0,
                budget: Optional[int] = None) -> str:
    """``cholesky`` while the dense path's peak (:func:`factkernels.memory.dense_gram_bytes` in ``dtype``)
    plus ``other_bytes`` (the rest of the build, :func:`factkernels.memory.estimate_build`) fits in
    DENSE_MEMORY_SHARE of ``budget`` (default: the free memory of ``device``, on a GPU
    ``torch.cuda.mem_get_info``) and, on a CPU, F <= DENSE_MAX_FACTS; else matrix-free ``cg``.

    On a GPU the dense path is faster wherever it fits: at F = 32,768 on an H100 Cholesky 0.51 s, cg 2.68 s
    (issue 33); the factorization grows as F³ and cg about as F² (iterations alike), which puts the
    crossover near 5 x 32,768 facts, where the float32 Gram alone is ~100 GB: on today's GPUs memory
    decides first, so no crossover in F is applied there (an 80 GB H100 keeps the dense path to
    F ≈ 40,000). On a CPU the O(F³) factorization loses to cg above DENSE_MAX_FACTS."""
    budget = available_memory(device) if budget is None else budget
    dense_is_faster = device.type == "cuda" or num_facts <= DENSE_MAX_FACTS
    if dense_is_faster and dense_gram_bytes(num_facts, dtype) + other_bytes <= DENSE_MEMORY_SHARE * budget:
        return "cholesky"
    return "cg"


def cg_iterations_hint(width_multiplier: float) -> int:
    """Rough CG iteration budget from the Marchenko–Pastur condition number of the Gram."""
    ratio = 1.0 / max(width_multiplier, 1.0 + 1e-3)
    kappa = ((1 + math.sqrt(ratio)) / (1 - math.sqrt(ratio))) ** 2
    return int(min(5000, max(200, 10 * math.sqrt(kappa) * math.log(1e7))))
