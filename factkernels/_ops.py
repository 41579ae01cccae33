"""The one door to the compiled kernels.

Every op here validates its tensors, then either calls ``factkernels._C`` (CPU
or CUDA, chosen by the tensors' device) with data pointers, leading dimensions,
shapes and the current CUDA stream, or runs its pure-torch twin. The twins are
the reference the tests compare against and what the benchmarks race.

``backend`` (every op, and ``construct``) is one of
  "auto"     compiled kernel when one exists for the device and dtype and, on CUDA, when it beat its
             twin on a GPU (``CUDA_AUTO_KERNELS``), else torch;
  "kernels"  compiled kernel, error if unavailable;
  "torch"    the pure-torch twin.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from pathlib import Path
from typing import NamedTuple, Optional

import torch

try:  # the compiled extension is absent when running from a source checkout
    from . import _C  # type: ignore[attr-defined]
except ImportError:  # exercised in a subprocess by the tests
    _C = None


def _missing_extension_message(package_dir: Path) -> str:
    """How to get the compiled kernels back, for the folder factkernels was imported from."""
    fix = ("run from another folder so the installed package is imported, or build this checkout in place "
           "with `pip install --no-build-isolation -e .`")
    if (package_dir.parent / "pyproject.toml").is_file():
        where = f"factkernels was imported from the source folder {package_dir}, which has no compiled _C"
    else:
        where = f"factkernels at {package_dir} has no compiled _C"
        fix = "reinstall it (`pip install factkernels`, or `pip install --no-build-isolation -e .` in a checkout)"
    return f"{where}; every op runs its (slower) torch twin. To use the kernels, {fix}."


if _C is None:  # a module body runs once per process: one warning
    warnings.warn(_missing_extension_message(Path(__file__).resolve().parent), UserWarning, stacklevel=2)

HAS_EXTENSION = _C is not None

BACKENDS = ("auto", "kernels", "torch")

# Analytic, non-polynomial activations; codes match csrc/kernels.h.
ACTIVATIONS = {"silu": 0, "gelu": 1, "tanh": 2, "sigmoid": 3, "softplus": 4}
# Activations a user might ask for that the gated gadget cannot use (Lemma 4.1.2).
REJECTED_ACTIVATIONS = {
    "relu": "ReLU is not analytic",
    "leaky_relu": "leaky ReLU is not analytic",
    "identity": "the identity is a polynomial",
    "linear": "a linear activation is a polynomial",
    "square": "x^2 is a polynomial",
    "quadratic": "x^2 is a polynomial",
}

_TORCH_ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softplus": torch.nn.functional.softplus,
}


def build_info() -> dict:
    """What was compiled: CUDA (and for which architectures, runtime and driver versions), OpenMP, compiler."""
    if _C is None:
        return {"compiled": False, "cuda": False, "cuda_devices": 0, "openmp": False}
    info = dict(_C.build_info())
    info["compiled"] = True
    return info


@functools.cache
def _build() -> dict:
    """build_info() read once: the ops consult it on every call."""
    return build_info()


def _cuda_unusable_reason(info: dict, torch_cuda: Optional[str], torch_sees_gpu: bool) -> Optional[str]:
    """Why compiled CUDA kernels cannot serve this process (None when they can).

    info: build_info(); torch_cuda: torch.version.cuda ("12.4") or None; torch_sees_gpu:
    torch.cuda.is_available(). The kernels link their CUDA runtime statically, so they need a
    driver at least as new as the nvcc they were built with, and torch's own CUDA must share
    that major version (a CUDA-13 build under a CUDA-12 torch may find a driver too old).
    """
    if not info.get("cuda"):
        return None if not torch_sees_gpu else "factkernels was built without CUDA kernels"
    if not torch_sees_gpu:
        return "torch sees no usable CUDA device"
    built = info.get("cuda_runtime_version", 0) // 1000
    if torch_cuda is not None and built and int(torch_cuda.split(".")[0]) != built:
        return (f"the CUDA kernels were built with CUDA {built} (nvcc) but torch uses CUDA {torch_cuda}; "
                f"rebuild with the matching toolkit, e.g. CUDACXX=/usr/local/cuda-{torch_cuda.split('.')[0]}/bin/nvcc "
                f"pip install --no-build-isolation -e .")
    if info.get("cuda_devices", 0) == 0:
        return (f"the CUDA runtime the kernels were built with ({info.get('cuda_runtime_version')}) finds no device; "
                f"the driver supports {info.get('cuda_driver_version')}")
    return None


@functools.cache
def _cuda_kernels_usable() -> bool:
    """Whether CUDA tensors go to the compiled kernels; warns once (at import) when a CUDA build cannot serve them."""
    reason = _cuda_unusable_reason(_build(), torch.version.cuda, torch.cuda.is_available())
    if reason is not None and _build().get("cuda") and torch.cuda.is_available():
        warnings.warn(f"factkernels: CUDA ops fall back to their torch twins: {reason}", RuntimeWarning, stacklevel=3)
    return reason is None


if _build().get("cuda"):
    _cuda_kernels_usable()  # decide (and warn) once, at import


def check_activation(activation: str) -> str:
    """Return ``activation`` if the gated gadget can use it, else raise ValueError."""
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a string, got {type(activation).__name__}")
    if activation in ACTIVATIONS:
        return activation
    if activation in REJECTED_ACTIVATIONS:
        raise ValueError(
            f"activation={activation!r} cannot be used for the gated gadget: "
            f"{REJECTED_ACTIVATIONS[activation]}; the construction needs an analytic, "
            f"non-polynomial activation, one of {sorted(ACTIVATIONS)}"
        )
    raise ValueError(f"unknown activation={activation!r}; choose one of {sorted(ACTIVATIONS)}")


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    """Elementwise activation by name (torch)."""
    return _TORCH_ACTIVATIONS[activation](x)


# ----------------------------------------------------------------------------- validation


def _matrix(name: str, t: torch.Tensor, rows: Optional[int] = None, cols: Optional[int] = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if rows is not None and t.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows, got shape {tuple(t.shape)}")
    if cols is not None and t.shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns, got shape {tuple(t.shape)}")


def _vector(name: str, t: Optional[torch.Tensor], length: int) -> None:
    """An optional 1-D tensor of exactly ``length`` entries (a bias: no broadcasting, the kernels read all of it)."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {tuple(t.shape)}")


def _same(ref_name: str, ref: torch.Tensor, **others: Optional[torch.Tensor]) -> None:
    for name, t in others.items():
        if t is None:
            continue
        if t.dtype != ref.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; use one dtype")
        if t.device != ref.device:
            raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}; use one device")


