"""Command line for relational graph recognition (seed 002).

    factkernels rgr-train --m 128 --d-model 32 --heads 4 --d-k 8 --seeds 3 --json out.json
    factkernels rgr-train --degree 4 ...              # r-regular graph (App. A.3)
    factkernels rgr-train --objective messages ...    # value channel, message-retrieval MSE (Sec. 7.2)
    factkernels experiment rgr-budget --quick --out results/
    factkernels experiment rgr-value --quick          # Fig. 6: MSE vs D_K per h
    factkernels experiment rgr-regular --quick        # App. A.3: D_K* vs r m log2(m) / d_model
    factkernels experiment rgr-block --quick          # Sec. 7.3: pre-LN block on frozen MiniLM tokens

``add_subcommands(subparsers)`` registers them; every parser sets ``handler``, so the
top-level ``main`` runs ``args.handler(args)`` and returns its exit status. Every report is
written through ``factkernels.results`` (JSON with the environment, PNG figures).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

import numpy as np

from ..results import save_figure, write_json
from .block import BlockConfig, block_experiment
from .training import (OBJECTIVES, QUICK_GRID, SEED_GRID, BudgetGrid, TrainingConfig, budget_experiment,
                       regular_experiment, t_interval, train_runs, value_experiment)

REPORT_NAME = "rgr_budget"


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected low,high, got {text!r}") from None
    if len(values) != 2 or not 0 < values[0] <= values[1]:
        raise argparse.ArgumentTypeError(f"expected 0 < low <= high, got {text!r}")
    return values


def _pairs(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(v) for v in p.split("x")) for p in text.split(",") if p]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected pairs like 64x16,128x32 (m x d_model), got {text!r}")
    return pairs


def _add_training_options(p: argparse.ArgumentParser) -> None:
    d = TrainingConfig()
    p.add_argument("--context-length", type=int, default=d.context_length, help="ell, items per context")
    p.add_argument("--target-rate", type=float, default=d.target_rate, help="rho, target-in-context rate")
    p.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate")
    p.add_argument("--steps", type=int, default=None, help="step cut-off (default: Table 2 of the seed)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads while training")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _training_config(args: argparse.Namespace) -> TrainingConfig:
    extra = {k: getattr(args, k) for k in ("degree", "objective", "message_dim") if hasattr(args, k)}
    return TrainingConfig(context_length=args.context_length, target_rate=args.target_rate, lr=args.lr,
                          max_steps=args.steps, threads=args.threads, **extra)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def add_subcommands(subparsers, experiment_subparsers=None) -> None:
    """Register ``rgr-train`` on ``subparsers`` and ``rgr-budget`` on ``experiment_subparsers``.

    Without ``experiment_subparsers`` an ``experiment`` command is created on ``subparsers``.
    """
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
    _add_training_options(train)
    train.set_defaults(handler=run_rgr_train)

    if experiment_subparsers is None:
        experiment = subparsers.add_parser("experiment", help="run an experiment; writes JSON and PNG")
        experiment_subparsers = experiment.add_subparsers(dest="experiment", required=True)
    budget = experiment_subparsers.add_parser(
        "rgr-budget", help="minimal key budget D_K* vs m log m / d_model, fits, CIs, plots")
    budget.add_argument("--quick", action="store_true",
                        help="small grid that runs in minutes on 2 CPU cores (default: the seed's grid, days on CPU)")
    budget.add_argument("--out", default="results/rgr-budget", help="output folder for JSON and PNG")
    budget.add_argument("--pairs", type=_pairs, default=None, help="override (m, d_model) pairs: 64x16,128x32")
    budget.add_argument("--heads", type=_ints, default=None, help="override head counts: 1,2,4,8")
    budget.add_argument("--seeds", type=int, default=None, help="override the number of seeds")
    budget.add_argument("--budget-range", type=_floats, default=None,
                        help="D_K tried, low,high multiples of the seed's law 1.19 m log2(m) / d_model")
    _add_training_options(budget)
    budget.set_defaults(handler=run_rgr_budget)

    value = experiment_subparsers.add_parser("rgr-value", help="value channel: message-retrieval MSE vs D_K per h "
                                             "(Sec. 7.2, Fig. 6)")
    _add_experiment_options(value, "results/rgr-value", "m = 64, d_model 16 and 32, h in 1,4,8, D_K 16..128, "
                            "10,000-step cut-off")
    value.add_argument("--message-dim", type=int, default=None, help="d_msg (default d_model)")
    _add_training_options(value)
    value.set_defaults(handler=run_rgr_value)

    regular = experiment_subparsers.add_parser("rgr-regular", help="D_K* on r-regular graphs vs r m log2(m) / "
                                               "d_model (App. A.3)")
    _add_experiment_options(regular, "results/rgr-regular", "m = 64, d_model = 32, r in 1,2,4, h in 2,8, "
                            "10,000-step cut-off")
    _add_training_options(regular)
    regular.set_defaults(handler=run_rgr_regular)

    block = experiment_subparsers.add_parser("rgr-block", help="pre-LN Transformer block on frozen MiniLM token "
                                             "embeddings, accuracy vs D_K per h (Sec. 7.3)")
    _add_experiment_options(block, "results/rgr-block", "m = 256, ell = 8, D_K 16 and 64, h 1 and 4, 1,500 steps")
    block.add_argument("--steps", type=int, default=None, help="training steps (default 100,000; quick 1,500)")
    block.add_argument("--threads", type=int, default=1, help="torch CPU threads while training")
    block.add_argument("--quiet", action="store_true", help="no progress bars")
    block.set_defaults(handler=run_rgr_block)


def _add_experiment_options(p: argparse.ArgumentParser, out: str, quick: str) -> None:
    p.add_argument("--quick", action="store_true", help=f"a grid for 2 CPU cores: {quick} (default: the seed's)")
    p.add_argument("--out", default=out, help="output folder for JSON and PNG")
    p.add_argument("--seeds", type=int, default=None, help="override the number of seeds")


def run_rgr_train(args: argparse.Namespace) -> int:
    """Handler of ``rgr-train``: per-run test F1 (or MSE) and the mean with a 95% t-interval per d_k."""
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    config = _training_config(args)
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
        payload = {"config": {"m": args.m, "d_model": args.d_model, "heads": args.heads, "head_dims": args.d_k,
                              "seeds": seeds, "training": asdict(config)},
                   "runs": [r.to_dict() for r in runs], "summary": summary, "elapsed_s": elapsed}
        print(f"wrote {write_json(path.parent, path.stem, payload)}")
    return 0


def _grid(args: argparse.Namespace) -> BudgetGrid:
    grid = QUICK_GRID if args.quick else SEED_GRID
    if args.pairs:
        grid = replace(grid, pairs=tuple(args.pairs))
    if args.heads:
        grid = replace(grid, head_counts=tuple(args.heads))
    if args.seeds:
        grid = replace(grid, seeds=tuple(range(args.seeds)))
    if args.budget_range:
        grid = replace(grid, budget_range=tuple(args.budget_range))
    if args.steps:
        grid = replace(grid, max_steps=args.steps)
    return grid


def run_rgr_budget(args: argparse.Namespace) -> int:
    """Handler of ``experiment rgr-budget``: budget search, fits, JSON and PNG into ``--out``."""
    start = time.perf_counter()
    report = budget_experiment(_grid(args), _training_config(args), quiet=args.quiet)
    report["elapsed_s"] = time.perf_counter() - start
    print(format_budget_report(report))
    return _write(args.out, REPORT_NAME, report, plot_budget_report(report))


def _write(out: str, name: str, report: dict, figures: dict) -> int:
    """Write ``report`` as out/name.json and each figure as out/<key>.png; print the paths."""
    for key, fig in figures.items():
        print(f"wrote {save_figure(fig, out, key)}")
    print(f"wrote {write_json(out, name, report)}")
    return 0


def _seeds(args: argparse.Namespace, default: int) -> list[int]:
    return list(range(args.seeds if args.seeds else default))


def run_rgr_value(args: argparse.Namespace) -> int:
    """Handler of ``experiment rgr-value`` (Sec. 7.2)."""
    config = _training_config(args)
    config = replace(config, max_steps=config.max_steps or (10_000 if args.quick else None))
    grid = ((64, (16, 32), (1, 4, 8), (16, 32, 64, 128), 3) if args.quick else
            (64, (16, 32), (1, 2, 4, 8, 16), (16, 32, 64, 128, 256), 3))
    m, dims, heads, budgets, seeds = grid
    start = time.perf_counter()
    report = value_experiment(m, dims, heads, budgets, _seeds(args, seeds), config, quiet=args.quiet)
    report["elapsed_s"] = time.perf_counter() - start
    print(f"{'d_model':>7} {'h':>3} {'D_K':>5} {'mean MSE':>9} {'95% CI':>18}")
    for row in report["summary"]:
        print(f"{row['d_model']:>7} {row['num_heads']:>3} {row['key_budget']:>5} {row['mean_mse']:>9.4f} "
              f"[{row['ci_low']:.4f}, {row['ci_high']:.4f}]")
    return _write(args.out, "rgr_value", report,
                  {"rgr_value_mse": _curves(report["summary"], "d_model", "mean_mse", "test MSE", log_y=True)})


def run_rgr_regular(args: argparse.Namespace) -> int:
    """Handler of ``experiment rgr-regular`` (App. A.3)."""
    config = _training_config(args)
    config = replace(config, max_steps=config.max_steps or (10_000 if args.quick else None))
    m, d_model, degrees, heads, seeds = ((64, 32, (1, 2, 4), (2, 8), 3) if args.quick else
                                         (128, 32, (1, 2, 4, 8, 16), (1, 2, 4, 8, 16, 32), 10))
    start = time.perf_counter()
    report = regular_experiment(m, d_model, degrees, heads, _seeds(args, seeds), config, quiet=args.quiet)
    report["elapsed_s"] = time.perf_counter() - start
    print(f"{'r':>3} {'x=r m log2 m/d':>14} {'D_K* lo':>8} {'D_K*':>6} {'D_K* up':>8} {'h*':>4}")
    for p in report["points"]:
        print(f"{p['degree']:>3} {p['edge_scaling_x']:>14.1f} {_dash(p['key_budget_lower']):>8} "
              f"{_dash(p['key_budget']):>6} {_dash(p['key_budget_upper']):>8} {_dash(p['best_heads']):>4}")
    fit = report["fit"]
    print("D_K* ~ c r m log2(m) / d_model: " + ("no point passed" if fit is None else
          f"c = {fit['slope']:.3f} (R^2 = {fit['r2']:.3f}, {fit['points']} points)") +
          f"   seed: c = {report['seed_fit']['slope']}")
    return _write(args.out, "rgr_regular", report, {"rgr_regular_scaling": _regular_figure(report)})


def run_rgr_block(args: argparse.Namespace) -> int:
    """Handler of ``experiment rgr-block`` (Sec. 7.3)."""
    if args.quick:
        m, budgets, heads, seeds = 256, (16, 64), (1, 4), 2
        config = BlockConfig(context_pairs=8, max_steps=1_500, check_every=250, val_examples=500,
                             test_examples=1000, threads=args.threads)
    else:
        m, budgets, heads, seeds = 6144, (64, 128, 256, 512), (1, 2, 4, 8), 7
        config = BlockConfig(threads=args.threads)
    if args.steps:
        config = replace(config, max_steps=args.steps)
    start = time.perf_counter()
    report = block_experiment(m, budgets, heads, _seeds(args, seeds), config, quiet=args.quiet)
    report["elapsed_s"] = time.perf_counter() - start
    summary = []
    for budget in budgets:
        for h in heads:
            accs = [r["test_accuracy"] for r in report["runs"] if (r["key_budget"], r["num_heads"]) == (budget, h)]
            mean, low, high = t_interval(accs)
            summary.append({"key_budget": budget, "num_heads": h, "mean_accuracy": mean, "ci_low": low,
                            "ci_high": high, "per_seed": accs})
            print(f"D_K={budget:>4} h={h:>2}: mean test accuracy {mean:.4f} [{low:.4f}, {high:.4f}]  per seed "
                  + " ".join(f"{a:.3f}" for a in accs))
    report["summary"] = summary
    report["seed_claim"] = ("Fig. 7 (m = 6144, d_model = 768, GPT-2): at every D_K, h >= 2 beats h = 1; h = 1 "
                            "saturates near 0.81 or collapses to 0 for D_K >= 256; multi-head nears 1 by D_K = 512")
    return _write(args.out, "rgr_block", report,
                  {"rgr_block_accuracy": _curves(summary, None, "mean_accuracy", "test accuracy")})


def _curves(summary: list, panel_key: Optional[str], value_key: str, ylabel: str, log_y: bool = False):
    """Mean +- 95% CI of ``value_key`` against D_K, one line per head count, one panel per ``panel_key``."""
    plt = _plt()
    panels = sorted({row[panel_key] for row in summary}) if panel_key else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        rows = [row for row in summary if panel_key is None or row[panel_key] == panel]
        for h in sorted({row["num_heads"] for row in rows}):
            line = sorted((row for row in rows if row["num_heads"] == h), key=lambda row: row["key_budget"])
            y = np.array([row[value_key] for row in line])
            err = np.array([y - [row["ci_low"] for row in line], [row["ci_high"] for row in line] - y])
            ax.errorbar([row["key_budget"] for row in line], y, yerr=np.maximum(err, 0), marker="o", ms=3,
                        capsize=2, label=f"h={h}")
        ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("D_K = h d_k")
        ax.set_ylabel(ylabel)
        if panel_key:
            ax.set_title(f"{panel_key}={panel}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _regular_figure(report: dict):
    """D_K* (with its lower / upper estimates) against x = r m log2(m) / d_model, our fit and the seed's 0.46 x."""
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    passed = [p for p in report["points"] if p["key_budget"] is not None]
    if passed:
        x = np.array([p["edge_scaling_x"] for p in passed])
        y = np.array([p["key_budget"] for p in passed])
        lo = np.array([p["key_budget_lower"] or p["key_budget"] for p in passed])
        hi = np.array([p["key_budget_upper"] or p["key_budget"] for p in passed])
        left.errorbar(x, y, yerr=[y - lo, np.maximum(hi - y, 0)], fmt="o", capsize=3, label="measured D_K*")
        for p in passed:
            left.annotate(f"r={p['degree']}", (p["edge_scaling_x"], p["key_budget"]), fontsize=7)
        grid = np.linspace(0, x.max() * 1.05, 50)
        fit = report["fit"]
        left.plot(grid, fit["slope"] * grid, label=f"fit {fit['slope']:.2f} x (R²={fit['r2']:.2f})")
        left.plot(grid, report["seed_fit"]["slope"] * grid, ls="--", label=f"seed {report['seed_fit']['slope']} x")
        left.legend(fontsize=8)
        right.plot([p["edge_compression"] for p in passed], [p["best_heads"] for p in passed], "o")
    left.set_xlabel("x = r m log2(m) / d_model")
    left.set_ylabel("D_K*")
    right.set_xlabel("r m / d_model")
    right.set_ylabel("h*")
    fig.tight_layout()
    return fig


