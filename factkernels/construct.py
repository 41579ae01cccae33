"""construct(K, V, f, m=...) -> FactMLP: a fact-storing MLP built in closed form.

Pipeline (seed 000, Alg. 1): optional ZCA whitening of keys and values (folded
into the weights at the end), output embeddings U (margin-optimal U* or the
values themselves), the smallest verified m for the JL decoder, one shared-gate
solve for all m encoder gadgets, assembly in SwiGLU layout, and verification of
every fact with the fused decode.
"""

from __future__ import annotations

import math
import time
from typing import Optional, Union

import torch

from . import _ops, geometry
from .decoder import (OUTPUTS, JLDecoder, check_decodable, choose_m, code_margins, decoder_failures, jl_decoder,
                      jl_projection, least_m, output_embeddings, verify_margins)
from .encoder import assemble, build_per_gadget, build_shared_gate, gadget_width
from .memory import check_fits, estimate_build
from .mlp import FactMLP
from .report import ConstructionReport, FactStorageError
from .solvers import PRECONDITIONERS, SOLVERS, pick_solver
from .validation import (check_choice, check_distinct, check_positive_int, input_problems, raise_input_problems,
                         validate_inputs)


# ----------------------------------------------------------------------------- helpers


class _PhaseClock:
    """Phase timings without a host sync per phase: CUDA events on a GPU (read once the final
    report has synchronized), the host clock on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.marks: list = [("start", self._now())]

    def _now(self):
        if self.stream is None:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def lap(self, name: str) -> None:
        """End the phase ``name`` (it began where the previous one ended)."""
        self.marks.append((name, self._now()))

    def seconds(self) -> dict:
        """Seconds per phase; on a GPU only after a synchronization."""
        return {name: (begin.elapsed_time(end) / 1e3 if self.stream is not None else end - begin)
                for (_, begin), (name, end) in zip(self.marks, self.marks[1:])}


def _memory_guard(num_facts: int, values: torch.Tensor, d_in: int, m: int, width: int, solver: str, outputs,
                  verify, hidden: Optional[int], max_memory: Optional[int], backend: str,
                  what: str = "construct") -> str:
    """Check that the build fits before allocating it and resolve solver="auto" from the same
    estimate; returns the solver. Raises MemoryBudgetError naming the argument to change (``what``: the build
    it names, with the m assumed when m is not known yet)."""
    # the CPU-only kernels run only on a CPU ("auto": as estimate_build resolves it)
    cpu_kernels = None if backend == "auto" else backend == "kernels" and values.device.type == "cpu"
    kwargs = dict(m=m, gadget_width=width, dtype=values.dtype, verify=verify is not False, cpu_kernels=cpu_kernels,
                  outputs=outputs if isinstance(outputs, str) else "given",
                  width_argument="width_multiplier" if hidden is None else "hidden", device_type=values.device.type)
    shape = (num_facts, values.shape[0], d_in, values.shape[1])
    if solver == "auto":
        rest = estimate_build(*shape, solver="cg", **kwargs).total
        solver = pick_solver(num_facts, values.device, dtype=values.dtype, other_bytes=rest, budget=max_memory)
    check_fits(estimate_build(*shape, solver=solver, **kwargs), values.device, max_memory, what=what)
    return solver


def _gadget_width(num_facts: int, d_in: int, m, width_multiplier: float, hidden: Optional[int]) -> int:
    """h̃ from the width multiplier, or hidden // m (checked to give h̃(d_in+1)+1 >= F)."""
    if hidden is None:
        return gadget_width(num_facts, d_in, width_multiplier)
    if not isinstance(m, int):
        raise ValueError("hidden needs an explicit integer m (hidden = m x gadget width)")
    width = hidden // m
    if width * (d_in + 1) + 1 < num_facts:
        raise ValueError(
            f"hidden={hidden} is too few hidden units for F={num_facts}: each of the m={m} gadgets "
            f"needs width*(d_in+1)+1 >= F, i.e. hidden >= {m * math.ceil((num_facts - 1) / (d_in + 1))}"
        )
    return width


