"""The cell that seed 002's key-budget experiments share (Sec. 6.1, 7.1, App. A.2, A.3), and their summaries' helpers.

One cell = one (m, d_model, h, d_k) configuration trained for a group of seeds (batched; each
seed's run is the run it would be alone), with the seed's step cut-off (Table 2; 80,000 for the
softmax model) unless the config says otherwise. A config names its variant only where it is
not the base model: ``degree`` r > 1 (r-regular graph), ``aggregation`` "softmax-sum".
Summaries merge the seed groups of a configuration and give, per variant and (m, d_model),
the three D_K* estimates and h* with its paired-t-test interval (App. A.2), and the fits.

    rgr-budget    base grid, m in {64..512}, d_model in {16, 32, 64}: D_K* and h* fits (Fig. 3, 10)
    rgr-diagonal  the lambda = m / d_model = 8 diagonal up to (4096, 512) (Fig. 4)
    rgr-softmax   F1-D_K curves of the softmax model beside the max model (Fig. 5)
    rgr-regular   r-regular graphs at m = 128, d_model = 32, r up to 16 (Fig. 12, 13)

Each grid is the full static sweep (every h against a geometric D_K ladder, ratio 1.25, around
the law: 1.19 m log2(m) / d_model, times r for r-regular graphs). Most of it cannot matter:
:func:`.rgr_search.search` runs only the cells that decide the estimates, per head count a bracket on the
ladder, descending while the F1 interval's high end still reaches 0.99 and ascending while its
low end does not, and never above 1.1x the best conservative D_K found so far (such cells
cannot change any estimate or the h* interval). Monotonicity in D_K at fixed h is assumed,
as the seed's threshold definition does.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from ..attention.budget_fits import seed_law
from ..attention.key_budget import LADDER_RUNGS, PASS_F1, ConfigResult, rung_head_dim, summarize_budget
from ..attention.train_heads import TrainingConfig, train_runs
from . import engine


BASE_PAIRS = tuple((m, d) for m in (64, 128, 256, 512) for d in (16, 32, 64))
DIAGONAL_PAIRS = ((128, 16), (256, 32), (512, 64), (1024, 128), (2048, 256), (4096, 512))
SOFTMAX_PANELS = ((64, 16), (64, 32), (128, 16), (128, 32))
SEED_HEADS = (1, 2, 4, 8, 16, 32, 64)
NO_PASS = "no configuration reached mean test F1 >= 0.99 on the cells that ran"
REGULAR_DEGREES = (1, 2, 4, 8, 16)
REGULAR_HEADS = (1, 2, 4, 8, 16, 32, 64, 128)


# ----------------------------------------------------------------------------- cells


def cell_config(m: int, d_model: int, heads: int, head_dim: int, seeds: Sequence[int],
                max_steps: Optional[int] = None, *, degree: int = 1, aggregation: str = "max") -> dict:
    """A cell's config; ``max_steps`` None: the seed's cut-off for this (m, d_model) and model."""
    training = TrainingConfig(degree=degree, aggregation=aggregation)
    config = {"m": m, "d_model": d_model, "heads": heads, "head_dim": head_dim, "seeds": list(seeds),
              "max_steps": training.steps_for(m, d_model) if max_steps is None else max_steps}
    if degree != 1:
        config["degree"] = degree
    if aggregation != "max":
        config["aggregation"] = aggregation
    return config


def variant(config: dict) -> tuple:
    """(m, d_model, degree, aggregation): the configurations one D_K* is taken over."""
    return config["m"], config["d_model"], config.get("degree", 1), config.get("aggregation", "max")


def law(m: int, d_model: int, degree: int = 1) -> float:
    """Centre of the D_K ladder: the seed's 1.19 m log2(m) / d_model, times r (edges) for r-regular graphs."""
    return degree * seed_law(m, d_model)


def ladder_grid(pairs: Sequence[tuple], heads: Sequence[int], seeds: Sequence[int], max_steps: Optional[int] = None,
                *, degree: int = 1, aggregation: str = "max") -> list[dict]:
    """Every h in ``heads`` against every distinct d_k of the ladder, for each (m, d_model)."""
    cells = []
    for m, d in pairs:
        for h in heads:
            dims = sorted({rung_head_dim(law(m, d, degree), h, k) for k in range(*LADDER_RUNGS)})
            cells += [cell_config(m, d, h, d_k, seeds, max_steps, degree=degree, aggregation=aggregation)
                      for d_k in dims]
    return cells


