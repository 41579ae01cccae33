"""U* round trips: launches, host syncs and streaming passes per margin_optimal_outputs call.

    python benchmarks/ustar_launches.py                      # CPU, |V| = 4,096 d = 128 and 16,384 d = 128
    python benchmarks/ustar_launches.py --sizes 65536x256    # one size (minutes on a CPU)
    python benchmarks/ustar_launches.py --device cuda        # on a GPU: also kernel launches, syncs, copies

Writes benchmarks/results/ustar_launches-<device>.json (rows are merged by size, device and --label, so a
run on another checkout, e.g. --label before, adds its rows beside the others). Per size, for spherical
values (seed 0), in float32:

  seconds          one call, unprofiled, after a warm-up call at a small size; cpu_seconds the process's CPU
                   seconds in it (steadier than wall seconds on a shared machine), loadavg_1min the load after it
  passes           calls of the streaming star-score pass (``_ops.star_topk``, kernel or twin) and the
                   same in full-pass equivalents (rows scored / |V|); seconds_in_passes_measured the seconds the
                   call spent in them (synchronized around each)
  pass_seconds     one full streaming pass at the call's width; seconds_in_passes = seconds / pass_seconds
                   (the CPU target: <= 8 at |V| = 16,384, d = 128), cpu_seconds_in_passes the same in CPU seconds
  aten_ops         aten operators the call runs (every operator, and those called from Python), from
                   torch.profiler; work_ops those that do work (innermost, not a view or an allocation):
                   about one kernel launch each on a GPU; work_ops_on_device less the host-side ones
  host_syncs       operators that make the host wait for the device: aten::_local_scalar_dense (item,
                   bool, int of a tensor) and aten::nonzero (boolean masks, data-dependent shapes); host_reads
                   every read of a tensor's value on the host, from Python or inside an operator
                   (factkernels.host_reads.HostReadCounter): each one host round trip on a GPU
  cuda             (GPU only) runtime calls: kernel launches, stream/device/event synchronisations, memcpy
  sync_free_path   (CPU) the same counts for the GPU's code path (corral.SYNC_FREE_DEVICES), run on the CPU
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from factkernels import _ops, embeddings, ustar
from factkernels.host_reads import HostReadCounter

try:  # the solver before its sync-free path had no factkernels.corral (the rows labelled "before")
    from factkernels import corral
except ImportError:
    corral = None

RESULTS = Path(__file__).resolve().parent / "results"
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero")
NO_WORK_OPS = {f"aten::{name}" for name in (
    "as_strided", "view", "reshape", "_reshape_alias", "unsqueeze", "squeeze", "expand", "transpose", "t", "permute",
    "select", "slice", "alias", "empty", "empty_strided", "empty_like", "detach", "resolve_conj", "resolve_neg",
    "_unsafe_view", "lift_fresh", "diagonal", "narrow", "split", "unbind", "as_strided_", "_local_scalar_dense",
    "result_type", "is_nonzero", "size", "stride", "numel", "dim")}


HOST_SIDE_WORK_OPS = ("aten::scalar_tensor", "aten::to", "aten::resize_")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PassCounter:
    """Counts the streaming passes of U* (calls of ``_ops.star_topk``, the one door to the kernel and its
    twin) and the rows they score, while installed as a context manager, and the seconds spent in them (the
    device synchronized before and after each: a few syncs more per call)."""

    def __init__(self) -> None:
        self.calls, self.rows, self.width, self.seconds = 0, 0, 1, 0.0

    def __enter__(self) -> "PassCounter":
        self._real = _ops.star_topk

        def counted(values, k, outputs=None, rows=None, **kwargs):
            self.calls += 1
            self.rows += values.shape[0] if rows is None else rows.numel()
            self.width = k  # that of the last pass
            _sync(values.device)
            begin = time.perf_counter()
            found = self._real(values, k, outputs, rows, **kwargs)
            _sync(values.device)
            self.seconds += time.perf_counter() - begin
            return found

        _ops.star_topk = counted
        return self

    def __exit__(self, *exc) -> None:
        _ops.star_topk = self._real


def device_time_table(events, top: int = 15) -> dict:
    """Where the device's time went, from a profile's events: the ``top`` device kernels (and copies, memsets)
    by total device time, each with its calls, and the device's busy time and event count over all of them."""
    on_device = [e for e in events if e.device_type != torch.autograd.DeviceType.CPU]
    calls, micros = collections.Counter(), collections.Counter()
    for e in on_device:
        calls[e.name] += 1
        micros[e.name] += e.time_range.elapsed_us()
    return {"device_events": len(on_device), "device_busy_ms": sum(micros.values()) / 1e3,
            "top_device_kernels": [{"name": name[:160], "calls": calls[name], "total_ms": round(us / 1e3, 4)}
                                   for name, us in micros.most_common(top)]}


