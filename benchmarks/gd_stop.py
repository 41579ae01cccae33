"""The GD MLP's stop test under the MSE loss: every fact's logits vs decoding radii.

    python benchmarks/gd_stop.py                 # writes benchmarks/results/gd_stop.json
    python benchmarks/gd_stop.py --facts 1024

A GD MLP trained with MSE (the fact experts of the LM, seed 000 App. A.3.2) stops at the first step
where every fact decodes, argmax_j <o_i, v_j> = f(i). The plain test computes all (F, |V|) logits
every step; ``all_decoded_near`` settles each row whose output lies within its target's decoding
radius without logits and decodes the rest farthest first, stopping at the first miss. This races
the two on the LM's geometry (F books and F authors on the unit sphere, |V| = 2F, d = 64) with
outputs o_i = v_f(i) + noise, from far (early training: most rows miss) to near (late: every row
decodes), and checks that they agree. One torch thread; each figure is the fastest of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from factkernels.baselines.stacked_swiglu import all_decoded, all_decoded_near, decoding_radii
from factkernels.environment import environment

RESULTS = Path(__file__).resolve().parent / "results"
NOISE = (1.0, 0.3, 0.1, 0.05, 0.02)  # per-coordinate noise; a unit value's radius is ~0.5 at d = 64


def _fastest(run, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return min(times), out


def race(*, facts: int, d: int, repeats: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    values = torch.nn.functional.normalize(torch.randn(1, 2 * facts, d, generator=generator), dim=2)
    targets = (torch.randperm(facts, generator=generator) + facts).unsqueeze(0)  # books -> authors
    wanted = values[:, targets[0]]
    start = time.perf_counter()
    radii = decoding_radii(values, targets)
    radii_seconds = time.perf_counter() - start
    rows = []
    for noise in NOISE:
        outputs = wanted + noise * torch.randn(wanted.shape, generator=generator)
        errors = (outputs - wanted).square().sum(2)
        full_seconds, full = _fastest(lambda: all_decoded(outputs, values, targets), repeats)
        near_seconds, near = _fastest(lambda: all_decoded_near(outputs, values, targets, errors, radii), repeats)
        if not torch.equal(full, near):
            raise AssertionError(f"the tests disagree at noise {noise}")
        decoded = (torch.bmm(outputs, values.transpose(1, 2)).argmax(2) == targets).double().mean()
        rows.append({"noise": noise, "rows_decoded": float(decoded),
                     "rows_inside_radius": float((errors < radii.square()).double().mean()),
                     "all_decoded": bool(full[0]), "full_seconds": full_seconds, "radius_seconds": near_seconds,
                     "speedup": full_seconds / near_seconds})
        print(json.dumps(rows[-1]), flush=True)
    return {"setting": {"facts": facts, "values": 2 * facts, "d": d, "repeats": repeats},
            "radii_seconds_once_per_fit": radii_seconds,
            "median_radius": float(radii.median()), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=4096)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "gd_stop.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    payload = race(facts=args.facts, d=args.d, repeats=args.repeats)
    payload.update(threads=1, loadavg_before=load_before, loadavg_after=os.getloadavg(), environment=environment())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
