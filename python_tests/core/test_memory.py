"""Memory guards: a build that cannot fit raises before allocating; solver='auto' follows the estimate."""

import pytest
import torch

from factkernels import construct
from factkernels.embeddings import random_fact_set
from factkernels.encoder import gadget_width
from factkernels.memory import MemoryBudgetError, available_memory, estimate_build, format_bytes
from factkernels.solvers import pick_solver


@pytest.fixture(scope="module")
def facts():
    return random_fact_set(256, 256, 16, seed=0, dtype=torch.float64)


def test_huge_m_raises_before_allocating(facts):
    K, V, f = facts
    with pytest.raises(MemoryBudgetError, match=r"set by m=10000000\); lower m") as err:
        construct(K, V, f, m=10**7, progress=False)
    assert "available on cpu" in str(err.value)


def test_max_memory_names_the_dense_gram_and_auto_falls_back_to_cg(facts):
    K, V, f = facts
    shape = dict(num_facts=256, num_values=256, d_in=16, d_out=16, m=64, gadget_width=gadget_width(256, 16, 1.5),
                 outputs="values", dtype=torch.float64)
    cg, dense = estimate_build(**shape, solver="cg"), estimate_build(**shape, solver="cholesky")
    assert dense.parts["dense Gram"][0] == 2 * 256 * 256 * 8 and dense.total > cg.total  # float64: Gram and factor
    budget = cg.total + (dense.total - cg.total) // 2
    with pytest.raises(MemoryBudgetError, match=r"dense Gram .*set by solver='cholesky'\); use solver='cg'"):
        construct(K, V, f, m=64, outputs="values", solver="cholesky", max_memory=budget, progress=False)
    mlp = construct(K, V, f, m=64, outputs="values", max_memory=budget, progress=False)
    assert mlp.report.solver == "cg" and mlp.report.failed == 0
    assert construct(K, V, f, m=64, outputs="values", progress=False).report.solver == "cholesky"


def test_max_memory_is_checked():
    K, V, f = random_fact_set(8, 8, 4, seed=0)
    with pytest.raises(ValueError, match="max_memory must be a positive int or None"):
        construct(K, V, f, m=4, max_memory=0, progress=False)


def test_pick_solver_and_estimate_parts():
    assert pick_solver(1024, torch.device("cpu"), budget=1 << 34) == "cholesky"
    assert pick_solver(1024, torch.device("cpu"), budget=1 << 20) == "cg"
    assert pick_solver(1024, torch.device("cpu"), other_bytes=1 << 40, budget=1 << 34) == "cg"
    est = estimate_build(1000, 500, 16, 16, m=32, gadget_width=100, solver="cg", outputs="values")
    name, nbytes, argument = est.largest()
    assert nbytes == max(b for b, _ in est.parts.values()) and argument in est.args
    # MLP weights: gate (h̃, d+1), up (m·h̃, d+1), down (d_out, m·h̃ + 1), built twice, float32
    assert est.parts["MLP weights"][0] == 2 * 4 * (100 * 17 + 3200 * 17 + 16 * 3201)
    assert available_memory(torch.device("cpu")) > 0
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(3 << 40) == "3.0 TiB"
