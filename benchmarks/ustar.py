"""Margin-optimal outputs U* at scale: dense solver vs active-set cutting planes, and the builds that use them.

    python benchmarks/ustar.py                       # every case, writes benchmarks/results/ustar_cpu.json
    python benchmarks/ustar.py --only ustar --quick  # small sizes, a smoke run

Every case runs in a fresh child process (peak memory = its own: /proc/self/clear_refs resets the
high-water mark after the inputs exist, VmHWM is read after the call). Cases already in the output
JSON are skipped, so an interrupted run resumes. Threads follow --threads (1 on a loaded machine). --repeat N times
the ustar and construct_default calls N - 1 more times in the same process (cpu_seconds_runs, seconds_runs and their
best: on a loaded machine one call's CPU seconds vary by +-10%, more than the changes measured).

  ustar              margin_optimal_outputs(V, method=...) for spherical V: seconds, rho, streaming
                     passes (calls of the fused star_topk kernel), peak extra memory; for the active set
                     also the time of one streaming pass and the total in units of it
  construct_default  construct(K, V, f) with the defaults (U* outputs) at F = |V|; for the builds also, from one
                     more call each (ustar_launches.py's counts): aten_ops, work_ops, host_syncs
                     (aten::_local_scalar_dense + aten::nonzero) and host_reads (every read of a tensor's value on
                     the host: one host round trip each on a GPU), and the same for outputs="values" with m given
                     (values_given_m: the build with nothing to search)
  values_vs_chol     construct(..., outputs="values") against the fastest single float32 Cholesky of an F x F Gram
                     on the machine: torch's (MKL) and LAPACK's potrf through scipy (OpenBLAS, in place), both
                     reported, the ratio against the faster (all warmed up, best of 3 taken in turn, wall and CPU
                     seconds); with the floor: the multiply-adds the build must do (Gram, solves, one verification
                     pass; then the weights and the rho pass) at the measured square-GEMM rate, plus the Cholesky
  cholesky           the Cholesky references alone at F = 1,024 ... 8,192 (--only cholesky, --cholesky-sizes), and
                     (both cases) LAPACK's potrf on one OpenBLAS thread, which the library runs at one or two torch
                     threads, and every timed call's wall seconds (walls_s: the spread under load)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def child(case: dict) -> dict:
    """Runs one case in this (fresh) process and returns its measurements."""
    import factkernels
    from factkernels import _ops, embeddings, ustar
    from factkernels.embeddings import random_fact_set

    torch.set_num_threads(case["threads"])
    kind, n, d = case["kind"], case["n"], case["d"]
    out: dict = {}
    if kind == "ustar":
        V = embeddings.spherical(n, d, generator=torch.Generator().manual_seed(0))
        calls = [0]
        kernel = _ops.star_topk

        def counted(*a, **k):
            calls[0] += 1
            return kernel(*a, **k)

        _ops.star_topk = counted
        fn = lambda: ustar.margin_optimal_outputs(V, method=case["method"])  # noqa: E731
    elif kind == "construct_default":
        K, V, f = random_fact_set(n, n, d, seed=0)
        fn = lambda: factkernels.construct(K, V, f, progress=False)  # noqa: E731
    elif kind == "values_vs_chol":
        K, V, f = random_fact_set(n, n, d, seed=0)
        fn = lambda: factkernels.construct(K, V, f, outputs="values", progress=False)  # noqa: E731
        walls: dict = {}
        best = _best_of({**_cholesky_calls(n), "construct": fn}, walls)
        out.update(_cholesky_fields(best), walls_s=walls)
        out["construct_best_s"], out["construct_best_cpu_s"] = best["construct"]
        out["ratio_best_wall"] = best["construct"][0] / out["cholesky_fastest_s"]
        out["ratio_best_cpu"] = best["construct"][1] / out["cholesky_fastest_cpu_s"]
        out["gemm_float32_macs_per_cpu_s"] = _gemm_rate()
    elif kind == "cholesky":
        walls = {}
        out.update(_cholesky_fields(_best_of(_cholesky_calls(n), walls)), walls_s=walls)
        fn = None
    else:
        raise ValueError(kind)
    if fn is None:
        return out
    base = _status_bytes("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")
    start, start_cpu = time.perf_counter(), time.process_time()
    result = fn()
    out["seconds"], out["cpu_seconds"] = time.perf_counter() - start, time.process_time() - start_cpu
    out["peak_extra_bytes"] = _status_bytes("VmHWM:") - base
    if kind == "ustar":
        out["rho"], out["streaming_passes"] = result[1], calls[0]
        if case["method"] == "active_set":  # the unit of the "~10 passes" target: one round's streaming pass
            start, start_cpu = time.perf_counter(), time.process_time()
            kernel(V, 2 * max(6, d // 10), result[0], torch.arange(n))
            out["pass_seconds"], out["pass_cpu_seconds"] = time.perf_counter() - start, time.process_time() - start_cpu
            out["seconds_in_passes"] = out["seconds"] / out["pass_seconds"]
            out["cpu_seconds_in_passes"] = out["cpu_seconds"] / out["pass_cpu_seconds"]
    else:
        out["accuracy"] = result.report.accuracy
        out["rho"] = result.report.rho if hasattr(result.report, "rho") else None
        out["phases_s"] = {k: round(v, 4) for k, v in result.report.timings.items()}
        out["counts"] = _build_counts(fn)
        if kind == "values_vs_chol":
            out["counts_values_given_m"] = _build_counts(
                lambda: factkernels.construct(K, V, f, result.report.m, outputs="values", progress=False))
        if kind == "values_vs_chol":  # the single timed call above, against the fastest Cholesky
            out["ratio_to_cholesky"] = out["seconds"] / out["cholesky_fastest_s"]
            out["floor"] = _values_floor(result.report, out)
    if case.get("repeat", 1) > 1 and kind in ("ustar", "construct_default"):
        runs = [(out["seconds"], out["cpu_seconds"])]
        for _ in range(case["repeat"] - 1):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            runs.append((time.perf_counter() - start, time.process_time() - start_cpu))
        out["seconds_runs"], out["cpu_seconds_runs"] = [r[0] for r in runs], [r[1] for r in runs]
        out["seconds_best"], out["cpu_seconds_best"] = min(out["seconds_runs"]), min(out["cpu_seconds_runs"])
    return out


def _build_counts(fn) -> dict:
    """Operators, host syncs and host reads of one more call of ``fn`` (torch.profiler, HostReadCounter)."""
    from ustar_launches import profile_counts, profiler

    from factkernels.host_reads import HostReadCounter

    with profiler([torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    with HostReadCounter() as reads:
        fn()
    return dict(profile_counts(prof), host_reads=reads.count, host_reads_by_kind=dict(Counter(reads.reads)))


def _best_of(calls: dict, walls: dict | None = None) -> dict:
    """Best (wall, CPU) seconds of each call (or (untimed preparation, call)): all warmed up, then timed in turn 3 times (so a change in the
    machine's load hits all); with several threads CPU seconds add up the threads, spinning included. walls: gets
    each call's three wall times (the spread under load)."""
    best = {name: [math.inf, math.inf] for name in calls}
    for trial in range(4):  # trial 0 warms up
        for name, call in calls.items():
            if isinstance(call, tuple):  # (untimed preparation, call)
                call[0]()
                call = call[1]
            start, cpu = time.perf_counter(), time.process_time()
            call()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            if trial > 0:
                best[name] = [min(best[name][0], wall), min(best[name][1], cpu)]
                if walls is not None:
                    walls.setdefault(name, []).append(wall)
    return best


def _cholesky_calls(n: int) -> dict:
    """One float32 Cholesky of an (n, n) SPD Gram: torch's, and LAPACK's potrf through scipy in place on a
    fresh copy made outside the timed call (what the values build does with its Gram)."""
    from scipy.linalg import lapack

    from threadpoolctl import threadpool_limits

    A = torch.randn(n, 128, generator=torch.Generator().manual_seed(1))
    G = A @ A.T
    G.diagonal().add_(float(n))
    work = []

    def scipy_potrf():
        _, info = lapack.spotrf(work.pop().numpy().T, lower=0, clean=0, overwrite_a=1)  # the lower triangle, no copy
        assert info == 0

    def scipy_potrf_one_thread():  # what the library runs at one or two torch threads (solvers.cholesky_factor)
        with threadpool_limits(limits=1, user_api="blas"):
            scipy_potrf()

    return {"cholesky_torch": lambda: torch.linalg.cholesky(G),
            "cholesky_scipy": (lambda: work.append(G.clone()), scipy_potrf),
            "cholesky_scipy_1thread": (lambda: work.append(G.clone()), scipy_potrf_one_thread)}


def _cholesky_fields(best: dict) -> dict:
    out = {"cholesky_torch_s": best["cholesky_torch"][0], "cholesky_torch_cpu_s": best["cholesky_torch"][1],
           "cholesky_scipy_s": best["cholesky_scipy"][0], "cholesky_scipy_cpu_s": best["cholesky_scipy"][1],
           "cholesky_scipy_1thread_s": best["cholesky_scipy_1thread"][0],
           "cholesky_scipy_1thread_cpu_s": best["cholesky_scipy_1thread"][1]}
    fastest = min(("cholesky_torch", "cholesky_scipy"), key=lambda k: best[k][1])
    out["cholesky_fastest"] = fastest.split("_")[1]
    out["cholesky_fastest_s"], out["cholesky_fastest_cpu_s"] = best[fastest]
    return out


def _gemm_rate(n: int = 2048) -> float:
    """Multiply-adds per CPU second of one square float32 GEMM (best of 3)."""
    a, b = (torch.randn(n, n, generator=torch.Generator().manual_seed(s)) for s in (2, 3))
    return n**3 / _best_of({"gemm": lambda: a @ b})["gemm"][1]


def _values_floor(report, out: dict) -> dict:
    """Counted multiply-adds of what a values build must do, and the CPU seconds they take at the square-GEMM
    rate on top of the fastest Cholesky: the lowest ratio to one Cholesky this machine allows."""
    F, nv, m, h, q = report.num_facts, report.num_values, report.m, report.gadget_width, report.d_in + 1
    macs = {
        "cholesky": F**3 / 6,
        "gram_lower": F * (F + 1) / 2 * (h + q),  # (S S^T) o (K~ K~^T), lower triangle
        "solves": F * F * m,  # two triangular solves, m right-hand sides
        "verify": F * m * h * q + F * nv * min(m, report.d_out),  # the encoder's codes, their decode
        "weights": F * m * h * q,  # M~^T alpha
        "rho_values": nv * (nv + 1) / 2 * report.d_out,  # the symmetric half of V V^T
    }
    rate, chol = out["gemm_float32_macs_per_cpu_s"], out["cholesky_fastest_cpu_s"]
    must = ("gram_lower", "solves", "verify")
    floor = chol + sum(macs[k] for k in must) / rate
    with_rest = floor + (macs["weights"] + macs["rho_values"]) / rate
    return {"macs": macs, "floor_cpu_s": floor, "floor_ratio": floor / chol, "floor_cpu_s_with_weights_and_rho":
            with_rest, "floor_ratio_with_weights_and_rho": with_rest / chol,
            "cholesky_macs_per_cpu_s": macs["cholesky"] / chol}




def cases(quick: bool, only: set[str], threads: int, grid_arg: str | None = None,
          cholesky_sizes: str | None = None) -> list[dict]:
    todo = []
    if "ustar" in only:
        grid = [(1024, 64, "dense"), (1024, 64, "active_set")] if quick else [
            (4096, 128, "dense"), (4096, 128, "active_set"), (16384, 128, "active_set"), (16384, 128, "dense"),
            (65536, 256, "active_set")]
        if grid_arg:  # e.g. "4096x128:active_set,16384x128:active_set"
            grid = [(int(nd.split("x")[0]), int(nd.split("x")[1]), m)
                    for nd, m in (item.split(":") for item in grid_arg.split(","))]
        todo += [{"kind": "ustar", "n": n, "d": d, "method": m} for n, d, m in grid]
    size = (1024, 64) if quick else (4096, 128)
    if "construct" in only:
        todo.append({"kind": "construct_default", "n": size[0], "d": size[1]})
    if "values" in only:
        todo.append({"kind": "values_vs_chol", "n": size[0], "d": size[1]})
    if "cholesky" in only:
        sizes = [int(x) for x in cholesky_sizes.split(",")] if cholesky_sizes else (
            [512, 1024] if quick else [1024, 2048, 4096, 8192])
        todo += [{"kind": "cholesky", "n": n, "d": 0} for n in sizes]
    for c in todo:
        c["threads"] = threads
    return sorted(todo, key=lambda c: c["n"] * c["n"] * c["d"])  # cheap cases first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="ustar,construct,values")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    parser.add_argument("--repeat", type=int, default=1, help="timed calls of the ustar and construct_default cases")
    parser.add_argument("--ustar-grid", default=None,
                        help="U* cases instead of the default grid, e.g. 4096x128:active_set,16384x128:dense")
    parser.add_argument("--cholesky-sizes", default=None, help="F of the cholesky cases, e.g. 4096 (default 1,024-8,192)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/ustar_cpu[-quick].json)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench import device_info  # the shared environment record

    from factkernels.environment import code_version

    out = Path(args.out) if args.out else RESULTS / f"ustar_cpu{'-quick' if args.quick else ''}.json"
    report = json.loads(out.read_text()) if out.exists() else {"environment": device_info(torch.device("cpu")),
                                                                 "cases": []}
    report["environment"]["threads"] = args.threads
    report["environment"]["code"] = code_version()
    done = {json.dumps({k: v for k, v in c.items() if k in ("kind", "n", "d", "method", "threads")}, sort_keys=True)
            for c in report["cases"]}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    for case in cases(args.quick, set(args.only.split(",")), args.threads, args.ustar_grid, args.cholesky_sizes):
        if args.repeat > 1:
            case["repeat"] = args.repeat
        key = json.dumps(case, sort_keys=True)
        if key in done:
            continue
        row = dict(case, loadavg_before=_loadavg())
        try:
            proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(case)], capture_output=True,
                                  text=True, timeout=args.timeout, env=env)
            if proc.returncode != 0:
                row["error"] = proc.stderr.strip().splitlines()[-1:]
            else:
                row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        except subprocess.TimeoutExpired:
            row["timed_out_after_s"] = args.timeout
        row["loadavg_after"] = _loadavg()
        report["cases"].append(row)
        print(json.dumps(row), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
