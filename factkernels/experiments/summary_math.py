"""Numbers the experiments' summaries share: log-log fits, ratios of costs, spans of ratios as text."""

from __future__ import annotations

from typing import Optional

import numpy as np


def loglog_fit(x: list[float], y: list[float], min_points: int = 3) -> Optional[dict]:
    """Least squares log y = a + b log x: {"slope": b, "intercept": a, "r2", "points"}; None below ``min_points``."""
    if len(x) < min_points:
        return None
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    slope, intercept = np.polyfit(lx, ly, 1)
    residual = ly - (intercept + slope * lx)
    total = ((ly - ly.mean()) ** 2).sum()
    r2 = 1.0 - (residual**2).sum() / total if total > 0 else float("nan")
    return {"slope": float(slope), "intercept": float(intercept), "r2": float(r2), "points": len(x)}


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return None if not numerator or not denominator else numerator / denominator


def span_text(span: tuple[float, float], digits: int) -> str:
    """"a–b×", or "a×" when the span is one value at this precision."""
    lo, hi = f"{span[0]:.{digits}f}", f"{span[1]:.{digits}f}"
    return f"{lo}×" if lo == hi else f"{lo}–{hi}×"


def loglog_slope(x: list[float], y: list[float]) -> Optional[float]:
    """The least-squares slope of log y against log x; None below 2 points."""
    fit = loglog_fit(x, y, min_points=2)
    return None if fit is None else fit["slope"]
