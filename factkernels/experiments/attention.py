"""Relational graph recognition experiments of seed 002 (§7.2–7.3) and the ``rgr-train`` command.

    factkernels experiment rgr-value --scale quick --out runs/    # §7.2, Fig. 6: value channel MSE vs D_K per h
    factkernels experiment rgr-block --scale quick --out runs/    # §7.3: pre-LN block on frozen MiniLM tokens
    factkernels rgr-train --m 128 --d-model 32 --heads 4 --d-k 8 --seeds 3 --json out.json

The key-budget experiments (rgr-budget, rgr-diagonal, rgr-softmax, rgr-regular) live in
:mod:`.rgr_budget`. rgr-value trains one (d_model, h) over its D_K; rgr-block one (D_K, h, seed).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..attention.block import BlockConfig, train_block
from ..attention.key_budget import t_interval
from ..attention.train_heads import OBJECTIVES, TrainingConfig, train_runs
from ..embeddings import token_embeddings
from ..environment import environment
from . import engine
from .engine import Claim, Finding

# ----------------------------------------------------------------------------- shared


def _training(config: dict) -> TrainingConfig:
    """The cell's TrainingConfig: the seed's protocol plus the cell's overrides; threads are the engine's."""
    return TrainingConfig(threads=None, **config.get("training", {}))


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
        reason = f"at d_model = {smallest} h ≥ 4 reaches {multi:.2f} vs h = 1 {single:.2f}"
        # the claim's second half: at a larger d_model the h = 1 vs h >= 4 gap (in MSE, as the figure plots it)
        # narrows
        wider = max(r["d_model"] for r in rows)
        single_wide = mse(wider, 1, top)
        multi_wide = min((mse(wider, h, top) for h in many if mse(wider, h, top)), default=None)
        narrows = None
        if wider != smallest and single_wide is not None and multi_wide is not None:
            narrows = single_wide - multi_wide < single - multi
            reason += (f"; at d_model = {wider} the gap {'narrows' if narrows else 'does not narrow'}: "
                       f"{single_wide:.2f} vs {multi_wide:.2f} ({single_wide - multi_wide:.2f} against "
                       f"{single - multi:.2f}; as a ratio {single_wide / multi_wide:.1f}× against "
                       f"{single / multi:.1f}×)")
        if narrows is None:
            reason += "; the claim's second half (a larger d_model) did not run"
        verdict = "reproduced" if better and narrows else "partly" if better else "not reproduced"
        finding = Finding(f"test MSE at D_K = {top}: {per_dim}", setting, verdict, reason)
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


__all__ = ["add_commands", "run_block_cell", "run_rgr_train", "run_value_cell"]