def format_budget_report(report: dict) -> str:
    """A table of D_K* (lower / central / upper) and h* per (m, d_model), then both fits beside the seed's."""
    lines = [f"{'m':>5} {'d_model':>7} {'x=m log2 m/d':>12} {'D_K* lo':>8} {'D_K*':>6} {'D_K* up':>8} {'h*':>4} "
             f"{'h range':>8}"]
    for p in report["points"]:
        hr = "-" if p["heads_range"] is None else f"{p['heads_range'][0]}-{p['heads_range'][1]}"
        lines.append(f"{p['m']:>5} {p['d_model']:>7} {p['scaling_x']:>12.1f} {_dash(p['key_budget_lower']):>8} "
                     f"{_dash(p['key_budget']):>6} {_dash(p['key_budget_upper']):>8} {_dash(p['best_heads']):>4} "
                     f"{hr:>8}")
    seed, fits = report["seed_fits"], report["fits"]
    kb, hd = fits["key_budget"], fits["heads"]
    lines.append("D_K* ~ c m log2(m) / d_model:  " + ("no point passed" if kb is None else
                 f"c = {kb['slope']:.3f} (R^2 = {kb['r2']:.3f}, {kb['points']} points)") +
                 f"   seed: c = {seed['key_budget_slope']} (R^2 = {seed['key_budget_r2']})")
    lines.append("h* ~ a m / d_model + b:        " + ("fewer than 2 compressions" if hd is None else
                 f"a = {hd['slope']:.3f}, b = {hd['intercept']:.3f} (R^2 = {hd['r2']:.3f}, {hd['points']} points)") +
                 f"   seed: a = {seed['heads_slope']}, b = {seed['heads_intercept']} (R^2 = {seed['heads_r2']})")
    return "\n".join(lines)