def _check_options(m, solver, outputs, values, activation, width_multiplier, hidden, whiten, verify, backend,
                   cg_preconditioner) -> None:
    if m is not None and not (isinstance(m, str) and m == "bound"):
        if isinstance(m, bool) or not isinstance(m, int):
            raise TypeError(f"m must be an int, None (smallest m that verifies) or 'bound', got {m!r}")
        if m < 1:
            raise ValueError(f"m must be >= 1, got {m}")
    check_choice("solver", solver, SOLVERS)
    check_choice("cg_preconditioner", cg_preconditioner, PRECONDITIONERS)
    if isinstance(outputs, torch.Tensor):
        if outputs.shape != values.shape or outputs.dtype != values.dtype or outputs.device != values.device:
            raise ValueError(f"outputs given as a tensor must match V: shape {tuple(values.shape)}, {values.dtype}, "
                             f"{values.device}; got {tuple(outputs.shape)}, {outputs.dtype}, {outputs.device}")
    elif not isinstance(outputs, str) or outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {OUTPUTS} or a (|V|, d_out) tensor of output embeddings, got {outputs!r}")
    _ops.check_activation(activation)
    check_choice("backend", backend, _ops.BACKENDS)
    if not (isinstance(whiten, (int, float)) and 0.0 <= float(whiten) <= 1.0):
        raise ValueError(f"whiten must be a strength alpha in [0, 1], got {whiten!r}")
    if verify not in (True, False, "report"):
        raise ValueError(f"verify must be True, False or 'report', got {verify!r}")
    if hidden is None and not width_multiplier >= 1.0:
        raise ValueError(
            f"width_multiplier={width_multiplier} gives too few hidden units: each gadget needs "
            f"h~(d+1) >= F, so width_multiplier must be >= 1 (1.25-2 is well conditioned)"
        )
    check_positive_int("hidden", hidden, allow_none=True)


# ----------------------------------------------------------------------------- construct


