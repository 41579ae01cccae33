"""rgr-block (seed 002 §7.3, Fig. 7): a pre-LN Transformer block on frozen MiniLM token embeddings, accuracy
against D_K per h.

    factkernels experiment rgr-block --scale quick --out runs/

One cell trains one (D_K, h, seed).
"""

from __future__ import annotations

import numpy as np

from ..attention.block import BlockConfig, train_block
from ..attention.key_budget import t_interval
from ..datasets import token_embeddings
from . import engine
from .engine import Claim, Finding


CLAIMS = (
    Claim("002-fig7-block-heads", "002", "§7.3, Fig. 7", "in a pre-LN Transformer block, h ≥ 2 beats h = 1 at every "
          "key budget D_K", "m = 6144, GPT-2 embeddings: h = 1 saturates near 0.81 (or collapses); multi-head nears "
          "1 by D_K = 512 (partly: multi-head ahead at some D_K only)"),
)


def grid(scale: str) -> list[dict]:
    m, budgets, heads, seeds, block = {
        "tiny": (12, (8,), (1, 2), (0,), {"context_pairs": 2, "batch_size": 8, "max_steps": 20, "check_every": 10,
                                          "val_examples": 20, "test_examples": 20}),
        "quick": (256, (16, 64), (1, 4), (0, 1), {"context_pairs": 8, "max_steps": 1_500, "check_every": 250,
                                                  "val_examples": 500, "test_examples": 1000}),
        "seed": (6144, (64, 128, 256, 512), (1, 2, 4, 8), tuple(range(7)), {}),
    }[scale]
    return [{"m": m, "key_budget": b, "heads": h, "seed": s, "block": block} for b in budgets for h in heads
            for s in seeds]


def run_cell(config: dict) -> dict:
    table, tokens = token_embeddings(config["m"] + 1)
    run = train_block(config["m"], config["heads"], config["key_budget"], config["seed"],
                      BlockConfig(threads=None, **config["block"]), table=table, quiet=True)
    return {**run.to_dict(), "d_model": table.shape[1], "null_token": tokens[-1]}


def _steps_text(cells: list[engine.Cell], cap: int) -> str:
    """The steps the blocks trained (they stop early on validation accuracy) under the cap."""
    steps = [c.result["steps"] for c in cells if "steps" in c.result]
    if not steps:
        return f"up to {cap:,} steps"
    ran = f"{min(steps):,}" if min(steps) == max(steps) else f"{min(steps):,}–{max(steps):,}"
    return f"{ran} steps (cap {cap:,})"


def summarize(cells: list[engine.Cell]) -> dict:
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
               f"{c0['block'].get('context_pairs', 16)}, {_steps_text(cells, c0['block'].get('max_steps', 100_000))}, D_K ∈ "
               f"{sorted({c.config['key_budget'] for c in cells})}, h ∈ {sorted({c.config['heads'] for c in cells})}, "
               f"{len({c.config['seed'] for c in cells})} seeds; paper: GPT-2, m = 6144, ell = 16, 100,000 steps, "
               "7 seeds; NULL = the (m+1)-th token, not GPT-2's EOS")
    ours = "; ".join(f"D_K={b}: h=1 {s:.2f}, best h>1 {x:.2f}" for b, s, x in wins) or "-"
    if not wins:
        finding = Finding(ours, setting, "not run", "needs h = 1 and h > 1 at one D_K")
    else:
        ahead = [budget for budget, s, x in wins if x > s]
        finding = Finding(ours, setting,
                          "reproduced" if len(ahead) == len(wins) else "partly" if ahead else "not reproduced",
                          "multi-head ahead at every D_K" if len(ahead) == len(wins) else
                          f"multi-head ahead at D_K ∈ {ahead} of {[b for b, _, _ in wins]}" if ahead else
                          "h = 1 is as good as multi-head or better at every D_K")
    return {"rows": rows, "claims": {"002-fig7-block-heads": finding}}


def plot(summary: dict, cells: list[engine.Cell]) -> dict:
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


EXPERIMENT = engine.register(engine.Experiment(
    "rgr-block", "pre-LN Transformer block on frozen MiniLM token embeddings, accuracy vs D_K per h (Sec. 7.3)",
    CLAIMS, grid, run_cell, summarize, plot, threads=1))
