"""Does the memory guard's estimate bound the measured peak of a cg build?  (issue 33)

    OMP_NUM_THREADS=1 python benchmarks/memory_guard.py            # -> results/memory_guard-cpu.json
    python benchmarks/memory_guard.py --sizes 2048x32 --iters 2 --out /tmp/m.json    # a smoke run

Cases already in the output JSON are kept and skipped (an interrupted run resumes).

Each case is construct(K, V, f, outputs="values", solver="cg") on random unit facts (F = |V|, d in = d out) in a
fresh child process: the peak is VmHWM after /proc/self/clear_refs reset it once the inputs exist, plus the
inputs' bytes, against factkernels.memory.estimate_build for the m the build found (the guard's model, phase by
phase). CG is capped at a few iterations: every iteration allocates the same. backend "auto" runs the CPU kernels
of the gadget products; "torch" runs their blocked twins (the GPU's path). Then what the guard says, from the same
estimate, for F = 2^18 and 2^20 at d = 1,024 on an 80 GB and a 141 GB GPU (LARGE_BUILDS).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
# Free memory of a whole GPU as torch.cuda.mem_get_info reports it with nothing allocated (about): H100 80 GB,
# H200 141 GB.
GPUS = {"H100 80 GB": 78 << 30, "H200 141 GB": 139 << 30}
# (F, m) at d = 1,024: m = 79 is the 2^18 build's (H200, session 24); at 2^20 m grows with log |V| and 1/rho^2,
# so also a larger one.
LARGE_BUILDS = ((2**18, 79), (2**20, 79), (2**20, 128))


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def child(case: dict) -> dict:
    """One build in this fresh process: measured peak and the estimate's parts."""
    import factkernels
    from factkernels.embeddings import random_fact_set
    from factkernels.memory import estimate_build

    torch.set_num_threads(1)
    F, d = case["F"], case["d"]
    K, V, f = random_fact_set(F, F, d, seed=0)
    inputs = K.numel() * K.element_size() + V.numel() * V.element_size()
    base = _status_bytes("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark (VmHWM)
    mlp = factkernels.construct(K, V, f, outputs="values", solver="cg", cg_max_iter=case["iters"], verify="report",
                                backend=case["backend"], progress=False)
    peak = _status_bytes("VmHWM:") - base + inputs
    report = mlp.report
    est = estimate_build(F, F, d, d, m=report.m, gadget_width=report.gadget_width, solver="cg", outputs="values",
                         device_type="cpu", cpu_kernels=case["backend"] != "torch")
    return {**case, "m": report.m, "gadget_width": report.gadget_width, "cg_preconditioner": report.cg_preconditioner,
            "measured_peak_bytes": peak, "estimate_bytes": est.total, "estimate_over_measured": est.total / peak,
            "estimate_phases_bytes": est.phase_bytes(), "estimate_parts_bytes": {k: b for k, (b, _) in est.parts.items()}}


def guard_verdicts() -> list:
    """What check_fits says at d = 1,024 for F = 2^18 and 2^20 on each GPU of GPUS (device_type "cuda")."""
    from factkernels.encoder import gadget_width
    from factkernels.memory import MemoryBudgetError, check_fits, estimate_build

    rows = []
    for F, m in LARGE_BUILDS:
        est = estimate_build(F, F, 1024, 1024, m=m, gadget_width=gadget_width(F, 1024, 1.5), solver="cg",
                             outputs="values", device_type="cuda", cpu_kernels=False)
        for gpu, free in GPUS.items():
            try:
                check_fits(est, torch.device("cuda"), free)
                verdict = {"fits": True}
            except MemoryBudgetError as err:
                verdict = {"fits": False, "message": str(err)}
            rows.append({"F": F, "d": 1024, "m": m, "gpu": gpu, "free_bytes": free, "estimate_bytes": est.total,
                         "estimate_phases_bytes": est.phase_bytes(), "estimate": str(est), **verdict})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["8192x128", "16384x128", "16384x256", "32768x128",
                                                       "32768x128x30"],
                        help="FxD cases (backend auto), FxDxI with I CG iterations instead of --iters")
    parser.add_argument("--torch-sizes", nargs="*", default=["8192x128", "16384x256"],
                        help="FxD cases also run with backend='torch' (the blocked twins)")
    parser.add_argument("--iters", type=int, default=3,
                        help="CG iterations per build (each allocates the same; the allocators' retained blocks grow "
                             "over the first tens, hence one case at 30)")
    parser.add_argument("--out", type=Path, default=RESULTS / "memory_guard-cpu.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    cases = [(s, "auto") for s in args.sizes] + [(s, "torch") for s in args.torch_sizes]
    rows = json.loads(args.out.read_text())["builds"] if args.out.exists() else []
    done = {(r["F"], r["d"], r["backend"], r["iters"]) for r in rows}
    for size, backend in cases:
        F, d, *iters = (int(x) for x in size.split("x"))
        case = {"F": F, "d": d, "backend": backend, "iters": iters[0] if iters else args.iters}
        if tuple(case.values()) in done:
            continue
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(case)], capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps({k: row[k] for k in ("F", "d", "backend", "m", "measured_peak_bytes", "estimate_bytes",
                                               "estimate_over_measured")}), flush=True)
        rows.append(row)
    result = {"command": "python benchmarks/memory_guard.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "device": "cpu", "platform": platform.platform(), "python": platform.python_version(),
              "torch": torch.__version__, "threads": 1, "builds": rows, "guard": guard_verdicts()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
