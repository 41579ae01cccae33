"""usability (seed 000 §5.2-5.3, Fig. 3b-c, 8): capacity against usability over whitening alpha and condition
number kappa, and usability against the Lipschitz constant.

    factkernels experiment usability --scale quick --out runs/

Cells: one per (block, kappa, alpha).
"""

from __future__ import annotations

import math
from typing import Optional

from ..transformer.scaling import SEED_DIM, SEED_SEEDS
from ..transformer.training import rescored_runs
from ..transformer.usability import SEED_ALPHAS, SEED_KAPPAS, SEED_LRS, run_usability, spearman
from . import engine
from .engine import Claim, Finding
from .transformer_cells import QUICK_TRAIN, SEED_TRAIN, TINY_TRAIN, TRANSFORMER_DEVICES, block_switches, seed_block, train_text


# ----------------------------------------------------------------------------- usability (§5.2–5.3)

CLAIMS = (
    Claim("000-fig3b-tradeoff", "000", "§5.2, Fig. 3b/8a", "whitening trades usability for capacity: more whitened "
          "MLPs store more facts but are less usable", "negative relation of usability to capacity "
          "(reproduced: whitening trades at every κ where capacity changes; partly: at some κ, or a negative pooled "
          "rank correlation)"),
    Claim("000-fig3c-lipschitz", "000", "§5.3, Fig. 3c/8b", "a larger Lipschitz constant goes with lower usability",
          "negative relation (reproduced: Spearman < −0.5; partly: < 0)"),
)

# A fall of usability smaller than this is no trade: near chance (1/F) it is noise.
USABILITY_DROP = 0.05


def grid(scale: str) -> list[dict]:
    if scale == "tiny":
        base, kappas, alphas = {"dim": 8, "facts": 8, "seeds": [0], **TINY_TRAIN, "lipschitz_samples": 4}, [1.1], \
            [0.0, 1.0]
    elif scale == "quick":
        base, kappas, alphas = {"dim": 32, "facts": 64, "seeds": [0], **QUICK_TRAIN, "lipschitz_samples": 100}, \
            [1.1, 1e3], [0.0, 0.1, 1.0]
    else:
        base, kappas, alphas = {"dim": SEED_DIM, "facts": 1024, "seeds": list(range(SEED_SEEDS)), **SEED_TRAIN,
                                "lrs": SEED_LRS, "lipschitz_samples": 100}, SEED_KAPPAS, SEED_ALPHAS
    kind = "gd" if scale == "seed" else "constructed"  # the seed trains GD MLPs; construct() for quick CPU runs
    size = 4 * math.ceil(base["facts"] / base["dim"]) if kind == "gd" else base["dim"]
    # cells of our earlier block (no "output_norm" field) and of the seed's GPT-2 block with its final norm
    blocks = [{"output_norm": True}] if scale == "tiny" else [{}, {"output_norm": True}]
    return [{**base, **block, "mlp": kind, "size": size, "gd_steps": 2000, "kappa": k, "alpha": a}
            for block in blocks for k in kappas for a in alphas]


def run_cell(config: dict) -> dict:
    (row,) = run_usability(num_keys=config["facts"], dim=config["dim"], size=config["size"], kind=config["mlp"],
                           kappas=[config["kappa"]], alphas=[config["alpha"]], lrs=config["lrs"], seeds=config["seeds"],
                           gd_steps=config["gd_steps"], lipschitz_samples=config["lipschitz_samples"],
                           switches=block_switches(config), progress=False, device=str(engine.cell_device()),
                           steps=config["steps"], batch_size=config["batch_size"])
    return row


def _usability_on_j(row: dict) -> dict:
    """A usability row (its runs scored on training + held-out junk tuples) scored on the seed's J instead."""
    if not row["runs"]:
        return row
    runs = rescored_runs(row["runs"], "all", "train")
    best = max(run["fact_adaptive_accuracy"] for run in runs)
    return {**row, "runs": runs, "fact_adaptive_accuracy": best,
            "usability": best / row["capacity"] if row["capacity"] else None}


