"""Experiments: every claim of the seed papers as a grid of cells (see :mod:`.engine`).

Importing this package registers every experiment module in :data:`engine.REGISTRY`.
The library (factkernels.*) never imports this package.
"""

from .engine import REGISTRY, Cell, Claim, Experiment, Finding, get, register, run
from . import real_lm  # noqa: F401  (registers real-lm-editing)

from . import attention, capacity, rgr_budget, transformer  # noqa: F401  (each experiment module registers itself)

__all__ = ["REGISTRY", "Cell", "Claim", "Experiment", "Finding", "get", "register", "run"]
