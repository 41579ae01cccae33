"""Memory estimates of a build, checked before any large allocation.

:func:`estimate_build` adds up the tensors a construction holds at its peak (output
embeddings, JL codes, gate features, the dense Gram or the CG vectors, the MLP weights,
verification), each tagged with the argument that drives it; :func:`check_fits` raises a
:class:`MemoryBudgetError` naming that argument and the estimate when the total exceeds
the budget (default: the free memory of the device), instead of letting the process be
killed half-way. ``solver="auto"`` is chosen from the same estimate
(:func:`factkernels.solvers.pick_solver`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from . import _ops

# Most working memory of the U* solver beyond its output (chunk buffers of the score matrix).
_OUTPUTS_WORK_BYTES = 256 << 20
# Working memory that no tensor of the build accounts for: BLAS/LAPACK buffers, the allocator's slack, the code
# pages first used during a build. On a CPU a cg build's peak stood 27-31 MiB above the tensors at F <= 4,096
# (benchmarks/results/memory_guard-cpu.json), whatever the size.
_RUNTIME_BYTES = 64 << 20
# Share of the tensors added for the allocators' retained, fragmented blocks (glibc's heap, torch's CUDA caching
# allocator): without it the model stood at 1.03x the measured peak at F = 32,768, d = 128 on a CPU, falling with F
# (2.0x at 8,192; memory_guard-cpu.json).
_ALLOCATOR_SLACK = 0.25
# Codes of the m search's trial decoders alive at once, in units of |V|·m: decoder.SEARCH_BATCH = 4 trials of up to
# M_GROWTH³ = 1.95 m each (1 + 1.25 + 1.56 + 1.95 = 5.8).
_SEARCH_CODES = 6
# Rows of keys verified per chunk (bounds the hidden activations of the torch forward).
VERIFY_CHUNK = 4096


class MemoryBudgetError(MemoryError):
    """The requested build does not fit in the memory budget; raised before allocating it."""


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _cgroup_free() -> Optional[int]:
    """Bytes left under a cgroup v2 memory limit, or None when there is no limit."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None


