"""Experiments: every claim of the seed papers as a grid of cells (see :mod:`.engine`).

Importing this package registers every experiment module in :data:`engine.REGISTRY`.
The library (factkernels.*) never imports this package.
"""

from .engine import REGISTRY, Cell, Claim, Experiment, Finding, get, register, run
from . import real_lm  # noqa: F401  (registers real-lm-editing)

from . import (attention, cost_scaling, hybrid_costs, method_costs, ntk_ustar, rgr_budget,  # noqa: F401  (each experiment
               rho_vs_cost, transformer, whitening_cost)  # module registers itself)

__all__ = ["REGISTRY", "Cell", "Claim", "Experiment", "Finding", "get", "register", "run"]
