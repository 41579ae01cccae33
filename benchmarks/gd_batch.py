"""GD cost searches with every seed of a size trained as one batch vs one model at a time.

    python benchmarks/gd_batch.py                       # writes benchmarks/results/gd_batch.json
    python benchmarks/gd_batch.py --d 16 --facts 64 --seeds 3 --gd-steps 3000

For each GD method ("gd" and the hybrids "gd+jl", "bin+gd", "gd+gd") it runs
:func:`factkernels.capacity.sampled_storage_cost` twice on the same sampled fact sets:
``batch=True`` (one stacked model per size) and ``batch=False`` (one model per seed, stopping at
the first seed that fails), checks both find the same size, and records the wall times. A third
figure, "every_seed", trains every seed of every size the search visited one model at a time
(the plain loop the batch replaces, without the serial search's early stop at a failing seed).
One torch thread (as the experiments run). Each figure is the fastest of ``--repeats`` runs, the
modes taking turns, so that load from other processes shows up as spread (every run is recorded)
rather than as a speedup.

"step_cost" measures what a batch can save at most: seconds per Adam step of B GD MLPs trained as
one batch (B = 1, 3, 9, 21; a width that stores no fact set here, so no model stops early), its
ratio to one model's step, and the ceiling B / ratio on the speedup of training B models at once.
"step_cost_by_size" measures the same for B = 1 and 3 at larger fact sets (F = |V| = 256, 1,024 and 2,048):
where the ratio nears or passes 3, a batch saves nothing on this device, which is where the searches'
``batch="auto"`` trains one model at a time (``capacity.SERIAL_LOGITS``).

"loss_kernel" races the GD MLP's cross-entropy through the compiled kernel (``_ops.softmax_cross_entropy``)
against its torch twin: seconds per step of gd_mlp_batch with ``backend="kernels"`` and ``"torch"``, at the
three sizes of "step_cost_by_size" (B = 3, 3 and 1 models).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from factkernels.baselines import gd_mlp_batch
from factkernels.capacity import methods, sampled_storage_cost
from factkernels.embeddings import family_fact_set
from factkernels.environment import environment

RESULTS = Path(__file__).resolve().parent / "results"


def _every_seed_seconds(method: str, sample, seeds: int, sizes: list[int], options: dict) -> float:
    """Wall time to train every seed of every size in ``sizes`` one model at a time (fact sets drawn and
    prepared first, as the search does, and not timed)."""
    spec = methods[method]
    cases = []
    for seed in range(seeds):
        K, V, f = sample(seed=seed)
        cases.append((K, V, f, seed, spec.prepared(K, V, f, options)))
    start = time.perf_counter()
    for size in sizes:
        for K, V, f, seed, prepared in cases:
            spec(K, V, f, size, seed, **prepared)
    return time.perf_counter() - start


STEP_COST_BATCHES = (1, 3, 9, 21)
STEP_COST_SIZES = ((256, 32, 100), (1024, 32, 40), (2048, 64, 20))  # (F, d, steps timed)


def step_costs(*, d: int, facts: int, steps: int, repeats: int, device: str = "cpu", hidden: int = 2,
               batches: tuple[int, ...] = STEP_COST_BATCHES) -> list[dict]:
    """Seconds per step of B GD MLPs (width ``hidden``) trained as one batch for ``steps`` steps, for B in
    ``batches`` (fastest of ``repeats``), with the ratio to B = 1 and the ceiling B / ratio."""
    fact_sets = [tuple(t.to(device) for t in family_fact_set("spherical", facts, d, seed=seed))
                 for seed in range(max(batches))]
    rows = []
    for models in batches:
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            mlps = gd_mlp_batch(fact_sets[:models], hidden, list(range(models)), steps=steps, progress=False)
            runs.append(time.perf_counter() - start)
            if any(m.fit_results["mlp"].steps != steps for m in mlps):
                raise RuntimeError(f"a width-{hidden} model stopped early: pick a width that stores nothing")
        rows.append({"models": models, "seconds_per_step": min(runs) / steps, "runs": runs})
    for row in rows:
        row["cost_vs_one"] = row["seconds_per_step"] / rows[0]["seconds_per_step"]
        row["ceiling"] = row["models"] / row["cost_vs_one"]
    return rows


LOSS_RACE_MODELS = (3, 3, 1)  # models per batch at each size of STEP_COST_SIZES


def loss_kernel_race(*, repeats: int, device: str = "cpu") -> list[dict]:
    """Seconds per GD step (width 2: no model stops early) with the loss kernel and with its torch twin,
    the modes taking turns, fastest of ``repeats``; speedup = torch / kernels."""
    rows = []
    for (facts, d, steps), models in zip(STEP_COST_SIZES, LOSS_RACE_MODELS):
        fact_sets = [tuple(t.to(device) for t in family_fact_set("spherical", facts, d, seed=seed))
                     for seed in range(models)]
        row = {"facts": facts, "d": d, "models": models, "steps": steps}
        for _ in range(repeats):
            for backend in ("kernels", "torch"):
                start = time.perf_counter()
                gd_mlp_batch(fact_sets, 2, list(range(models)), steps=steps, progress=False, backend=backend)
                runs = row.setdefault(backend, {"runs": []})["runs"]
                runs.append((time.perf_counter() - start) / steps)  # fit reads the loss back every step
                row[backend]["seconds_per_step"] = min(runs)
        row["speedup"] = row["torch"]["seconds_per_step"] / row["kernels"]["seconds_per_step"]
        rows.append(row)
    return rows


def step_costs_by_size(*, repeats: int, device: str = "cpu") -> list[dict]:
    """:func:`step_costs` for B = 1 and 3 at each (F, d) of STEP_COST_SIZES."""
    return [{"facts": facts, "d": d, "rows": step_costs(d=d, facts=facts, steps=steps, repeats=repeats, device=device,
                                                        batches=(1, 3))}
            for facts, d, steps in STEP_COST_SIZES]


def race(methods: list[str], *, d: int, facts: int, seeds: int, gd_steps: int, repeats: int,
         device: str = "cpu") -> dict:
    """Batched vs one-at-a-time vs every-seed searches for each method on ``device``: rows and totals."""
    def sample(seed: int):
        return tuple(t.to(device) for t in family_fact_set("spherical", facts, d, seed=seed))
    rows = []
    for method in methods:
        options = {"steps": gd_steps} if method == "gd" else {}
        row = {"method": method}
        for _ in range(repeats):
            for name, batch in (("batched", True), ("one_at_a_time", False)):
                start = time.perf_counter()
                cost = sampled_storage_cost(method, sample, seeds=seeds, progress=False, batch=batch, **options)
                runs = row.setdefault(name, {"runs": []})["runs"]
                runs.append(time.perf_counter() - start)  # the search reads every accuracy back: synchronized
                row[name].update(seconds=min(runs), size=cost.size, parameters=cost.parameters,
                                 sizes_tried=[t.size for t in cost.trace])
            runs = row.setdefault("every_seed", {"runs": []})["runs"]
            runs.append(_every_seed_seconds(method, sample, seeds, row["batched"]["sizes_tried"], options))
            row["every_seed"]["seconds"] = min(runs)
        row["same_size"] = row["batched"]["size"] == row["one_at_a_time"]["size"]
        row["speedup"] = row["one_at_a_time"]["seconds"] / row["batched"]["seconds"]
        row["speedup_vs_every_seed"] = row["every_seed"]["seconds"] / row["batched"]["seconds"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    total = {k: sum(r[k]["seconds"] for r in rows) for k in ("batched", "one_at_a_time", "every_seed")}
    return {"setting": {"family": "spherical", "d": d, "facts": facts, "seeds": seeds, "gd_steps": gd_steps,
                        "repeats": repeats, "device": device},
            "rows": rows, "total_seconds": total, "total_speedup": total["one_at_a_time"] / total["batched"],
            "total_speedup_vs_every_seed": total["every_seed"] / total["batched"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=16)
    parser.add_argument("--facts", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--gd-steps", type=int, default=3000, help="step cap of the GD MLP (the seed: 20000)")
    parser.add_argument("--methods", default="gd,gd+jl,bin+gd,gd+gd")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode; the fastest is reported")
    parser.add_argument("--device", default="cpu", help="where the models train (gpu_suite.py runs it on cuda)")
    parser.add_argument("--out", default=str(RESULTS / "gd_batch.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    payload = race(args.methods.split(","), d=args.d, facts=args.facts, seeds=args.seeds, gd_steps=args.gd_steps,
                   repeats=args.repeats, device=args.device)
    payload["step_cost"] = step_costs(d=args.d, facts=args.facts, steps=min(args.gd_steps, 500), repeats=args.repeats,
                                      device=args.device)
    payload["step_cost_by_size"] = step_costs_by_size(repeats=args.repeats, device=args.device)
    payload["loss_kernel"] = loss_kernel_race(repeats=args.repeats, device=args.device)
    payload["setting"]["threads"] = 1
    payload.update(loadavg_before=load_before, loadavg_after=os.getloadavg(), environment=environment())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    print(f"total speedup {payload['total_speedup']:.2f}x (vs every seed one at a time "
          f"{payload['total_speedup_vs_every_seed']:.2f}x) -> {args.out}")


if __name__ == "__main__":
    main()
