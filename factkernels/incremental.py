"""Incremental facts: add, remove and change facts of a constructed MLP without a rebuild.

The shared-gate gadget system (see :mod:`factkernels.solvers`) is ``G α = O`` with the
Gram ``G = (S Sᵀ) ∘ (P Pᵀ) + 1 1ᵀ`` of whitened gate features S = Σ W_s and keys
P = K̃ W_p. :class:`FactBuilder` keeps what a rebuild would redo: the gate, the whitening
transforms W_s, W_p of the first build (they span the same space for any key set, so
later rows border the Gram cleanly), S, P and the Cholesky factor L of G, in the keys' dtype (the
whitened Gram is well conditioned, so a float32 factor holds α to ~1e-5, as construct's float32 solve does).

* ``add``: k new facts border G with k rows; L extends by one triangular solve and a
  k×k Cholesky, O(F²k) instead of O(F³). The new keys are checked against the stored ones through
  their first coordinate (no sort of all F keys). L is kept as row panels (:class:`BorderedFactor`),
  so a border appends a (k, F+k) panel and never copies the F×F factor (at F = 16,384 that
  copy alone took 7 s and doubled the peak memory). Every dual variable changes, so every weight does:
  with k < m the weights take a rank-k change (one triangular solve and one Mᵀ product with k columns),
  else all of α is re-solved from the cached forward rows (m columns); either is the exact minimum-norm
  solution of the enlarged system.
* ``remove``: removed facts stay in L as tombstones; the kept system is solved from the
  full factor through its r×r Schur complement (x = G⁻¹[O; z] with z chosen so that
  x vanishes on the removed rows), O(F²r). When a quarter of the rows are tombstones the
  factor is recomputed on the kept rows.
* ``update``: new targets only, one solve with the same factor.
* ``solver="cg"`` (large F, no F×F matrix): no factor; every change re-solves the matrix-free
  system by CG warm-started from the last solution (new rows start at 0, removed rows are dropped).
* New values extend U* (recomputed for the enlarged value set) and may grow m: the Gram
  does not depend on m, only the right-hand sides do.

After every change ``.mlp`` is reassembled and the facts the change touched are verified (their codes
decoded, as :func:`factkernels.construct` verifies): the added rows, the changed rows, or every row when
the targets of all facts changed (new values re-solve U* and may grow m; a wider gate rebuilds). Untouched facts keep their exact
targets in the enlarged system, so re-checking them costs a forward pass over all F keys for no
information; ``verify_scope="all"`` checks every stored fact after every change anyway.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from . import _ops
from .decoder import OUTPUTS, JLDecoder, check_decodable, code_margins, output_embeddings, search_m
from .encoder import GatedEncoder, assemble, augment, encoder_codes, gadget_width, sample_gate
from .memory import check_fits, estimate_build
from .mlp import FactMLP
from .report import ConstructionReport, FactStorageError
from .solvers import GadgetOperator, SolveInfo, cg_iterations_hint, cholesky_factor, pick_solver, solve_cg
from .validation import (check_choice, check_distinct_added, check_facts, check_matrix, check_positive_int,
                         validate_inputs)

# Fraction of tombstoned rows at which the factor is recomputed on the kept rows.
COMPACT_FRACTION = 0.25
# Which facts a change verifies: those it touched, or every stored fact.
VERIFY_SCOPES = ("changed", "all")
# Below this many unknowns h̃(d+1) per fact the Gram is ill-conditioned: a wider gate is sampled
# and the factor recomputed (Lemma 4.1.2 needs >= 1; construct's default is 1.5).
MIN_WIDTH_RATIO = 1.2


def cholesky(gram: torch.Tensor) -> torch.Tensor:
    """Lower Cholesky factor of a gadget Gram (only its lower triangle is read, and its memory may become the
    factor's: :func:`factkernels.solvers.cholesky_factor`), with an error that says what to change. Only the
    factor's lower triangle is defined: its panels are used through lower-triangular solves."""
    factor, info = cholesky_factor(gram, overwrite=True)
    if int(info) != 0:
        raise RuntimeError("the gadget Gram is not positive definite: the keys are not in general position or the "
                           "gate is too narrow for this many facts; build a new FactBuilder with a larger "
                           "width_multiplier")
    return factor


class BorderedFactor:
    """A lower Cholesky factor L (n, n) stored as row panels, grown by bordering without copies.

    Panel i holds rows [start_i, start_i + k_i) of L up to its diagonal: a (k_i, start_i + k_i)
    block whose last k_i columns are the (lower triangular) diagonal block L_ii.
    """

    def __init__(self, factor: torch.Tensor) -> None:
        self.panels = [factor]
        self.starts = [0]

    @property
    def size(self) -> int:
        return self.panels[-1].shape[1]

    def border(self, cross: torch.Tensor, corner: torch.Tensor) -> None:
        """Append k rows to G = L Lᵀ: ``cross`` (k, n) new Gram rows against the old ones,
        ``corner`` (k, k) their Gram among themselves."""
        below = self.forward(cross.T).T  # (k, n): L_21 = cross L⁻ᵀ
        self.starts.append(self.size)
        self.panels.append(torch.cat([below, cholesky(corner - below @ below.T)], dim=1))

    def forward(self, rhs: torch.Tensor, known: Optional[torch.Tensor] = None) -> torch.Tensor:
        """y (n, c) with L y = rhs (n, c); ``known`` (r, c): the solution's first r rows, already
        solved (rows of a bordered factor's solution never change)."""
        done = 0 if known is None else known.shape[0]
        parts = [] if known is None else [known]
        for start, panel in zip(self.starts, self.panels):
            rows = panel.shape[0]
            if start + rows <= done:
                continue
            if start < done:
                raise ValueError(f"known rows must end at a panel boundary, got {done} rows")
            rest = rhs[start:start + rows]
            if start:
                rest = rest - panel[:, :start] @ torch.cat(parts)
            parts.append(torch.linalg.solve_triangular(panel[:, start:], rest, upper=False))
        return torch.cat(parts)

    def backward(self, y: torch.Tensor) -> torch.Tensor:
        """x (r, c) with L_rᵀ x = y (r, c), from the last panel up; L_r is the leading r×r block of L
        (r = n, or the size before later borders: r must end at a panel boundary)."""
        rows = y.shape[0]
        if rows not in self.starts[1:] + [self.size]:
            raise ValueError(f"y must have as many rows as the factor or a leading block of its panels, got {rows}")
        out = torch.empty_like(y)
        acc = torch.zeros_like(y)  # Σ over later panels of their off-diagonal blocksᵀ x
        for start, panel in zip(reversed(self.starts), reversed(self.panels)):
            end = start + panel.shape[0]
            if end > rows:
                continue
            # solve_triangular is ~3x faster on an upper factor from the left than on L from the right.
            out[start:end] = torch.linalg.solve_triangular(panel[:, start:].T, y[start:end] - acc[start:end],
                                                           upper=True)
            if start:
                acc[:start] += panel[:, :start].T @ out[start:end]
        return out

    def solve(self, rhs: torch.Tensor) -> torch.Tensor:
        """G⁻¹ rhs for G = L Lᵀ."""
        return self.backward(self.forward(rhs))


class FactBuilder:
    """A fact MLP that stays built while facts are added, removed and changed.

    ``FactBuilder(K, V, f, m=64)`` builds like ``construct(K, V, f, m=64, solver="cholesky")``
    and keeps the factorization; ``.add(K_new, f_new)``, ``.remove(indices)`` and
    ``.update(indices, f_changed)`` change the stored facts, ``.mlp`` is the verified MLP, its ``.report``
    a :class:`~factkernels.ConstructionReport` over the facts the change checked.
    With ``solver="cg"`` it keeps the matrix-free operator and the last solution instead (the
    warm start of the next solve): no F×F matrix, for F beyond the dense range.

    Args:
        K: (F, d_in) keys; V: (|V|, d_out) values; f: (F,) value index per key.
        m: code dimension (grown by x1.25 when new values no longer decode).
        outputs: "margin_optimal" (U*) or "values".
        activation, width_multiplier, seed, backend, gate_scale: as in :func:`factkernels.construct`;
            the gate is kept while h̃(d_in+1) >= 1.2 F, then resampled wider (``rebuilds`` counts it).
        verify: True raises :class:`factkernels.FactStorageError` when a change leaves a checked fact
            unstored, "report" only records ``failed``/``min_margin``/``checked``.
        verify_scope: "changed" checks the facts a change touched (added or changed rows; all rows
            when new values change every code), "all" checks every stored fact after every change.
        max_memory: bytes the factor and the build may use (default: free memory).
        solver: "cholesky" (factor in the keys' dtype, bordered on add), "cg" (warm-started matrix-free CG) or
            "auto" (as :func:`factkernels.construct` picks from F and the memory budget).
        cg_tol: relative residual at which a CG solve stops.
    """

    def __init__(self, K: torch.Tensor, V: torch.Tensor, f: torch.Tensor, m: int = 64, *,
                 outputs: str = "margin_optimal", activation: str = "silu", width_multiplier: float = 1.5,
                 seed: int = 0, backend: str = "auto", gate_scale: float = 1.0, verify: Union[bool, str] = True,
                 max_memory: Optional[int] = None, solver: str = "cholesky", cg_tol: float = 1e-4,
                 verify_scope: str = "changed") -> None:
        facts = validate_inputs(K, V, f)
        check_positive_int("m", m)
        check_choice("outputs", outputs, OUTPUTS)
        check_choice("backend", backend, _ops.BACKENDS)
        _ops.check_activation(activation)
        if not (isinstance(width_multiplier, (int, float)) and width_multiplier >= 1.0):
            raise ValueError(f"width_multiplier must be >= 1 (each gadget needs h~(d+1) >= F), got {width_multiplier!r}")
        if verify not in (True, "report"):
            raise ValueError(f"verify must be True or 'report', got {verify!r}")
        check_choice("solver", solver, ("auto", "cholesky", "cg"))
        check_choice("verify_scope", verify_scope, VERIFY_SCOPES)
        num_facts, d_in = K.shape
        width = gadget_width(num_facts, d_in, width_multiplier)
        if solver == "auto":
            rest = estimate_build(num_facts, V.shape[0], d_in, V.shape[1], m=m, gadget_width=width, solver="cg",
                                  dtype=K.dtype, outputs=outputs, device_type=K.device.type).total
            solver = pick_solver(num_facts, K.device, dtype=K.dtype, other_bytes=rest, budget=max_memory)
        self.solver, self.cg_tol, self.outputs = solver, cg_tol, outputs
        check_fits(self._estimate(num_facts, V.shape[0], d_in, V.shape[1], m, width, K), K.device, max_memory,
                   what="FactBuilder")
        self.activation, self.backend, self.verify, self.verify_scope = activation, backend, verify, verify_scope
        self.max_memory, self.width_multiplier, self.gate_scale = max_memory, width_multiplier, gate_scale
        self._generator = torch.Generator().manual_seed(seed)
        self._keys, self._values, self._facts = K, V, facts
        self._alive = torch.ones(num_facts, dtype=torch.bool, device=K.device)
        self._set_outputs(m)
        self._factorize(width)
        self.rebuilds = 0
        self._refresh()

    # ------------------------------------------------------------------ public API

    @property
    def num_facts(self) -> int:
        """Facts currently stored."""
        return int(self._alive.sum())

    @property
    def keys(self) -> torch.Tensor:
        """(F, d_in) keys of the stored facts, in insertion order (removed ones skipped)."""
        return self._keys[self._alive]

    @property
    def facts(self) -> torch.Tensor:
        """(F,) value index of each stored key."""
        return self._facts[self._alive]

    @property
    def values(self) -> torch.Tensor:
        """(|V|, d_out) values (the initial ones, then those added)."""
        return self._values

    def add(self, K_new: torch.Tensor, f_new: torch.Tensor, V_new: Optional[torch.Tensor] = None) -> FactMLP:
        """Store k more facts: keys K_new (k, d_in) -> f_new (k,), indices into the values, which
        ``V_new`` (n, d_out) extends (new values get indices |V|, |V|+1, ...). Returns ``.mlp``."""
        check_matrix(K_new, "K_new")
        self._same_kind("K_new", K_new, self._keys)
        values = self._values
        if V_new is not None:
            check_matrix(V_new, "V_new")
            self._same_kind("V_new", V_new, self._values)
            if V_new.shape[1] != values.shape[1]:
                raise ValueError(f"V_new must have {values.shape[1]} columns like V, got shape {tuple(V_new.shape)}")
            check_distinct_added(values, V_new, "V")
            values = torch.cat([values, V_new])
        f_new = check_facts(f_new, K_new.shape[0], values.shape[0], self._keys.device, name="f_new")
        if K_new.shape[1] != self._keys.shape[1]:
            raise ValueError(f"K_new must have {self._keys.shape[1]} columns like K, got shape {tuple(K_new.shape)}")
        check_distinct_added(self.keys, K_new, "K")  # the stored keys are distinct already
        if not bool(self._alive.all()) and bool(torch.isin(self._keys[~self._alive, 0], K_new[:, 0]).any()):
            self._compact()  # a removed key may come back: its tombstone row would make the bordered Gram singular
        d_in, stored = K_new.shape[1], self.num_facts + K_new.shape[0]
        if self.gadget_width * (d_in + 1) < MIN_WIDTH_RATIO * stored:
            return self._regrow(torch.cat([self.keys, K_new]), torch.cat([self.facts, f_new]), values,
                                V_new is not None)
        total = self._keys.shape[0] + K_new.shape[0]
        check_fits(self._estimate(total, values.shape[0], d_in, values.shape[1], self.m, self.gadget_width,
                                  K_new), K_new.device, self.max_memory, what="FactBuilder.add")
        s_new = self._gate_features(K_new) @ self._op.feature_transform
        p_new = augment(K_new) @ self._op.key_transform
        if self._factor is not None:
            cross = (s_new @ self._op.gate_features.T) * (p_new @ self._op.keys_aug.T) + 1.0  # (k, F)
            corner = (s_new @ s_new.T) * (p_new @ p_new.T) + 1.0  # (k, k)
            self._factor.border(cross, corner)
        if self._alpha is not None:  # the warm start: new rows from 0
            self._alpha = torch.cat([self._alpha, self._alpha.new_zeros(K_new.shape[0], self._alpha.shape[1])])
        self._op = GadgetOperator(torch.cat([self._op.gate_features, s_new]), torch.cat([self._op.keys_aug, p_new]),
                                  self._op.feature_transform, self._op.key_transform, self.backend)
        self._keys = torch.cat([self._keys, K_new])
        self._facts = torch.cat([self._facts, f_new])
        self._alive = torch.cat([self._alive, torch.ones_like(f_new, dtype=torch.bool)])
        if V_new is not None:  # new U* and maybe a new m: every code, so every fact, changes
            self._values = values
            self._set_outputs(self.m)
            self._refresh()
        elif K_new.shape[0] < self.m and self._factor is not None and bool(self._alive.all()):
            self._refresh(torch.arange(total - K_new.shape[0], total, device=K_new.device),
                          self._bordered_weights(K_new.shape[0]))
        else:
            self._refresh(torch.arange(total - K_new.shape[0], total, device=K_new.device))
        return self.mlp

    def remove(self, indices: Union[Sequence[int], torch.Tensor]) -> FactMLP:
        """Forget the facts at ``indices`` (positions in :attr:`keys`). Returns ``.mlp``."""
        rows = self._rows(indices)
        if rows.numel() >= self.num_facts:
            raise ValueError("remove would leave no facts; build a new FactBuilder instead")
        self._alive[rows] = False
        if self._factor is None or int((~self._alive).sum()) > COMPACT_FRACTION * self._alive.numel():
            self._compact()
        self._refresh(rows.new_empty(0))  # the kept facts keep their targets: nothing is touched
        return self.mlp

    def update(self, indices: Union[Sequence[int], torch.Tensor], f_changed: torch.Tensor) -> FactMLP:
        """Map the keys at ``indices`` (positions in :attr:`keys`) to new values ``f_changed``."""
        rows = self._rows(indices)
        f_changed = check_facts(f_changed, rows.numel(), self._values.shape[0], self._keys.device, name="f_changed")
        self._facts[rows] = f_changed
        self._refresh(rows)
        return self.mlp

    # ------------------------------------------------------------------ internals

    @property
    def m(self) -> int:
        return self._decoder.m

    @property
    def gadget_width(self) -> int:
        return self._gate[0].shape[0]

    @staticmethod
    def _same_kind(name: str, t: torch.Tensor, like: torch.Tensor) -> None:
        if t.dtype != like.dtype or t.device != like.device:
            raise ValueError(f"{name} must be {like.dtype} on {like.device} like the first build, got {t.dtype} on {t.device}")

    def _gate_features(self, keys: torch.Tensor) -> torch.Tensor:
        return _ops.gate_features(keys, *self._gate, self.activation, backend=self.backend)

    def _rows(self, indices) -> torch.Tensor:
        """Positions among the stored facts -> rows of the factor (positions checked)."""
        index = torch.as_tensor(indices, dtype=torch.int64, device=self._keys.device).flatten()
        if index.numel() == 0:
            raise ValueError("indices must name at least one stored fact")
        if int(index.min()) < 0 or int(index.max()) >= self.num_facts:
            raise ValueError(f"indices must be positions in [0, {self.num_facts}) of the stored facts, "
                             f"got range [{int(index.min())}, {int(index.max())}]")
        if index.unique().numel() != index.numel():
            raise ValueError("indices must not repeat")
        return torch.nonzero(self._alive).flatten()[index]

    def _estimate(self, facts: int, values: int, d_in: int, d_out: int, m: int, width: int, like: torch.Tensor):
        """estimate_build of a build in ``like``'s dtype and device."""
        return estimate_build(facts, values, d_in, d_out, m=m, gadget_width=width, solver=self.solver, dtype=like.dtype,
                              outputs=self.outputs, device_type=like.device.type)

    def _set_outputs(self, m: int) -> None:
        """Output embeddings of the current values and the smallest m >= the given one that decodes them."""
        self._alpha = None  # a new decoder gives new codes: nothing to warm-start from
        self._out_embed, rho = output_embeddings(self._values, self.outputs)
        self.rho = check_decodable(float(rho), self.outputs)
        used = torch.arange(self._values.shape[0], device=self._values.device)
        decoder, tried, _ = search_m(m, self._out_embed, self._values, used, self._generator, self.backend)
        self._decoder: JLDecoder = decoder
        self._m_search = "given" if len(tried) == 1 else "grown: " + " -> ".join(map(str, tried))

    def _factorize(self, width: int) -> None:
        """Sample a gate of ``width`` rows for the current keys, whiten, form and factor the Gram."""
        self._gate = sample_gate(self._keys, width, self._generator, self.gate_scale)
        self._op = GadgetOperator.whitened(self._gate_features(self._keys), augment(self._keys), backend=self.backend)
        self._factor = BorderedFactor(cholesky(self._op.dense(lower=True))) if self.solver == "cholesky" else None
        self._forward = self._alpha = None

    def _regrow(self, keys: torch.Tensor, facts: torch.Tensor, values: torch.Tensor, new_values: bool) -> FactMLP:
        """Too many facts for the gate: a full rebuild with a gate sized for them."""
        self._keys, self._facts, self._values = keys, facts, values
        self._alive = torch.ones(keys.shape[0], dtype=torch.bool, device=keys.device)
        if new_values:
            self._set_outputs(self.m)
        self._factorize(gadget_width(keys.shape[0], keys.shape[1], self.width_multiplier))
        self.rebuilds += 1
        self._refresh()
        return self.mlp

    def _compact(self) -> None:
        """Drop the removed rows (with a factor: recomputed on the kept rows)."""
        keep = self._alive
        self._op = GadgetOperator(self._op.gate_features[keep], self._op.keys_aug[keep], self._op.feature_transform,
                                  self._op.key_transform, self.backend)
        self._keys, self._facts = self._keys[keep], self._facts[keep]
        self._alive = self._alive[keep]
        if self._alpha is not None:
            self._alpha = self._alpha[keep]
        self._forward = None
        if self._factor is not None:
            self._factor = BorderedFactor(cholesky(self._op.dense(lower=True)))
            self.rebuilds += 1

    def _solve(self, targets: torch.Tensor) -> torch.Tensor:
        """Dual variables α (F_all, m) of the kept rows' system, zero on tombstones."""
        if self._factor is None:
            alpha, self.last_solve = solve_cg(self._op, targets.to(self._keys.dtype), tol=self.cg_tol,
                                              max_iter=cg_iterations_hint(self.width_multiplier), progress=False,
                                              x0=self._alpha)
            self._alpha = alpha
            return alpha
        # L y = O by forward substitution (new rows only after an addition), then Lᵀ α = y: one F²m solve.
        alpha = self._factor.backward(self._forward_rows(targets))
        self.last_solve = SolveInfo("cholesky (incremental)", str(targets.dtype).replace("torch.", ""), float("nan"))
        dead = torch.nonzero(~self._alive).flatten()
        if dead.numel():
            # x = G⁻¹[O; z], z on the removed rows chosen so that x vanishes there: A_KK x_K = O_K.
            unit = torch.zeros(self._factor.size, dead.numel(), dtype=targets.dtype, device=targets.device)
            unit[dead, torch.arange(dead.numel())] = 1.0
            columns = self._factor.solve(unit)  # G⁻¹ e_R: (F_all, r)
            z = torch.linalg.solve(columns[dead], -alpha[dead])
            alpha = alpha + columns @ z
            alpha[dead] = 0.0
        return alpha

    def _bordered_weights(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Weights (m, h̃, d+1), (m,) after the last border added k < m facts, as a rank-k change of the last ones.

        With G = L Lᵀ bordered by [L_21 L_22], the new rows' dual variables are w = L_22⁻ᵀ y_2 (k, m) and every
        old row's move by −L_11⁻ᵀ L_21ᵀ w, so the weights move by Mᵀ A w with A = [−L_11⁻ᵀ L_21ᵀ; I_k]: one
        triangular solve and one Mᵀ product with k columns instead of m (F²k/2 + F·N·k multiply-adds, N the
        unknowns per gadget, against F²m/2 + F·N·m for all of α and its weights).
        """
        targets = self._decoder.codes[self._facts]
        forward = self._forward_rows(targets)
        panel = self._factor.panels[-1]  # (k, F + k): [L_21 | L_22]
        n = panel.shape[1] - k
        w = torch.linalg.solve_triangular(panel[:, n:].T, forward[n:], upper=True)  # (k, m)
        moves = torch.cat([-self._factor.backward(panel[:, :n].T.contiguous()), torch.eye(k, dtype=w.dtype,
                                                                                           device=w.device)])
        basis, bias = self._op.unknowns(moves)  # (k, h̃, d+1), (k,)
        self.last_solve = SolveInfo("cholesky (incremental)", str(targets.dtype).replace("torch.", ""), float("nan"))
        return self._coef + torch.einsum("lj,lrc->jrc", w, basis), self._out_bias + w.T @ bias

    def _forward_rows(self, targets: torch.Tensor) -> torch.Tensor:
        """y (F_all, m) with L y = targets, reusing the rows of y that an addition left unchanged (a
        bordered factor keeps its leading rows); cached for the next change."""
        cached, known = self._forward, None
        if cached is not None and cached[0].shape[0] <= self._factor.size and \
                torch.equal(cached[0], targets[: cached[0].shape[0]]):
            known = cached[1]
        forward = self._factor.forward(targets, known)
        self._forward = (targets, forward)
        return forward

    def _refresh(self, touched: Optional[torch.Tensor] = None,
                 weights: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> None:
        """Solve for the current targets (or take the given ``weights``), assemble ``.mlp`` and verify the
        ``touched`` rows of the factor ((t,) long; None: every stored fact), or every stored fact with
        verify_scope="all"."""
        if weights is None:
            weights = self._op.unknowns(self._solve(self._decoder.codes[self._facts] * self._alive[:, None]))
        coef, out_bias = self._coef, self._out_bias = weights  # (m, h̃, d+1), (m,)
        m, width, d = coef.shape[0], coef.shape[1], self._keys.shape[1]
        encoder = GatedEncoder(gate_weight=self._gate[0], gate_bias=self._gate[1],
                               up_weight=coef[:, :, :d].reshape(m * width, d).contiguous(),
                               up_bias=coef[:, :, d].reshape(m * width).contiguous(), output_bias=out_bias,
                               gadget_width=width, solve=self.last_solve)
        self.mlp = assemble(encoder, self._decoder.projection, activation=self.activation, backend=self.backend)
        if touched is None or self.verify_scope == "all":
            keys, facts = self.keys, self.facts
        else:
            keys, facts = self._keys[touched], self._facts[touched]
        self.checked = keys.shape[0]
        if self.checked:  # as construct verifies: the MLP outputs D·codes
            codes = encoder_codes(encoder, keys, activation=self.activation, backend=self.backend)
            margins = code_margins(codes, self._decoder.projection, self._values, facts, backend=self.backend)
            self.failed, self.min_margin = int((margins <= 0).sum()), float(margins.min())
        else:
            self.failed, self.min_margin = 0, float("nan")
        self.mlp.report = ConstructionReport(
            num_facts=self.num_facts, num_values=self._values.shape[0], d_in=d, d_out=self._values.shape[1], m=m,
            m_search=self._m_search, rho=self.rho, outputs=self.outputs, hidden=self.mlp.hidden_size,
            gadget_width=width, width_multiplier=round(self.width_multiplier, 4), params=self.mlp.num_parameters,
            activation=self.activation, solver=self.last_solve.solver, precision=self.last_solve.precision,
            residual=float(self.last_solve.residual), cg_iterations=self.last_solve.iterations, whiten_alpha=0.0,
            backend=self.backend, device=str(self._keys.device), verified=True, failed=self.failed,
            accuracy=1.0 - self.failed / self.checked if self.checked else None, min_margin=self.min_margin,
            checked=self.checked)
        if self.verify is True and self.failed:
            raise FactStorageError(f"{self.failed} of the {self.checked} facts checked are not stored after the "
                                   f"change (min margin {self.min_margin:.3g}); raise m or rebuild with a larger "
                                   "width_multiplier", self.mlp.report)


__all__ = ["BorderedFactor", "FactBuilder", "cholesky"]