def _indices(name: str, t: torch.Tensor, ref: torch.Tensor, size: int, what: str) -> torch.Tensor:
    """``t`` as int64 after checking it holds one integer index in [0, size) per row of ``ref`` (2-D), on ref's
    device; ``what`` names what the indices point into (in the range error). The kernels read whatever the
    indices point at, so the range is checked (one pass over the n indices)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer indices, got dtype {t.dtype}")
    if t.shape != (ref.shape[0],):
        raise ValueError(f"{name} must have shape ({ref.shape[0]},), got {tuple(t.shape)}")
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but the scores' operand is on {ref.device}")
    t = t.to(torch.int64)
    if t.numel():
        low, high = torch.stack(torch.aminmax(t)).tolist()  # one read back from a GPU, not two
        if low < 0 or high >= size:
            raise ValueError(f"{name} entries must lie in [0, {size}) ({what}), got range [{low}, {high}]")
    return t


# Kernels that earn their place. On an H200 and an H100 (benchmarks/results/gpu_suite-*.json) torch's
# cuBLAS-backed twins ran the GEMM-shaped ops faster than the shared-memory float32 CUDA kernels (kernel speed
# over twin's, H200 / H100): gadget products 0.26-0.64x / 0.28-0.86x, gated_forward 0.42-0.60x / 0.45-0.62x,
# decode 0.34-0.87x / 0.35-0.97x. A kernel as fast as cuBLAS needs tensor cores in a 3xTF32 split (float32
# accuracy), which no lent GPU run could yet show winning, so those four CUDA kernels are removed: on a GPU
# they run their twins (decode's twin streams in chunks, so it never holds n x |V| scores either). The twins'
# products in a 3xTF32 split on the tensor cores (session 24) lost too: the 2^18 x 1,024 build's CG solve took
# 96.7 s (102 iterations) against 66.5 s (94) in float32 on an H200 (gpu_suite-NVIDIA_H200-s24-run3.json), and a
# fused gated_forward on the tensor cores (hand WMMA, 3xTF32; session 31, H200) ran 0.63-0.79x its twin at the
# construction's d = 128 (gpu_suite-NVIDIA_H200-s31-run2.json), so it is removed as well. Their CPU
# kernels stay (1.5-4.3x their twins). gate_features' CUDA kernel won on the H100 (1.13-1.14x) but lost at the
# construction's shape on the H200 in two sessions (0.73x at n = 4,096, k = 128, h = 48; 1.02-1.06x at n = 1,024;
# gpu_suite-NVIDIA_H200-s24-run1.json, -s28-run1.json), a 0.05 ms op either way: it is removed too. CUDA "auto"
# runs the three that won (hadamard_gram 1.10-1.13x / 1.16-1.29x,
# softmax_cross_entropy 1.83x / 2.08x, star_topk on the H100: 3.70-3.93x against a twin that sorted whole rows of
# scores; the twin now selects with torch.topk, and gpu_suite's kernels section races the two at U*'s pass widths)
# and max_head_scores (0.50-0.87x / 0.55-0.99x, but h times less memory than the twin's per-head scores).
# backend="kernels" runs every compiled kernel on its devices.
# corral_minor (U*'s per-row minimum-norm-point steps) has no CUDA kernel: on a GPU the batched torch steps run
# with fixed shapes and no host round trip. corral_solve (whole solves, U*'s active-set rounds) has one, a warp
# per row and one launch per round: on an H200 (session 24, gpu_suite-NVIDIA_H200-s24-run1.json) it gave the same
# rho as the batched torch solver with 2.4x fewer launches at 4,096 x 128, and at 65,536 x 256 its rounds took
# ~1.5 s against ~3.1 s for the batched solver, so "auto" runs it.
KERNEL_OPS = ("gate_features", "hadamard_gram", "gadget_matvec", "gadget_rmatvec", "gated_forward", "decode",
              "softmax_cross_entropy", "max_head_scores", "star_topk", "exact_star_scores", "corral_minor",
              "corral_solve")
# exact_star_scores (a gather of scattered rows per pair, the float64 re-check of streamed candidates) has no CUDA
# kernel either: its twin is a few batched torch ops there.
CPU_ONLY_KERNELS = frozenset({"gate_features", "gadget_matvec", "gadget_rmatvec", "gated_forward", "decode",
                              "exact_star_scores", "corral_minor"})
CUDA_AUTO_KERNELS = frozenset({"hadamard_gram", "softmax_cross_entropy", "max_head_scores", "star_topk",
                               "corral_solve"})
# star_topk's CUDA kernel (CUDA-core tiles, a running list per output) won at k = 8 (1.28-1.91x its twin) and lost
# at U*'s pass widths k = 96-384 (0.04-0.16x against the twin's cuBLAS products and torch.topk; H200, session 24,
# gpu_suite-NVIDIA_H200-s24-run1.json): "auto" runs it on a GPU up to this k only, and for fewer values than
# STAR_TOPK_CUDA_KERNEL_MAX_N: at k = 8 it won 1.98x at 4,096 x 64 but tied at 16,384 x 128 (run 2), and the
# twin's GEMMs gain with size while the kernel stays at 7-8x the GEMM-rate limit (the value-margin pass of the
# 2^18 x 1,024 build took 14.5 s, 5.2x its limit, on the kernel).
STAR_TOPK_CUDA_KERNEL_MAX_K = 8
STAR_TOPK_CUDA_KERNEL_MAX_N = 16384


def star_topk_auto_runs_kernel(k: int, n: int, device_type: str) -> bool:
    """Whether backend="auto" picks star_topk's compiled kernel for k of n values on ``device_type``, given one."""
    return auto_runs_kernel("star_topk", device_type) and (
        device_type != "cuda" or (k <= STAR_TOPK_CUDA_KERNEL_MAX_K and n < STAR_TOPK_CUDA_KERNEL_MAX_N))


def auto_runs_kernel(op: str, device_type: str) -> bool:
    """Whether backend="auto" picks ``op``'s compiled kernel on ``device_type`` ("cpu" or "cuda"), given one."""
    if op not in KERNEL_OPS:
        raise ValueError(f"op must be one of {KERNEL_OPS}, got {op!r}")
    return device_type != "cuda" or op in CUDA_AUTO_KERNELS


def _use_kernel(backend: str, op: str, *tensors: Optional[torch.Tensor]) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    ref = tensors[0]
    if backend == "kernels" and ref.device.type == "cuda" and op in CPU_ONLY_KERNELS:
        raise RuntimeError(f"backend='kernels': {op} has no CUDA kernel (its cuBLAS-backed torch twin was faster on "
                           "an H100 and an H200, so the CUDA kernel was removed); use backend='auto' or 'torch'")
    ok = (
        _C is not None
        and ref.dtype in (torch.float32, torch.float64)
        and (ref.device.type == "cpu" or (ref.device.type == "cuda" and op not in CPU_ONLY_KERNELS
                                          and _cuda_kernels_usable()))
        and not any(t is not None and t.requires_grad and torch.is_grad_enabled() for t in tensors)
    )
    if backend == "kernels" and not ok:
        raise RuntimeError(
            f"backend='kernels' but no compiled kernel serves dtype={ref.dtype} on {ref.device} "
            f"(build_info: {_build()}); use backend='auto' or 'torch'"
        )
    return ok and (backend == "kernels" or auto_runs_kernel(op, ref.device.type))


def uses_kernel(backend: str, op: str, *tensors: Optional[torch.Tensor]) -> bool:
    """Whether ``op`` runs its compiled kernel on these tensors under ``backend``, for callers whose twin is a
    whole algorithm above this module (``corral_solve``'s is U*'s batched torch solver). Raises as the op would
    for ``backend="kernels"`` without a kernel, and for an extension built before ``op`` existed."""
    if backend == "kernels" and _C is not None and not hasattr(_C, op):
        raise RuntimeError(f"backend='kernels': this build of factkernels._C has no {op}; rebuild it")
    return _use_kernel(backend, op, *tensors) and hasattr(_C, op)


