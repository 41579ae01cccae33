"""The torch twin of ``_ops.star_topk`` (U*'s streaming pass) on this machine, one size at a time.

    python benchmarks/star_topk_twin.py                                  # 4,096 and 16,384 x 128, k = 96, 1 thread
    PYTHONPATH=/some/other/checkout python benchmarks/star_topk_twin.py --label before   # another checkout's twin

Writes benchmarks/results/star_topk_twin-<device>.json (rows merged by size, k, device and --label, so runs of two
checkouts sit side by side). Per size, unit-norm random values (seed 0), every value's own output (p_i = w_i):
seconds (best of --repeats after one warm-up call, wall and this process's CPU seconds), the GEMM-rate limit
of the pass (2 |V|^2 d FLOPs at this machine's square float32 GEMM rate) and the ratio, and the code that ran.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import factkernels
from factkernels import _ops
from factkernels.environment import code_version

RESULTS = Path(__file__).resolve().parent / "results"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_twin(device: torch.device, n: int, d: int, k: int, repeats: int, rate: float) -> dict:
    """Best wall and CPU seconds of ``star_topk(V, k, backend="torch")`` over all n values."""
    values = torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(0)), dim=1)
    values = values.to(device)
    best, best_cpu = float("inf"), float("inf")
    for trial in range(repeats + 1):  # trial 0 warms up
        sync(device)
        begin, begin_cpu = time.perf_counter(), time.process_time()
        _ops.star_topk(values, k, backend="torch")
        sync(device)
        if trial:
            best = min(best, time.perf_counter() - begin)
            best_cpu = min(best_cpu, time.process_time() - begin_cpu)
    limit = 2 * n * n * d / rate
    row = {"n": n, "d": d, "k": k, "seconds": best, "cpu_seconds": best_cpu, "limit": "2 n^2 d FLOPs at the "
           "square float32 GEMM rate", "limit_s": limit, "seconds_over_limit": best / limit}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", default="4096x128x96,16384x128x96", help="comma-separated |V|xdxk")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--label", default="after", help="names this checkout's rows (e.g. before, after)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench import device_info, gemm_rate

    out = Path(args.out) if args.out else RESULTS / f"star_topk_twin-{device.type}.json"
    report = json.loads(out.read_text()) if out.exists() else {"rows": []}
    report["environment"] = dict(device_info(device), threads=args.threads)
    report["command"] = "python benchmarks/star_topk_twin.py " + " ".join(sys.argv[1:])
    rate = gemm_rate(device)
    for size in args.sizes.split(","):
        n, d, k = (int(x) for x in size.split("x"))
        row = dict(time_twin(device, n, d, k, args.repeats, rate), label=args.label, code=code_version(),
                   device=str(device), threads=args.threads, gemm_float32_flops_per_s=rate)
        report["rows"] = [r for r in report["rows"] if (r["n"], r["d"], r["k"], r["label"], r["device"])
                          != (n, d, k, args.label, str(device))] + [row]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
