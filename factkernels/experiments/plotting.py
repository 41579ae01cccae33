"""The one pyplot helper for experiments: a figure with n panels, and saving it as PNG.

    fig, axes = panels(2)            # 1 x 2 panels, 5 inches wide each
    save_figure(fig, folder, "name") # folder/name.png at 120 dpi, figure closed
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

try:
    import matplotlib
except ModuleNotFoundError as error:  # the library and the CLI run without it; only plots need it
    raise ModuleNotFoundError('experiment plots need matplotlib: pip install "factkernels[experiments]"',
                              name="matplotlib") from error

matplotlib.use("Agg")  # headless: experiments run on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402


def panels(ncols: int = 1, *, width: float = 5.0, height: float = 3.8, nrows: int = 1):
    """(figure, flat list of axes) with nrows x ncols panels."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def save_figure(fig, folder: Union[str, Path], name: str) -> Path:
    """Save ``fig`` to ``folder/name.png`` (120 dpi), close it and return the path."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
