"""Construction II (compressive) micro-F1 over all m² pairs against d_model, at the default budgets.

    python benchmarks/construction2_f1.py [--sizes 256 1024 4096] [--dims 64 128 256 512]

Writes benchmarks/results/attention/construction2_f1.json (seed 0, permutation graphs, Gaussian
unit-norm X; cells with h = m/d_model < 1 are skipped), resumable: finished cells are kept.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from factkernels import attention
from factkernels.environment import environment

OUT = Path(__file__).resolve().parent / "results" / "attention" / "construction2_f1.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    done = json.loads(args.out.read_text())["cells"] if args.out.exists() else []
    have = {(c["m"], c["d_model"]) for c in done}
    for m in args.sizes:
        for d_model in args.dims:
            if d_model > m or (m, d_model) in have:
                continue
            graph = attention.random_graph(m, kind="permutation", seed=0)
            X = attention.gaussian_unit_norm(m, d_model, seed=0)
            start = time.perf_counter()
            heads = attention.construct(graph, X, method="compressive", seed=0)
            f1 = attention.f1(heads, graph, X)
            done.append({"m": m, "d_model": d_model, "h": heads.num_heads, "d_k": heads.head_dim,
                         "key_budget": heads.key_budget, "f1": float(f1), "seconds": time.perf_counter() - start})
            print(done[-1], flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"cells": done, "environment": environment()}, indent=2))


if __name__ == "__main__":
    main()
