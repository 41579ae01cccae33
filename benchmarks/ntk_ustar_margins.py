"""Why NTK on the margin-optimal outputs U* is not cheaper than on V (seed 000 Fig. 5): signal vs cross-talk.

    python benchmarks/ntk_ustar_margins.py      # writes benchmarks/results/ntk_ustar_margins.json

For spherical fact sets (d = 32, F = |V| = 256, as the seed-scale ntk-ustar grid) and NTK widths around
the searched cost, the NTK MLP g is built on targets Y = V and Y = U*; at every key g(k_i) is split into
its part along the fact's own target, a_i y_f(i), and the rest e_i (cross-talk of the other keys plus
finite-width noise). Recorded per (fact set, width, targets), over several NTK seeds: accuracy, the
smallest decoding margin min_l <g(k_i), v_f(i) − v_l>, the same margin of the signal part alone, and
the mean norm of e relative to the signal's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from factkernels import ustar
from factkernels.baselines.ntk import ntk
from factkernels.embeddings import family_fact_set
from factkernels.environment import environment

RESULTS = Path(__file__).resolve().parent / "results"


def decode_margins(outputs: torch.Tensor, V: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """min over l != f(i) of <outputs_i, v_f(i) − v_l>: (F,) for outputs (F, d), values (|V|, d)."""
    scores = outputs @ V.T
    true = scores.gather(1, f[:, None]).squeeze(1)
    return true - scores.scatter(1, f[:, None], float("-inf")).max(1).values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--facts", type=int, default=256)
    parser.add_argument("--fact-sets", type=int, default=3)
    parser.add_argument("--ntk-seeds", type=int, default=4)
    parser.add_argument("--widths", default="3072,6144,8192,12288,65536")
    parser.add_argument("--out", default=str(RESULTS / "ntk_ustar_margins.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for fact_set in range(args.fact_sets):
        K, V, f = (t.double() if t.is_floating_point() else t
                   for t in family_fact_set("spherical", args.facts, args.d, seed=fact_set))
        U, rho = ustar.margin_optimal_outputs(V)
        for width in (int(w) for w in args.widths.split(",")):
            for name, targets in (("V", V), ("U*", U)):
                runs = []
                for seed in range(args.ntk_seeds):
                    mlp = ntk(K, V, f, hidden=width, margin_optimal=name == "U*", seed=seed)
                    with torch.no_grad():
                        g = mlp(K)
                    y = targets[f]
                    a = (g * y).sum(1) / (y * y).sum(1)
                    signal = a[:, None] * y
                    margins = decode_margins(g, V, f)
                    runs.append({"accuracy": float((margins > 0).double().mean()), "min_margin": float(margins.min()),
                                 "signal_min_margin": float(decode_margins(signal, V, f).min()),
                                 "crosstalk_over_signal": float((g - signal).norm(dim=1).mean()
                                                                / signal.norm(dim=1).mean())})
                row = {"fact_set": fact_set, "rho": rho, "width": width, "targets": name,
                       **{k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}, "runs": runs}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    payload = {"setting": {"family": "spherical", "d": args.d, "facts": args.facts, "fact_sets": args.fact_sets,
                           "ntk_seeds": args.ntk_seeds, "threads": 1},
               "rows": rows, "environment": environment()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