def _dash(value) -> str:
    return "-" if value is None else str(value)


def plot_budget_report(report: dict) -> dict:
    """Figures {name: figure}: F1-vs-D_K curves per (m, d_model), and D_K* / h* against their laws with the fits."""
    plt = _plt()

    points = report["points"]
    cols = min(3, len(points))
    rows = -(-len(points) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, p in zip(axes.flat, points):
        for h in sorted({c["num_heads"] for c in p["configs"]}):
            cs = sorted((c for c in p["configs"] if c["num_heads"] == h), key=lambda c: c["key_budget"])
            x = [c["key_budget"] for c in cs]
            y = np.array([c["mean_f1"] for c in cs])
            err = np.array([[c["mean_f1"] - c["ci_low"] for c in cs], [c["ci_high"] - c["mean_f1"] for c in cs]])
            ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, label=f"h={h}")
        ax.axhline(0.99, color="gray", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"m={p['m']}, d_model={p['d_model']}")
        ax.set_xlabel("D_K = h d_k")
        ax.set_ylabel("test micro-F1")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(points):]:
        ax.axis("off")
    fig.tight_layout()
    curves = fig

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    passed = [p for p in points if p["key_budget"] is not None]
    if passed:
        x = np.array([p["scaling_x"] for p in passed])
        y = np.array([p["key_budget"] for p in passed])
        lo = np.array([p["key_budget_lower"] if p["key_budget_lower"] is not None else p["key_budget"] for p in passed])
        hi = np.array([p["key_budget_upper"] if p["key_budget_upper"] is not None else p["key_budget"] for p in passed])
        left.errorbar(x, y, yerr=[y - lo, np.maximum(hi - y, 0)], fmt="o", capsize=3, label="measured D_K*")
        grid = np.linspace(0, x.max() * 1.05, 50)
        fit, seed = report["fits"]["key_budget"], report["seed_fits"]
        left.plot(grid, fit["slope"] * grid, label=f"fit {fit['slope']:.2f} x (R²={fit['r2']:.2f})")
        left.plot(grid, seed["key_budget_slope"] * grid, ls="--", label=f"seed {seed['key_budget_slope']} x")
        left.legend(fontsize=8)
    left.set_xlabel("x = m log2(m) / d_model")
    left.set_ylabel("D_K*")
    with_heads = [p for p in points if p["best_heads"] is not None]
    if with_heads:
        lam = np.array([p["compression"] for p in with_heads])
        hs = np.array([p["best_heads"] for p in with_heads])
        rng = [p["heads_range"] for p in with_heads]
        right.errorbar(lam, hs, yerr=[hs - [r[0] for r in rng], [r[1] for r in rng] - hs], fmt="o", capsize=3,
                       label="h*")
        grid = np.linspace(0, lam.max() * 1.05, 50)
        fit, seed = report["fits"]["heads"], report["seed_fits"]
        if fit is not None:
            right.plot(grid, fit["slope"] * grid + fit["intercept"],
                       label=f"fit {fit['slope']:.2f} λ {fit['intercept']:+.2f} (R²={fit['r2']:.2f})")
        right.plot(grid, seed["heads_slope"] * grid + seed["heads_intercept"], ls="--",
                   label=f"seed {seed['heads_slope']} λ {seed['heads_intercept']:+}")
        right.legend(fontsize=8)
    right.set_xlabel("λ = m / d_model")
    right.set_ylabel("h*")
    fig.tight_layout()
    return {f"{REPORT_NAME}_f1_curves": curves, f"{REPORT_NAME}_scaling": fig}


def main(argv: Optional[list[str]] = None) -> int:
    """Stand-alone entry for these commands alone (the package CLI registers them too)."""
    parser = argparse.ArgumentParser(prog="factkernels", description=__doc__)
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
