"""Operators per phase of the values build: where a GPU's launches come from, counted on any machine.

    python benchmarks/construct_ops.py                       # F = 4,096, d = 128, m given (96) and searched
    python benchmarks/construct_ops.py --label before        # on another checkout (PYTHONPATH): rows beside

Writes benchmarks/results/construct_ops-<device>.json (rows merged by size, m, routes, device and --label). One
profiled call of ``construct(K, V, f, m, outputs="values")`` after an unprofiled one, per row:

  phases       per phase of the report's clock (marks put into the profile when each phase ends; "checks" is
               the input validation before the clock starts, "read_back" the report's transfer after the last
               phase): aten_ops (every aten operator), from_python (those not called by another operator: one
               Python-level call each) and work_ops (innermost, not a view or an allocation: about one kernel
               launch each on a GPU), and the same totals for the call
  routes       "device": what backend="auto" runs on this device; "cuda": the routes it takes on a GPU
               (_ops.CUDA_AUTO_KERNELS, torch's Cholesky rather than scipy's potrf, the twins' chunk sizes and the
               m search's rule for a full decode per trial, decoder.UNSCREENED_PAIRS), run here on the CPU: a CPU
               counts about a GPU's operators
  order        the phases in the order they ended
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def count(n: int, d: int, m, routes: str, seed: int = 0) -> dict:
    """Operator counts per phase of one values build (see the module docstring)."""
    import importlib

    import factkernels
    from factkernels import _ops, solvers
    from factkernels.embeddings import random_fact_set
    from ustar_launches import NO_WORK_OPS, profiler

    if routes == "cuda":
        _ops.auto_runs_kernel = lambda op, device_type: op in _ops.CUDA_AUTO_KERNELS
        solvers.SCIPY_CHOLESKY_MAX_THREADS = 0
        for budget in ("STAR_TWIN_BYTES", "GADGET_TWIN_BYTES", "EXACT_TWIN_ELEMENTS"):
            getattr(_ops, budget)["cpu"] = getattr(_ops, budget)["cuda"]
        decoder = importlib.import_module("factkernels.decoder")
        if hasattr(decoder, "UNSCREENED_PAIRS"):  # (a checkout before session 28 screens on every device)
            decoder.UNSCREENED_PAIRS["cpu"] = decoder.UNSCREENED_PAIRS["cuda"]
    construct = importlib.import_module("factkernels.construct")
    lap = construct._PhaseClock.lap

    def marked(self, name):  # a zero-length mark in the profile where each phase ends
        with torch.profiler.record_function(f"phase::{name}"):
            pass
        lap(self, name)

    construct._PhaseClock.lap = marked
    K, V, f = random_fact_set(n, n, d, seed=seed)
    build = lambda: factkernels.construct(K, V, f, m, outputs="values", progress=False)  # noqa: E731
    mlp = build()
    with profiler([torch.profiler.ProfilerActivity.CPU]) as prof:
        build()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    marks = [(e.time_range.start, e.name.split("::", 1)[1]) for e in events if e.name.startswith("phase::")]
    start = next(e.time_range.start for e in events if e.name == "phase::whiten")  # the clock's first phase
    phases: dict = collections.defaultdict(collections.Counter)
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        t = e.time_range.start
        phase = "checks" if t < start else next((name for end, name in marks if t <= end), "read_back")
        top = e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")
        work = e.name not in NO_WORK_OPS and not any(c.name.startswith("aten::") for c in e.cpu_children)
        phases[phase].update(aten_ops=1, from_python=int(top), work_ops=int(work))
    total = sum(phases.values(), collections.Counter())
    return {"n": n, "d": d, "m_given": m, "m": mlp.report.m, "routes": routes, "phases": {k: dict(v) for k, v in
            phases.items()}, "total": dict(total), "order": [name for _, name in marks]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="4096x128", help="F x d (|V| = F)")
    parser.add_argument("--m", default="96,none", help="m values: an int (given) or none (searched)")
    parser.add_argument("--routes", default="device,cuda")
    parser.add_argument("--label", default="")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    torch.set_num_threads(1)
    if args.child:  # one row per process: the routes patch the library
        print(json.dumps(count(**json.loads(args.child))))
        return
    import subprocess

    from bench import device_info

    from factkernels.environment import code_version

    n, d = (int(x) for x in args.size.split("x"))
    out = RESULTS / "construct_ops-cpu.json"
    report = json.loads(out.read_text()) if out.exists() else {"rows": []}
    report["environment"] = device_info(torch.device("cpu"))
    for m in args.m.split(","):
        for routes in args.routes.split(","):
            case = {"n": n, "d": d, "m": None if m == "none" else int(m), "routes": routes}
            proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(case)], capture_output=True,
                                  text=True, check=True)
            row = dict(json.loads(proc.stdout.strip().splitlines()[-1]), label=args.label, code=code_version())
            key = lambda r: (r["n"], r["d"], r["m_given"], r["routes"], r["label"])  # noqa: E731
            report["rows"] = [r for r in report["rows"] if key(r) != key(row)] + [row]
            print(json.dumps({k: row[k] for k in ("label", "m_given", "routes", "total")}), flush=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
