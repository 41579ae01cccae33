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
from contextlib import contextmanager
from typing import Iterator, Optional, Union

import torch

from . import _ops, geometry
from .decoder import JLDecoder, decoder_failures, initial_m, jl_bound, jl_decoder
from .encoder import assemble, build_per_gadget, build_shared_gate
from .mlp import FactMLP
from .report import ConstructionReport
from .solvers import SOLVERS, pick_solver

OUTPUTS = ("margin_optimal", "values")
M_GROWTH = 1.25  # geometric growth of m while the decoder check fails


class FactStorageError(RuntimeError):
    """Raised by ``construct(..., verify=True)`` when some facts are not stored."""

    def __init__(self, message: str, report: "ConstructionReport") -> None:
        super().__init__(message)
        self.report = report


# ----------------------------------------------------------------------------- validation


def _validate_embeddings(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
    if t.dim() != 2 or t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D tensor (rows = embeddings), got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or Inf")


def _first_duplicate(t: torch.Tensor) -> Optional[tuple[int, int]]:
    """First pair of equal rows, or None. Equal rows have bit-equal projections on any
    direction, so sorting one projection finds every candidate pair in O(n log n)."""
    direction = torch.randn(t.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    proj = t.double() @ direction.to(t.device)
    order = proj.argsort()
    same = torch.nonzero(proj[order[1:]] == proj[order[:-1]]).flatten()
    if same.numel():
        first, second = order[same], order[same + 1]
        equal = (t[first] == t[second]).all(dim=1)
        if bool(equal.any()):
            k = int(torch.nonzero(equal)[0])
            pair = sorted((int(first[k]), int(second[k])))
            return pair[0], pair[1]
    return None


def validate_inputs(keys: torch.Tensor, values: torch.Tensor, facts: torch.Tensor) -> torch.Tensor:
    """Check K (F, d_in), V (|V|, d_out), f (F,) and return f as int64; raise naming the argument."""
    _validate_embeddings("K", keys)
    _validate_embeddings("V", values)
    if values.dtype != keys.dtype:
        raise TypeError(f"V has dtype {values.dtype} but K has {keys.dtype}; use one dtype")
    if values.device != keys.device:
        raise ValueError(f"V is on {values.device} but K is on {keys.device}; use one device")
    if not isinstance(facts, torch.Tensor):
        raise TypeError(f"f must be a torch.Tensor of value indices, got {type(facts).__name__}")
    if facts.dtype.is_floating_point or facts.dtype.is_complex or facts.dtype == torch.bool:
        raise TypeError(f"f must be an integer tensor, got {facts.dtype}")
    if facts.dim() != 1 or facts.shape[0] != keys.shape[0]:
        raise ValueError(f"f must have shape ({keys.shape[0]},) (one value index per key), got {tuple(facts.shape)}")
    if facts.device != keys.device:
        raise ValueError(f"f is on {facts.device} but K is on {keys.device}; use one device")
    if facts.numel() and (int(facts.min()) < 0 or int(facts.max()) >= values.shape[0]):
        raise ValueError(f"f must index values in [0, {values.shape[0]}), got range [{int(facts.min())}, {int(facts.max())}]")
    dup = _first_duplicate(values)
    if dup is not None:
        raise ValueError(f"V has duplicate rows {dup[0]} and {dup[1]}: rho(V) = 0, no MLP can tell them apart")
    dup = _first_duplicate(keys)
    if dup is not None:
        raise ValueError(f"K has duplicate rows {dup[0]} and {dup[1]}: keys must be distinct (generic)")
    return facts.to(torch.int64)


# ----------------------------------------------------------------------------- helpers


@contextmanager
def _timed(timings: dict, name: str, device: torch.device) -> Iterator[None]:
    start = time.perf_counter()
    yield
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timings[name] = time.perf_counter() - start


def _choose_m(m: Union[int, str, None], outputs: torch.Tensor, values: torch.Tensor, used: torch.Tensor, rho: float,
              generator: torch.Generator, backend: str) -> tuple[JLDecoder, str]:
    """JL decoder for a given m, for Thm B.5.3's bound, or the smallest m (geometric search) that decodes."""
    if isinstance(m, int):
        return jl_decoder(outputs, m, generator), "given"
    if m == "bound":
        bound = jl_bound(rho, values.shape[0])
        return jl_decoder(outputs, bound, generator), "Thm B.5.3 bound (delta=0.1)"
    tried = []
    current = initial_m(rho, values.shape[0])
    while True:
        decoder = jl_decoder(outputs, current, generator)
        tried.append(current)
        if decoder_failures(decoder, values, used, backend) == 0:
            return decoder, "auto: " + " -> ".join(map(str, tried))
        if current >= 64 * values.shape[1]:
            raise RuntimeError(f"no m up to {current} decodes every value; rho={rho:.3g} is too small")
        current = max(current + 1, math.ceil(current * M_GROWTH))


def _check_options(m, solver, outputs, values, activation, width_multiplier, hidden, whiten, verify, backend) -> None:
    if m is not None and not (isinstance(m, str) and m == "bound"):
        if isinstance(m, bool) or not isinstance(m, int):
            raise TypeError(f"m must be an int, None (smallest m that verifies) or 'bound', got {m!r}")
        if m < 1:
            raise ValueError(f"m must be >= 1, got {m}")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if isinstance(outputs, torch.Tensor):
        if outputs.shape != values.shape or outputs.dtype != values.dtype or outputs.device != values.device:
            raise ValueError(f"outputs given as a tensor must match V: shape {tuple(values.shape)}, {values.dtype}, "
                             f"{values.device}; got {tuple(outputs.shape)}, {outputs.dtype}, {outputs.device}")
        if not torch.isfinite(outputs).all():
            raise ValueError("outputs contains NaN or Inf")
    elif not isinstance(outputs, str) or outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {OUTPUTS} or a (|V|, d_out) tensor of output embeddings, got {outputs!r}")
    _ops.check_activation(activation)
    if backend not in _ops.BACKENDS:
        raise ValueError(f"backend must be one of {_ops.BACKENDS}, got {backend!r}")
    if not (isinstance(whiten, (int, float)) and 0.0 <= float(whiten) <= 1.0):
        raise ValueError(f"whiten must be a strength alpha in [0, 1], got {whiten!r}")
    if verify not in (True, False, "report"):
        raise ValueError(f"verify must be True, False or 'report', got {verify!r}")
    if hidden is None and not width_multiplier >= 1.0:
        raise ValueError(
            f"width_multiplier={width_multiplier} gives too few hidden units: each gadget needs "
            f"h~(d+1) >= F, so width_multiplier must be >= 1 (1.25-2 is well conditioned)"
        )
    if hidden is not None:
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"hidden must be a positive int, got {hidden!r}")


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
    progress: bool = True,
) -> FactMLP:
    """Build a gated MLP g with argmax_j <g(k_i), v_j> = f(i) for every key.

    Args:
        K: (F, d_in) keys, distinct. V: (|V|, d_out) values, distinct. f: (F,) long, f[i] ∈ [0, |V|).
        m: code dimension; None picks the smallest m whose JL decoder decodes every used
            value (search from ρ⁻² ln|V| upward by x1.25), "bound" uses Thm B.5.3.
        outputs: "margin_optimal" (u_j = U*_j, the spherical Chebyshev centres), "values" (u_j = v_j),
            or precomputed output embeddings U (|V|, d_out), e.g. U* from
            :func:`factkernels.geometry.margin_optimal_outputs` reused across seeds. With
            ``whiten`` > 0, U must be the outputs of the whitened values.
        solver: "cholesky" (one factorization of the F×F Gram), "cg" (matrix-free batched
            PCG, no F×F matrix), "per_gadget" (Alg. 3 verbatim, slow reference) or "auto".
        activation: analytic non-polynomial gate activation ("silu", "gelu", "tanh", "sigmoid", "softplus").
        width_multiplier: h̃(d_in+1) ≈ multiplier·F per gadget (>= 1; 1.25–2 is well conditioned).
        hidden: total hidden size instead of the multiplier (h̃ = hidden // m).
        whiten: ZCA whitening strength α ∈ [0, 1] for keys and values, folded into the weights.
        verify: True checks every fact and raises FactStorageError on failures, "report" only
            records the result in the report, False skips the check.
        seed: seeds the gate and the JL projection (same seed, same MLP on CPU).
        backend: "auto" | "kernels" | "torch" (see factkernels._ops).

    Returns:
        FactMLP with ``.report`` (a :class:`ConstructionReport`).
    """
    timings: dict = {}
    facts = validate_inputs(K, V, f)
    _check_options(m, solver, outputs, V, activation, width_multiplier, hidden, whiten, verify, backend)
    num_facts, d_in = K.shape
    device = K.device
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()

    with _timed(timings, "whiten", device):
        alpha = float(whiten)
        if alpha > 0:
            keys, key_transform = geometry.whiten(K, alpha)
            values, value_transform = geometry.whiten(V, alpha)
        else:
            keys, values, key_transform, value_transform = K, V, None, None

    used = torch.unique(facts)
    with _timed(timings, "outputs", device):
        if isinstance(outputs, torch.Tensor):
            out_embed, rho = outputs, float(geometry.output_margins(values, outputs, backend=backend).min())
        elif outputs == "margin_optimal":
            out_embed, rho = geometry.margin_optimal_outputs(values)
        else:
            out_embed = values
            rho = float(geometry.output_margins(values, values, backend=backend).min())
        if not rho > 0:
            hint = " (try outputs='margin_optimal')" if isinstance(outputs, str) and outputs == "values" else ""
            label = "the given outputs" if isinstance(outputs, torch.Tensor) else f"outputs={outputs!r}"
            raise ValueError(f"V is not decodable with {label}: rho = {rho:.3g} <= 0{hint}")

    if hidden is not None:
        m_fixed = m if isinstance(m, int) else None
        if m_fixed is None:
            raise ValueError("hidden needs an explicit integer m (hidden = m x gadget width)")
        width = hidden // m_fixed
        if width * (d_in + 1) + 1 < num_facts:
            raise ValueError(
                f"hidden={hidden} is too few hidden units for F={num_facts}: each of the m={m_fixed} gadgets "
                f"needs width*(d_in+1)+1 >= F, i.e. hidden >= {m_fixed * math.ceil((num_facts - 1) / (d_in + 1))}"
            )
        width_multiplier = width * (d_in + 1) / num_facts

    with _timed(timings, "m_search", device):
        decoder, m_search = _choose_m(m, out_embed, values, used, rho, generator, backend)
    targets = decoder.codes[facts]  # (F, m)

    chosen = pick_solver(num_facts, device) if solver == "auto" else solver
    with _timed(timings, "solve", device):
        if chosen == "per_gadget":
            encoder = build_per_gadget(keys, targets, width_multiplier=width_multiplier, activation=activation,
                                       generator=generator, gate_scale=gate_scale, progress=progress)
        else:
            encoder = build_shared_gate(keys, targets, width_multiplier=width_multiplier, activation=activation,
                                        solver=chosen, generator=generator, backend=backend, gate_scale=gate_scale,
                                        cg_tol=cg_tol, cg_max_iter=cg_max_iter, progress=progress)

    with _timed(timings, "assemble", device):
        width = encoder.gadget_width
        mlp = assemble(encoder, decoder.projection, activation=activation, backend=backend,
                       key_transform=key_transform, value_transform=value_transform)

    report = ConstructionReport(
        num_facts=num_facts, num_values=V.shape[0], d_in=d_in, d_out=V.shape[1], m=decoder.m, m_search=m_search,
        rho=rho, outputs=outputs if isinstance(outputs, str) else "given", hidden=mlp.hidden_size, gadget_width=width,
        width_multiplier=round(width_multiplier, 4), params=mlp.num_parameters, activation=activation,
        solver=encoder.solve.solver, precision=encoder.solve.precision, residual=encoder.solve.residual,
        cg_iterations=encoder.solve.iterations, whiten_alpha=alpha, backend=backend, device=str(device),
        verified=verify is not False,
    )
    if verify is not False:
        with _timed(timings, "verify", device):
            margins = mlp.margins(K, V, facts)
        failed = int((margins <= 0).sum())
        report.failed, report.accuracy, report.min_margin = failed, 1.0 - failed / num_facts, float(margins.min())
    timings["total"] = time.perf_counter() - start
    report.timings = timings
    mlp.report = report
    if verify is True and report.failed:
        raise FactStorageError(_failure_message(report, decoder_failures(decoder, values, used, backend)), report)
    return mlp


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
