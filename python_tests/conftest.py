"""Shared fixtures: seeded fact sets and device parametrization."""

import pytest
import torch

from factkernels.cli import random_fact_set


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