def profile_counts(prof) -> dict:
    """Operator, host-sync and (on a GPU) runtime-call counts of one profile, and where the device time went."""
    events = list(prof.events())
    aten = [e for e in events if e.name.startswith("aten::")]
    names = collections.Counter(e.name for e in aten)
    # operators that do work: no aten operator below them, and not a view or an allocation
    work = collections.Counter(e.name for e in aten if e.name not in NO_WORK_OPS
                               and not any(c.name.startswith("aten::") for c in e.cpu_children))
    out = {
        "aten_ops": len(aten),
        "aten_ops_from_python": sum(1 for e in aten if e.cpu_parent is None),
        "work_ops": sum(work.values()),
        # without the host-side ones: a Python scalar wrapped as a tensor, a no-op .to(), a resize of an empty output
        "work_ops_on_device": sum(c for name, c in work.items() if name not in HOST_SIDE_WORK_OPS),
        "host_syncs": sum(names[name] for name in SYNC_OPS),
        "host_syncs_by_op": {name: names[name] for name in SYNC_OPS},
        "top_work_ops": dict(work.most_common(12)),
    }
    runtime = collections.Counter(e.name for e in events if e.device_type == torch.autograd.DeviceType.CPU
                                  and e.name.startswith(("cuda", "cu")))
    if runtime:
        out["cuda"] = {
            "kernel_launches": sum(c for name, c in runtime.items() if "LaunchKernel" in name or name == "cudaGraphLaunch"),
            "stream_syncs": sum(c for name, c in runtime.items() if "Synchronize" in name),
            "stream_synchronize": runtime["cudaStreamSynchronize"],
            "memcpy": sum(c for name, c in runtime.items() if "Memcpy" in name),
            "device_kernels": sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
            "runtime_calls": dict(runtime.most_common(12)),
        }
        out.update(device_time_table(events))
    return out


