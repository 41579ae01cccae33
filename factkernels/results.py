"""Where experiments put what they measured: one JSON and PNG figures per experiment.

    path = write_json(out_dir, "rho_vs_cost", {"config": ..., "measured": ..., "seed_claim": ...})
    save_figure(fig, out_dir, "rho_vs_cost")      # out_dir/rho_vs_cost.png

Every JSON carries the environment (device, versions, build) next to the numbers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Union

from .environment import environment

PathLike = Union[str, Path]


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/Inf become None, tuples lists, tensors and numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "tolist"):  # torch / numpy arrays and scalars
        return _clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(out_dir: PathLike, name: str, payload: dict) -> Path:
    """Write ``payload`` plus ``environment`` to ``out_dir/name.json`` and return the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(_clean({**payload, "environment": environment()}), indent=2, allow_nan=False))
    return path


def save_figure(fig, out_dir: PathLike, name: str) -> Path:
    """Save a matplotlib figure to ``out_dir/name.png`` (120 dpi) and close it."""
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