def _usability_correlations(rows: list[dict]) -> tuple[list[dict], Optional[float], Optional[float]]:
    """The rows with a usability, and Spearman(usability, Lipschitz) and (usability, capacity) over them."""
    usable = [r for r in rows if r["usability"] is not None]
    if len(usable) < 2:
        return usable, None, None
    use = [r["usability"] for r in usable]
    return usable, spearman([r["lipschitz"] for r in usable], use), spearman([r["capacity"] for r in usable], use)


def summarize(cells: list[engine.Cell]) -> dict:
    # the seed's block (with the final norm) speaks for the claims when any of its cells ran
    faithful, cells, block = seed_block(cells)
    all_tuples = [c.result for c in cells]  # the cells score training + held-out junk tuples
    # the seed scores J: every run records its held-out accuracy, so J follows exactly (rescored_runs)
    on_j = all(run.get("fact_adaptive_test_accuracy") is not None for r in all_tuples for run in r["runs"])
    rows = [_usability_on_j(r) for r in all_tuples] if on_j else all_tuples
    usable, rho_lip, rho_cap = _usability_correlations(rows)
    _, lip_all, cap_all = _usability_correlations(all_tuples) if on_j else (None, None, None)

    def stricter(name: str, rho: Optional[float]) -> str:
        return "" if rho is None else (f"; scored on training + held-out junk tuples (stricter than the seed's J) "
                                       f"Spearman(usability, {name}) = {rho:+.2f}")
    c0 = cells[0].config
    scored_on = "the seed's J (training junk tuples)" if on_j else "training + held-out junk tuples"
    setting = (f"{c0['mlp']} MLPs of size {c0['size']}, F = {c0['facts']}, κ ∈ {sorted({c.config['kappa'] for c in cells})}, "
               f"α ∈ {sorted({c.config['alpha'] for c in cells})}, {train_text(c0, [run for r in rows for run in r['runs']])}, {block}, usability on {scored_on}; "
               "paper: GD MLPs, F = 1024, d = 128, 8 κ × 8 α, 5 lrs, 4.8M sequences")
    claims = {}
    if rho_cap is None or math.isnan(rho_cap):
        claims["000-fig3b-tradeoff"] = Finding("-", setting, "not run", "fewer than two usable points")
    else:
        within, traded, flat = [], [], []
        for kappa in sorted({r["kappa"] for r in usable}):
            mine = sorted((r for r in usable if r["kappa"] == kappa), key=lambda r: r["alpha"])
            if (mine[-1]["capacity"] > mine[0]["capacity"]
                    and mine[-1]["usability"] < mine[0]["usability"] - USABILITY_DROP):
                traded.append(kappa)
            elif mine[-1]["capacity"] == mine[0]["capacity"]:
                flat.append(kappa)
            within.append(f"κ={kappa:g}: capacity {mine[0]['capacity']:.2f}→{mine[-1]['capacity']:.2f}, usability "
                          f"{mine[0]['usability']:.2f}→{mine[-1]['usability']:.2f} (α {mine[0]['alpha']:g}→"
                          f"{mine[-1]['alpha']:g})")
        # The claim is about whitening: within a κ, does a larger α raise capacity and lower usability? The
        # pooled rank correlation also mixes κ, where badly conditioned embeddings are low in both.
        changed = [k for k in sorted({r["kappa"] for r in usable}) if k not in flat]
        every = len(changed) >= 2 and traded == changed  # one κ is too thin to call it
        verdict = ("reproduced" if every or (not changed and rho_cap < -0.3) else
                   "partly" if traded or rho_cap < 0 else "not reproduced")
        claims["000-fig3b-tradeoff"] = Finding(
            f"Spearman(usability, capacity) = {rho_cap:+.2f} over {len(usable)} points; " + "; ".join(within), setting,
            verdict,
            (f"whitening raises capacity and lowers usability at every κ where capacity changes ({traded})" if every
             else f"whitening raises capacity and lowers usability at κ ∈ {traded} of {changed}" if traded
             else "whitening never trades usability for capacity here")
            + f" (a trade: usability falls by more than {USABILITY_DROP})"
            + (f"; at κ ∈ {flat} capacity does not change with α" if flat else "")
            + f"; pooled over κ the rank correlation is {rho_cap:+.2f}"
            + (" (badly conditioned embeddings are low in both)" if rho_cap >= 0 else "")
            + stricter("capacity", cap_all))
    if rho_lip is None or math.isnan(rho_lip):
        claims["000-fig3c-lipschitz"] = Finding("-", setting, "not run", "fewer than two usable points")
    else:
        claims["000-fig3c-lipschitz"] = Finding(f"Spearman(usability, Lipschitz) = {rho_lip:+.2f} over {len(usable)} "
                                                "points", setting, "reproduced" if rho_lip < -0.5 else
                                                "partly" if rho_lip < 0 else "not reproduced",
                                                f"rank correlation over {len(usable)} (κ, α) points"
                                                + (", a weak one" if -0.5 <= rho_lip < 0 else "")
                                                + stricter("Lipschitz", lip_all))
    return {"rows": rows, "usability_split": "train" if on_j else "all", "rows_all_tuples": all_tuples if on_j else [],
            "output_norm": faithful, "spearman_usability_vs_lipschitz": rho_lip,
            "spearman_usability_vs_capacity": rho_cap, "claims": claims}


