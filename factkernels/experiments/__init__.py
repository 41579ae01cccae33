"""Experiments: every claim of the seed papers as a grid of cells (see :mod:`.engine`).

Importing this package registers every experiment module in :data:`engine.REGISTRY`.
The library (factkernels.*) never imports this package.
"""

from .engine import REGISTRY, Cell, Claim, Experiment, Finding, get, register, run
# each experiment module registers itself on import
from . import (cost_scaling, hybrid_costs, lm_facts, method_costs, ntk_ustar, real_lm_editing,  # noqa: F401
               rgr_block, rgr_budget, rgr_diagonal, rgr_regular, rgr_softmax, rgr_value, rho_vs_cost, ssfr_swap,
               toy_lm_editing, usability_tradeoff, whitening_cost)

__all__ = ["REGISTRY", "Cell", "Claim", "Experiment", "Finding", "get", "register", "run"]
