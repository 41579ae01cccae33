"""Experiments: every claim of the seed papers as a grid of cells (see :mod:`.engine`).

Importing this package registers every experiment module in :data:`engine.REGISTRY`.
The library (factkernels.*) never imports this package.
"""

from .engine import REGISTRY, Cell, Claim, Experiment, Finding, get, register, run
from . import real_lm  # noqa: F401  (registers real-lm-editing)

from . import (cost_scaling, hybrid_costs, lm_facts, method_costs, ntk_ustar, rgr_block, rgr_budget,  # noqa: F401
               rgr_diagonal, rgr_regular, rgr_softmax, rgr_value, rho_vs_cost, ssfr_swap, toy_lm_editing,
               usability_tradeoff, whitening_cost)  # (each experiment module registers itself)

__all__ = ["REGISTRY", "Cell", "Claim", "Experiment", "Finding", "get", "register", "run"]
