"""Helpers shared by test modules (conftest holds the fixtures)."""

import math

import numpy as np
import pytest
import torch

# Kernel tests run on every device present; CUDA ones are simply absent without a GPU. The cuda mark puts
# them in `pytest -m cuda`, the GPU suite's selection (without it the suite's first GPU run compared no
# CUDA kernel with its twin in these tests).
DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)] if torch.cuda.is_available() else [])


def gloo_construct_worker(rank: int, world_size: int, port: int, out: str, sizes: tuple) -> None:
    """One rank of a 2-process gloo build (lives here, not in a test module, so that spawned
    children can import it: this folder is on sys.path through pytest's ``pythonpath``)."""
    import torch.distributed as dist

    from factkernels.distributed import construct_sharded, shard_rows
    from factkernels.embeddings import random_fact_set

    facts, values, dim, m = sizes
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        K, V, f = random_fact_set(facts, values, dim, seed=0, dtype=torch.float64)
        rows = shard_rows(facts, rank, world_size)
        mlp = construct_sharded(K[rows], V, f[rows], m=m, outputs="values", cg_tol=1e-10)
        if rank == 0:
            torch.save({"state": mlp.state_dict(), "report": mlp.report.to_dict()}, out)
    finally:
        dist.destroy_process_group()


def direct_margins(V: np.ndarray, U: np.ndarray) -> np.ndarray:
    """min_{j != i} <v_i - v_j, u_i> / (|v_i - v_j| |u_i|) by the definition, pair by pair (0 for identical values)."""
    n = V.shape[0]
    out = np.empty(n)
    for i in range(n):
        best = math.inf
        for j in range(n):
            if j == i:
                continue
            diff = V[i] - V[j]
            nd = np.linalg.norm(diff)
            m = 0.0 if nd == 0 else diff @ U[i] / (nd * np.linalg.norm(U[i]))
            best = min(best, m)
        out[i] = best
    return out


# Context prefixes and background text in the tiny Llama's vocabulary (python_tests/conftest.py TINY_WORDS),
# shared by the hf insertion tests
TINY_PREFIXES = ["the old house by the river", "music in the city"]
TINY_TEXTS = ["the old house by the river", "music and rain in the city on a new day", "people know the time of year",
              "the sun and the stone . the tree and the light"] * 3
