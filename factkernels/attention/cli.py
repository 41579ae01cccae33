"""Command line for relational graph recognition (seed 002).

    factkernels rgr-train --m 128 --d-model 32 --heads 4 --d-k 8 --seeds 3 --json out.json
    factkernels experiment rgr-budget --quick --out results/

``add_subcommands(subparsers)`` registers both; every parser sets ``handler``, so the
top-level ``main`` runs ``args.handler(args)`` and returns its exit status.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

import numpy as np

from ..environment import environment
from .training import QUICK_GRID, SEED_GRID, BudgetGrid, TrainingConfig, budget_experiment, t_interval, train_runs

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
    return TrainingConfig(context_length=args.context_length, target_rate=args.target_rate, lr=args.lr,
                          max_steps=args.steps, threads=args.threads)


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


def run_rgr_train(args: argparse.Namespace) -> int:
    """Handler of ``rgr-train``: print per-run test F1 and the mean with a 95% t-interval per d_k."""
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    config = _training_config(args)
    start = time.perf_counter()
    runs = train_runs(args.m, args.d_model, args.heads, args.d_k, seeds, config, quiet=args.quiet)
    elapsed = time.perf_counter() - start
    print(f"m={args.m} d_model={args.d_model} h={args.heads} steps<={config.steps_for(args.m, args.d_model)} "
          f"({elapsed:.1f}s)")
    print(f"{'d_k':>5} {'D_K':>6} {'seed':>5} {'test F1':>8} {'val F1':>7} {'steps':>7} {'tau':>8}")
    for r in runs:
        print(f"{r.head_dim:>5} {r.key_budget:>6} {r.seed:>5} {r.test_f1:>8.4f} {r.val_f1:>7.4f} {r.steps:>7} "
              f"{r.heads.threshold:>8.3f}")
    summary = []
    for d_k in args.d_k:
        mean, low, high = t_interval([r.test_f1 for r in runs if r.head_dim == d_k])
        summary.append({"head_dim": d_k, "key_budget": d_k * args.heads, "mean_f1": mean, "ci_low": low,
                        "ci_high": high})
        print(f"d_k={d_k} D_K={d_k * args.heads}: mean test F1 {mean:.4f}  95% CI [{low:.4f}, {high:.4f}]")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"config": {"m": args.m, "d_model": args.d_model, "heads": args.heads, "head_dims": args.d_k,
                              "seeds": seeds, "training": asdict(config)},
                   "runs": [r.to_dict() for r in runs], "summary": summary,
                   "elapsed_s": elapsed, "environment": environment()}
        path.write_text(json.dumps(payload, indent=2))
        print(f"wrote {path}")
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report = budget_experiment(_grid(args), _training_config(args), quiet=args.quiet)
    report["elapsed_s"] = time.perf_counter() - start
    report["environment"] = environment()
    json_path = out / f"{REPORT_NAME}.json"
    json_path.write_text(json.dumps(report, indent=2))
    print(format_budget_report(report))
    for path in plot_budget_report(report, out):
        print(f"wrote {path}")
    print(f"wrote {json_path}")
    return 0


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


def plot_budget_report(report: dict, out: Path) -> list[Path]:
    """F1-vs-D_K curves per (m, d_model), and D_K* / h* against their laws with the fits (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    curves = out / f"{REPORT_NAME}_f1_curves.png"
    fig.savefig(curves, dpi=120)
    plt.close(fig)

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
    scaling = out / f"{REPORT_NAME}_scaling.png"
    fig.savefig(scaling, dpi=120)
    plt.close(fig)
    return [curves, scaling]


def main(argv: Optional[list[str]] = None) -> int:
    """Stand-alone entry for these commands alone (the package CLI registers them too)."""
    parser = argparse.ArgumentParser(prog="factkernels", description=__doc__)
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