@contextlib.contextmanager
def profiler(activities: list):
    """torch.profiler over one call. A second profile in the same process makes some torch releases (2.11 seen)
    warn that events of an earlier cycle are cleared; each profile here is one cycle, so nothing is lost, and the
    warning (an error under the test suite's filterwarnings) is silenced for this one message only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)
        with profile(activities=activities) as prof:
            yield prof


@contextlib.contextmanager
def gpu_sequence_on_cpu():
    """The op sequence a GPU runs, on a CPU: the solver's sync-free path (corral.SYNC_FREE_DEVICES), the twins CUDA
    runs under backend="auto" (star_topk above STAR_TOPK_CUDA_KERNEL_MAX_K, exact_star_scores) with the GPU's
    chunk budgets, and the corral solve on its kernel (C++ here, CUDA there: one operator either way). The C++
    corral_solve's range checks read back from the device (the CUDA entry skips them): its host syncs are
    counted apart under the record_function "corral_solve"."""
    real_topk, real_exact, real_solve = _ops.star_topk, _ops.exact_star_scores, _ops.corral_solve
    real_runs_kernel = _ops.star_topk_runs_kernel
    budgets = _ops.STAR_TWIN_BYTES["cpu"], _ops.EXACT_TWIN_ELEMENTS["cpu"]

    def topk(values, k, outputs=None, rows=None, **kwargs):
        if k > _ops.STAR_TOPK_CUDA_KERNEL_MAX_K:
            kwargs["backend"] = "torch"
        return real_topk(values, k, outputs, rows, **kwargs)

    def runs_kernel(backend, k, values, outputs=None):  # (callers that build the twin's operand ask this)
        return k <= _ops.STAR_TOPK_CUDA_KERNEL_MAX_K and real_runs_kernel(backend, k, values, outputs)

    def exact(*args, **kwargs):
        return real_exact(*args, **dict(kwargs, backend="torch"))

    def solve(*args, **kwargs):
        with torch.profiler.record_function("corral_solve"):
            return real_solve(*args, **kwargs)

    corral.SYNC_FREE_DEVICES.add("cpu")
    _ops.star_topk, _ops.exact_star_scores, _ops.corral_solve = topk, exact, solve
    _ops.star_topk_runs_kernel = runs_kernel
    _ops.STAR_TWIN_BYTES["cpu"], _ops.EXACT_TWIN_ELEMENTS["cpu"] = _ops.STAR_TWIN_BYTES["cuda"], _ops.EXACT_TWIN_ELEMENTS["cuda"]
    try:
        yield
    finally:
        corral.SYNC_FREE_DEVICES.discard("cpu")
        _ops.star_topk, _ops.exact_star_scores, _ops.corral_solve = real_topk, real_exact, real_solve
        _ops.star_topk_runs_kernel = real_runs_kernel
        _ops.STAR_TWIN_BYTES["cpu"], _ops.EXACT_TWIN_ELEMENTS["cpu"] = budgets


def _under(event, name: str) -> bool:
    while event is not None:
        if event.name == name:
            return True
        event = event.cpu_parent
    return False


def emulated_gpu_counts(n: int, d: int) -> dict:
    """Counts of one U* call (method auto) on the GPU's op sequence emulated on the CPU (gpu_sequence_on_cpu)."""
    values = embeddings.spherical(n, d, generator=torch.Generator().manual_seed(0))
    with gpu_sequence_on_cpu():
        ustar.margin_optimal_outputs(values[:256])  # warm-up
        with PassCounter() as passes:
            begin = time.perf_counter()
            U, rho = ustar.margin_optimal_outputs(values)
            seconds = time.perf_counter() - begin
        with profiler([ProfilerActivity.CPU]) as prof:
            ustar.margin_optimal_outputs(values)
        with HostReadCounter() as reads:
            ustar.margin_optimal_outputs(values)
    row = dict(profile_counts(prof), n=n, d=d, seconds=seconds, rho=rho, rho_hex=float(rho).hex(), passes=passes.calls,
               host_reads=reads.count)
    in_solve = [e for e in prof.events() if e.name in SYNC_OPS and _under(e, "corral_solve")]
    row["host_syncs_in_cpu_corral_solve_checks"] = len(in_solve)
    row["host_syncs_gpu"] = row["host_syncs"] - len(in_solve)
    row["corral_solve_calls"] = sum(1 for e in prof.events() if e.name == "corral_solve")
    return row


