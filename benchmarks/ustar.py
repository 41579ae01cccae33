"""Margin-optimal outputs U* at scale: dense solver vs active-set cutting planes, and the builds that use them.

    python benchmarks/ustar.py                       # every case, writes benchmarks/results/ustar_cpu.json
    python benchmarks/ustar.py --only ustar --quick  # small sizes, a smoke run

Every case runs in a fresh child process (peak memory = its own: /proc/self/clear_refs resets the
high-water mark after the inputs exist, VmHWM is read after the call). Cases already in the output
JSON are skipped, so an interrupted run resumes. Threads follow --threads (1 on a loaded machine).

  ustar              margin_optimal_outputs(V, method=...) for spherical V: seconds, rho, streaming
                     passes (calls of the fused star_topk kernel), peak extra memory; for the active set
                     also the time of one streaming pass and the total in units of it
  construct_default  construct(K, V, f) with the defaults (U* outputs) at F = |V|
  values_vs_chol     construct(..., outputs="values") against one dense float32 Cholesky of an F x F Gram (both
                     warmed up, best of 3 taken in turn, wall and CPU seconds)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
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
        A = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
        G = A @ A.T
        G.diagonal().add_(float(n))
        # Both warmed up, then timed in turn (so a change in the machine's load hits both): best of 3 in wall
        # and process CPU seconds (with several threads CPU seconds add up the threads, spinning included).
        best = {"cholesky": [math.inf, math.inf], "construct": [math.inf, math.inf]}
        for trial in range(4):  # trial 0 warms both up
            for name, call in (("cholesky", lambda: torch.linalg.cholesky(G)), ("construct", fn)):
                start, cpu = time.perf_counter(), time.process_time()
                call()
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                if trial > 0:
                    best[name] = [min(best[name][0], wall), min(best[name][1], cpu)]
        out["cholesky_float32_s"], out["cholesky_float32_cpu_s"] = best["cholesky"]
        out["construct_best_s"], out["construct_best_cpu_s"] = best["construct"]
        out["ratio_best_wall"] = best["construct"][0] / best["cholesky"][0]
        out["ratio_best_cpu"] = best["construct"][1] / best["cholesky"][1]
        del G
    else:
        raise ValueError(kind)
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
        if kind == "values_vs_chol":  # the single timed call above, against the best Cholesky
            out["ratio_to_cholesky"] = out["seconds"] / out["cholesky_float32_s"]
    return out


def cases(quick: bool, only: set[str], threads: int) -> list[dict]:
    todo = []
    if "ustar" in only:
        grid = [(1024, 64, "dense"), (1024, 64, "active_set")] if quick else [
            (4096, 128, "dense"), (4096, 128, "active_set"), (16384, 128, "active_set"), (16384, 128, "dense"),
            (65536, 256, "active_set")]
        todo += [{"kind": "ustar", "n": n, "d": d, "method": m} for n, d, m in grid]
    size = (1024, 64) if quick else (4096, 128)
    if "construct" in only:
        todo.append({"kind": "construct_default", "n": size[0], "d": size[1]})
    if "values" in only:
        todo.append({"kind": "values_vs_chol", "n": size[0], "d": size[1]})
    for c in todo:
        c["threads"] = threads
    return sorted(todo, key=lambda c: c["n"] * c["n"] * c["d"])  # cheap cases first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="ustar,construct,values")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/ustar_cpu[-quick].json)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench import device_info  # the shared environment record

    out = Path(args.out) if args.out else RESULTS / f"ustar_cpu{'-quick' if args.quick else ''}.json"
    report = json.loads(out.read_text()) if out.exists() else {"environment": device_info(torch.device("cpu")),
                                                                 "cases": []}
    report["environment"]["threads"] = args.threads
    done = {json.dumps({k: v for k, v in c.items() if k in ("kind", "n", "d", "method", "threads")}, sort_keys=True)
            for c in report["cases"]}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    for case in cases(args.quick, set(args.only.split(",")), args.threads):
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
