"""D_K* search for learned QK heads (seed 002, App. A.2): for each (m, d_model), head counts h against a geometric D_K ladder
(``bracket_budget``), D_K* = min{D_K : mean test F1 >= 0.99 for some h}, with the conservative
upper estimate (95% t-interval low end >= 0.99) and the optimistic lower one (high end >=
0.99); h* the head count attaining D_K* (ties: larger mean F1) with the paired-t-test interval.
Each configuration trains through :func:`factkernels.attention.train_heads.train_runs`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import numpy as np
from scipy import stats

from .budget_fits import seed_law
from .train_heads import TrainingConfig, check_int_list, train_runs

PASS_F1 = 0.99  # the seed's D_K* criterion on mean test micro-F1
CONFIDENCE = 0.95


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): mean +- t_{(1+c)/2, n-1} s / sqrt(n). With one value, low = high = mean."""
    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if v.size < 2:
        return mean, mean, mean
    half = float(stats.t.ppf((1 + confidence) / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return mean, mean - half, mean + half


@dataclass
class ConfigResult:
    """All seeds of one (h, d_k) configuration."""

    num_heads: int
    head_dim: int
    test_f1: list  # per seed, in seed order
    seeds: list
    steps: list

    @property
    def key_budget(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def interval(self) -> tuple[float, float, float]:
        return t_interval(self.test_f1)

    def to_dict(self) -> dict:
        mean, low, high = self.interval
        return {"num_heads": self.num_heads, "head_dim": self.head_dim, "key_budget": self.key_budget,
                "seeds": self.seeds, "test_f1": self.test_f1, "steps": self.steps,
                "mean_f1": mean, "ci_low": low, "ci_high": high}


@dataclass
class BudgetPoint:
    """D_K* for one (m, d_model): central, conservative upper and optimistic lower estimates."""

    m: int
    d_model: int
    configs: list  # ConfigResult
    key_budget: Optional[int]  # central: min D_K with mean F1 >= 0.99
    key_budget_upper: Optional[int]  # min D_K with CI low >= 0.99
    key_budget_lower: Optional[int]  # min D_K with CI high >= 0.99
    best_heads: Optional[int]  # h* attaining the central D_K*
    heads_range: Optional[tuple]  # (min, max) head counts not significantly worse (App. A.2)

    @property
    def scaling_x(self) -> float:
        """m log2(m) / d_model, the abscissa of the capacity law."""
        return self.m * math.log2(self.m) / self.d_model

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "configs"}
        d["configs"] = [c.to_dict() for c in self.configs]
        d["scaling_x"] = self.scaling_x
        d["compression"] = self.m / self.d_model
        return d


def _min_budget(configs: list, which: int) -> Optional[ConfigResult]:
    """Config with the smallest D_K whose interval[which] >= PASS_F1; ties: larger mean F1."""
    passing = [c for c in configs if c.interval[which] >= PASS_F1]
    return min(passing, key=lambda c: (c.key_budget, -c.interval[0])) if passing else None


def summarize_budget(m: int, d_model: int, configs: Sequence[ConfigResult]) -> BudgetPoint:
    """D_K* (central / upper / lower), h* and its interval from trained configurations (App. A.2).

    h* interval: h* and every head count with a tested D_K within 10% of D_K* whose per-seed
    F1 there (its best such configuration) is not significantly different from h*'s (paired
    two-sided t-test, p > 0.05; identical F1s count as not different).
    """
    configs = list(configs)
    central, upper, lower = (_min_budget(configs, w) for w in (0, 1, 2))
    heads_range = None
    if central is not None:
        kept = [central.num_heads]
        for h in {c.num_heads for c in configs} - {central.num_heads}:
            near = [c for c in configs if c.num_heads == h and c.seeds == central.seeds
                    and abs(c.key_budget - central.key_budget) <= 0.1 * central.key_budget]
            if near and _paired_p_value(max(near, key=lambda c: c.interval[0]).test_f1, central.test_f1) > 0.05:
                kept.append(h)
        heads_range = (min(kept), max(kept))
    return BudgetPoint(m, d_model, configs, central and central.key_budget, upper and upper.key_budget,
                       lower and lower.key_budget, central and central.num_heads, heads_range)


def _paired_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided paired t-test p-value; a constant difference gives 1 (if zero) or 0."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if np.all(diff == diff[0]):
        return 1.0 if diff[0] == 0 else 0.0
    return float(stats.ttest_rel(a, b).pvalue)


LADDER_RATIO = 1.25
LADDER_RUNGS = (-7, 5)  # rung k: D_K ~ centre * 1.25^k for k in [-7, 5), i.e. 0.21x to 2.4x the centre


def rung_head_dim(centre: float, num_heads: int, rung: int) -> int:
    """d_k of ladder rung ``rung`` with h heads: round(centre * 1.25^rung / h), at least 1."""
    return max(1, round(centre * LADDER_RATIO ** rung / num_heads))


def bracket_budget(head_counts: Sequence[int], evaluate: Callable[[int, int], ConfigResult], centre: float,
                   compression: float, *, start_rung: int = -1, known_upper: Optional[int] = None
                   ) -> list[ConfigResult]:
    """The configurations that decide the App. A.2 estimates, found on the ladder around ``centre``.

    ``evaluate(h, d_k)`` trains (or looks up) one configuration over its seeds. Head counts run
    nearest to ``compression`` (r m / d_model, the construction's head count) first. Per h, from
    ``start_rung`` (lowered below 1.1x the best conservative D_K so far): down while the F1
    interval's high end still reaches 0.99, then up while its low end does not. No D_K above
    1.1x the best conservative D_K is tried: such a configuration cannot be any estimate nor in
    the h* test's 10% pool. Assumes F1 grows with D_K at fixed h, as the seed's definition does.
    ``known_upper``: a conservative D_K* found earlier (by other head counts).
    """
    head_counts = check_int_list("head_counts", head_counts, 1)
    order = sorted(head_counts, key=lambda h: (abs(math.log2(h) - math.log2(compression)), -h))
    low_rung, high_rung = LADDER_RUNGS
    best_upper = math.inf if known_upper is None else known_upper
    done: list[ConfigResult] = []

    def budget(h: int, rung: int) -> int:
        return h * rung_head_dim(centre, h, rung)

    def bounds(h: int, rung: int) -> tuple[float, float]:
        nonlocal best_upper
        config = evaluate(h, rung_head_dim(centre, h, rung))
        done.append(config)
        _, low, high = config.interval
        if low >= PASS_F1:
            best_upper = min(best_upper, config.key_budget)
        return low, high

    for h in order:
        start = start_rung
        while start > low_rung and budget(h, start) > 1.1 * best_upper:
            start -= 1
        if budget(h, start) > 1.1 * best_upper:
            continue
        first_low, high = bounds(h, start)
        rung = start
        while high >= PASS_F1 and rung - 1 >= low_rung and budget(h, rung - 1) < budget(h, rung):
            rung -= 1
            _, high = bounds(h, rung)
        rung, low = start, first_low
        while low < PASS_F1 and rung + 1 < high_rung and budget(h, rung + 1) <= 1.1 * best_upper:
            rung += 1
            if budget(h, rung) > budget(h, rung - 1):
                low, _ = bounds(h, rung)
    return done


def search_budget(m: int, d_model: int, head_counts: Sequence[int], seeds: Sequence[int],
                  config: TrainingConfig = TrainingConfig(), *, known_upper: Optional[int] = None,
                  quiet: bool = False) -> BudgetPoint:
    """D_K* estimates and h* of one (m, d_model) (App. A.2) by ``bracket_budget`` around the seed's law
    (times r for an r-regular graph), each configuration trained for all seeds as one batch."""
    def evaluate(h: int, d_k: int) -> ConfigResult:
        runs = train_runs(m, d_model, h, [d_k], seeds, config, quiet=quiet)
        return ConfigResult(h, d_k, [r.test_f1 for r in runs], [r.seed for r in runs], [r.steps for r in runs])

    configs = bracket_budget(head_counts, evaluate, config.degree * seed_law(m, d_model),
                             config.degree * m / d_model, known_upper=known_upper)
    return summarize_budget(m, d_model, configs)