def plot(summary: dict, cells: list[engine.Cell]) -> dict:
    """Top: capacity and usability against whitening α, one line per κ (Fig. 3b/8a); bottom: usability
    against capacity and against the Lipschitz estimate, coloured by α (Fig. 3c/8b)."""
    from .plotting import panels

    rows = [r for r in summary["rows"] if r["usability"] is not None]
    fig, axes = panels(2, height=3.8, nrows=2)
    kappas = sorted({r["kappa"] for r in summary["rows"]})
    for ax, key, label in ((axes[0], "capacity", "capacity (fraction of facts stored)"),
                           (axes[1], "usability", "usability (fact-adaptive accuracy / capacity)")):
        for kappa in kappas:
            mine = sorted((r for r in summary["rows"] if r["kappa"] == kappa and r[key] is not None),
                          key=lambda r: r["alpha"])
            # α = 0 sits on a symlog axis's linear part, the seed's α from 0.01 to 1 on its log part
            ax.plot([r["alpha"] for r in mine], [r[key] for r in mine], "o-", ms=3, label=f"κ={kappa:g}")
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set(xlabel="whitening α", ylabel=label, ylim=(-0.02, 1.02))
    axes[0].legend(fontsize=7)
    for ax, key, label in ((axes[2], "capacity", "capacity (fraction of facts stored)"),
                           (axes[3], "lipschitz", "Lipschitz estimate max_i σ1(J(k_i))")):
        points = ax.scatter([r[key] for r in rows], [r["usability"] for r in rows], c=[r["alpha"] for r in rows],
                            cmap="viridis")
        if len(rows) <= 12:  # few points: name them
            for r in rows:
                ax.annotate(f"κ={r['kappa']:g}", (r[key], r["usability"]), fontsize=7)
        ax.set(xlabel=label, ylabel="usability")
        fig.colorbar(points, ax=ax, label="whitening α")
    axes[3].set_xscale("log")
    return {"usability": fig}


EXPERIMENT = engine.register(engine.Experiment(
    "usability", "capacity vs usability over whitening alpha and condition number kappa, Lipschitz (Sec. 5.2-5.3)",
    CLAIMS, grid, run_cell, summarize, plot, threads=1,
    devices=TRANSFORMER_DEVICES))
