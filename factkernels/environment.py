"""The environment recorded beside every result (CLI reports, experiments)."""

from __future__ import annotations

import os
import platform
import sys

import networkx
import numpy as np
import scipy
import torch

from . import _ops


# The real-model extra: its versions are recorded when the run imported it (a checkpoint or a number made with
# one transformers release can differ under another); not imported here, it costs seconds.
OPTIONAL = ("transformers", "tokenizers", "gguf", "accelerate")


def environment() -> dict:
    """Versions (the optional real-model packages when imported), platform, threads and what was compiled."""
    optional = {name: getattr(sys.modules[name], "__version__", "unknown") for name in OPTIONAL if name in sys.modules}
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "scipy": scipy.__version__, "networkx": networkx.__version__, **optional, "platform": platform.platform(),
            "processor": platform.processor(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "build": _ops.build_info()}