def measure(device: torch.device, n: int, d: int, *, method: str = "auto", count_below: float = math.inf,
            backend: str = "auto") -> dict:
    """One size: time, rho, passes and, when the call took under ``count_below`` seconds, the profiler's
    operator, sync and launch counts."""
    values = embeddings.spherical(n, d, generator=torch.Generator().manual_seed(0)).to(device)
    ustar.margin_optimal_outputs(values[:256], method=method, backend=backend)  # warm-up (kernels, allocator)
    _sync(device)
    with PassCounter() as passes:
        begin, begin_cpu = time.perf_counter(), time.process_time()
        U, rho = ustar.margin_optimal_outputs(values, method=method, backend=backend)
        _sync(device)
        seconds, cpu_seconds = time.perf_counter() - begin, time.process_time() - begin_cpu
    row = {"n": n, "d": d, "method": method, "backend": backend, "seconds": seconds, "cpu_seconds": cpu_seconds,
           "rho": rho, "loadavg_1min": os.getloadavg()[0],
           "passes": passes.calls, "full_pass_equivalents": passes.rows / n, "seconds_in_passes_measured": passes.seconds}
    # the unit of the CPU target "<= 8 score passes": one full streaming pass at the width the solver uses. On a
    # shared machine the CPU seconds (this process's, all its threads) are the steadier ratio.
    begin, begin_cpu = time.perf_counter(), time.process_time()
    _ops.star_topk(values, passes.width, U, torch.arange(n, device=device), backend=backend)
    _sync(device)
    row["pass_seconds"], row["pass_cpu_seconds"] = time.perf_counter() - begin, time.process_time() - begin_cpu
    row["seconds_in_passes"] = seconds / row["pass_seconds"]
    row["cpu_seconds_in_passes"] = cpu_seconds / row["pass_cpu_seconds"]
    if seconds < count_below:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profiler(activities) as prof:
            ustar.margin_optimal_outputs(values, method=method, backend=backend)
            _sync(device)
        row.update(profile_counts(prof))
        with HostReadCounter() as reads:
            ustar.margin_optimal_outputs(values, method=method, backend=backend)
        row["host_reads"] = reads.count
        sync_free = None if corral is None else corral.SYNC_FREE_DEVICES
        if sync_free is not None and device.type not in sync_free:  # the GPU's code path, counted here
            sync_free.add(device.type)
            try:
                begin = time.perf_counter()
                ustar.margin_optimal_outputs(values, method=method, backend=backend)
                seconds_sync_free = time.perf_counter() - begin
                with profiler(activities) as prof:
                    ustar.margin_optimal_outputs(values, method=method, backend=backend)
                with HostReadCounter() as reads:
                    ustar.margin_optimal_outputs(values, method=method, backend=backend)
            finally:
                sync_free.discard(device.type)
            row["sync_free_path"] = dict(profile_counts(prof), seconds=seconds_sync_free, host_reads=reads.count)
    if device.type == "cuda":
        row["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
    print(json.dumps({k: v for k, v in row.items() if k not in ("top_work_ops", "host_syncs_by_op", "sync_free_path",
                                                                 "top_device_kernels")}),
          flush=True)
    if "sync_free_path" in row:
        print("  sync-free path:", json.dumps({k: v for k, v in row["sync_free_path"].items() if k.startswith(("aten", "work", "host", "sec"))}), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", default="4096x128,16384x128", help="comma-separated |V|xd")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--label", default="after", help="names this checkout's rows (e.g. before, after)")
    parser.add_argument("--no-count", action="store_true", help="time and passes only (no profiler run)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--emulate-gpu", action="store_true",
                        help="only the GPU's op sequence on the CPU (gpu_sequence_on_cpu): counts, rho, passes; "
                             "writes ustar_launches-emulated_gpu.json unless --out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench import device_info

    out = Path(args.out) if args.out else RESULTS / f"ustar_launches-{'emulated_gpu' if args.emulate_gpu else device.type}.json"
    report = json.loads(out.read_text()) if out.exists() else {"rows": []}
    report["environment"] = device_info(device)
    report["command"] = "python benchmarks/ustar_launches.py " + " ".join(sys.argv[1:])
    if args.emulate_gpu:
        for size in args.sizes.split(","):
            n, d = (int(x) for x in size.split("x"))
            row = dict(emulated_gpu_counts(n, d), label=args.label)
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)}), flush=True)
            report["rows"] = [r for r in report["rows"] if (r["n"], r["d"], r["label"]) != (n, d, args.label)] + [row]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {out}")
        return
    for size in args.sizes.split(","):
        n, d = (int(x) for x in size.split("x"))
        row = dict(measure(device, n, d, count_below=0.0 if args.no_count else math.inf), label=args.label,
                   threads=args.threads,
                   device=str(device))
        report["rows"] = [r for r in report["rows"]
                          if (r["n"], r["d"], r["label"], r["device"]) != (n, d, args.label, str(device))] + [row]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
