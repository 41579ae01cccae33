"""Shared fixtures: seeded fact sets and device parametrization."""

import pytest
import torch

from factkernels.embeddings import random_fact_set


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_cuda)


@pytest.fixture
def small_facts():
    """d=16, F=|V|=96 spherical keys and values, random bijection, float64."""
    return random_fact_set(96, 96, 16, seed=1, dtype=torch.float64)


@pytest.fixture
def medium_facts():
    """d=32, F=|V|=256, float32 (the seed's d=32 scale)."""
    return random_fact_set(256, 256, 32, seed=2)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny training problems run faster on one thread than with thread hand-offs,
    which dominate (10x and more) on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny():
    """d=16, F=|V|=24, tied spherical keys and values, random bijection (float32)."""
    return random_fact_set(24, 24, 16, seed=3, tied=True)
