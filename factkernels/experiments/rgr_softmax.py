"""rgr-softmax (seed 002 §7.1, Fig. 5): F1-D_K curves of the softmax model beside the max model.

    factkernels rgr-search rgr-softmax --aggregation softmax-sum --pairs 64:16 --out runs/
"""

from __future__ import annotations

import math

from ..attention.key_budget import PASS_F1
from . import engine
from .rgr_cells import (NO_PASS, SOFTMAX_PANELS, budget_points, cell_config, complete_claims, curve_rows, curves_figure,
                        run_cell, setting_text)

CLAIMS = (
    engine.Claim("002-softmax-multihead", "002", "§7.1, Fig. 5",
                 "with softmax, multiple heads reach F1 0.99 at smaller D_K than one head when m >> d_model",
                 "multi-head advantage in every panel except m = 64, d_model = 32 (3 seeds, up to 80,000 steps; "
                 "partly: in some panels, or a higher best F1 only)"),
    engine.Claim("002-softmax-shift", "002", "§7.1, Fig. 5",
                 "the softmax model needs more D_K than the max model for F1 0.99",
                 "F1-D_K curves shifted to the right (partly: in some panels)"),
)
SOFTMAX_BUDGETS = (4, 8, 16, 32, 64, 128)  # D_K swept in each panel (powers of two: every h in the grid divides them)


def grid(scale: str) -> list[dict]:
    if scale == "tiny":
        panels, heads, budgets, seeds, steps = ((32, 16),), (1, 4), (8, 16), (0, 1), 500
    elif scale == "quick":
        panels, heads, budgets, seeds, steps = ((64, 16), (64, 32)), (1, 4), (8, 16, 32, 64), (0, 1, 2), 20_000
    else:
        panels, heads, budgets, seeds, steps = SOFTMAX_PANELS, (1, 2, 4, 8, 16), SOFTMAX_BUDGETS, (0, 1, 2), None
    return [cell_config(m, d, h, b // h, seeds, steps, aggregation=aggregation)
            for aggregation in ("softmax-sum", "max") for m, d in panels for h in heads for b in budgets if b >= h]


def summarize(cells: list) -> dict:
    points = budget_points(cells)
    rows, multi, shift = [], [], []
    for (m, d, _, aggregation), point in sorted(points.items()):
        single = [c for c in point.configs if c.num_heads == 1 and c.interval[0] >= PASS_F1]
        several = [c for c in point.configs if c.num_heads > 1 and c.interval[0] >= PASS_F1]
        one = min((c.key_budget for c in single), default=None)
        many = min((c.key_budget for c in several), default=None)
        # best mean F1 of one head, and of several heads at no larger D_K than one head tried
        top = max((c.key_budget for c in point.configs if c.num_heads == 1), default=math.inf)
        best_one = max((c.interval[0] for c in point.configs if c.num_heads == 1), default=None)
        best_many = max((c.interval[0] for c in point.configs if c.num_heads > 1 and c.key_budget <= top),
                        default=None)
        rows.append({"m": m, "d_model": d, "aggregation": aggregation, "key_budget": point.key_budget,
                     "best_heads": point.best_heads, "single_head_budget": one, "multi_head_budget": many,
                     "configs": curve_rows(point.configs)})
        if aggregation == "softmax-sum":
            multi.append((m, d, one, many, best_one, best_many))
            other = points.get((m, d, 1, "max"))
            if other is not None:
                shift.append((m, d, point.key_budget, other.key_budget))
    setting = setting_text(cells, {k[:2]: p for k, p in points.items()})
    claims = {}
    if multi:
        compressed = [row for row in multi if row[0] / row[1] >= 4]
        wins = [many is not None and (one is None or many < one) for _, _, one, many, _, _ in compressed]
        ahead = [None not in (b1, bm) and bm > b1 for _, _, _, _, b1, bm in compressed]
        claims["002-softmax-multihead"] = engine.Finding(
            "; ".join(f"(m={m}, d={d}): min D_K at F1 0.99 h=1 {one or 'never'}, h>1 {many or 'never'}; best mean F1 "
                      f"h=1 {b1 if b1 is None else round(b1, 3)}, h>1 {bm if bm is None else round(bm, 3)}"
                      for m, d, one, many, b1, bm in multi),
            setting, "not run" if not compressed else
            ("reproduced" if all(wins) else "partly" if any(wins) or all(ahead) else "not reproduced"),
            "in panels with m / d_model >= 4: several heads reach 0.99 at a smaller D_K than one head (reproduced), "
            "or only reach a higher best F1 at no larger D_K (partly)")
    if shift:
        right = [s is None or (mx is not None and s > mx) for _, _, s, mx in shift]
        claims["002-softmax-shift"] = engine.Finding(
            "; ".join(f"(m={m}, d={d}): softmax {s or 'never'}, max {mx or 'never'}" for m, d, s, mx in shift),
            setting, "reproduced" if all(right) else "partly" if any(right) else "not reproduced",
            "D_K* (min over h) of the softmax model against the max model on the same cells")
    return {"panels": rows, "claims": complete_claims(claims, CLAIMS, setting, NO_PASS)}


def plot(summary: dict, cells: list) -> dict:
    points = [{"m": r["m"], "d_model": r["d_model"], "label": r["aggregation"], "configs": r["configs"]}
              for r in summary["panels"]]
    return {"rgr_softmax_curves": curves_figure(points)}


EXPERIMENT = engine.register(engine.Experiment(
    "rgr-softmax", "seed 002 softmax model: F1-D_K curves beside the max model (Sec. 7.1, Fig. 5)",
    CLAIMS, grid, run_cell, summarize, plot))
