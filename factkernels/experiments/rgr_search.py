"""The bracketing D_K* search of seed 002's key-budget experiments, as their cells (``factkernels rgr-search``).

Per head count a bracket on the D_K ladder (:func:`factkernels.attention.key_budget.bracket_budget`): only
the cells that decide the estimates run, each written to OUT/NAME/cells as it finishes.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from ..attention.key_budget import ConfigResult, bracket_budget
from . import engine
from .rgr_cells import budget_points, cell_config, law, run_cell, variant

def search_pair(m: int, d_model: int, head_counts: Sequence[int], seeds: Sequence[int],
                evaluate: Callable[[dict], dict], *, max_steps: Optional[int] = None, degree: int = 1,
                aggregation: str = "max", known_upper: Optional[int] = None) -> list[dict]:
    """``attention.bracket_budget`` on one (m, d_model) with cells: the configs evaluated, in order.

    ``evaluate(config) -> result`` with ``test_f1`` and ``steps`` per seed (the caller caches).
    """
    done: list[dict] = []

    def train(h: int, d_k: int) -> ConfigResult:
        config = cell_config(m, d_model, h, d_k, seeds, max_steps, degree=degree, aggregation=aggregation)
        result = evaluate(config)
        done.append(config)
        return ConfigResult(h, d_k, list(result["test_f1"]), list(seeds), list(result["steps"]))

    bracket_budget(head_counts, train, law(m, d_model, degree), degree * m / d_model, known_upper=known_upper)
    return done


def search(out: str, name: str, pairs: Sequence[tuple], seeds: Sequence[int], head_counts: Sequence[int],
           *, heads_window: Optional[float] = None, max_steps: Optional[int] = None, degree: int = 1,
           aggregation: str = "max", log: Callable[[str], None] = print) -> list[dict]:
    """``search_pair`` for every pair, each cell written to OUT/NAME/cells as it finishes (kept ones reused).

    heads_window: only h = 1 and head counts within this factor of r m / d_model are tried.
    """
    engine.get(name)
    cached = engine.load_cells(out, name)

    def evaluate(config: dict) -> dict:
        return _evaluate_cached(out, name, config, cached, log)

    configs = []
    known = budget_points(list(cached.values()))
    for m, d in pairs:
        heads = [h for h in head_counts if heads_window is None or h == 1
                 or 1 / heads_window <= h / (degree * m / d) <= heads_window]
        point = known.get((m, d, degree, aggregation))
        configs += search_pair(m, d, heads, seeds, evaluate, max_steps=max_steps, degree=degree,
                               aggregation=aggregation, known_upper=point and point.key_budget_upper)
    return configs


def densify(out: str, name: str, pairs: Sequence[tuple], seeds: Sequence[int], *, degree: int = 1,
            aggregation: str = "max", log: Callable[[str], None] = print) -> list[dict]:
    """Train ``seeds`` (one more cell each) for every configuration near the D_K* estimates of ``pairs``.

    Near: D_K from 0.8x the optimistic estimate to 1.1x the conservative one (the largest D_K run
    when none passes conservatively) -- the configurations every estimate and the h* test read.
    """
    cells = engine.load_cells(out, name)
    points = budget_points(list(cells.values()))
    steps = {variant(c.config) + (c.config["heads"], c.config["head_dim"]): c.config["max_steps"]
             for c in cells.values()}
    done = []
    for m, d in pairs:
        point = points.get((m, d, degree, aggregation))
        if point is None or point.key_budget_lower is None:
            continue
        top = point.key_budget_upper or max(c.key_budget for c in point.configs)
        for c in point.configs:
            if 0.8 * point.key_budget_lower <= c.key_budget <= 1.1 * top:
                missing = [s for s in seeds if s not in c.seeds]
                if missing:
                    config = cell_config(m, d, c.num_heads, c.head_dim, missing,
                                         steps[(m, d, degree, aggregation, c.num_heads, c.head_dim)],
                                         degree=degree, aggregation=aggregation)
                    done.append(config)
    for config in done:
        _evaluate_cached(out, name, config, cells, log)
    return done


def _evaluate_cached(out: str, name: str, config: dict, cached: dict, log: Callable[[str], None]) -> dict:
    """The cell of ``config``: from ``cached`` (by key) or trained now and written to OUT/NAME/cells."""
    key = engine.cell_key(config)
    if key not in cached:
        start = time.perf_counter()
        result = run_cell(config)
        seconds = time.perf_counter() - start
        engine._write_cell(out, name, key, config, result, seconds)
        cached[key] = engine.Cell(key, config, result, seconds)
        log(f"{time.strftime('%H:%M:%S')} {name} m={config['m']} d={config['d_model']} r={config.get('degree', 1)} "
            f"h={config['heads']} d_k={config['head_dim']} D_K={config['heads'] * config['head_dim']} "
            f"seeds={config['seeds']} f1={[round(f, 4) for f in result['test_f1']]} steps={result['steps']} "
            f"{seconds:.1f}s")
    return cached[key].result


BUDGET_EXPERIMENTS = ("rgr-budget", "rgr-diagonal", "rgr-softmax", "rgr-regular")
"""The experiments whose cells :func:`search` and :func:`densify` write."""