def run_cell(config: dict) -> dict:
    training = TrainingConfig(max_steps=config["max_steps"], degree=config.get("degree", 1),
                              aggregation=config.get("aggregation", "max"))
    runs = train_runs(config["m"], config["d_model"], config["heads"], [config["head_dim"]], config["seeds"],
                      training, quiet=True)
    return {"test_f1": [r.test_f1 for r in runs], "val_f1": [r.val_f1 for r in runs],
            "steps": [r.steps for r in runs], "early_stopped": [r.early_stopped for r in runs],
            "threshold": [r.heads.threshold for r in runs]}


def config_results(cells: Sequence[engine.Cell]) -> dict:
    """{variant: [ConfigResult]}, the seed groups of one (h, d_k) merged in seed order."""
    merged: dict = {}
    for cell in cells:
        c, r = cell.config, cell.result
        per_seed = merged.setdefault((variant(c), c["heads"], c["head_dim"]), {})
        for seed, f1, steps in zip(c["seeds"], r["test_f1"], r["steps"]):
            per_seed[seed] = (f1, steps)
    out: dict = {}
    for (key, h, d_k), per_seed in sorted(merged.items()):
        seeds = sorted(per_seed)
        out.setdefault(key, []).append(ConfigResult(h, d_k, [per_seed[s][0] for s in seeds], seeds,
                                                    [per_seed[s][1] for s in seeds]))
    return out


def budget_points(cells: Sequence[engine.Cell]) -> dict:
    """{variant: BudgetPoint} (App. A.2 estimates) of every variant the cells cover."""
    return {key: summarize_budget(key[0], key[1], configs) for key, configs in config_results(cells).items()}


def setting_text(cells: Sequence[engine.Cell], points: dict) -> str:
    seeds = sorted({len(c.seeds) for p in points.values() for c in p.configs})
    caps = sorted({c.config["max_steps"] for c in cells})
    ran = [s for c in cells for s in c.result.get("steps", [])]
    span = "" if not ran else f"{min(ran):,}" if min(ran) == max(ran) else f"{min(ran):,}–{max(ran):,}"
    trained = f"runs trained {span} steps (cut-offs {caps})" if ran else f"step cut-offs {caps}"
    return (f"{len(cells)} cells over (m, d_model) = {sorted({k[:2] for k in points})}; seeds per configuration "
            f"{seeds} (seed: 10); {trained}; bracketing D_K search (ladder ratio 1.25) per h")


def complete_claims(claims: dict, declared: Sequence[engine.Claim], setting: str, reason: str) -> dict:
    """``claims`` with a finding for every declared claim: the ones the cells cannot decide get ``reason``."""
    return {c.id: claims.get(c.id) or engine.Finding("-", setting, "not reproduced", reason) for c in declared}


def curve_rows(configs: Sequence[ConfigResult]) -> list[dict]:
    return [c.to_dict() for c in sorted(configs, key=lambda c: (c.num_heads, c.key_budget))]


def heads_at_grid_edge(point) -> bool:
    """Whether h*/2, the next smaller count of the doubling head grid, never ran: then h* is an upper bound."""
    tried = {c.num_heads for c in point.configs}
    return point.best_heads is not None and point.best_heads > 1 and point.best_heads // 2 not in tried


def curves_figure(points: Sequence[dict]):
    """Mean test F1 (95% t-interval) against D_K, one line per h, one panel per point (Fig. 1, 9)."""
    from .plotting import panels

    fig, axes = panels(min(4, max(1, len(points))), nrows=max(1, math.ceil(len(points) / 4)), width=4.0, height=3.2)
    colors = {h: f"C{k}" for k, h in enumerate(REGULAR_HEADS)}  # one colour per h in every panel
    for ax, p in zip(axes, points):
        for h in sorted({c["num_heads"] for c in p["configs"]}):
            line = [c for c in p["configs"] if c["num_heads"] == h]
            ax.errorbar([c["key_budget"] for c in line], [c["mean_f1"] for c in line], marker="o", ms=3, capsize=2,
                        yerr=[[c["mean_f1"] - c["ci_low"] for c in line], [c["ci_high"] - c["mean_f1"] for c in line]],
                        color=colors.get(h), label=f"h={h}")
        ax.axhline(PASS_F1, color="grey", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set(title=f"m={p['m']} d={p['d_model']}" + (f" {p['label']}" if "label" in p else ""),
               xlabel="D_K", ylabel="test micro-F1")
        ax.legend(fontsize=6)
    for ax in axes[len(points):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


