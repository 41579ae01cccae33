"""Experiments: every claim of the seed papers as a grid of cells (see :mod:`.engine`).

Importing this package registers every experiment module in :data:`engine.REGISTRY`.
The library (factkernels.*) never imports this package.
"""

from . import rgr_budget  # noqa: F401  (registers)
from .engine import REGISTRY, Cell, Claim, Experiment, Finding, get, register, run

__all__ = ["REGISTRY", "Cell", "Claim", "Experiment", "Finding", "get", "register", "run"]
