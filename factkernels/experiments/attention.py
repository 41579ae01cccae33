"""Relational graph recognition experiments of seed 002 (§6–7, App. A) and the ``rgr-train`` command.

    factkernels experiment rgr-budget --scale quick --out runs/   # D_K* vs m log2(m)/d_model, h* vs m/d_model
    factkernels experiment rgr-value --scale quick --out runs/    # §7.2, Fig. 6: value channel MSE vs D_K per h
    factkernels experiment rgr-regular --scale quick --out runs/  # App. A.3: D_K* vs r m log2(m)/d_model
    factkernels experiment rgr-block --scale quick --out runs/    # §7.3: pre-LN block on frozen MiniLM tokens
    factkernels rgr-train --m 128 --d-model 32 --heads 4 --d-k 8 --seeds 3 --json out.json

Cells: rgr-budget and rgr-regular train one (m, d_model[, r], h) with every d_k of its ladder
(:func:`factkernels.attention.head_dim_ladder`) and all seeds as one batch; the summary finds D_K*
and h* per (m, d_model[, r]) with :func:`factkernels.attention.summarize_budget` (App. A.2).
Unlike :func:`factkernels.attention.search_budget` the cells do not cap the ladder once a larger
head count passed (cells are independent); the cap never changes D_K* or the h* interval.
rgr-value trains one (d_model, h) over its D_K; rgr-block one (D_K, h, seed).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import numpy as np

from ..attention.block import BlockConfig, train_block
from ..attention.training import (OBJECTIVES, QUICK_GRID, SEED_FITS, SEED_GRID, SEED_REGULAR_SLOPE, ConfigResult,
                                  TrainingConfig, fit_head_count, fit_key_budget, fit_through_origin,
                                  head_dim_ladder, summarize_budget, t_interval, train_runs)
from ..embeddings import token_embeddings
from ..environment import environment
from . import engine
from .engine import Claim, Finding

# ----------------------------------------------------------------------------- shared


def _training(config: dict) -> TrainingConfig:
    """The cell's TrainingConfig: the seed's protocol plus the cell's overrides; threads are the engine's."""
    return TrainingConfig(threads=None, **config.get("training", {}))


def _configs(config: dict) -> list[dict]:
    """Train one (m, d_model, h) cell over its d_k ladder and seeds; one ConfigResult dict per d_k."""
    runs = train_runs(config["m"], config["d_model"], config["heads"], config["head_dims"], config["seeds"],
                      _training(config), quiet=True)
    out = []
    for d_k in config["head_dims"]:
        mine = [r for r in runs if r.head_dim == d_k]
        out.append(ConfigResult(config["heads"], d_k, [r.test_f1 for r in mine], [r.seed for r in mine],
                                [r.steps for r in mine]).to_dict())
    return out


def run_ladder_cell(config: dict) -> dict:
    return {"configs": _configs(config)}


def _ladder_cells(pairs, head_counts, seeds, budget_range, training: dict, degree: int = 1) -> list[dict]:
    cells = []
    for m, d_model in pairs:
        for h in head_counts:
            low, high = budget_range
            dims = head_dim_ladder(m, d_model, h, (low * degree, high * degree))
            train = {**training, "degree": degree} if degree != 1 else dict(training)
            cells.append({"m": m, "d_model": d_model, "heads": h, "head_dims": dims, "seeds": list(seeds),
                          "training": train, **({"degree": degree} if degree != 1 else {})})
    return cells


def _points(cells: list[engine.Cell], by: tuple[str, ...]):
    """summarize_budget per group of cells sharing the ``by`` keys -> {group: BudgetPoint}."""
    groups: dict = {}
    for c in cells:
        key = tuple(c.config.get(k, 1) for k in by)
        groups.setdefault(key, []).extend(ConfigResult(d["num_heads"], d["head_dim"], d["test_f1"], d["seeds"],
                                                       d["steps"]) for d in c.result["configs"])
    return {key: summarize_budget(key[0], key[1], configs) for key, configs in sorted(groups.items())}


def _setting(cells: list[engine.Cell], paper: str) -> str:
    configs = [c.config for c in cells]
    pairs = sorted({(c["m"], c["d_model"]) for c in configs})
    heads = sorted({c["heads"] for c in configs})
    seeds = max(len(c["seeds"]) for c in configs)
    steps = sorted({c["training"].get("max_steps") or "Table 2" for c in configs}, key=str)
    return (f"(m, d_model) ∈ {pairs}, h ∈ {heads}, {seeds} seeds, step cut-off {', '.join(map(str, steps))}; "
            f"paper: {paper}")


def _dash(value) -> str:
    return "-" if value is None else str(value)


# ----------------------------------------------------------------------------- rgr-budget (§6.1, App. A.2)

BUDGET_CLAIMS = (
    Claim("002-sec6-dk-fit", "002", "§6.1, Fig. 3", "the minimal key budget follows D_K* ≈ c m log2(m) / d_model "
          "(max-over-heads, permutation graphs)", f"c = {SEED_FITS['key_budget_slope']}, R² = "
          f"{SEED_FITS['key_budget_r2']}"),
    Claim("002-sec6-hstar-fit", "002", "§6.1", "the best head count grows linearly with compression m / d_model",
          f"h* ≈ {SEED_FITS['heads_slope']} m/d_model {SEED_FITS['heads_intercept']} (R² = {SEED_FITS['heads_r2']})"),
)
_BUDGET_PAPER = "m ∈ {64..512}, d_model ∈ {16, 32, 64}, h ∈ {1..64}, 10 seeds, Table 2 cut-offs"


def _budget_grid(scale: str) -> list[dict]:
    if scale == "tiny":
        return _ladder_cells(((12, 12), (16, 8)), (1, 2), (0, 1), (0.8, 1.2),
                             {"max_steps": 100, "context_length": 8, "val_contexts": 50, "test_contexts": 100})
    grid = {"quick": QUICK_GRID, "seed": SEED_GRID}[scale]
    return _ladder_cells(grid.pairs, grid.head_counts, grid.seeds, grid.budget_range,
                         {"max_steps": grid.max_steps} if grid.max_steps else {})


def _summarize_budget(cells: list[engine.Cell]) -> dict:
    points = list(_points(cells, ("m", "d_model")).values())
    kb, hd = fit_key_budget(points), fit_head_count(points)
    setting = _setting(cells, _BUDGET_PAPER)
    claims = {}
    if kb is None:
        claims["002-sec6-dk-fit"] = Finding("no (m, d_model) reached F1 ≥ 0.99", setting, "not reproduced",
                                            "no D_K* found in the ladder")
    else:
        close = abs(kb.slope / SEED_FITS["key_budget_slope"] - 1) <= 0.25 and kb.r2 >= 0.9
        claims["002-sec6-dk-fit"] = Finding(f"c = {kb.slope:.3f}, R² = {kb.r2:.3f} over {kb.points} (m, d_model)",
                                            setting, "reproduced" if close else "partly",
                                            "c within 25% of 1.19 and R² ≥ 0.9" if close else
                                            "linear in m log2(m)/d_model, with another constant or more scatter")
    fewest_heads, most_heads = min(c.config["heads"] for c in cells), max(c.config["heads"] for c in cells)
    at_floor = [p for p in points if p.best_heads == fewest_heads]
    at_ceiling = [(p.m, p.d_model) for p in points if p.best_heads == most_heads]
    if hd is None:
        claims["002-sec6-hstar-fit"] = Finding("fewer than 2 compressions with an h*", setting, "not run",
                                               "needs D_K* at two or more m / d_model")
    else:
        claims["002-sec6-hstar-fit"] = Finding(
            f"h* ≈ {hd.slope:.2f} m/d_model {hd.intercept:+.2f} (R² = {hd.r2:.3f}, {hd.points} points)"
            + (f"; h* is the smallest head count tried at {len(at_floor)} point(s)" if at_floor else "")
            + (f"; h* = {most_heads}, the largest head count tried, at (m, d_model) = {at_ceiling}: the true h* may "
               "be larger there" if at_ceiling else ""),
            setting, "partly" if hd.slope > 0 else "not reproduced",
            "h* grows with compression; the quick grid's head counts are too few to fit the paper's line"
            if hd.slope > 0 else "h* does not grow with compression here")
    return {"points": [p.to_dict() for p in points],
            "fits": {"key_budget": kb and asdict(kb), "heads": hd and asdict(hd)}, "seed_fits": SEED_FITS,
            "claims": claims}


def _f1_curves(points: list[dict], value: str = "mean_f1", ylabel: str = "test micro-F1", threshold: float = 0.99):
    from .plotting import panels

    cols = min(3, len(points))
    fig, axes = panels(cols, nrows=-(-len(points) // cols), width=4.2, height=3.3)
    for ax, p in zip(axes, points):
        for h in sorted({c["num_heads"] for c in p["configs"]}):
            cs = sorted((c for c in p["configs"] if c["num_heads"] == h), key=lambda c: c["key_budget"])
            y = np.array([c[value] for c in cs])
            err = np.array([y - [c["ci_low"] for c in cs], [c["ci_high"] for c in cs] - y])
            ax.errorbar([c["key_budget"] for c in cs], y, yerr=np.maximum(err, 0), marker="o", ms=3, capsize=2,
                        label=f"h={h}")
        ax.axhline(threshold, color="gray", ls=":", lw=1)
        ax.set(xscale="log", xlabel="D_K = h d_k", ylabel=ylabel,
               title=f"m={p['m']}, d_model={p['d_model']}" + (f", r={p['degree']}" if "degree" in p else ""))
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    for ax in axes[len(points):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def _law_panel(ax, points: list[dict], x_key: str, fit: Optional[dict], paper_slope: float, xlabel: str) -> None:
    passed = [p for p in points if p["key_budget"] is not None]
    if passed:
        x = np.array([p[x_key] for p in passed])
        y = np.array([p["key_budget"] for p in passed])
        lo = np.array([p["key_budget_lower"] if p["key_budget_lower"] is not None else p["key_budget"] for p in passed])
        hi = np.array([p["key_budget_upper"] if p["key_budget_upper"] is not None else p["key_budget"] for p in passed])
        ax.errorbar(x, y, yerr=[y - lo, np.maximum(hi - y, 0)], fmt="o", capsize=3, label="measured D_K*")
        grid = np.linspace(0, x.max() * 1.05, 50)
        if fit is not None:
            ax.plot(grid, fit["slope"] * grid, label=f"fit {fit['slope']:.2f} x (R²={fit['r2']:.2f})")
        ax.plot(grid, paper_slope * grid, ls="--", label=f"paper {paper_slope} x")
        ax.legend(fontsize=8)
    ax.set(xlabel=xlabel, ylabel="D_K*")


def _heads_panel(ax, points: list[dict], x_key: str, fit: Optional[dict], paper: Optional[tuple], xlabel: str) -> None:
    with_heads = [p for p in points if p["best_heads"] is not None]
    if with_heads:
        lam = np.array([p[x_key] for p in with_heads])
        hs = np.array([p["best_heads"] for p in with_heads])
        rng = [p["heads_range"] for p in with_heads]
        ax.errorbar(lam, hs, yerr=[hs - [r[0] for r in rng], [r[1] for r in rng] - hs], fmt="o", capsize=3, label="h*")
        grid = np.linspace(0, lam.max() * 1.05, 50)
        if fit is not None:
            ax.plot(grid, fit["slope"] * grid + fit["intercept"],
                    label=f"fit {fit['slope']:.2f} λ {fit['intercept']:+.2f} (R²={fit['r2']:.2f})")
        if paper is not None:
            ax.plot(grid, paper[0] * grid + paper[1], ls="--", label=f"paper {paper[0]} λ {paper[1]:+}")
        ax.legend(fontsize=8)
    ax.set(xlabel=xlabel, ylabel="h*")


def _plot_budget(summary: dict, cells: list[engine.Cell]) -> dict:
    from .plotting import panels

    points = summary["points"]
    fig, (left, right) = panels(2)
    _law_panel(left, points, "scaling_x", summary["fits"]["key_budget"], SEED_FITS["key_budget_slope"],
               "x = m log2(m) / d_model")
    _heads_panel(right, points, "compression", summary["fits"]["heads"],
                 (SEED_FITS["heads_slope"], SEED_FITS["heads_intercept"]), "λ = m / d_model")
    fig.tight_layout()
    return {"rgr_budget_f1_curves": _f1_curves(points), "rgr_budget_scaling": fig}


engine.register(engine.Experiment(
    "rgr-budget", "minimal key budget D_K* vs m log2(m) / d_model and h* vs m / d_model (Sec. 6.1, App. A.2)",
    BUDGET_CLAIMS, _budget_grid, run_ladder_cell, _summarize_budget, _plot_budget, threads=1))


# ----------------------------------------------------------------------------- rgr-regular (App. A.3)

REGULAR_CLAIMS = (
    Claim("002-a3-regular-fit", "002", "App. A.3, Fig. 12", "on r-regular graphs D_K* collapses onto the edge "
          "budget x = r m log2(m) / d_model", f"D_K* ≈ {SEED_REGULAR_SLOPE} x over r ∈ {{1, 2, 4, 8, 16}}"),
    Claim("002-a3-regular-hstar", "002", "App. A.3, Fig. 10", "the number of heads needed grows about linearly "
          "with the edge compression r m / d_model", "linear least-squares trend"),
)


def _regular_grid(scale: str) -> list[dict]:
    if scale == "tiny":
        pairs, degrees, heads, seeds, rng = ((16, 16),), (1, 2), (2,), (0, 1), (0.5, 1.0)
        training = {"max_steps": 100, "context_length": 8, "val_contexts": 50, "test_contexts": 100}
    elif scale == "quick":
        pairs, degrees, heads, seeds, rng, training = ((64, 32),), (1, 2, 4), (2, 8), (0, 1, 2), (0.15, 2.0), \
            {"max_steps": 10_000}
    else:
        pairs, degrees, heads, seeds, rng, training = ((128, 32),), (1, 2, 4, 8, 16), (1, 2, 4, 8, 16, 32), \
            tuple(range(10)), (0.15, 2.0), {}
    return [c for r in degrees for c in _ladder_cells(pairs, heads, seeds, rng, training, degree=r)]


def _summarize_regular(cells: list[engine.Cell]) -> dict:
    points = []
    for (m, d_model, r), point in _points(cells, ("m", "d_model", "degree")).items():
        points.append(point.to_dict() | {"degree": r, "edge_scaling_x": r * point.scaling_x,
                                         "edge_compression": r * m / d_model})
    fit = fit_through_origin([p["edge_scaling_x"] for p in points], [p["key_budget"] for p in points])
    heads_tried = sorted({c.config["heads"] for c in cells})
    degrees = sorted({p["degree"] for p in points})
    setting = f"r ∈ {degrees}, " + _setting(cells, "m = 128, d_model = 32, fit over r ∈ {1, 2, 4, 8, 16} (the text "
                                            "scales r up to 32), seed count as in App. A.2")
    claims = {}
    if fit is None:
        claims["002-a3-regular-fit"] = Finding("no r reached F1 ≥ 0.99", setting, "not reproduced", "no D_K* found")
    else:
        close = abs(fit.slope / SEED_REGULAR_SLOPE - 1) <= 0.25 and fit.r2 >= 0.9
        missing = [p["degree"] for p in points if p["key_budget"] is None]
        full_range = max(degrees) >= 16
        claims["002-a3-regular-fit"] = Finding(
            f"D_K* ≈ {fit.slope:.3f} x (R² = {fit.r2:.3f}, {fit.points} degrees)"
            + (f"; no D_K* at r = {missing}" if missing else ""), setting,
            "reproduced" if close and not missing and full_range else "partly",
            ("slope within 25% of 0.46" if close else "linear in x with another constant")
            + ("" if full_range else f", over r ≤ {max(degrees)} only (the paper: up to 16)"))
    best = [(p["edge_compression"], p["best_heads"]) for p in points if p["best_heads"] is not None]
    floor = [h for _, h in best if h == heads_tried[0]]
    ours = ", ".join(f"r m/d = {x:g}: h* = {h}" for x, h in best) or "-"
    if len(best) < 2:
        claims["002-a3-regular-hstar"] = Finding(ours, setting, "not run", "needs h* at two or more degrees")
    elif len(floor) == len(best):
        claims["002-a3-regular-hstar"] = Finding(
            ours + f" (h* = {heads_tried[0]} is the smallest head count tried: an upper bound, not a measured optimum)",
            setting, "not run", f"h ∈ {heads_tried} only: h* sits at the smallest head count at every r, so this grid "
            "cannot show growth")
    else:
        grows = best[-1][1] > best[0][1]
        claims["002-a3-regular-hstar"] = Finding(ours, setting, "partly" if grows else "not reproduced",
                                                 "h* grows, over few head counts" if grows else
                                                 "h* does not grow with r m / d_model")
    return {"points": points, "fit": fit and asdict(fit), "seed_fit": {"slope": SEED_REGULAR_SLOPE},
            "claims": claims}


def _plot_regular(summary: dict, cells: list[engine.Cell]) -> dict:
    from .plotting import panels

    fig, (left, right) = panels(2)
    _law_panel(left, summary["points"], "edge_scaling_x", summary["fit"], SEED_REGULAR_SLOPE,
               "x = r m log2(m) / d_model")
    _heads_panel(right, summary["points"], "edge_compression", None, None, "r m / d_model")
    fig.tight_layout()
    return {"rgr_regular_f1_curves": _f1_curves(summary["points"]), "rgr_regular_scaling": fig}


engine.register(engine.Experiment(
    "rgr-regular", "D_K* on r-regular graphs vs the edge budget r m log2(m) / d_model (App. A.3)",
    REGULAR_CLAIMS, _regular_grid, run_ladder_cell, _summarize_regular, _plot_regular, threads=1))


# ----------------------------------------------------------------------------- rgr-value (§7.2, Fig. 6)

VALUE_CLAIMS = (
    Claim("002-fig6-value-heads", "002", "§7.2, Fig. 6", "with a value channel, h = 1 plateaus at high MSE at "
          "d_model = 16 while h ≥ 4 drives it down; at d_model = 32 the gap narrows",
          "m = 64: h ≥ 4 reaches far lower MSE than h = 1 at d_model = 16"),
)


def _value_grid(scale: str) -> list[dict]:
    m, dims, heads, budgets, seeds, training = {
        "tiny": (12, (12,), (1, 2), (4, 8), (0, 1), {"max_steps": 100, "context_length": 8, "val_contexts": 50,
                                                      "test_contexts": 100}),
        "quick": (64, (16, 32), (1, 4, 8), (16, 32, 64, 128), (0, 1, 2), {"max_steps": 10_000}),
        "seed": (64, (16, 32), (1, 2, 4, 8, 16), (16, 32, 64, 128, 256), (0, 1, 2), {}),
    }[scale]
    return [{"m": m, "d_model": d, "heads": h, "head_dims": [b // h for b in budgets if b % h == 0],
             "seeds": list(seeds), "training": {**training, "objective": "messages"}}
            for d in dims for h in heads if any(b % h == 0 for b in budgets)]


def run_value_cell(config: dict) -> dict:
    runs = train_runs(config["m"], config["d_model"], config["heads"], config["head_dims"], config["seeds"],
                      _training(config), quiet=True)
    return {"runs": [r.to_dict() for r in runs]}


def _summarize_value(cells: list[engine.Cell]) -> dict:
    rows = []
    for c in cells:
        for d_k in c.config["head_dims"]:
            mses = [r["test_mse"] for r in c.result["runs"] if r["head_dim"] == d_k]
            mean, low, high = t_interval(mses)
            rows.append({"d_model": c.config["d_model"], "num_heads": c.config["heads"],
                         "key_budget": d_k * c.config["heads"], "mean_mse": mean, "ci_low": low, "ci_high": high})
    rows.sort(key=lambda r: (r["d_model"], r["num_heads"], r["key_budget"]))
    budgets = sorted({r["key_budget"] for r in rows})
    smallest = min(r["d_model"] for r in rows)

    def mse(d_model, h, budget):
        return next((r["mean_mse"] for r in rows if (r["d_model"], r["num_heads"], r["key_budget"]) ==
                     (d_model, h, budget)), None)

    top = budgets[-1]
    heads = sorted({r["num_heads"] for r in rows})
    many = [h for h in heads if h >= 4]
    single, multi = mse(smallest, 1, top), min((mse(smallest, h, top) for h in many if mse(smallest, h, top)),
                                               default=None)
    configs = [c.config for c in cells]
    setting = (f"m = {configs[0]['m']}, d_model ∈ {sorted({c['d_model'] for c in configs})}, h ∈ {heads}, D_K ∈ "
               f"{budgets}, {len(configs[0]['seeds'])} seeds, cut-off "
               f"{configs[0]['training'].get('max_steps') or 'Table 2'} steps; paper: h ∈ {{1..16}}, D_K up to 256, "
               "20,000-step cut-off")
    per_dim = "; ".join(f"d_model={d}: " + ", ".join(f"h={h} {mse(d, h, top):.2f}" for h in heads
                                                      if mse(d, h, top) is not None)
                        for d in sorted({r["d_model"] for r in rows}))
    if single is None or multi is None:
        finding = Finding(per_dim or "-", setting, "not run", "needs h = 1 and h ≥ 4 at the largest D_K")
    else:
        better = multi < 0.8 * single
        finding = Finding(f"test MSE at D_K = {top}: {per_dim}", setting, "reproduced" if better else "not reproduced",
                          f"at d_model = {smallest} h ≥ 4 reaches {multi:.2f} vs h = 1 {single:.2f}")
    return {"rows": rows, "claims": {"002-fig6-value-heads": finding}}


def _plot_value(summary: dict, cells: list[engine.Cell]) -> dict:
    from .plotting import panels

    rows = summary["rows"]
    dims = sorted({r["d_model"] for r in rows})
    fig, axes = panels(len(dims), width=4.6, height=3.6)
    for ax, d_model in zip(axes, dims):
        mine = [r for r in rows if r["d_model"] == d_model]
        for h in sorted({r["num_heads"] for r in mine}):
            line = [r for r in mine if r["num_heads"] == h]
            y = np.array([r["mean_mse"] for r in line])
            err = np.array([y - [r["ci_low"] for r in line], [r["ci_high"] for r in line] - y])
            ax.errorbar([r["key_budget"] for r in line], y, yerr=np.maximum(err, 0), marker="o", ms=3, capsize=2,
                        label=f"h={h}")
        ax.set(yscale="log", xlabel="D_K = h d_k", ylabel="test MSE", title=f"d_model={d_model}")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return {"rgr_value_mse": fig}


engine.register(engine.Experiment(
    "rgr-value", "value channel: message-retrieval MSE vs D_K per h (Sec. 7.2, Fig. 6)",
    VALUE_CLAIMS, _value_grid, run_value_cell, _summarize_value, _plot_value, threads=1))


# ----------------------------------------------------------------------------- rgr-block (§7.3, Fig. 7)

BLOCK_CLAIMS = (
    Claim("002-fig7-block-heads", "002", "§7.3, Fig. 7", "in a pre-LN Transformer block, h ≥ 2 beats h = 1 at every "
          "key budget D_K", "m = 6144, GPT-2 embeddings: h = 1 saturates near 0.81 (or collapses); multi-head nears "
          "1 by D_K = 512"),
)


def _block_grid(scale: str) -> list[dict]:
    m, budgets, heads, seeds, block = {
        "tiny": (12, (8,), (1, 2), (0,), {"context_pairs": 2, "batch_size": 8, "max_steps": 20, "check_every": 10,
                                          "val_examples": 20, "test_examples": 20}),
        "quick": (256, (16, 64), (1, 4), (0, 1), {"context_pairs": 8, "max_steps": 1_500, "check_every": 250,
                                                  "val_examples": 500, "test_examples": 1000}),
        "seed": (6144, (64, 128, 256, 512), (1, 2, 4, 8), tuple(range(7)), {}),
    }[scale]
    return [{"m": m, "key_budget": b, "heads": h, "seed": s, "block": block} for b in budgets for h in heads
            for s in seeds]


def run_block_cell(config: dict) -> dict:
    table, tokens = token_embeddings(config["m"] + 1)
    run = train_block(config["m"], config["heads"], config["key_budget"], config["seed"],
                      BlockConfig(threads=None, **config["block"]), table=table, quiet=True)
    return {**run.to_dict(), "d_model": table.shape[1], "null_token": tokens[-1]}


def _summarize_block(cells: list[engine.Cell]) -> dict:
    rows = []
    for budget, h in sorted({(c.config["key_budget"], c.config["heads"]) for c in cells}):
        accs = [c.result["test_accuracy"] for c in cells if (c.config["key_budget"], c.config["heads"]) == (budget, h)]
        mean, low, high = t_interval(accs)
        rows.append({"key_budget": budget, "num_heads": h, "mean_accuracy": mean, "ci_low": low, "ci_high": high,
                     "per_seed": accs})
    wins = []
    for budget in sorted({r["key_budget"] for r in rows}):
        single = next((r["mean_accuracy"] for r in rows if r["key_budget"] == budget and r["num_heads"] == 1), None)
        multi = max((r["mean_accuracy"] for r in rows if r["key_budget"] == budget and r["num_heads"] > 1),
                    default=None)
        if single is not None and multi is not None:
            wins.append((budget, single, multi))
    c0 = cells[0].config
    setting = (f"m = {c0['m']} MiniLM tokens (d = {cells[0].result['d_model']}), ell = "
               f"{c0['block'].get('context_pairs', 16)}, {c0['block'].get('max_steps', 100_000)} steps, D_K ∈ "
               f"{sorted({c.config['key_budget'] for c in cells})}, h ∈ {sorted({c.config['heads'] for c in cells})}, "
               f"{len({c.config['seed'] for c in cells})} seeds; paper: GPT-2, m = 6144, ell = 16, 100,000 steps, "
               "7 seeds; NULL = the (m+1)-th token, not GPT-2's EOS")
    ours = "; ".join(f"D_K={b}: h=1 {s:.2f}, best h>1 {x:.2f}" for b, s, x in wins) or "-"
    if not wins:
        finding = Finding(ours, setting, "not run", "needs h = 1 and h > 1 at one D_K")
    else:
        all_win = all(x > s for _, s, x in wins)
        finding = Finding(ours, setting, "reproduced" if all_win else "partly",
                          "multi-head ahead at every D_K" if all_win else "multi-head not ahead at every D_K")
    return {"rows": rows, "claims": {"002-fig7-block-heads": finding}}


def _plot_block(summary: dict, cells: list[engine.Cell]) -> dict:
    from .plotting import panels

    fig, (ax,) = panels(1, width=4.6, height=3.6)
    rows = summary["rows"]
    for h in sorted({r["num_heads"] for r in rows}):
        line = [r for r in rows if r["num_heads"] == h]
        y = np.array([r["mean_accuracy"] for r in line])
        err = np.array([y - [r["ci_low"] for r in line], [r["ci_high"] for r in line] - y])
        ax.errorbar([r["key_budget"] for r in line], y, yerr=np.maximum(err, 0), marker="o", ms=3, capsize=2,
                    label=f"h={h}")
    ax.set(xlabel="D_K = h d_k", ylabel="test accuracy", title="pre-LN block, frozen MiniLM tokens")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    return {"rgr_block_accuracy": fig}


engine.register(engine.Experiment(
    "rgr-block", "pre-LN Transformer block on frozen MiniLM token embeddings, accuracy vs D_K per h (Sec. 7.3)",
    BLOCK_CLAIMS, _block_grid, run_block_cell, _summarize_block, _plot_block, threads=1))


# ----------------------------------------------------------------------------- the rgr-train command


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def run_rgr_train(args: argparse.Namespace) -> int:
    """Handler of ``rgr-train``: per-run test F1 (or MSE) and the mean with a 95% t-interval per d_k."""
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    config = TrainingConfig(context_length=args.context_length, target_rate=args.target_rate, lr=args.lr,
                            max_steps=args.steps, threads=args.threads, degree=args.degree, objective=args.objective,
                            message_dim=args.message_dim)
    start = time.perf_counter()
    runs = train_runs(args.m, args.d_model, args.heads, args.d_k, seeds, config, quiet=args.quiet)
    elapsed = time.perf_counter() - start
    print(f"m={args.m} d_model={args.d_model} h={args.heads} steps<={config.steps_for(args.m, args.d_model)} "
          f"({elapsed:.1f}s)")
    metric = "f1" if config.objective == "edges" else "mse"
    label = metric.upper()
    print(f"{'d_k':>5} {'D_K':>6} {'seed':>5} {'test ' + label:>8} {'val ' + label:>7} {'steps':>7} {'tau':>8}")
    for r in runs:
        print(f"{r.head_dim:>5} {r.key_budget:>6} {r.seed:>5} {getattr(r, 'test_' + metric):>8.4f} "
              f"{getattr(r, 'val_' + metric):>7.4f} {r.steps:>7} {r.heads.threshold:>8.3f}")
    summary = []
    for d_k in args.d_k:
        mean, low, high = t_interval([getattr(r, "test_" + metric) for r in runs if r.head_dim == d_k])
        summary.append({"head_dim": d_k, "key_budget": d_k * args.heads, f"mean_{metric}": mean, "ci_low": low,
                        "ci_high": high})
        print(f"d_k={d_k} D_K={d_k * args.heads}: mean test {label} {mean:.4f}  95% CI [{low:.4f}, {high:.4f}]")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"config": {"m": args.m, "d_model": args.d_model, "heads": args.heads, "head_dims": args.d_k,
                              "seeds": seeds, "training": asdict(config)},
                   "runs": [r.to_dict() for r in runs], "summary": summary, "elapsed_s": elapsed,
                   "environment": environment()}
        path.write_text(json.dumps(engine.clean_json(payload), indent=2, allow_nan=False))
        print(f"wrote {path}")
    return 0


def add_commands(subparsers) -> None:
    """Register the top-level ``rgr-train`` command (one batch of training runs, printed)."""
    d = TrainingConfig()
    train = subparsers.add_parser("rgr-train", help="train max-over-heads QK heads on a random permutation graph")
    train.add_argument("--m", type=int, default=128, help="number of items")
    train.add_argument("--d-model", type=int, default=32, help="embedding dimension")
    train.add_argument("--heads", type=int, default=4, help="number of heads h")
    train.add_argument("--d-k", type=_ints, default=[8], help="per-head width(s) d_k, e.g. 8 or 4,8,16")
    train.add_argument("--seeds", type=int, default=3, help="number of seeds (runs per d_k)")
    train.add_argument("--first-seed", type=int, default=0)
    train.add_argument("--degree", type=int, default=1, help="out-degree r: 1 permutation graph, > 1 r-regular")
    train.add_argument("--objective", choices=OBJECTIVES, default="edges",
                       help="edges: edge classification (F1); messages: value channel retrieval (MSE)")
    train.add_argument("--message-dim", type=int, default=None, help="d_msg of the value channel (default d_model)")
    train.add_argument("--json", help="write config, per-run results and environment to this JSON file")
    train.add_argument("--context-length", type=int, default=d.context_length, help="ell, items per context")
    train.add_argument("--target-rate", type=float, default=d.target_rate, help="rho, target-in-context rate")
    train.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate")
    train.add_argument("--steps", type=int, default=None, help="step cut-off (default: Table 2 of the seed)")
    train.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads while training")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.set_defaults(handler=run_rgr_train)


__all__ = ["add_commands", "run_block_cell", "run_ladder_cell", "run_rgr_train", "run_value_cell"]