def _rowmajor(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Unit stride in the last dimension (leading dimension passed separately)."""
    if t is None:
        return None
    if t.dim() == 2 and t.stride(1) == 1 and t.stride(0) >= max(1, t.shape[1]):
        return t
    return t.contiguous()


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _ld(t: torch.Tensor) -> int:
    return t.stride(0) if t.dim() == 2 else t.shape[-1]


def _launch_args(ref: torch.Tensor) -> tuple[str, str]:
    """Device ("cpu" or "cuda:N": the kernel makes N current for the launch) and dtype names."""
    device = "cpu" if ref.device.type == "cpu" else f"cuda:{ref.device.index}"
    return device, str(ref.dtype).replace("torch.", "")


def _stream(ref: torch.Tensor) -> int:
    if ref.device.type == "cuda":
        return torch.cuda.current_stream(ref.device).cuda_stream
    return 0


# ----------------------------------------------------------------------------- ops


def gate_features(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: str, *, backend: str = "auto"
) -> torch.Tensor:
    """Gate features ``act(x @ weight.T + bias)``.

    x: (n, k), weight: (h, k), bias: (h,) or None  ->  (n, h)
    """
    _matrix("x", x)
    _matrix("weight", weight, cols=x.shape[1])
    _vector("bias", bias, weight.shape[0])
    _same("x", x, weight=weight, bias=bias)
    check_activation(activation)
    if not _use_kernel(backend, "gate_features", x, weight, bias):
        pre = x @ weight.T
        return activate(pre + bias if bias is not None else pre, activation)
    return _registered(_gate_features_op, _gate_features_kernel)(x, weight, bias, activation)


def hadamard_gram(s: torch.Tensor, p: torch.Tensor, *, lower: bool = False, backend: str = "auto") -> torch.Tensor:
    """Hadamard Gram ``(s sᵀ) ∘ (p pᵀ)``, which equals ``M Mᵀ`` for the face-splitting M.

    s: (n, h) gate features, p: (n, q) augmented keys  ->  (n, n) symmetric
    lower: only the lower triangle (diagonal included) is defined, all a lower Cholesky reads; the
        kernels leave the strict upper triangle unwritten (mirroring it cost a third of the CPU
        kernel's time at n = 4,096), the twin fills it.
    """
    _matrix("s", s)
    _matrix("p", p, rows=s.shape[0])
    _same("s", s, p=p)
    if not isinstance(lower, bool):
        raise TypeError(f"lower must be a bool, got {type(lower).__name__}")
    if not _use_kernel(backend, "hadamard_gram", s, p):
        return (s @ s.T) * (p @ p.T)
    return _registered(_hadamard_gram_op, _hadamard_gram_kernel)(s, p, lower)


# Bytes of the (rows, m·h̃) temporary that the gadget_matvec / gadget_rmatvec twins hold per block of rows (one
# place; memory.estimate_build counts it). Unblocked, the 2^18 x 1,024 cg build's temporary alone was 29.6 GiB (H200,
# 36.4 GiB peak) and at 2^20 it would be ~474 GiB. A block's GEMM does 2·q flops per temporary element (q = d+1), so
# a 1 GiB block at d = 1,024 is ~0.55 TFLOP (~10 ms at the H100's 51 TFLOP/s) whatever m·h̃ is: thousands of rows,
# far above cuBLAS's 128-256-row tiles and the per-launch cost, so the blocked products keep the cg solve's GEMM
# rate (1.1x its limit per iteration in session 24). GADGET_TWIN_MIN_ROWS keeps a block's GEMM tall when m·h̃ is
# huge. On a CPU the kernels run under "auto"; their twins' blocks stay small.
GADGET_TWIN_BYTES = {"cuda": 1 << 30, "cpu": 1 << 26}
GADGET_TWIN_MIN_ROWS = 256


def gadget_twin_rows(columns: int, like: torch.Tensor) -> int:
    """Rows per block of the gadget twins' (rows, ``columns``) temporary in ``like``'s dtype and device: within
    GADGET_TWIN_BYTES, at least GADGET_TWIN_MIN_ROWS (and at least 1)."""
    budget = GADGET_TWIN_BYTES.get(like.device.type, GADGET_TWIN_BYTES["cpu"])
    return max(1, GADGET_TWIN_MIN_ROWS, budget // max(1, columns * like.element_size()))


def gadget_matvec(s: torch.Tensor, p: torch.Tensor, coef: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """``M vec(coef_j)`` for m right-hand sides without forming M.

    s: (n, h), p: (n, q), coef: (m, h, q)  ->  (n, m) with out[i, j] = Σ_r s[i,r] <p[i], coef[j,r]>
    """
    _matrix("s", s)
    _matrix("p", p, rows=s.shape[0])
    if not isinstance(coef, torch.Tensor):
        raise TypeError(f"coef must be a torch.Tensor, got {type(coef).__name__}")
    if coef.dim() != 3 or coef.shape[1:] != (s.shape[1], p.shape[1]):
        raise ValueError(f"coef must have shape (m, {s.shape[1]}, {p.shape[1]}), got {tuple(coef.shape)}")
    _same("s", s, p=p, coef=coef)
    if not _use_kernel(backend, "gadget_matvec", s, p, coef):
        m, h, q = coef.shape
        right = coef.permute(2, 0, 1).reshape(q, m * h)
        out = s.new_empty(s.shape[0], m)
        rows = gadget_twin_rows(m * h, s)
        for i in range(0, s.shape[0], rows):  # (rows, q) @ (q, m*h), then reduce over r against s
            t = p[i : i + rows] @ right
            t = t.view(t.shape[0], m, h)
            out[i : i + rows] = torch.einsum("ijr,ir->ij", t, s[i : i + rows])
        return out
    return _registered(_gadget_matvec_op, _gadget_matvec_kernel)(s, p, coef)


def gadget_rmatvec(s: torch.Tensor, p: torch.Tensor, y: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """``Mᵀ y_j`` for m right-hand sides without forming M.

    s: (n, h), p: (n, q), y: (n, m)  ->  (m, h, q) with out[j, r, c] = Σ_i y[i,j] s[i,r] p[i,c]
    """
    _matrix("s", s)
    _matrix("p", p, rows=s.shape[0])
    _matrix("y", y, rows=s.shape[0])
    _same("s", s, p=p, y=y)
    if not _use_kernel(backend, "gadget_rmatvec", s, p, y):
        n, h = s.shape
        m = y.shape[1]
        out = s.new_zeros(m * h, p.shape[1])
        rows = gadget_twin_rows(m * h, s)
        for i in range(0, n, rows):
            block = s[i : i + rows]
            w = (y[i : i + rows].unsqueeze(2) * block.unsqueeze(1)).reshape(block.shape[0], m * h)  # (rows, m*h)
            out.addmm_(w.T, p[i : i + rows])
        return out.view(m, h, p.shape[1])
    return _registered(_gadget_rmatvec_op, _gadget_rmatvec_kernel)(s, p, y)


def gated_forward(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: Optional[torch.Tensor],
    up_weight: torch.Tensor,
    up_bias: Optional[torch.Tensor],
    down_weight: torch.Tensor,
    down_bias: Optional[torch.Tensor],
    activation: str,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Fused gated MLP ``down(act(gate x)[r mod hg] ⊙ up x)``.

    x: (n, d_in), gate_weight: (hg, d_in) where hg divides h (hidden unit r uses
    gate row r mod hg, so gadgets can share one gate), up_weight: (h, d_in),
    down_weight: (d_out, h), biases matching or None  ->  (n, d_out)
    """
    _matrix("x", x)
    _matrix("up_weight", up_weight, cols=x.shape[1])
    h = up_weight.shape[0]
    _matrix("gate_weight", gate_weight, cols=x.shape[1])
    hg = gate_weight.shape[0]
    if hg == 0 or h % hg:
        raise ValueError(f"gate_weight rows ({hg}) must divide up_weight rows ({h})")
    _matrix("down_weight", down_weight, cols=h)
    _vector("gate_bias", gate_bias, hg)
    _vector("up_bias", up_bias, h)
    _vector("down_bias", down_bias, down_weight.shape[0])
    _same("x", x, gate_weight=gate_weight, gate_bias=gate_bias, up_weight=up_weight, up_bias=up_bias,
          down_weight=down_weight, down_bias=down_bias)
    check_activation(activation)
    if not _use_kernel(backend, "gated_forward", x, gate_weight, gate_bias, up_weight, up_bias, down_weight,
                       down_bias):
        gate = torch.nn.functional.linear(x, gate_weight, gate_bias)
        gate = activate(gate, activation)
        if hg != h:
            gate = gate.repeat(1, h // hg)
        up = torch.nn.functional.linear(x, up_weight, up_bias)
        return torch.nn.functional.linear(gate * up, down_weight, down_bias)
    return _registered(_gated_forward_op, _gated_forward_kernel)(x, gate_weight, gate_bias, up_weight, up_bias,
                                                                 down_weight, down_bias, activation)


def decode(
    y: torch.Tensor, values: torch.Tensor, target: Optional[torch.Tensor] = None, *, backend: str = "auto",
    chunk: int = 4096, target_checked: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused dot-product decode: ``argmax_j <y_i, v_j>`` and the margin, never the n×|V| matrix.

    y: (n, d), values: (|V|, d), target: (n,) long or None  ->  (index (n,) long, margin (n,))
    margin[i] = <y_i, v_t> − max_{j≠t} <y_i, v_j> with t = target[i] (or t = argmax,
    i.e. top-1 minus top-2 score, when target is None); a fact is stored iff margin > 0.
    A NaN score ranks above every number, as in ``torch.argmax``: a row with any NaN score
    gets the index of its first NaN and margin NaN (kernels and twin alike).
    The torch twin streams over rows of y in chunks of ``chunk``. target_checked: the caller has
    checked that target (int64, on y's device) lies in [0, |V|), which skips the range check (a read
    back from the device).
    """
    _matrix("y", y)
    _matrix("values", values, cols=y.shape[1])
    _same("y", y, values=values)
    if values.shape[0] == 0:
        raise ValueError("values must have at least one row: there is nothing to decode to")
    if target is not None and not target_checked:
        target = _indices("target", target, y, values.shape[0], "the rows of values")
    n, nv = y.shape[0], values.shape[0]
    if not _use_kernel(backend, "decode", y, values):
        if n <= chunk:  # one chunk: its own outputs, no copies (on a GPU each is a launch)
            return _decode_twin_rows(y, values, target)
        index = torch.empty(n, dtype=torch.int64, device=y.device)
        margin = torch.empty(n, dtype=y.dtype, device=y.device)
        for lo in range(0, n, chunk):
            index[lo : lo + chunk], margin[lo : lo + chunk] = _decode_twin_rows(
                y[lo : lo + chunk], values, None if target is None else target[lo : lo + chunk])
        return index, margin
    return _registered(_decode_op, _decode_kernel)(y, values, target)


def _decode_twin_rows(y: torch.Tensor, values: torch.Tensor,
                      target: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`decode`'s twin on one chunk of rows y (c, d): (index (c,), margin (c,)) from the (c, |V|) scores."""
    scores = y @ values.T
    idx = scores.argmax(dim=1)
    t = idx if target is None else target
    own = scores.gather(1, t[:, None]).squeeze(1)
    scores.scatter_(1, t[:, None], -math.inf)
    return idx, own - scores.max(dim=1).values


# Scores more than this far below their row's max count as exactly this far below in the softmax
# cross-entropy: torch's CPU exp leaves its vectorized path for arguments below about −87 (6–10× slower
# per element), trained GD logits go far below that, and a weight e^−80 ≈ 2e−35 beside a row total ≥ 1
# changes neither the loss nor any gradient a float32 or float64 update can see.
XENT_EXP_FLOOR = 80.0


def softmax_cross_entropy(logits: torch.Tensor, target: torch.Tensor, *,
                          backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row-wise softmax cross-entropy with its hit test and softmax, one read of each row (the GD loss).

    logits: (n, c), target: (n,) integer in [0, c)  ->  (loss (n,), hit (n,) bool, prob (n, c))
    loss_i = log Σ_j e_ij + top_i − logits[i, t] with top_i = max_j logits[i, j], t = target[i] and
    e_ij = exp(max(logits[i, j] − top_i, −XENT_EXP_FLOOR)); hit_i = logits[i, t] ≥ top_i (a tie for the
    top counts as a hit); prob = e / Σ_j e_ij, the softmax, from which the gradient is prob − one-hot.
    A row holding a NaN gets loss NaN, hit False and prob NaN (kernels and twin alike). Not differentiable
    itself: the caller's autograd Function uses prob (see ``baselines.stacked_swiglu``).
    """
    _matrix("logits", logits)
    if logits.shape[1] == 0:
        raise ValueError("logits must have at least one column (class)")
    target = _indices("target", target, logits, logits.shape[1], "the columns of logits")
    if not _use_kernel(backend, "softmax_cross_entropy", logits):
        top = logits.amax(1, keepdim=True)
        weights = (logits - top).clamp_(min=-XENT_EXP_FLOOR).exp_()
        total = weights.sum(1, keepdim=True)
        own = logits.gather(1, target.unsqueeze(1))
        return (total.log() + top - own).squeeze(1), (own >= top).squeeze(1), weights.div_(total)
    return _registered(_softmax_xent_op, _softmax_xent_kernel)(logits, target)


def _value_splits(n: int, nv: int, device: torch.device) -> int:
    """How many ranges of the values the CUDA star_topk splits into (1 on CPU, which splits on its own).

    One block covers 32 rows and streams 64-value tiles; with few rows the values are split
    until there are about two blocks per multiprocessor, each range at least 8 tiles long.
    """
    if device.type != "cuda":
        return 1
    row_blocks = -(-n // 32)
    want = -(-2 * _multiprocessors(device.index) // max(row_blocks, 1))
    return max(1, min(want, nv // (8 * 64), 65535))


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# ----------------------------------------------------------------------------- registered kernels
# Each compiled kernel is also a torch custom op (torch.ops.factkernels.*) with a fake
# (shape-only) twin, so torch.compile traces FactMLP and other callers through the kernel
# instead of breaking the graph at raw pointers. Eager calls skip the op's dispatch
# (about 50 us a call, paid on every CG iteration) and call the kernel function directly.


def _registered(op, kernel):
    """The custom op while torch.compile traces, else the plain kernel function."""
    return op if torch.compiler.is_compiling() else kernel


def _gate_features_kernel(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                          activation: str) -> torch.Tensor:
    """The compiled gate_features on validated tensors."""
    x, weight = _rowmajor(x), _rowmajor(weight)
    bias = None if bias is None else bias.contiguous()
    n, k, h = x.shape[0], x.shape[1], weight.shape[0]
    out = torch.empty(n, h, dtype=x.dtype, device=x.device)
    _C.gate_features(*_launch_args(x), _ptr(x), _ld(x), _ptr(weight), _ld(weight), _ptr(bias),
                     _ptr(out), _ld(out), n, k, h, ACTIVATIONS[activation], _stream(x))
    return out


_gate_features_op = torch.library.custom_op("factkernels::gate_features",
                                            mutates_args=())(_gate_features_kernel)


@_gate_features_op.register_fake
def _(x, weight, bias, activation):
    return x.new_empty(x.shape[0], weight.shape[0])


def _hadamard_gram_kernel(s: torch.Tensor, p: torch.Tensor, lower: bool) -> torch.Tensor:
    """The compiled hadamard_gram on validated tensors."""
    s, p = _rowmajor(s), _rowmajor(p)
    n = s.shape[0]
    out = torch.empty(n, n, dtype=s.dtype, device=s.device)
    _C.hadamard_gram(*_launch_args(s), _ptr(s), _ld(s), _ptr(p), _ld(p), _ptr(out), _ld(out),
                     n, s.shape[1], p.shape[1], lower, _stream(s))
    return out


_hadamard_gram_op = torch.library.custom_op("factkernels::hadamard_gram",
                                            mutates_args=())(_hadamard_gram_kernel)


@_hadamard_gram_op.register_fake
def _(s, p, lower):
    return s.new_empty(s.shape[0], s.shape[0])


def _gadget_matvec_kernel(s: torch.Tensor, p: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """The compiled gadget_matvec on validated tensors."""
    s, p, coef = _rowmajor(s), _rowmajor(p), coef.contiguous()
    n, m = s.shape[0], coef.shape[0]
    out = torch.empty(n, m, dtype=s.dtype, device=s.device)
    _C.gadget_matvec(*_launch_args(s), _ptr(s), _ld(s), _ptr(p), _ld(p), _ptr(coef), _ptr(out), _ld(out),
                     n, s.shape[1], p.shape[1], m, _stream(s))
    return out


_gadget_matvec_op = torch.library.custom_op("factkernels::gadget_matvec",
                                            mutates_args=())(_gadget_matvec_kernel)


@_gadget_matvec_op.register_fake
def _(s, p, coef):
    return s.new_empty(s.shape[0], coef.shape[0])


def _gadget_rmatvec_kernel(s: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The compiled gadget_rmatvec on validated tensors."""
    s, p, y = _rowmajor(s), _rowmajor(p), _rowmajor(y)
    n, h, q, m = s.shape[0], s.shape[1], p.shape[1], y.shape[1]
    out = torch.empty(m, h, q, dtype=s.dtype, device=s.device)
    _C.gadget_rmatvec(*_launch_args(s), _ptr(s), _ld(s), _ptr(p), _ld(p), _ptr(y), _ld(y), _ptr(out),
                      n, h, q, m, _stream(s))
    return out


_gadget_rmatvec_op = torch.library.custom_op("factkernels::gadget_rmatvec",
                                             mutates_args=())(_gadget_rmatvec_kernel)


@_gadget_rmatvec_op.register_fake
def _(s, p, y):
    return s.new_empty(y.shape[1], s.shape[1], p.shape[1])


def _gated_forward_kernel(x: torch.Tensor, gate_weight: torch.Tensor, gate_bias: Optional[torch.Tensor],
                          up_weight: torch.Tensor, up_bias: Optional[torch.Tensor], down_weight: torch.Tensor,
                          down_bias: Optional[torch.Tensor], activation: str) -> torch.Tensor:
    """The compiled gated_forward on validated tensors."""
    x, h, hg = _rowmajor(x), up_weight.shape[0], gate_weight.shape[0]
    gate_weight, up_weight, down_weight = (w.contiguous() for w in (gate_weight, up_weight, down_weight))
    gate_bias, up_bias, down_bias = (None if b is None else b.contiguous() for b in (gate_bias, up_bias, down_bias))
    n, d_out = x.shape[0], down_weight.shape[0]
    out = torch.empty(n, d_out, dtype=x.dtype, device=x.device)
    _C.gated_forward(*_launch_args(x), _ptr(x), _ld(x), _ptr(gate_weight), _ptr(gate_bias), _ptr(up_weight),
                     _ptr(up_bias), _ptr(down_weight), _ptr(down_bias), _ptr(out), _ld(out), n, x.shape[1], h, hg,
                     d_out, ACTIVATIONS[activation], _stream(x))
    return out


_gated_forward_op = torch.library.custom_op("factkernels::gated_forward",
                                            mutates_args=())(_gated_forward_kernel)


@_gated_forward_op.register_fake
def _(x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, activation):
    return x.new_empty(x.shape[0], down_weight.shape[0])


def _decode_kernel(y: torch.Tensor, values: torch.Tensor,
                   target: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled decode on validated tensors."""
    y, values = _rowmajor(y), _rowmajor(values)
    n, nv = y.shape[0], values.shape[0]
    target = None if target is None else target.contiguous()
    index = torch.empty(n, dtype=torch.int64, device=y.device)
    margin = torch.empty(n, dtype=y.dtype, device=y.device)
    _C.decode(*_launch_args(y), _ptr(y), _ld(y), _ptr(values), _ld(values), _ptr(target), _ptr(index),
              _ptr(margin), n, nv, y.shape[1], _stream(y))
    return index, margin


_decode_op = torch.library.custom_op("factkernels::decode", mutates_args=())(_decode_kernel)


@_decode_op.register_fake
def _(y, values, target):
    return (y.new_empty(y.shape[0], dtype=torch.int64), y.new_empty(y.shape[0]))


def _softmax_xent_kernel(logits: torch.Tensor,
                         target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The compiled softmax_cross_entropy on validated tensors."""
    logits, target = _rowmajor(logits), target.contiguous()
    n, c = logits.shape
    loss = torch.empty(n, dtype=logits.dtype, device=logits.device)
    hit = torch.empty(n, dtype=torch.bool, device=logits.device)  # one byte: the kernel writes 0 / 1
    prob = torch.empty(n, c, dtype=logits.dtype, device=logits.device)
    _C.softmax_xent(*_launch_args(logits), _ptr(logits), _ld(logits), _ptr(target), _ptr(loss), _ptr(hit),
                    _ptr(prob), _ld(prob), n, c, XENT_EXP_FLOOR, _stream(logits))
    return loss, hit, prob


_softmax_xent_op = torch.library.custom_op("factkernels::softmax_xent", mutates_args=())(_softmax_xent_kernel)


@_softmax_xent_op.register_fake
def _(logits, target):
    n = logits.shape[0]
    return logits.new_empty(n), logits.new_empty(n, dtype=torch.bool), logits.new_empty(logits.shape)


# ----------------------------------------------------------------------------- attention scores


def check_head_projections(queries: torch.Tensor, keys: torch.Tensor) -> None:
    """Validate per-head queries Q (batch, h, ell_q, d_k) and keys K (batch, h, ell_k, d_k)."""
    for name, t in (("Q", queries), ("K", keys)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, h, ell, d_k), got {tuple(t.shape)}")
    if keys.dtype != queries.dtype or keys.device != queries.device:
        raise TypeError(f"Q ({queries.dtype}, {queries.device}) and K ({keys.dtype}, {keys.device}) "
                        "must share dtype and device")
    (b, h, _, d), (bk, hk, _, dk) = queries.shape, keys.shape
    if (b, h, d) != (bk, hk, dk):
        raise ValueError(f"Q (batch, h, ell_q, d_k) = {tuple(queries.shape)} and K (batch, h, ell_k, d_k) = "
                         f"{tuple(keys.shape)} must agree in batch, h and d_k")
    if h == 0 or d == 0:
        raise ValueError(f"need at least one head and d_k >= 1, got h={h}, d_k={d}")


def batch_thresholds(tau, batch: int, like: torch.Tensor) -> torch.Tensor:
    """tau (a finite number, a 0-d tensor or one threshold per batch row) as a (batch,) tensor like ``like``."""
    if isinstance(tau, torch.Tensor):
        if tau.dim() == 0 or (tau.dim() == 1 and tau.shape[0] == batch):
            if not bool(torch.isfinite(tau).all()):
                raise ValueError("tau must be finite")
            return tau.to(dtype=like.dtype, device=like.device).expand(batch)
        raise ValueError(f"tau must be a number, a 0-d tensor or have shape ({batch},), got {tuple(tau.shape)}")
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau):
        raise TypeError(f"tau must be a finite number or a tensor, got {tau!r}")
    return torch.full((batch,), float(tau), dtype=like.dtype, device=like.device)


def max_head_scores(queries: torch.Tensor, keys: torch.Tensor, tau=None, *, decision_only: bool = False,
                    backend: str = "auto"):
    """Max-over-heads scores S[b, p, q] = max_k Q[b, k, p] . K[b, k, q] (seed 002, Sec. 3), fused with S > tau.

    Args:
        queries: Q (batch, h, ell_q, d_k), one query per source p and head k.
        keys:    K (batch, h, ell_k, d_k), one key per target q and head k.
        tau:     None, a finite number, a 0-d tensor, or one threshold per batch row (batch,).
        decision_only: return only the decision (needs tau); the kernel then writes no scores.

    Returns:
        S (batch, ell_q, ell_k) when tau is None; (S, S > tau) otherwise, the decision a bool
        tensor of the same shape; only S > tau with ``decision_only``. The compiled kernel never
        forms the (batch, h, ell_q, ell_k) per-head scores; the torch twin (also the path with
        gradients) does. A NaN score wins the max, as in ``torch.amax``.
    """
    check_head_projections(queries, keys)
    if decision_only and tau is None:
        raise ValueError("decision_only=True needs a threshold tau")
    batch, h, lq, dk = queries.shape
    lk = keys.shape[2]
    thresholds = None if tau is None else batch_thresholds(tau, batch, queries)
    use_kernel = _use_kernel(backend, "max_head_scores", queries, keys)
    kernel = getattr(_C, "max_head_scores", None)  # absent from builds older than this op
    if use_kernel and kernel is None:
        if backend == "kernels":
            raise RuntimeError("backend='kernels' but this build of factkernels._C has no max_head_scores; "
                               "rebuild the extension or use backend='auto' or 'torch'")
        use_kernel = False
    if not use_kernel:
        scores = torch.matmul(queries, keys.transpose(-1, -2)).amax(dim=1)
        if thresholds is None:
            return scores
        decision = scores > thresholds.view(-1, 1, 1)
        return decision if decision_only else (scores, decision)
    queries, keys = queries.contiguous(), keys.contiguous()
    scores = None if decision_only else torch.empty(batch, lq, lk, dtype=queries.dtype, device=queries.device)
    decision = None if thresholds is None else torch.empty(batch, lq, lk, dtype=torch.bool, device=queries.device)
    thresholds = None if thresholds is None else thresholds.contiguous()
    kernel(*_launch_args(queries), _ptr(queries), _ptr(keys), _ptr(thresholds), _ptr(scores), _ptr(decision),
           batch, h, lq, lk, dk, _stream(queries))
    if decision is None:
        return scores
    return decision if decision_only else (scores, decision)


# ----------------------------------------------------------------------------- star scores

# Relative squared distance below which star scores use the explicit difference (csrc/kernels.h).
STAR_CLOSE_REL = {torch.float32: 1e-3, torch.float64: 1e-6}


# Working memory of one chunk of the star_topk twin: rows x |V| scores and their temporaries. Larger chunks mean
# fewer launches and larger GEMMs; on a GPU at most a quarter of the free memory. On an H200 (session 24,
# gpu_suite-NVIDIA_H200-s24-run1.json, 16,384 rows of 65,536 x 256, k = 384) 256 MiB, 1 GiB and 4 GiB a chunk took
# 92, 72 and 63 ms.
STAR_TWIN_BYTES = {"cuda": 1 << 32, "cpu": 1 << 26}


def _star_twin_chunk(n: int, r: int, values: torch.Tensor) -> int:
    """Rows per chunk of the twin: three float (chunk, n) temporaries and a bool mask within the budget."""
    budget = STAR_TWIN_BYTES.get(values.device.type, STAR_TWIN_BYTES["cpu"])
    if values.device.type == "cuda":
        budget = min(budget, torch.cuda.mem_get_info(values.device)[0] // 4)
    return max(1, min(max(r, 1), budget // max(1, n * (3 * values.element_size() + 1))))


class StarOperand(NamedTuple):
    """What the star_topk twin's GEMMs need of values W (n, d), built once by :func:`star_operand` for several
    passes over the same values (U*'s), each build ~11 launches on a GPU.

    ``columns`` (K, n): [-w_j, 1, ||w_j||^2, 0...] with K = d + 2 rounded up to 4, the right operand: against left
    rows [p, <p, w_s>, 0] one GEMM gives the numerators <p, w_s - w_j>, against [2 w_s, ||w_s||^2, 1] the squared
    distances ||w_s||^2 + ||w_j||^2 - 2 <w_s, w_j>, with no (rows, |V|) pass to add the norms (given outputs; for
    p = w_s the distances come from the numerators); its row d + 1 holds the squared norms. Stored (K, n) so that
    the products are plain row-major GEMMs, the layout of the square GEMM whose rate the benchmarks quote (a
    transposed view ran cuBLAS's 64 x 64 FFMA tiles at ~37 of the H200's 51 TFLOP/s in session 24's run 1).
    ``distance_rows`` (n, K): [2 w_j, ||w_j||^2, 1, 0...], the left rows of the distances (one gather a pass)."""

    columns: torch.Tensor
    distance_rows: torch.Tensor


def star_operand(values: torch.Tensor) -> StarOperand:
    """The :class:`StarOperand` of ``values`` (n, d), for :func:`star_topk`'s ``operand``."""
    _matrix("values", values)
    n, d = values.shape
    sq = (values * values).sum(dim=1)
    K = -(-(d + 2) // 4) * 4
    columns = torch.zeros(K, n, dtype=values.dtype, device=values.device)
    torch.neg(values.T, out=columns[:d])
    columns[d] = 1.0
    columns[d + 1] = sq
    distance_rows = torch.zeros(n, K, dtype=values.dtype, device=values.device)
    torch.mul(values, 2.0, out=distance_rows[:, :d])
    distance_rows[:, d] = sq
    distance_rows[:, d + 1] = 1.0
    return StarOperand(columns, distance_rows)


def _star_scores_rows(values: torch.Tensor, operand: StarOperand, s: torch.Tensor, p: Optional[torch.Tensor],
                      close: float, bound: Optional[int]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Star scores of outputs ``p`` (c, d) (None: p = w_s) at values ``s`` (c,) against every value: (c, n),
    +inf at j = s, numerators and distances from one GEMM against ``operand.columns`` (:class:`StarOperand`).
    Pairs closer than ``close`` take the explicit difference. With ``bound``, they are found without a host sync
    (``torch.nonzero_static``, bound + 1 slots); the second result (a device bool) says whether there were more
    than the bound (the scores may then be wrong where the rest are)."""
    c, d = s.numel(), values.shape[1]
    right = operand.columns
    sq = right[d + 1]
    # the scores over the squared distances, both (2c, n)
    if p is None:  # left rows [w_s, ||w_s||^2, 0...]: the distance rows halved (exactly), their 1 cleared
        left = operand.distance_rows[s]
        left[:, :d].mul_(0.5)
        left[:, d + 1] = 0.0
        ws, sqs = left[:, :d], left[:, d]
        both = torch.empty(2 * c, values.shape[0], dtype=values.dtype, device=values.device)
        g, d2 = both[:c], both[c:]
        torch.mm(left, right, out=g)
        # the distance is twice the numerator ||w_s||^2 - <w_s, w_j> plus ||w_j||^2 - ||w_s||^2
        torch.add(sq[None, :], g, alpha=2.0, out=d2).sub_(sqs[:, None])
    else:  # left rows [p, <p, w_s>, 0...] over the distance rows
        ws = values[s]
        left = torch.empty(2 * c, right.shape[0], dtype=values.dtype, device=values.device)
        left[:c, :d] = p
        left[:c, d] = (p * ws).sum(dim=1)
        left[:c, d + 1 :] = 0.0
        torch.index_select(operand.distance_rows, 0, s, out=left[c:])
        sqs = left[c:, d]
        both = left @ right
        g, d2 = both[:c], both[c:]
    # the pairs' own threshold (a (rows, |V|) sum of norms: a per-row one found a superset, whose members were then
    # checked one by one, ~8 more launches a call on a GPU)
    close_pairs = d2 <= torch.add(sqs[:, None], sq[None, :]).mul_(close)
    if bound is None:
        ci, cj = close_pairs.nonzero(as_tuple=True)
        overflow = None
    else:  # one slot more than the bound: filled means there were more (counting the mask would convert all of it)
        found = torch.nonzero_static(close_pairs, size=bound + 1, fill_value=-1)
        overflow = found[-1, 0] >= 0
        ci, cj = found.unbind(1)
    del close_pairs
    g.div_(d2.sqrt_())  # NaN where d2 < 0: always a close pair, whose score is replaced below
    # unused slots (-1, -1) read the last row and value (negative indices wrap) and write into both's last
    # entry, a distance already used
    wsc = ws[ci]
    diff = wsc - values[cj]
    nrm = diff.norm(dim=1)  # 0 (and the score 0 / 0): a duplicate, score 0, or the row's own value
    both[ci, cj] = (((wsc if p is None else p[ci]) * diff).sum(dim=1) / nrm).nan_to_num_(0.0, math.inf, -math.inf)
    g.scatter_(1, s[:, None], math.inf)
    return g, overflow


# Scores beyond the k-th that the twin keeps to tell whether the k smallest are one set.
STAR_TIE_SLACK = 8
# Up to this many pair-dimension elements the twin's redo of tied rows checks all their pairs' explicit
# differences (a fixed-size search, no host sync).
STAR_REDO_ELEMENTS = 1 << 23


def _star_topk_twin(values: torch.Tensor, operand: StarOperand, k: int, outputs: Optional[torch.Tensor],
                    rows: torch.Tensor, chunk: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """star_topk in torch: per chunk of rows the scores by GEMMs, then ``torch.topk(k + STAR_TIE_SLACK)`` instead of
    sorting whole rows. The largest kept tells whether the k smallest are one set: where it equals the k-th (a tie
    across the boundary, where the lowest indices must win) or a chunk had more close pairs than its bound, those rows are
    redone at the end with the whole stable sort. Within the k the pairs are ordered by (score, index). One host
    sync per call (which rows to redo), however many chunks."""
    r, n = rows.shape[0], values.shape[0]
    close = STAR_CLOSE_REL.get(values.dtype, 1e-6)
    kk = min(k, n)
    step = chunk or _star_twin_chunk(n, r, values)
    whole_rows = kk + 1 > n  # k >= n: nothing to select, sort the rows
    parts = []  # per chunk of rows: the k smallest scores, their indices and (selected) which rows to redo
    for lo in range(0, r, step):
        s = rows[lo : lo + step]
        p = None if outputs is None else outputs[lo : lo + step]
        g, overflow = _star_scores_rows(values, operand, s, p, close, None if whole_rows else 2 * s.numel() + 64)
        if whole_rows:
            top, at = torch.sort(g, dim=1, stable=True)
            top, at, redo = top[:, :kk], at[:, :kk], None
        else:
            # STAR_TIE_SLACK more than k: the k smallest are one set unless the largest kept one ties the k-th (at
            # 4,096 x 128 in float32, 1-2 rows a U* pass tied the k+1-th, each a redo: ~70 launches on a GPU)
            top, at = torch.topk(g, min(n, kk + STAR_TIE_SLACK), dim=1, largest=False, sorted=False)
            at, by_index = at.sort(dim=1)  # then a stable sort by score: ties lowest index first
            top, by_score = top.gather(1, by_index).sort(dim=1, stable=True)
            at = at.gather(1, by_score)
            after, top, at = top[:, -1], top[:, :kk], at[:, :kk]
            # the largest kept equals the k-th (it is never less); ties at +inf need no redo (inf - inf is NaN):
            # their indices are all reported as -1
            redo = (after - top[:, -1] == 0) | overflow
        parts.append((top, at.masked_fill(top == math.inf, -1), redo))
    if not parts:  # no rows
        return (torch.full((0, k), math.inf, dtype=values.dtype, device=values.device),
                torch.full((0, k), -1, dtype=torch.int64, device=values.device))
    # one chunk (on a GPU up to STAR_TWIN_BYTES of scores): its own outputs, no copies
    scores, index = (parts[0][i] if len(parts) == 1 else torch.cat([part[i] for part in parts]) for i in (0, 1))
    if kk < k:
        scores = torch.nn.functional.pad(scores, (0, k - kk), value=math.inf)
        index = torch.nn.functional.pad(index, (0, k - kk), value=-1)
    if whole_rows:
        return scores, index
    redo = parts[0][2] if len(parts) == 1 else torch.cat([part[2] for part in parts])
    again = redo.nonzero().squeeze(1)
    # few rows to redo (ties): every pair of theirs fits the capped candidate search, which then cannot overflow
    # and needs no second host sync
    bound = again.numel() * n if again.numel() * n * values.shape[1] <= STAR_REDO_ELEMENTS else None
    for lo in range(0, again.numel(), step):
        i = again[lo : lo + step]
        g, _ = _star_scores_rows(values, operand, rows[i], None if outputs is None else outputs[i], close, bound)
        top, at = torch.sort(g, dim=1, stable=True)
        scores[i, :kk] = top[:, :kk]
        index[i, :kk] = at[:, :kk].masked_fill(top[:, :kk] == math.inf, -1)
    return scores, index


def star_topk_runs_kernel(backend: str, k: int, values: torch.Tensor, outputs: Optional[torch.Tensor] = None) -> bool:
    """Whether :func:`star_topk` runs its compiled kernel (else its twin) for ``k`` on these tensors."""
    return _use_kernel(backend, "star_topk", values, outputs) and (
        backend != "auto" or star_topk_auto_runs_kernel(k, values.shape[0], values.device.type))


def star_topk(
    values: torch.Tensor, k: int, outputs: Optional[torch.Tensor] = None, rows: Optional[torch.Tensor] = None,
    *, backend: str = "auto", chunk: Optional[int] = None, check_rows: bool = True,
    operand: Optional[StarOperand] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` smallest star scores of every output over all values, never the r×|V| matrix.

    values W: (n, d); rows: (r,) int64 in [0, n), the value s_i each output belongs to (default
    all n, in order); outputs P: (r, d), or None for p_i = w_{s_i}  ->  (scores (r, k), index (r, k))
    with score(i, j) = <p_i, w_s − w_j> / ‖w_s − w_j‖ over j ≠ s = rows[i], ascending (lowest j
    first on ties); identical values score 0; +inf and −1 past the n − 1 others. Distances come from
    ‖w_s‖² + ‖w_j‖² − 2<w_s, w_j> except for pairs closer than ``STAR_CLOSE_REL`` (explicit
    differences). These are the constraints of the margin-optimal outputs (seed 000, Def. 3.2.1)
    and the per-value margins of given outputs. The torch twin streams over rows in chunks of ``chunk`` (default:
    as many as ``STAR_TWIN_BYTES`` of scores hold), see :func:`_star_topk_twin`. ``check_rows=False`` skips the
    range check of ``rows`` (a read back from the device) for callers that built them in range. ``operand``:
    :func:`star_operand` of these ``values``, for callers that pass over the same values again (else built here).
    """
    _matrix("values", values)
    n, d = values.shape
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if rows is None:  # every value, in order: nothing to check (or read back from the device)
        rows = torch.arange(n, device=values.device)
    else:
        if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.dtype != torch.int64:
            raise TypeError("rows must be a 1-D int64 tensor of value indices")
        if rows.device != values.device:
            raise ValueError(f"rows is on {rows.device} but values is on {values.device}")
        if check_rows and rows.numel():
            low, high = torch.stack(torch.aminmax(rows)).tolist()  # one read back from the device
            if low < 0 or high >= n:
                raise ValueError(f"rows must lie in [0, {n}) (indices of values)")
    if outputs is not None:
        _matrix("outputs", outputs, rows=rows.shape[0], cols=d)
        _same("values", values, outputs=outputs)
    if operand is not None:
        K = -(-(d + 2) // 4) * 4
        if (not isinstance(operand, StarOperand) or operand.columns.shape != (K, n)
                or operand.distance_rows.shape != (n, K)):
            raise ValueError(f"operand must be star_operand(values): a StarOperand of ({K}, {n}) and ({n}, {K})")
        _same("values", values, operand_columns=operand.columns, operand_distance_rows=operand.distance_rows)
    r = rows.shape[0]
    if not star_topk_runs_kernel(backend, k, values, outputs):
        return _star_topk_twin(values, star_operand(values) if operand is None else operand, k, outputs, rows, chunk)
    sq = (values * values).sum(dim=1) if operand is None else operand.columns[d + 1]
    values, outputs, rows = _rowmajor(values), _rowmajor(outputs), rows.contiguous()
    scores = torch.empty(r, k, dtype=values.dtype, device=values.device)
    index = torch.empty(r, k, dtype=torch.int64, device=values.device)
    splits = _value_splits(r, n, values.device)  # few rows on a GPU: ranges of values, each with its lists
    part_vals = torch.empty(splits * r * k, dtype=values.dtype, device=values.device) if splits > 1 else None
    part_idx = torch.empty(splits * r * k, dtype=torch.int64, device=values.device) if splits > 1 else None
    _C.star_topk(*_launch_args(values), _ptr(outputs), 0 if outputs is None else _ld(outputs), _ptr(values),
                 _ld(values), _ptr(sq), _ptr(rows), _ptr(scores), _ptr(index), r, n, d, k, splits, _ptr(part_vals),
                 _ptr(part_idx), _stream(values))
    return scores, index


# Elements of one chunk's values that the exact_star_scores twin gathers per chunk of rows, by device type.
# On a GPU one chunk per U* pass up to |V| = 4,096, d = 128 (~2 GB of float64 temporaries; at 1 << 25 five
# chunks, ~100 launches a pass).
EXACT_TWIN_ELEMENTS = {"cuda": 1 << 28, "cpu": 1 << 20}


def exact_star_scores(W: torch.Tensor, U: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, *,
                      backend: str = "auto") -> torch.Tensor:
    """Star scores of given pairs from explicit differences: ``<U_k, w_s - w_j> / ||w_s - w_j||`` for
    ``s = rows[k]``, ``j = cols[k, c]`` (the re-check, in the values' precision, of candidates a streaming pass
    found in a lower one).

    W: (n, d) values, U: (r, d) outputs (same dtype), rows: (r,) int64 in [0, n), cols: (r, c) int64 in
    [-1, n)  ->  (r, c); identical values score 0, padding (``j = -1``) +inf.  The twin works in row chunks.
    """
    _matrix("W", W)
    n, d = W.shape
    _matrix("U", U, cols=d)
    _same("W", W, U=U)
    r = U.shape[0]
    # the index ranges are checked where they are read (the kernel, torch's indexing): a check here would read
    # back from the device
    if not isinstance(rows, torch.Tensor) or rows.shape != (r,) or rows.dtype != torch.int64:
        raise ValueError(f"rows must be an int64 ({r},) tensor, got {getattr(rows, 'shape', None)}")
    if not isinstance(cols, torch.Tensor) or cols.dim() != 2 or cols.shape[0] != r or cols.dtype != torch.int64:
        raise ValueError(f"cols must be an int64 ({r}, c) tensor, got {getattr(cols, 'shape', None)}")
    if not _use_kernel(backend, "exact_star_scores", W, U) or not hasattr(_C, "star_scores"):
        if backend == "kernels" and not hasattr(_C, "star_scores"):
            raise RuntimeError("backend='kernels': this build of factkernels._C has no star_scores; rebuild it")
        out = torch.empty(cols.shape, dtype=W.dtype, device=W.device)
        # ~4 gathered copies of the chunk's pairs; on a GPU big chunks (at 4,096 x 128 the CPU's 2^20-element budget
        # made 195 chunks a pass, ~2,700 of a U* call's 4,100 launches on an H200)
        budget = EXACT_TWIN_ELEMENTS.get(W.device.type, EXACT_TWIN_ELEMENTS["cpu"])
        step = max(1, max(budget, W.numel()) // (4 * max(1, cols.shape[1] * d)))
        for s in range(0, r, step):
            rs, c = rows[s : s + step], cols[s : s + step]
            diff = W[rs][:, None, :] - W[c]  # padding (-1) reads the last value (indices wrap): masked below
            nrm = diff.norm(dim=2)
            # 0 / 0 where nrm = 0 (identical values): score 0
            g = torch.bmm(U[s : s + step, None, :], diff.transpose(1, 2)).squeeze(1) / nrm
            g = g.nan_to_num_(0.0, math.inf, -math.inf).masked_fill_(c < 0, math.inf)
            if step >= r:  # one chunk (on a GPU up to EXACT_TWIN_ELEMENTS): no copy into out
                return g
            out[s : s + step] = g
        return out
    W, U, cols = _rowmajor(W), _rowmajor(U), cols.contiguous()
    out = torch.empty(cols.shape, dtype=W.dtype)
    _C.star_scores(*_launch_args(W), _ptr(U), _ld(U), _ptr(W), _ld(W), _ptr(rows.contiguous()), _ptr(cols),
                   _ptr(out), r, cols.shape[1], d, n)
    return out


# ----------------------------------------------------------------------------- corral steps (U*)

# Corral weights at or below this count as zero (the point leaves the corral).
CORRAL_EPS_W = 1e-13
# Ridge of the corral systems (relative to entries of size O(1)).
CORRAL_RIDGE = 1e-11
# The CUDA corral_solve runs up to this many warps (rows at once) per multiprocessor (as many as fit: 128 registers
# a thread, blocks of 4 warps), their scratch (about 8 (K d + 2 d^2) bytes each: 0.5 MB at d = 128, 2 MB at
# d = 256) within this many bytes.
CORRAL_SOLVE_WARPS_PER_SM = 16
CORRAL_SOLVE_WORK_BYTES = 1 << 32
# What corral_solve's ``steps`` count per row, in this order (CorralSolveStep in csrc/kernels.h): major cycles,
# points added (the warm corral's included), minor-cycle steps (two Cholesky solves each) and the corral sizes summed
# over them, drops and their rotations, the largest corral, the warm corral's size.
CORRAL_SOLVE_STEPS = ("major_cycles", "added", "minor_steps", "solve_rows", "drops", "rotations", "largest_corral",
                      "warm_corral")


def affine_min_norm(Q: torch.Tensor, m: torch.Tensor, refine: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Affine minimum-norm weights of each corral (batched torch; the twin's solve).

    Q: (r, k, k) Gram matrices of the star vectors, m: (r, k) bool corral mask.  Returns ``y`` (r, k) with
    ``sum(y) = 1`` minimising ``y^T Q y`` over the affine hull (0 off the corral) and ``ok`` (r,), False where
    the system could not be solved.  Solves ``(Q + 1 1^T) z = 1``, ``y = z / sum(z)``: ``Q + 1 1^T`` is
    positive definite on the corral iff the corral is affinely independent; a tiny ridge makes numerically
    dependent corrals give the small-norm minimiser instead of garbage.  One factorisation, no host round
    trip: a row whose factorisation fails keeps its weights (``ok`` False).
    """
    mf = m.to(Q.dtype)
    M = (Q + 1.0).mul_(mf[:, :, None]).mul_(mf[:, None, :])
    M.diagonal(dim1=1, dim2=2).add_(1.0 - mf + CORRAL_RIDGE * mf)
    L, info = torch.linalg.cholesky_ex(M)
    ok = info == 0  # where it is not, z is garbage and the row keeps its weights

    def solve(b: torch.Tensor) -> torch.Tensor:  # on a GPU two triangular solves (cuBLAS trsm, no host round trip)
        if L.device.type == "cpu":
            return torch.cholesky_solve(b[:, :, None], L).squeeze(2).mul_(mf)
        t = torch.linalg.solve_triangular(L, b[:, :, None], upper=False)
        return torch.linalg.solve_triangular(L.transpose(1, 2), t, upper=True).squeeze(2).mul_(mf)

    z = solve(mf)
    if refine:  # one step of iterative refinement against the unregularised system
        M.diagonal(dim1=1, dim2=2).sub_(CORRAL_RIDGE * mf)
        z += solve(mf - torch.bmm(z[:, None, :], M.transpose(1, 2)).squeeze(1))
    s = z.sum(dim=1, keepdim=True)
    ok &= torch.isfinite(s[:, 0]) & (s[:, 0] > 0)
    y = z / torch.where(ok[:, None], s, torch.ones_like(s))
    return y, ok


def _corral_step(Q: torch.Tensor, ls: torch.Tensor, ms: torch.Tensor, frozen: torch.Tensor,
                 fast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One corral step of the rows not ``frozen``: the new weights, mask and (r,) whether the cycle goes on."""
    y, ok = affine_min_norm(Q, ms, refine=not fast)
    ok &= ms.any(dim=1) & ~frozen
    neg = ms & (y <= CORRAL_EPS_W)
    if fast:  # one solve, clip the negative weights
        lnew, drop, again = torch.where(neg, torch.zeros_like(y), y), neg, torch.zeros_like(ok)
    else:  # Wolfe: move towards y until the first weight hits 0
        again = neg.any(dim=1)
        ratio = torch.where(neg, ls / (ls - y).clamp_min(1e-300), torch.full_like(y, math.inf))
        theta, first = ratio.min(dim=1)
        theta = torch.where(again, theta.clamp(0.0, 1.0), torch.ones_like(theta))
        lnew = ls + theta[:, None] * (y - ls)
        slots = torch.arange(ms.shape[1], device=ms.device)
        drop = ((neg & (lnew <= CORRAL_EPS_W)) | (again[:, None] & (slots[None, :] == first[:, None]))) & ms
    lnew = torch.where(drop | ~ms, torch.zeros_like(lnew), lnew.clamp_min(0.0))
    ssum = lnew.sum(dim=1, keepdim=True)
    lnew = lnew / torch.where(ssum > 0, ssum, torch.ones_like(ssum))
    ls = torch.where(ok[:, None], lnew, ls)  # unsolvable system or frozen row: keep the weights
    return ls, ms & ~(drop & ok[:, None]), again & ok


def corral_minor(Q: torch.Tensor, lam: torch.Tensor, occ: torch.Tensor, frozen: torch.Tensor, *, fast: bool,
                 max_steps: int, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Minor cycles of Wolfe's minimum-norm-point method, one corral per row (U*'s corral solver).

    Q: (r, k, k) float64 Gram matrices of each row's slot vectors, lam: (r, k) simplex weights, occ: (r, k)
    bool corral membership, frozen: (r,) bool rows to leave as they are.  Each step solves the affine
    minimum-norm problem of the corral (:func:`affine_min_norm`) and either clips the weights at or below
    ``CORRAL_EPS_W`` (``fast``: one step) or moves towards the affine optimum until the first weight reaches
    zero (Wolfe's line search: that point leaves), up to ``max_steps`` steps while the cycle goes on.
    Returns ``(lam, occ, settled)``: new weights and membership, and (r,) True where the cycle finished.
    The CPU kernel factors each corral once per call and drops points from the factor by rank-1 updates;
    the twin runs batched torch steps (on a GPU with fixed shapes, one step per call: ``max_steps`` 1).
    """
    if Q.dim() != 3 or Q.shape[1] != Q.shape[2] or Q.dtype != torch.float64:
        raise ValueError(f"Q must be a float64 (r, k, k) tensor, got {tuple(Q.shape)} {Q.dtype}")
    r, k = Q.shape[:2]
    if lam.shape != (r, k) or occ.shape != (r, k) or frozen.shape != (r,):
        raise ValueError(f"lam and occ must be ({r}, {k}) and frozen ({r},), got {tuple(lam.shape)}, "
                         f"{tuple(occ.shape)}, {tuple(frozen.shape)}")
    if lam.dtype != torch.float64 or occ.dtype != torch.bool or frozen.dtype != torch.bool:
        raise ValueError("lam must be float64, occ and frozen bool")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
    steps = 1 if fast else max_steps
    # an extension built before this kernel existed (a stale in-place build) runs the twin under "auto"
    if backend == "kernels" and _C is not None and not hasattr(_C, "corral_minor"):
        raise RuntimeError("backend='kernels': this build of factkernels._C has no corral_minor; rebuild it")
    if not (_use_kernel(backend, "corral_minor", Q, lam) and hasattr(_C, "corral_minor")):
        ls, ms, again = _corral_step(Q, lam, occ, frozen, fast)
        if Q.device.type == "cpu":  # only the rows still moving (a host round trip costs nothing here)
            rows = again.nonzero(as_tuple=True)[0]
            for _ in range(steps - 1):
                if rows.numel() == 0:
                    break
                l_r, m_r, a_r = _corral_step(Q[rows], ls[rows], ms[rows], frozen[rows], fast)
                ls[rows], ms[rows], again[rows] = l_r, m_r, a_r
                rows = rows[a_r]
        else:  # fixed shapes: rows whose cycle finished are frozen by a mask
            for _ in range(steps - 1):
                ls, ms, again = _corral_step(Q, ls, ms, frozen | ~again, fast)
        return ls, ms, ~again
    Q = Q.contiguous()
    lam, occ = lam.contiguous().clone(), occ.contiguous().clone()
    settled = torch.empty(r, dtype=torch.bool)
    frozen = frozen.contiguous()
    _C.corral_minor("cpu", _ptr(Q), _ptr(lam), _ptr(occ), _ptr(frozen), _ptr(settled), r, k, k, bool(fast), steps,
                    CORRAL_EPS_W, CORRAL_RIDGE)
    return lam, occ, settled


def corral_solve(W: torch.Tensor, rows: torch.Tensor, cand: torch.Tensor, start: torch.Tensor,
                 corral: Optional[tuple[torch.Tensor, torch.Tensor]] = None, *, tol: float, max_iter: int,
                 n_init: int, n_add: int, zero_norm2: float, steps: Optional[torch.Tensor] = None):
    """Minimum-norm points of candidate stars, one whole solve per row (the kernel of U*'s active-set rounds: a
    C++ task per row on a CPU, a warp per row on a GPU).

    W: (n, d) float64 centred values; rows: (r,) int64 the rows' values; cand: (r, K) int64 candidate values,
    -1 padding: row t's star is ``x_c = (w_{rows[t]} - w_{cand[t, c]}) / ||.||``; start: (r, d) float64 start
    directions for rows without a warm ``corral`` ``(cols (r, kw) int64 positions into cand, -1 none; weights
    (r, kw) float64)``.  Wolfe's method with ``n_init`` points added to an empty corral and ``n_add`` per later
    major cycle, until the relative gap is at most ``tol``, ``||p||^2 <= zero_norm2``, a stall, or ``max_iter``
    cycles.  Returns ``(U (r, d), lo (r,), hi (r,), (cols (r, kc), weights (r, kc)), dup (r,))``: the unit
    direction with the best margin seen and that margin, the smallest hull-point norm, the final corral
    (positions into cand, occupied first) and whether a candidate duplicates the row's value.  Its torch twin
    is the batched solver itself (:func:`factkernels.corral.solve_rows` on :func:`factkernels.corral.candidate_star`,
    which ``backend="torch"`` runs); the tests compare the three. ``steps``: a CPU (r, len(CORRAL_SOLVE_STEPS))
    int64 tensor that receives each row's counts (the CUDA kernel takes the same steps and counts none).
    """
    if not uses_kernel("kernels", "corral_solve", W):
        raise RuntimeError("corral_solve has no kernel here (no extension, or not a float64 tensor)")
    _matrix("W", W)
    n, d = W.shape
    if W.dtype != torch.float64 or start.dtype != torch.float64:
        raise ValueError("W and start must be float64")
    if cand.dim() != 2 or cand.dtype != torch.int64 or rows.dim() != 1 or rows.dtype != torch.int64:
        raise ValueError("rows must be (r,) and cand (r, K) int64 tensors")
    r, K = cand.shape
    _matrix("start", start, rows=r, cols=d)
    others = (rows, cand, start) + (tuple(corral) if corral is not None else ())
    if any(t.device != W.device for t in others):
        raise ValueError(f"rows, cand, start and corral must be on W's device ({W.device})")
    cuda = W.device.type == "cuda"
    if not cuda:  # on a GPU each range check is a read back (a host sync per round): the callers build the
        # indices in range, and the CUDA kernel treats a candidate outside [0, n) as padding
        _indices("rows", rows, start, n, "values")
        if cand.numel() and (int(cand.min()) < -1 or int(cand.max()) >= n):
            raise ValueError(f"cand entries must lie in [-1, {n})")
    elif rows.shape != (r,):
        raise ValueError(f"rows must have shape ({r},), got {tuple(rows.shape)}")
    cols, lam, kw = None, None, 0
    if corral is not None and corral[0].shape[1] > 0:
        cols, lam = corral[0].contiguous(), corral[1].contiguous()
        kw = cols.shape[1]
        if cols.shape != (r, kw) or lam.shape != (r, kw) or cols.dtype != torch.int64 or lam.dtype != torch.float64:
            raise ValueError(f"corral must be ((r, kw) int64, (r, kw) float64) with r = {r}")
    if steps is not None and (cuda or steps.shape != (r, len(CORRAL_SOLVE_STEPS)) or steps.dtype != torch.int64
                              or not steps.is_contiguous()):
        raise ValueError(f"steps must be a contiguous CPU ({r}, {len(CORRAL_SOLVE_STEPS)}) int64 tensor")
    W, rows, cand, start = W.contiguous(), rows.contiguous(), cand.contiguous(), start.contiguous()
    kc = max(1, min(K, d + 1))
    dev = W.device
    U = torch.empty(r, d, dtype=torch.float64, device=dev)
    lo, hi = torch.empty(r, dtype=torch.float64, device=dev), torch.empty(r, dtype=torch.float64, device=dev)
    out_cols = torch.empty(r, kc, dtype=torch.int64, device=dev)
    out_lam = torch.empty(r, kc, dtype=torch.float64, device=dev)
    dup = torch.empty(r, dtype=torch.bool, device=dev)
    work, slots = None, 0
    if cuda and r:  # a scratch slice per warp (its star, Gram and factor), as many warps as fill the GPU and the budget
        per_warp = 8 * (_C.corral_solve_work(d, K, 1) - _C.corral_solve_work(d, K, 0))
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        slots = max(1, min(r, CORRAL_SOLVE_WARPS_PER_SM * sms, CORRAL_SOLVE_WORK_BYTES // per_warp))
        work = torch.empty(_C.corral_solve_work(d, K, slots), dtype=torch.float64, device=dev)
    _C.corral_solve(_launch_args(W)[0], _ptr(W), n, d, _ptr(rows), _ptr(cand), r, K, _ptr(start), _ptr(cols),
                    _ptr(lam), kw, float(tol), int(max_iter), int(n_init), int(n_add), CORRAL_EPS_W, CORRAL_RIDGE,
                    float(zero_norm2), _ptr(U), _ptr(lo), _ptr(hi), _ptr(out_cols), _ptr(out_lam), kc, _ptr(dup),
                    _ptr(work), slots, _ptr(steps), _stream(W))
    return U, lo, hi, (out_cols, out_lam), dup