def construct(
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    m: Union[int, str, None] = None,
    *,
    outputs: Union[str, torch.Tensor] = "margin_optimal",
    solver: str = "auto",
    activation: str = "silu",
    width_multiplier: float = 1.5,
    hidden: Optional[int] = None,
    whiten: float = 0.0,
    verify: Union[bool, str] = True,
    seed: int = 0,
    backend: str = "auto",
    gate_scale: float = 1.0,
    cg_tol: float = 1e-4,
    cg_max_iter: Optional[int] = None,
    cg_preconditioner: str = "auto",
    progress: bool = True,
    max_memory: Optional[int] = None,
) -> FactMLP:
    """Build a gated MLP g with argmax_j <g(k_i), v_j> = f(i) for every key.

    Args:
        K: (F, d_in) keys, distinct. V: (|V|, d_out) values, distinct. f: (F,) long, f[i] ∈ [0, |V|).
        m: code dimension; None picks the smallest m whose JL decoder decodes every used
            value (search from ρ⁻² ln|V| upward by x1.25), "bound" uses Thm B.5.3.
        outputs: "margin_optimal" (u_j = U*_j, the spherical Chebyshev centres), "values" (u_j = v_j),
            or precomputed output embeddings U (|V|, d_out), e.g. U* from
            :func:`factkernels.ustar.margin_optimal_outputs` reused across seeds. With
            ``whiten`` > 0, U must be the outputs of the whitened values.
        solver: "cholesky" (one factorization of the F×F Gram), "cg" (matrix-free batched
            PCG, no F×F matrix), "per_gadget" (Alg. 3 verbatim, slow reference) or "auto".
        cg_preconditioner: "auto" | "keys" | "constant" | "jacobi", see :func:`factkernels.solvers.solve_cg`.
        activation: analytic non-polynomial gate activation ("silu", "gelu", "tanh", "sigmoid", "softplus").
        width_multiplier: h̃(d_in+1) ≈ multiplier·F per gadget (>= 1; 1.25–2 is well conditioned).
        hidden: total hidden size instead of the multiplier (h̃ = hidden // m).
        whiten: ZCA whitening strength α ∈ [0, 1] for keys and values, folded into the weights.
        verify: True checks every fact and raises FactStorageError on failures, "report" only
            records the result in the report, False skips the check.
        seed: seeds the gate and the JL projection (same seed, same MLP on CPU).
        backend: "auto" | "kernels" | "torch" (see factkernels._ops).
        max_memory: bytes the build may use (default: the free memory of the device). The
            build's peak is estimated before anything large is allocated
            (:func:`factkernels.memory.estimate_build`); a build that does not fit raises
            :class:`factkernels.memory.MemoryBudgetError` naming the argument to change, and
            solver="auto" picks the dense Cholesky only when it fits with room to spare.

    Returns:
        FactMLP with ``.report`` (a :class:`ConstructionReport`).
    """
    checked_facts = validate_inputs(K, V, f, deferred=True)  # the entries' checks: queued below, read with the first read
    facts = checked_facts.clamp(0, V.shape[0] - 1)
    problems = None  # the entries' checks, once queued (_queued_problems)
    _check_options(m, solver, outputs, V, activation, width_multiplier, hidden, whiten, verify, backend,
                   cg_preconditioner)
    check_positive_int("max_memory", max_memory, allow_none=True)
    num_facts, d_in = K.shape
    device = K.device
    width = _gadget_width(num_facts, d_in, m, width_multiplier, hidden)
    if hidden is not None:
        width_multiplier = width * (d_in + 1) / num_facts
    # Before anything large (with an integer m this also resolves solver="auto"); m unknown: the least m it can
    # reach, not the search's cap 64·d_out, 15x the m found at |V| = 256, d = 16 (it would refuse builds that fit).
    guard_m = m if isinstance(m, int) else least_m(m, V.shape[0])
    chosen = _memory_guard(num_facts, V, d_in, guard_m, width,
                           solver if isinstance(m, int) or solver != "auto" else "cg", outputs, verify, hidden,
                           max_memory, backend,
                           what="construct" if isinstance(m, int) else
                           f"construct at m={guard_m} (the least m that m={m!r} can pick, rho <= 1)")
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    # From here to the report nothing is read back from the device (with an integer m, outputs other than U*
    # and the dense solver): every phase queues its work, and the report reads its numbers (the input
    # checks' among them) in one transfer.
    clock = _PhaseClock(device)
    alpha = float(whiten)
    if alpha > 0 or (isinstance(outputs, str) and outputs == "margin_optimal"):
        # the whitening's eigendecomposition and U* read back anyway, and need sound inputs: settle them first
        problems = _settle_problems(_queued_problems(K, V, checked_facts, outputs, value_duplicates=True), K, V, f)
    if alpha > 0:
        keys, key_transform = geometry.whiten(K, alpha)
        values, value_transform = geometry.whiten(V, alpha)
    else:
        keys, values, key_transform, value_transform = K, V, None, None
    clock.lap("whiten")
    decoded: dict = {}  # rho, the decoder, how m was found and the targets (F, m), once formed

    def decode_targets(projection: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Output embeddings, their margin rho and the JL decoder (D = ``projection`` when drawn already, else
        drawn here, m searched on the host when not given): the targets (F, m) of the encoder."""
        nonlocal problems
        if problems is None:  # with the factorization first, behind it
            problems = _queued_problems(K, V, checked_facts, outputs, value_duplicates=False)
        out_embed, rho = output_embeddings(values, outputs, backend=backend, checked=True)
        clock.lap("outputs")
        if projection is not None:
            decoder, m_search = JLDecoder(projection, out_embed @ projection), "given"
        elif isinstance(m, int):
            decoder, m_search = jl_decoder(out_embed, m, generator), "given"
        else:  # the search is decided on the host: it reads rho (with the input checks) and each trial's decode back
            used = torch.zeros(V.shape[0], dtype=torch.bool, device=device).index_fill_(0, facts, True)
            host = _read_scalars([rho, used.sum(), *problems])
            problems = _settle_problems(host[2:], K, V, f)
            # torch.unique(facts) with its size read above: a stable sort puts the used values first, in order
            used = torch.argsort(used.logical_not().to(torch.uint8), stable=True)[: int(host[1])]
            decoder, m_search = choose_m(m, out_embed, values, used, _check_rho(host[0], V, outputs), generator,
                                         backend)
        clock.lap("m_search")
        decoded.update(rho=rho, decoder=decoder, m_search=m_search, targets=decoder.codes[facts])
        return decoded["targets"]

    if isinstance(m, int) and chosen == "cholesky":
        # The Gram and its factorization need neither the outputs nor the decoder: with D drawn first (the generator
        # draws in the order it always did), the factorization is queued before their work, and a GPU factors while
        # the host queues the rest (before, the host queued most of the build's operators with the GPU idle first).
        projection = jl_projection(values.shape[1], m, generator, values)

        def targets() -> torch.Tensor:
            clock.lap("factor")
            return decode_targets(projection)
    else:
        targets = decode_targets()
        chosen = _memory_guard(num_facts, V, d_in, decoded["decoder"].m, width, solver, outputs, verify, hidden,
                               max_memory, backend)

    def build(targets, gate=None, deferred=False):
        """Encoder, MLP and (when verifying) the margins (F,) of every fact, all left on the device. targets: (F, m),
        or the function forming them once the factorization is queued (see build_shared_gate)."""
        if chosen == "per_gadget":
            encoder = build_per_gadget(keys, targets, width_multiplier=width_multiplier, activation=activation,
                                       generator=generator, gate_scale=gate_scale, progress=progress)
        else:
            encoder = build_shared_gate(keys, targets, width_multiplier=width_multiplier, activation=activation,
                                        solver=chosen, generator=generator, backend=backend, gate_scale=gate_scale,
                                        cg_tol=cg_tol, cg_max_iter=cg_max_iter, cg_preconditioner=cg_preconditioner,
                                        progress=progress, gate=gate,
                                        deferred=deferred, codes=verify is not False)
        clock.lap("solve")
        projection = decoded["decoder"].projection
        mlp = assemble(encoder, projection, activation=activation, backend=backend,
                       key_transform=key_transform, value_transform=value_transform)
        clock.lap("assemble")
        if verify is False:
            margins = None
        elif encoder.codes is not None:  # the MLP's outputs are P·codes: decode those, no second forward pass
            projection = projection if value_transform is None else value_transform @ projection
            margins = code_margins(encoder.codes, projection, V, facts, backend=backend)
        else:
            margins = verify_margins(mlp, K, V, facts)
        clock.lap("verify")
        return encoder, mlp, margins

    encoder, mlp, margins = build(targets, deferred=chosen == "cholesky")
    decoder, m_search = decoded["decoder"], decoded["m_search"]
    rho, accepted, residual, failed, min_margin, problems = _read_back(decoded["rho"], encoder.solve, margins, problems)
    _settle_problems(problems, K, V, f)
    _check_rho(rho, V, outputs)
    if not accepted:  # the float32 factorization failed or missed the residual: refine, or redo in float64
        encoder, mlp, margins = build(decoded["targets"], gate=(encoder.gate_weight, encoder.gate_bias))
        _, _, residual, failed, min_margin, _ = _read_back(torch.zeros(()), encoder.solve, margins, [])
    encoder.solve.residual, encoder.solve.accepted = residual, None

    report = ConstructionReport(
        num_facts=num_facts, num_values=V.shape[0], d_in=d_in, d_out=V.shape[1], m=decoder.m, m_search=m_search,
        rho=rho, outputs=outputs if isinstance(outputs, str) else "given", hidden=mlp.hidden_size, gadget_width=width,
        width_multiplier=round(width_multiplier, 4), params=mlp.num_parameters, activation=activation,
        solver=encoder.solve.solver, precision=encoder.solve.precision, residual=residual,
        cg_iterations=encoder.solve.iterations, whiten_alpha=alpha, backend=backend, device=str(device),
        verified=verify is not False, cg_preconditioner=encoder.solve.preconditioner,
    )
    if verify is not False:
        report.failed, report.accuracy, report.min_margin = failed, 1.0 - failed / num_facts, min_margin
    report.timings = clock.seconds()
    report.timings["total"] = time.perf_counter() - start
    mlp.report = report
    if verify is True and report.failed:
        raise FactStorageError(_failure_message(report, decoder_failures(decoder, values, torch.unique(facts), backend)),
                               report)
    return mlp


def _read_scalars(scalars: list) -> list:
    """0-dim tensors or numbers as Python floats, the tensors of each device read back in one transfer (a
    host tensor is not sent to the device first: a copy from pageable memory would synchronize the stream)."""
    out = [x if not isinstance(x, torch.Tensor) else None for x in scalars]
    groups: dict = {}  # per device, the positions of each dtype: one stack and one conversion each (a launch each
    for i, x in enumerate(scalars):  # on a GPU), not a conversion per scalar
        if isinstance(x, torch.Tensor):
            groups.setdefault(x.device, {}).setdefault(x.dtype, []).append(i)
    for by_dtype in groups.values():
        parts = [torch.stack([scalars[i].detach() for i in group])
                 if len(group) > 1 else scalars[group[0]].detach().reshape(1)
                 for group in by_dtype.values()]
        parts = [part.to(torch.float64) for part in parts]
        values = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()
        for i, value in zip([i for group in by_dtype.values() for i in group], values):
            out[i] = value
    return [float(x) for x in out]


def _queued_problems(K: torch.Tensor, V: torch.Tensor, facts: torch.Tensor, outputs, *,
                     value_duplicates: bool) -> torch.Tensor:
    """The input checks' (k,) device flags, queued and not read: :func:`input_problems` of the inputs (facts: the
    unclamped int64 f; value_duplicates: see there) and, with outputs given as a tensor, a 5th flag for their
    entries."""
    problems = input_problems(K, V, facts, value_duplicates=value_duplicates)
    if isinstance(outputs, torch.Tensor):
        problems = torch.cat([problems, (~torch.isfinite(outputs).all() | (outputs == 0).all(1).any())[None]])
    return problems


def _check_rho(rho: float, V: torch.Tensor, outputs) -> float:
    """Return rho, or raise naming the cause when it is <= 0: equal rows of V (the input checks leave them to this
    margin, which equal values make 0: no second pass over V), else V not decodable with these outputs."""
    if not rho > 0:
        check_distinct(V, "V")
    return check_decodable(rho, outputs)


def _settle_problems(problems, K, V, f) -> list:
    """Raise the first input problem (``problems``: the (k,) device flags of the input checks, or them read
    back), naming its argument; returns [] (nothing left to read). Flag 4, when present, is given outputs
    with a NaN/Inf entry or an all-zero row."""
    flags = _read_scalars(list(problems)) if isinstance(problems, torch.Tensor) else list(problems)
    raise_input_problems(flags[:4], K, V, f)
    if len(flags) > 4 and flags[4]:
        raise ValueError("outputs contains NaN or Inf entries or an all-zero row (every output needs a direction)")
    return []


def _read_back(rho: torch.Tensor, solve, margins: Optional[torch.Tensor],
               problems) -> tuple[float, bool, float, int, float, list]:
    """The build's one read back from the device: (rho, whether the solve was accepted, its relative
    residual, failed facts, min margin, the input checks' flags); failed and min margin are 0 and nan without
    verification. problems: the input checks' device flags not read yet, or []."""
    accepted = solve.accepted if solve.accepted is not None else torch.ones((), dtype=torch.bool)
    scalars = [rho, accepted, solve.residual]
    if margins is not None:
        scalars += [(margins <= 0).sum(), margins.min()]
    out = _read_scalars(scalars + list(problems))
    flags = out[len(scalars):]
    if margins is None:
        out[3:3] = [0, float("nan")]
    return out[0], bool(out[1]), out[2], int(out[3]), out[4], flags


def _failure_message(report: ConstructionReport, decoder_failed: int) -> str:
    head = f"{report.failed} of {report.num_facts} facts are not stored (min margin {report.min_margin:.3g}). "
    if decoder_failed:
        cause = (f"Likely cause: m={report.m} is too small for rho={report.rho:.3f} ({decoder_failed} values do "
                 "not survive the JL projection); raise m or pass m=None to search for it.")
    elif report.residual > 1e-3:
        cause = (f"Likely cause: an ill-conditioned solve (relative residual {report.residual:.1e}); raise "
                 "width_multiplier (1.5-2), or use float64 keys and values.")
    else:
        cause = ("Likely cause: margins below the working precision; use float64 inputs or a larger m.")
    return head + cause + " Pass verify='report' to get the MLP and its report anyway."
