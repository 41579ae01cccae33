"""The steps of U*'s corral solves per row: what one warp of the CUDA corral_solve runs in sequence.

    python benchmarks/corral_steps.py                    # |V| = 4,096, d = 128, one thread
    python benchmarks/corral_steps.py --sizes 1024x64 --label before

On a GPU the corral kernel runs a row per warp and about two rows per warp at |V| = 4,096, d = 128, so its time is
one row's chain of steps, not a throughput. This runs U* (spherical values, seed 0, float32, method auto) on the
GPU's code path on the CPU (``ustar_launches.gpu_sequence_on_cpu``: the sync-free rounds, one corral_solve call per
round over all its rows) with the C++ kernel, which takes the same steps as the CUDA one, and counts each row's
steps (``_ops.CORRAL_SOLVE_STEPS``: major cycles, additions, minor steps and the corral sizes summed over them, drops
and their rotations, the largest and the warm corral). Per round (one kernel call) it writes the rows, the
candidates per row (K), the warm corral's width, each count's mean, median, 90th percentile, max and total, and the
CPU seconds of the call; then rho and the whole call's CPU seconds in corral_solve. Rows are merged into
benchmarks/results/corral_steps-cpu.json by size and --label.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ustar_launches import gpu_sequence_on_cpu  # noqa: E402

from factkernels import _ops, embeddings, ustar  # noqa: E402
from factkernels.environment import environment  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _summary(counts: torch.Tensor) -> dict:
    """Mean, median, 90th percentile, max and total of each count over the rows of ``counts`` (r, steps)."""
    c = counts.double()
    out = {}
    for j, name in enumerate(_ops.CORRAL_SOLVE_STEPS):
        col = c[:, j]
        out[name] = {"mean": round(float(col.mean()), 3), "median": float(col.median()),
                     "p90": float(col.quantile(0.9)), "max": int(col.max()), "total": int(col.sum())}
    return out


def measure(n: int, d: int) -> dict:
    """One U* call on the GPU's code path, its corral_solve calls counted and timed."""
    V = embeddings.spherical(n, d, generator=torch.Generator().manual_seed(0))
    rounds = []
    with gpu_sequence_on_cpu():
        solve = _ops.corral_solve

        def counted(W, rows, cand, start, corral=None, **kw):
            steps = torch.zeros(rows.numel(), len(_ops.CORRAL_SOLVE_STEPS), dtype=torch.int64)
            begin = time.process_time()
            out = solve(W, rows, cand, start, corral, steps=steps, **kw)
            rounds.append({"rows": rows.numel(), "candidates": cand.shape[1],
                           "warm_width": 0 if corral is None else corral[0].shape[1],
                           "cpu_seconds": round(time.process_time() - begin, 4), "steps": _summary(steps)})
            return out

        _ops.corral_solve = counted
        try:
            begin = time.process_time()
            _, rho = ustar.margin_optimal_outputs(V, backend="kernels")
            cpu = time.process_time() - begin
        finally:
            _ops.corral_solve = solve
    return {"n": n, "d": d, "rho": rho, "cpu_seconds": round(cpu, 4),
            "corral_solve_cpu_seconds": round(sum(r["cpu_seconds"] for r in rounds), 4), "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096x128", help="comma-separated NxD")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--label", default="", help="kept beside the rows (e.g. before / after a change)")
    ap.add_argument("--out", type=Path, default=RESULTS / "corral_steps-cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"rows": []}
    doc["command"] = " ".join(["python", *sys.argv])
    for size in args.sizes.split(","):
        n, d = (int(x) for x in size.lower().split("x"))
        row = dict(measure(n, d), label=args.label, threads=args.threads, loadavg=list(os.getloadavg()),
                   environment=environment())
        print(json.dumps(row, indent=1))
        doc["rows"] = [r for r in doc["rows"] if (r["n"], r["d"], r.get("label", "")) != (n, d, args.label)] + [row]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
