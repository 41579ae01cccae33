"""The environment recorded beside every result (CLI reports, experiments)."""

from __future__ import annotations

import os
import platform

import networkx
import numpy as np
import scipy
import torch

from . import _ops


def environment() -> dict:
    """Versions, platform, threads and what was compiled."""
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "scipy": scipy.__version__, "networkx": networkx.__version__, "platform": platform.platform(),
            "processor": platform.processor(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "build": _ops.build_info()}
