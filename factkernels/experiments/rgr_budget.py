"""Seed 002's base budget grid (Sec. 6.1, App. A.2) as engine cells, and a bracketing search over them.

One cell = one (m, d_model, h, d_k) configuration trained for a group of seeds (batched; each
seed's run is the run it would be alone), with the Table 2 step cut-off unless the config says
otherwise. ``summarize`` merges seed groups per configuration and gives, per (m, d_model), the
three D_K* estimates, h* with its paired-t-test interval, and both fits beside the seed's.

The seed's grid sweeps every h in {1, ..., 64} against several D_K with 10 seeds: days of CPU
time. ``search`` runs the cells that decide the estimates: for each head count a bracket on a
geometric D_K ladder (ratio 1.25 around the seed's law 1.19 m log2(m) / d_model), descending
while the F1 interval's high end still reaches 0.99 and ascending while its low end does not,
and never above 1.1x the best conservative D_K found so far (such cells cannot change any
estimate or the h* interval). Monotonicity in D_K at fixed h is assumed, as the seed's
threshold definition does.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Callable, Optional, Sequence

from ..attention.training import (PASS_F1, SEED_FITS, ConfigResult, TrainingConfig, fit_head_count,
                                  fit_key_budget, seed_law, step_cutoff, summarize_budget, t_interval,
                                  train_runs)
from . import engine

NAME = "rgr-budget"
LADDER_RATIO = 1.25
LADDER_RANGE = (-7, 5)  # rung k: D_K ~ seed_law * 1.25^k, k in [-7, 5) (0.21x to 2.4x the law)
SEED_PAIRS = tuple((m, d) for m in (64, 128, 256, 512) for d in (16, 32, 64))
SEED_HEADS = (1, 2, 4, 8, 16, 32, 64)

CLAIMS = (
    engine.Claim("002-dk-fit", "002", "§6.1, Fig. 3", "D_K* ~ c m log2(m) / d_model on the base grid",
                 "c = 1.19, R^2 = 0.944"),
    engine.Claim("002-heads-fit", "002", "§6.1, Fig. 10", "h* ~ a m / d_model + b on the base grid",
                 "a = 1.65, b = -6.64, R^2 = 0.824"),
)


def rung_heads_dim(m: int, d_model: int, heads: int, rung: int) -> int:
    """d_k of rung ``rung`` with ``heads`` heads: round(seed_law * 1.25^rung / h), at least 1."""
    return max(1, round(seed_law(m, d_model) * LADDER_RATIO ** rung / heads))


def cell_config(m: int, d_model: int, heads: int, head_dim: int, seeds: Sequence[int],
                max_steps: Optional[int] = None) -> dict:
    return {"m": m, "d_model": d_model, "heads": heads, "head_dim": head_dim, "seeds": list(seeds),
            "max_steps": step_cutoff(m, d_model) if max_steps is None else max_steps}


def _grid(scale: str) -> list[dict]:
    if scale == "tiny":
        return [cell_config(32, 16, h, d_k, (0, 1), 500) for h in (1, 2) for d_k in (4, 8)]
    if scale == "quick":
        pairs, heads, seeds, steps = ((64, 16), (64, 32), (128, 32)), (1, 2, 4, 8), (0, 1, 2), None
    else:
        pairs, heads, seeds, steps = SEED_PAIRS, SEED_HEADS, tuple(range(10)), None
    cells = []
    for m, d in pairs:
        for h in heads:
            dims = sorted({rung_heads_dim(m, d, h, k) for k in range(*LADDER_RANGE)})
            cells += [cell_config(m, d, h, d_k, seeds, steps) for d_k in dims]
    return cells


def _run_cell(config: dict) -> dict:
    runs = train_runs(config["m"], config["d_model"], config["heads"], [config["head_dim"]], config["seeds"],
                      TrainingConfig(max_steps=config["max_steps"]), quiet=True)
    return {"test_f1": [r.test_f1 for r in runs], "val_f1": [r.val_f1 for r in runs],
            "steps": [r.steps for r in runs], "early_stopped": [r.early_stopped for r in runs],
            "threshold": [r.heads.threshold for r in runs]}


def config_results(cells: Sequence[engine.Cell]) -> dict:
    """{(m, d_model): [ConfigResult]}, seed groups of one (h, d_k) merged in seed order."""
    merged: dict = {}
    for cell in cells:
        c, r = cell.config, cell.result
        per_seed = merged.setdefault((c["m"], c["d_model"], c["heads"], c["head_dim"]), {})
        for seed, f1, steps in zip(c["seeds"], r["test_f1"], r["steps"]):
            per_seed[seed] = (f1, steps)
    out: dict = {}
    for (m, d, h, d_k), per_seed in sorted(merged.items()):
        seeds = sorted(per_seed)
        out.setdefault((m, d), []).append(ConfigResult(h, d_k, [per_seed[s][0] for s in seeds], seeds,
                                                       [per_seed[s][1] for s in seeds]))
    return out


def _summarize(cells: list) -> dict:
    points = [summarize_budget(m, d, configs) for (m, d), configs in config_results(cells).items()]
    budget_fit, heads_fit = fit_key_budget(points), fit_head_count(points)
    seeds = sorted({len(c.seeds) for p in points for c in p.configs})
    setting = (f"{len(cells)} cells over (m, d_model) = {[(p.m, p.d_model) for p in points]}; seeds per "
               f"configuration {seeds}; Table 2 step cut-offs; bracketing D_K search (ratio 1.25) per h")
    claims = {}
    if budget_fit is not None:
        close = abs(budget_fit.slope - SEED_FITS["key_budget_slope"]) / SEED_FITS["key_budget_slope"] <= 0.25
        claims["002-dk-fit"] = engine.Finding(
            f"c = {budget_fit.slope:.3f}, R^2 = {budget_fit.r2:.3f} ({budget_fit.points} points)", setting,
            "reproduced" if close and budget_fit.r2 >= 0.9 else "partly",
            "slope within 25% of 1.19 and R^2 >= 0.9" if close and budget_fit.r2 >= 0.9
            else "law holds only loosely on the grid that ran")
    if heads_fit is not None:
        claims["002-heads-fit"] = engine.Finding(
            f"a = {heads_fit.slope:.2f}, b = {heads_fit.intercept:.2f}, R^2 = {heads_fit.r2:.3f} "
            f"({heads_fit.points} points)", setting,
            "reproduced" if heads_fit.slope > 0 and heads_fit.r2 >= 0.7 else "partly",
            "h* grows linearly with m / d_model" if heads_fit.slope > 0 else "no linear growth seen")
    return {"points": [p.to_dict() for p in points],
            "fits": {"key_budget": budget_fit and budget_fit.__dict__, "heads": heads_fit and heads_fit.__dict__},
            "seed_fits": SEED_FITS, "claims": claims}


def _plot(summary: dict, cells: list) -> dict:
    from .plotting import panels

    fig, (ax_k, ax_h) = panels(2)
    pts = [p for p in summary["points"] if p["key_budget"] is not None]
    xs = [p["scaling_x"] for p in pts]
    ax_k.errorbar(xs, [p["key_budget"] for p in pts], fmt="o",
                  yerr=[[p["key_budget"] - (p["key_budget_lower"] or p["key_budget"]) for p in pts],
                        [(p["key_budget_upper"] or p["key_budget"]) - p["key_budget"] for p in pts]])
    top = max(xs, default=1.0)
    fit = summary["fits"]["key_budget"]
    if fit:
        ax_k.plot([0, top], [0, fit["slope"] * top], "-", label=f"ours {fit['slope']:.2f} x")
    ax_k.plot([0, top], [0, SEED_FITS["key_budget_slope"] * top], "--", label="seed 1.19 x")
    ax_k.set(xlabel="m log2(m) / d_model", ylabel="D_K*")
    ax_k.legend()
    lam = [p["compression"] for p in pts]
    ax_h.plot(lam, [p["best_heads"] for p in pts], "o")
    fit = summary["fits"]["heads"]
    span = [min(lam, default=0.0), max(lam, default=1.0)]
    if fit:
        ax_h.plot(span, [fit["slope"] * x + fit["intercept"] for x in span], "-", label="ours")
    ax_h.plot(span, [SEED_FITS["heads_slope"] * x + SEED_FITS["heads_intercept"] for x in span], "--", label="seed")
    ax_h.set(xlabel="m / d_model", ylabel="h*")
    ax_h.legend()
    return {"rgr_budget": fig}


EXPERIMENT = engine.register(engine.Experiment(NAME, "seed 002 base budget grid: D_K* and h* fits (Sec. 6.1, App. A.2)",
                                               CLAIMS, _grid, _run_cell, _summarize, _plot))


# ----------------------------------------------------------------------------- bracketing search


def search_pair(m: int, d_model: int, head_counts: Sequence[int], seeds: Sequence[int],
                evaluate: Callable[[dict], dict], start_rung: int = -1,
                max_steps: Optional[int] = None) -> list[dict]:
    """Bracket D_K* of one (m, d_model): the configs it evaluated, in order (module docstring).

    Head counts run nearest to m / d_model first. ``evaluate(config) -> result`` (cached by the
    caller). Returns the configs evaluated.
    """
    order = sorted(head_counts, key=lambda h: (abs(math.log2(h) - math.log2(m / d_model)), -h))
    done: list[dict] = []
    best_upper = math.inf

    def low_high(h: int, rung: int) -> tuple[float, float, int]:
        config = cell_config(m, d_model, h, rung_heads_dim(m, d_model, h, rung), seeds, max_steps)
        result = evaluate(config)
        done.append(config)
        _, low, high = t_interval(result["test_f1"])
        return low, high, h * config["head_dim"]

    for h in order:
        rung = start_rung
        while rung > LADDER_RANGE[0] and h * rung_heads_dim(m, d_model, h, rung) > 1.1 * best_upper:
            rung -= 1
        if h * rung_heads_dim(m, d_model, h, rung) > 1.1 * best_upper:
            continue
        low, high, budget = low_high(h, rung)
        if low >= PASS_F1:
            best_upper = min(best_upper, budget)
        first_low, up = low, rung
        down = rung
        while high >= PASS_F1 and down - 1 >= LADDER_RANGE[0] and \
                rung_heads_dim(m, d_model, h, down - 1) < rung_heads_dim(m, d_model, h, down):
            down -= 1
            low, high, budget = low_high(h, down)
            if low >= PASS_F1:
                best_upper = min(best_upper, budget)
        low = first_low
        while low < PASS_F1 and up + 1 < LADDER_RANGE[1]:
            up += 1
            d_k = rung_heads_dim(m, d_model, h, up)
            if h * d_k > 1.1 * best_upper:
                break
            if d_k == rung_heads_dim(m, d_model, h, up - 1):
                continue
            low, high, budget = low_high(h, up)
            if low >= PASS_F1:
                best_upper = min(best_upper, budget)
    return done


def search(out: str, pairs: Sequence[tuple], seeds: Sequence[int], head_counts: Sequence[int] = SEED_HEADS,
           heads_window: Optional[int] = None, max_steps: Optional[int] = None, log: Callable = print) -> list[dict]:
    """Run ``search_pair`` for every pair, writing each cell into OUT/rgr-budget/cells as it finishes.

    heads_window: only head counts within this factor of m / d_model (and h = 1) are tried.
    """
    cached = engine.load_cells(out, NAME)

    def evaluate(config: dict) -> dict:
        key = engine.cell_key(config)
        if key not in cached:
            start = time.perf_counter()
            result = _run_cell(config)
            seconds = time.perf_counter() - start
            engine._write_cell(out, NAME, key, config, result, seconds)
            cached[key] = engine.Cell(key, config, result, seconds)
            log(f"{time.strftime('%H:%M:%S')} m={config['m']} d={config['d_model']} h={config['heads']} "
                f"d_k={config['head_dim']} D_K={config['heads'] * config['head_dim']} "
                f"f1={[round(f, 4) for f in result['test_f1']]} steps={result['steps']} {seconds:.1f}s")
        return cached[key].result

    configs = []
    for m, d in pairs:
        heads = [h for h in head_counts if heads_window is None or h == 1
                 or 1 / heads_window <= h / (m / d) <= heads_window]
        configs += search_pair(m, d, heads, seeds, evaluate, max_steps=max_steps)
    return configs


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="rgr-budget-search",
                                description="bracketing D_K* search on the seed 002 base grid, as engine cells")
    p.add_argument("--out", required=True)
    p.add_argument("--pairs", required=True, help="m:d_model,m:d_model,...")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--heads", default=",".join(map(str, SEED_HEADS)))
    p.add_argument("--heads-window", type=float, default=None)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    engine.set_threads(args.threads)
    pairs = [tuple(int(x) for x in pair.split(":")) for pair in args.pairs.split(",")]
    search(args.out, pairs, list(range(args.seeds)), [int(h) for h in args.heads.split(",")], args.heads_window,
           args.max_steps, log=lambda s: print(s, flush=True))
    return 0
