"""Memory guards: a build that cannot fit raises before allocating; solver='auto' follows the estimate."""

import math
import sys

import pytest
import torch

from factkernels import construct
from factkernels.embeddings import random_fact_set
from factkernels.decoder import least_m
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


def test_max_memory_names_the_dense_gram_and_auto_falls_back_to_cg():
    K, V, f = random_fact_set(1024, 1024, 16, seed=0, dtype=torch.float64)
    shape = dict(num_facts=1024, num_values=1024, d_in=16, d_out=16, m=128, gadget_width=gadget_width(1024, 16, 1.5),
                 outputs="values", dtype=torch.float64)
    cg, dense = estimate_build(**shape, solver="cg"), estimate_build(**shape, solver="cholesky")
    assert dense.parts["dense Gram"][0] == 2 * 1024 * 1024 * 8 and dense.total > cg.total  # float64: Gram and factor
    budget = cg.total + (dense.total - cg.total) // 2
    with pytest.raises(MemoryBudgetError, match=r"dense Gram .*set by solver='cholesky'\); use solver='cg'"):
        construct(K, V, f, m=128, outputs="values", solver="cholesky", max_memory=budget, progress=False)
    mlp = construct(K, V, f, m=128, outputs="values", max_memory=budget, progress=False)
    assert mlp.report.solver == "cg" and mlp.report.failed == 0
    assert construct(K, V, f, m=128, outputs="values", progress=False).report.solver == "cholesky"


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
    assert nbytes == max(b for b, arg in est.parts.values() if arg) and argument in est.args
    assert est.parts["runtime"] == (64 << 20, None)  # never named as the part to change
    # MLP weights: gate (h̃, d+1), up (m·h̃, d+1), down (d_out, m·h̃ + 1), built twice, float32
    assert est.parts["MLP weights"][0] == 2 * 4 * (100 * 17 + 3200 * 17 + 16 * 3201)
    assert available_memory(torch.device("cpu")) > 0
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(3 << 40) == "3.0 TiB"


@pytest.mark.parametrize("m", [12, None])
def test_guard_refuses_before_any_work_with_the_estimate(facts, monkeypatch, m):
    """Under a budget below the estimate, construct raises before it computes anything (the outputs' pass is the
    first work) and the message gives the estimate's total and its parts."""
    construct_module = sys.modules["factkernels.construct"]  # the package's name "construct" is the function

    K, V, f = facts
    width = gadget_width(256, 16, 1.5)
    est = estimate_build(256, 256, 16, 16, m=m or least_m(None, 256), gadget_width=width, solver="cg",
                         outputs="values", dtype=torch.float64, cpu_kernels=False)  # m=None: the least m searched

    def never(*args, **kwargs):
        raise AssertionError("the build started before the guard refused it")

    monkeypatch.setattr(construct_module, "output_embeddings", never)
    with pytest.raises(MemoryBudgetError) as err:
        construct(K, V, f, m=m, outputs="values", solver="cg", backend="torch", max_memory=est.total - 1,
                  progress=False)
    message = str(err.value)
    assert f"would need about {format_bytes(est.total)} but {format_bytes(est.total - 1)} is max_memory" in message
    assert f"Estimate: {est}" in message


# the build of the fixture's facts that the guard tests below run, and its estimate's arguments but m
_RUN = dict(outputs="values", solver="cg", backend="torch", progress=False)
_SHAPE = dict(num_facts=256, num_values=256, d_in=16, d_out=16, gadget_width=gadget_width(256, 16, 1.5), solver="cg",
              outputs="values", dtype=torch.float64, cpu_kernels=False)


@pytest.mark.parametrize("m", [None, "bound"])
def test_unknown_m_is_guarded_at_the_least_m_it_can_reach(facts, monkeypatch, m):
    """m=None / "bound": a budget that fits m = 1 but not the least m the search (or the bound) can return is
    refused before the outputs' pass, naming the m assumed."""
    construct_module = sys.modules["factkernels.construct"]
    K, V, f = facts
    least = least_m(m, 256)
    assert least == (math.ceil(math.log(256)) if m is None else math.ceil(32 * math.log(4 * 256 * 255 / 0.1)))
    at_one, at_least = estimate_build(**_SHAPE, m=1), estimate_build(**_SHAPE, m=least)
    assert at_one.total < at_least.total

    def never(*args, **kwargs):
        raise AssertionError("the build started before the guard refused it")

    with monkeypatch.context() as patch:
        patch.setattr(construct_module, "output_embeddings", never)
        with pytest.raises(MemoryBudgetError) as err:
            construct(K, V, f, m=m, max_memory=at_one.total, **_RUN)
    message = str(err.value)
    assert message.startswith(f"construct at m={least} (the least m that m={m!r} can pick, rho <= 1) would need "
                              f"about {format_bytes(at_least.total)} but {format_bytes(at_one.total)} is max_memory")
    assert f"Estimate: {at_least}" in message


def test_a_search_that_fits_still_builds(facts):
    """m=None under a budget that fits the m searched (above the least m): the build and the m are unchanged."""
    K, V, f = facts
    searched = construct(K, V, f, m=None, **_RUN).report.m
    assert searched > least_m(None, 256)
    mlp = construct(K, V, f, m=None, max_memory=estimate_build(**_SHAPE, m=searched).total, **_RUN)
    assert mlp.report.m == searched and mlp.report.failed == 0


def test_estimate_counts_the_cg_transients():
    """The twins' row block (within _ops.GADGET_TWIN_BYTES, whole when F is small), nine (F, m) CG vectors, the
    deflation; total = held parts + the largest phase."""
    from factkernels import _ops

    F, d, m, width = 100_000, 64, 40, 200
    est = estimate_build(F, F, d, d, m=m, gadget_width=width, solver="cg", outputs="values", device_type="cuda",
                         cpu_kernels=False)
    rows = _ops.GADGET_TWIN_BYTES["cuda"] // (m * width * 4)
    assert rows < F and est.parts["gadget product block"][0] == rows * m * width * 4
    cpu = estimate_build(F, F, d, d, m=m, gadget_width=width, solver="cg", outputs="values", cpu_kernels=False)
    assert cpu.parts["gadget product block"][0] == (_ops.GADGET_TWIN_BYTES["cpu"] // (m * width * 4)) * m * width * 4
    small = estimate_build(1000, 1000, d, d, m=m, gadget_width=width, solver="cg", outputs="values", cpu_kernels=False)
    assert small.parts["gadget product block"][0] == 1000 * m * width * 4  # one block of all rows
    kernels = estimate_build(1000, 1000, d, d, m=m, gadget_width=width, solver="cg", outputs="values")
    assert kernels.parts["gadget product block"][0] == 0  # the CPU kernels hold no block
    assert est.parts["targets and dual variables"][0] + est.parts["CG vectors"][0] == 9 * F * m * 4
    phases = est.phase_bytes()
    assert set(phases) == {"held", "outputs", "m search", "solve", "verify"}
    assert est.total == phases["held"] + max(v for k, v in phases.items() if k != "held")
    assert est.total < sum(b for b, _ in est.parts.values())
