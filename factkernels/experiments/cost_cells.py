"""The cost-search cell that the fact-storage cost experiments of seed 000 share (§3.1, §3.3, §4.4, Fig. 2).

One cell = one cost search (:func:`factkernels.capacity.sampled_storage_cost`) for one
(method, family, F, d, options) over its seeds: seed s draws a fact set of the family (tied
K = V, random bijection, A.1.1) and seeds the method; a size stores when every fact of every
seed is stored (eps_acc = 0), so the cost of a cell is the worst seed's, as in the seed.
Cells of "ours" also search m at the width multipliers in ``multipliers`` (the construction's
default is 1.5) and report the cheapest, and every m-sized cell says whether m < d, i.e.
whether the JL step compresses anything. The experiments: rho_vs_cost, whitening_cost,
cost_scaling, hybrid_costs, ntk_ustar, method_costs; the ``capacity`` command runs one cell.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
import torch

from ..capacity import encoder_width_method, methods, sampled_storage_cost
from ..decoder import jl_bound
from ..embeddings import FAMILIES, FactSet, family_fact_set
from ..ustar import decodability
from . import engine

DEFAULT_MULTIPLIER = 1.5  # construct()'s width_multiplier
MULTIPLIERS = (1.0, 1.25, DEFAULT_MULTIPLIER)
GD_METHODS = ("gd",)  # methods whose step cap is the cell's gd_steps
# The cost-search experiments also run on a GPU (--device cuda): the GD MLPs' logits (models x F x |V| per
# step) make the seed's larger GD cells days of CPU time.
COST_DEVICES = engine.CPU_OR_CUDA


def num_facts(dim: int, ratio: float) -> int:
    """F = ratio · d² (the seed's α = F / d²), at least 2."""
    return max(2, round(ratio * dim * dim))


def cost_cell(method: str, family: str, facts: int, dim: int, seeds: int, *, max_size: int = 1 << 17,
              gd_steps: int = 20000, **options) -> dict:
    """A cell config for one cost search (JSON-able)."""
    if method not in methods:
        raise ValueError(f"method must be one of {sorted(methods)}, got {method!r}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family!r}")
    config = {"method": method, "family": family, "facts": facts, "d": dim, "seeds": seeds, "max_size": max_size,
              **options}
    if method in GD_METHODS:
        config["gd_steps"] = gd_steps
    if method == "ours":
        config.setdefault("multipliers", list(MULTIPLIERS))
    return config


def sampler(config: dict) -> Callable[..., FactSet]:
    """Seed -> the cell's fact set of that seed, on the device the cell runs on (:func:`engine.cell_device`)."""
    device = engine.cell_device()

    def sample(seed: int) -> FactSet:
        return FactSet(*(t.to(device) for t in family_fact_set(config["family"], config["facts"], config["d"],
                                                                seed=seed)))
    return sample


def search_cost(config: dict, **extra) -> dict:
    sample = sampler(config)
    options = {"whiten": config["whiten"]} if config.get("whiten") else {}
    if config["method"] in GD_METHODS:
        options["steps"] = config["gd_steps"]
    cost = sampled_storage_cost(config["method"], sample, seeds=config["seeds"], max_size=config["max_size"],
                                progress=False, checkpoint=engine.partial_path(), **options, **extra)
    return {"size_name": cost.size_name, "size": cost.size, "parameters": cost.parameters,
            "accuracies": cost.accuracies,
            # best worst-seed accuracy over the sizes tried: how close a method that stores nothing came
            "best_min_accuracy": max(min(t.accuracies) for t in cost.trace),
            "trace": [[t.size, t.stored, min(t.accuracies)] for t in cost.trace]}


def run_cost_cell(config: dict) -> dict:
    """The cost search of one cell, ρ of its values (mean over seeds) and, for "ours", every multiplier."""
    result = search_cost(config)
    sample = functools.partial(family_fact_set, config["family"], config["facts"], config["d"])
    value_sets = [sample(seed=s).V for s in range(config["seeds"])]
    rhos = [decodability(V) for V in value_sets]
    result["rho"] = float(np.mean(rhos))
    result["coherence"] = float(np.mean([coherence(V) for V in value_sets]))
    if result["size_name"] == "m" and result["size"] is not None:
        result["jl_compresses"] = result["size"] < config["d"]
    if config["method"] == "ours":  # Thm B.5.3 at the worst seed's rho (delta = 0.1)
        result["jl_bound"] = jl_bound(min(rhos), config["facts"])
    if config.get("encoder_width_search") and result["size"] is not None:
        result["width_search"] = encoder_width_search(config, result["size"])
    if config["method"] == "ours":
        by_multiplier = {}
        for mult in config["multipliers"]:
            found = result if mult == DEFAULT_MULTIPLIER else search_cost(config, width_multiplier=mult,
                                                                       start=result["size"] or 8)
            by_multiplier[f"{mult:g}"] = {"m": found["size"], "parameters": found["parameters"]}
        stored = {k: v for k, v in by_multiplier.items() if v["parameters"]}
        result["by_multiplier"] = by_multiplier
        result["cheapest_multiplier"] = min(stored, key=lambda k: stored[k]["parameters"]) if stored else None
        result["cheapest_parameters"] = stored[result["cheapest_multiplier"]]["parameters"] if stored else None
    return result


def coherence(V: torch.Tensor) -> float:
    """Def. B.5.7: max_{i≠j} |<v_i, v_j>| of the unit-normalized rows of V (|V|, d)."""
    unit = torch.nn.functional.normalize(V.double(), dim=1)
    gram = (unit @ unit.T).abs()
    gram.fill_diagonal_(0.0)
    return float(gram.max())


def encoder_width_search(config: dict, m: int) -> dict:
    """The seed's second search for the GD-encoder hybrids (Fig. 2c): at the m found, the smallest GD
    encoder width that stores, from the default ⌈mF/d⌉ down (or up to multiplier 2)."""
    default = math.ceil(m * config["facts"] / config["d"])
    cost = sampled_storage_cost(encoder_width_method(config["method"], m), sampler(config), seeds=config["seeds"],
                                start=default, max_size=2 * default, progress=False, checkpoint=engine.partial_path())
    return {"m": m, "default_width": default, "width": cost.size, "parameters": cost.parameters,
            "trace": [[t.size, t.stored, min(t.accuracies)] for t in cost.trace]}


def setting_text(cells: list[engine.Cell], paper: str) -> str:
    """What ran, from the cells' configs: d, F, seeds, GD steps, and how it differs from the paper."""
    configs = [c.config for c in cells]
    dims = sorted({c["d"] for c in configs})
    facts = sorted({c["facts"] for c in configs})
    seeds = sorted({c["seeds"] for c in configs})
    steps = sorted({c["gd_steps"] for c in configs if "gd_steps" in c})
    text = (f"d={','.join(map(str, dims))}, F={','.join(map(str, facts))}, {'/'.join(map(str, seeds))} seeds "
            f"(cost = worst seed), methods {','.join(sorted({c['method'] for c in configs}))}")
    if steps:
        text += f", GD <= {','.join(map(str, steps))} Adam steps"
    ours = [c for c in cells if c.config["method"] == "ours" and c.result["size"] is not None]
    uncompressed = [c for c in ours if not c.result["jl_compresses"]]
    if uncompressed:
        text += (f"; m >= d in {len(uncompressed)} of {len(ours)} 'ours' cells (the JL step compresses nothing "
                 "there)")
    return f"{text}; paper: {paper}"


def cost_rows(cells: list[engine.Cell]) -> list[dict]:
    return [{**{k: c.config[k] for k in ("method", "family", "facts", "d", "seeds")},
             **({"whiten": c.config["whiten"]} if "whiten" in c.config else {}),
             **{k: c.result.get(k) for k in ("size", "parameters", "rho", "coherence", "best_min_accuracy",
                                              "jl_compresses", "cheapest_multiplier", "cheapest_parameters")},
             **({"after_width_search": c.result["width_search"]["parameters"]} if "width_search" in c.result else {})}
            for c in cells]


def by_method(cells: list[engine.Cell]) -> dict[str, list[engine.Cell]]:
    grouped: dict = {}
    for c in cells:
        grouped.setdefault(c.config["method"], []).append(c)
    return grouped


def cells_with_m_at_least_d(cells: list[engine.Cell]) -> list[str]:
    return [f"{c.config['method']} d={c.config['d']} F={c.config['facts']} m={c.result['size']}" for c in cells
            if c.result.get("jl_compresses") is False]