def available_memory(device: torch.device) -> int:
    """Bytes that a new allocation on ``device`` can use: free GPU memory, or on the CPU the
    kernel's MemAvailable (free + reclaimable cache), capped by a cgroup limit."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
            free = 4 << 30
    cgroup = _cgroup_free()
    return free if cgroup is None else min(free, cgroup)


def dense_gram_bytes(num_facts: int, dtype: torch.dtype = torch.float32) -> int:
    """Peak of the Cholesky path in ``dtype``: in float32 the redo after a missed residual holds the F×F Gram
    and its factor with their float64 copies (4 + 4 + 8 + 8 bytes an entry); in float64 the Gram and its factor."""
    return (24 if dtype == torch.float32 else 16) * num_facts * num_facts


@dataclass
class MemoryEstimate:
    """Peak bytes of a build by part. parts: name -> (bytes, driving argument); phases: name -> the phase that holds
    the part (parts not named there are held throughout); args: argument -> value.

    total: the parts held throughout plus the largest phase (the outputs' pass, the solve, the verification run
    one after another and free their working memory in between)."""

    parts: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)
    args: dict = field(default_factory=dict)

    def add(self, name: str, nbytes: float, argument: Optional[str], phase: Optional[str] = None) -> None:
        """``argument``: the one that drives the part (None: none does)."""
        self.parts[name] = (int(nbytes), argument)
        if phase is not None:
            self.phases[name] = phase

    def phase_bytes(self) -> dict:
        """phase -> bytes of its parts ("held": the parts held throughout)."""
        out: dict = {}
        for name, (nbytes, _) in self.parts.items():
            phase = self.phases.get(name, "held")
            out[phase] = out.get(phase, 0) + nbytes
        return out

    @property
    def total(self) -> int:
        phases = self.phase_bytes()
        held = phases.pop("held", 0)
        return held + max(phases.values(), default=0)

    def largest(self) -> tuple[str, int, str]:
        """(part name, bytes, driving argument) of the biggest part that an argument drives."""
        name = max((k for k in self.parts if self.parts[k][1] is not None), key=lambda k: self.parts[k][0])
        return name, *self.parts[name]

    def __str__(self) -> str:
        items = sorted(self.parts.items(), key=lambda kv: -kv[1][0])
        return ", ".join(f"{name} {format_bytes(b)}" for name, (b, _) in items if b)


_FIXES = {
    "m": "lower m, or pass m=None to search the smallest m that stores every fact",
    "hidden": "lower hidden (or width_multiplier)",
    "width_multiplier": "lower width_multiplier (1.25-2 is enough)",
    "solver": "use solver='cg' (matrix-free: no F x F Gram)",
    "K": "store fewer facts per MLP, or shard the facts across processes (distributed=True)",
    "V": "use fewer values, or pass precomputed outputs",
}


def estimate_build(
    num_facts: int,
    num_values: int,
    d_in: int,
    d_out: int,
    *,
    m: int,
    gadget_width: int,
    solver: str,
    dtype: torch.dtype = torch.float32,
    outputs: str = "margin_optimal",
    verify: bool = True,
    cpu_kernels: Optional[bool] = None,
    width_argument: str = "width_multiplier",
    device_type: str = "cpu",
) -> MemoryEstimate:
    """Peak memory of ``construct`` for F keys (d_in), |V| values (d_out), code dimension m and
    gadget width h̃ (hidden = m·h̃), with ``solver`` "cholesky" | "cg" | "per_gadget".

    A model of the tensors alive at the peak, not a measurement: accurate to a small factor,
    which is what a guard against a build 100x too large needs. ``cpu_kernels``: the CPU-only kernels run
    (_ops.CPU_ONLY_KERNELS: the fused verification forward with no hidden activations, decode and the gadget
    products with no score chunk or row block; and star_topk's CPU kernel), not their torch twins; None: as
    backend="auto" picks on ``device_type``.
    ``device_type``: "cpu" | "cuda", whose working-memory budgets (_ops.GADGET_TWIN_BYTES, STAR_TWIN_BYTES) apply.
    Each part is tagged with the phase that holds it (outputs, solve, verify; untagged: held throughout) and
    counted as if all of its phase's tensors were alive at once: checked to bound the measured peak in
    benchmarks/results/memory_guard-cpu.json (benchmarks/memory_guard.py).
    """
    if cpu_kernels is None:
        cpu_kernels = _ops.build_info()["compiled"] and _ops.auto_runs_kernel("gated_forward", device_type)
    item = torch.finfo(dtype).bits // 8
    hidden = m * gadget_width
    est = MemoryEstimate(args={"m": m, "hidden": hidden, "K": f"({num_facts}, {d_in})", "V": f"({num_values}, {d_out})",
                               "solver": repr(solver), width_argument: gadget_width})
    if outputs == "margin_optimal":
        work = min(_OUTPUTS_WORK_BYTES, 4 * num_values * num_values * 8)  # chunks of the |V|×|V| scores
        # (and the streaming passes' packed copy of the values in their dtype, star_topk's CPU kernel)
        est.add("outputs U*", (6 * 8 + item) * num_values * d_out + work, "V", "outputs")
    elif outputs == "values":  # geometry.checked_value_margins: three float64 copies of V, two in dtype, and the
        # streaming pass's chunk of scores (star_topk's twin's, within STAR_TWIN_BYTES; its CPU kernel holds none)
        budget = _ops.STAR_TWIN_BYTES.get(device_type, _ops.STAR_TWIN_BYTES["cpu"])
        chunk = 0 if cpu_kernels else min(budget, num_values * num_values * (3 * item + 1))
        est.add("output margins", (3 * 8 + 2 * item) * num_values * d_out + chunk, "V", "outputs")
    est.add("JL codes", num_values * m * item + d_out * m * 8, "m")
    # _ops.decode's twin (run where the fused forward's is: both kernels are CPU-only) scores VERIFY_CHUNK rows
    # against all |V| values at a time
    decode_chunk = 0 if cpu_kernels else min(num_facts, VERIFY_CHUNK) * num_values * item
    # decoder.search_m: a batch of up to 4 trial decoders' codes (|V|, m') with m' up to 1.25³ m, and a decode
    est.add("m search", _SEARCH_CODES * num_values * m * item + decode_chunk, "m", "m search")
    est.add("targets and dual variables", 2 * num_facts * m * item, "m")
    if solver == "cg":  # solvers.solve_cg holds r, p, z and Ap beside the targets and α, and at its peak (applying
        # the preconditioner, or forming the next p) three (F, m) temporaries
        est.add("CG vectors", 7 * num_facts * m * item, "m", "solve")
    est.add("gate features", 2 * num_facts * (gadget_width + d_in + 1) * item, width_argument, "solve")
    if solver == "cg":  # at most: the keys' span deflated (solvers.deflated_preconditioner), its basis twice and
        # the k × h̃(d+1) coefficients of its products, with one chunk of m columns (scaled, and its coefficients)
        rank, coefficients = d_in + 1, gadget_width * (d_in + 1)
        est.add("CG deflation", ((2 * num_facts + coefficients) * rank + (num_facts + coefficients) * m) * item, "solver",
                "solve")
        # the gadget products' twins hold a (rows, m·h̃) block (_ops.gadget_twin_rows); their CPU kernels none
        budget = _ops.GADGET_TWIN_BYTES.get(device_type, _ops.GADGET_TWIN_BYTES["cpu"])
        rows = 0 if cpu_kernels else min(num_facts, max(_ops.GADGET_TWIN_MIN_ROWS, budget // max(1, hidden * item)))
        est.add("gadget product block", rows * hidden * item, "m", "solve")
    est.add("gadget coefficients", 3 * m * gadget_width * (d_in + 1) * item, "m", "solve")
    # gate (h̃, d_in), up (m·h̃, d_in + 1) and down (d_out, m·h̃), each built once more during assembly
    est.add("MLP weights", 2 * (gadget_width * (d_in + 1) + hidden * (d_in + 1) + d_out * (hidden + 1)) * item, "m",
            "verify")
    if solver == "cholesky":
        est.add("dense Gram", dense_gram_bytes(num_facts, dtype), "solver")
    elif solver == "per_gadget":
        est.add("explicit gadget system", 2 * num_facts * (gadget_width * (d_in + 1) + 1) * 8, width_argument, "solve")
    if verify:
        rows = min(num_facts, VERIFY_CHUNK)
        activations = 0 if cpu_kernels else 3 * hidden
        est.add("verification", num_facts * (8 + m * item) + rows * (d_out + activations) * item + decode_chunk, "m",
                "verify")
    est.add("keys and values", (num_facts * d_in + num_values * d_out) * item, "K")
    est.add("allocator slack", _ALLOCATOR_SLACK * est.total, None)
    est.add("runtime", _RUNTIME_BYTES, None)
    return est


def check_fits(estimate: MemoryEstimate, device: torch.device, budget: Optional[int] = None,
               *, what: str = "construct") -> None:
    """Raise :class:`MemoryBudgetError` when ``estimate.total`` exceeds ``budget`` bytes
    (default: :func:`available_memory` of ``device``), naming the argument of the largest part."""
    limit = available_memory(device) if budget is None else budget
    if estimate.total <= limit:
        return
    name, nbytes, argument = estimate.largest()
    value = estimate.args.get(argument, "?")
    source = "max_memory" if budget is not None else f"available on {device}"
    raise MemoryBudgetError(
        f"{what} would need about {format_bytes(estimate.total)} but {format_bytes(limit)} is {source}: "
        f"the largest part is {name} ({format_bytes(nbytes)}, set by {argument}={value}); "
        f"{_FIXES.get(argument, 'reduce the problem size')}. Estimate: {estimate}"
    )


__all__ = ["MemoryBudgetError", "MemoryEstimate", "available_memory", "check_fits", "dense_gram_bytes",
           "estimate_build", "format_bytes", "VERIFY_CHUNK"]
