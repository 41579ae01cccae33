"""The CUDA corral_solve's variants raced against the current kernel on U*'s own calls (issue 33).

    python benchmarks/corral_race.py                                  # 4,096 x 128 and 65,536 x 256 on cuda
    python benchmarks/corral_race.py --sizes 4096x128 --repeats 9
    python benchmarks/corral_race.py --device cpu --sizes 512x32      # smoke run: "current" only (the C++ kernel)

Per size, U* runs once (spherical values, seed 0, float32, method auto, backend auto: on a GPU its rounds' corral
solves run the CUDA kernel, one call per round) and the inputs of its corral_solve calls are kept. Then each call
runs under every variant of ``_ops.CORRAL_SOLVE_CUDA_VARIANTS`` (csrc/cuda/corral_solve.cu says what each changes;
a CPU has "current" only): one warm-up, then ``repeats`` rounds in which the variants take turns (clock and
temperature drift fall on all of them alike), each call timed by CUDA events (wall time on a CPU). Per call and
variant: the median and fastest milliseconds, the speedup of the median against "current"'s, and whether the
outputs (U, lo, hi, corral, weights, dup) equal current's bit for bit (every variant should: same arithmetic). A
variant whose launch raises is recorded under "failed" with its error, and the others still race.
Per size and variant: the medians summed over the calls (U*'s corral time: 16.5 ms over 2 calls at 4,096 x 128 on
an H200 in session 28's run 1) and the speedup. Writes benchmarks/results/corral_race-<device>.json; gpu_suite.py's
"corral" section puts the same report into its JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from factkernels import _ops, embeddings, ustar
from factkernels.environment import environment

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = ((4096, 128), (65536, 256))


def _capture_calls(values: torch.Tensor) -> list[tuple[tuple, dict]]:
    """U* on ``values`` with the inputs of each of its corral_solve calls kept (cloned: the caller may reuse them)."""
    solve, calls = _ops.corral_solve, []

    def kept(*args, **kw):
        calls.append((tuple(None if a is None else (tuple(t.clone() for t in a) if isinstance(a, tuple) else a.clone())
                            for a in args), dict(kw)))
        return solve(*args, **kw)

    _ops.corral_solve = kept
    try:
        ustar.margin_optimal_outputs(values)
    finally:
        _ops.corral_solve = solve
    return calls


def _timed(call: tuple[tuple, dict], variant: str, device: torch.device):
    """One corral_solve of ``call`` under ``variant``: (milliseconds, flat outputs)."""
    args, kw = call
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        out = _ops.corral_solve(*args, **kw, cuda_variant=variant)
        end.record()
        end.synchronize()
        ms = begin.elapsed_time(end)
    else:
        start = time.perf_counter()
        out = _ops.corral_solve(*args, **kw, cuda_variant=variant)
        ms = 1e3 * (time.perf_counter() - start)
    return ms, out[:3] + out[3] + out[4:]


def race(device: torch.device, sizes=SIZES, repeats: int = 5) -> dict:
    """Every variant (on ``device``) on U*'s corral_solve calls at each of ``sizes`` ((n, d) pairs)."""
    variants = sorted(_ops.CORRAL_SOLVE_CUDA_VARIANTS, key=_ops.CORRAL_SOLVE_CUDA_VARIANTS.get)
    if device.type != "cuda":
        variants = ["current"]
    rows = []
    for n, d in sizes:
        values = embeddings.spherical(n, d, generator=torch.Generator().manual_seed(0)).to(device)
        calls = _capture_calls(values)
        call_rows, failed = [], {}
        for call in calls:
            args, kw = call
            reference = _timed(call, "current", device)[1]  # warm-up of "current", and the outputs to match
            same = {"current": True}
            for v in variants[1:]:  # warm-up (a variant's first launch loads its kernel), outputs compared
                if v in failed:
                    continue
                try:
                    same[v] = all(torch.equal(x, y) for x, y in zip(_timed(call, v, device)[1], reference))
                except RuntimeError:  # recorded: the other variants still race
                    failed[v] = traceback.format_exc()[-2000:]
                    print(f"corral_race {n}x{d} {v}: failed\n{failed[v]}", file=sys.stderr, flush=True)
            ms = {v: [] for v in same}
            for _ in range(repeats):
                for v in ms:
                    ms[v].append(_timed(call, v, device)[0])
            base = statistics.median(ms["current"])
            call_rows.append({"rows": int(args[1].numel()), "candidates": int(args[2].shape[1]),
                              "warm_width": 0 if len(args) < 5 or args[4] is None else int(args[4][0].shape[1]),
                              "variants": {v: {"median_ms": statistics.median(t), "min_ms": min(t), "ms": t,
                                               "speedup": base / statistics.median(t),
                                               "bit_identical": same[v]} for v, t in ms.items()}})
        timed = [v for v in variants if v not in failed]
        totals = {v: sum(c["variants"][v]["median_ms"] for c in call_rows) for v in timed}
        rows.append({"n": n, "d": d, "calls": call_rows, "failed": failed,
                     "total_median_ms": totals,
                     "speedup": {v: totals["current"] / totals[v] for v in timed},
                     "all_bit_identical": not failed and all(c["variants"][v]["bit_identical"]
                                                             for c in call_rows for v in timed)})
        print(json.dumps({"n": n, "d": d, "calls": len(call_rows), "total_median_ms": totals,
                          "all_bit_identical": rows[-1]["all_bit_identical"]}), flush=True)
    return {"variants": variants, "repeats": repeats, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sizes", default=",".join(f"{n}x{d}" for n, d in SIZES), help="comma-separated NxD")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/corral_race-<device>.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("corral_race: no CUDA device (--device cpu runs the smoke run)")
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    report = race(device, sizes, args.repeats)
    name = torch.cuda.get_device_name(device).replace(" ", "_") if device.type == "cuda" else "cpu"
    out = args.out or RESULTS / f"corral_race-{name}.json"
    report.update(environment=environment(), command=" ".join(["python", "benchmarks/corral_race.py"] + sys.argv[1:]))
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
