"""The environment recorded beside every result (CLI reports, experiments)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional

import networkx
import numpy as np
import scipy
import torch

from . import _ops


# The real-model extra: its versions are recorded when the run imported it (a checkpoint or a number made with
# one transformers release can differ under another); not imported here, it costs seconds.
OPTIONAL = ("transformers", "tokenizers", "gguf", "accelerate")


def code_version(where: Optional[Path] = None) -> str:
    """The commit of the factkernels that runs (``+dirty`` with uncommitted changes in the package), or "unknown"
    for an installed copy outside a git checkout: results made by different code must be told apart.
    where: the folder asked about (default: this package's)."""
    where = Path(__file__).resolve().parent if where is None else where
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def environment() -> dict:
    """Versions (the optional real-model packages when imported), platform, threads, what was compiled, the GPU
    (when CUDA is available) and the code's commit."""
    optional = {name: getattr(sys.modules[name], "__version__", "unknown") for name in OPTIONAL if name in sys.modules}
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "scipy": scipy.__version__, "networkx": networkx.__version__, **optional, "platform": platform.platform(),
            "processor": platform.processor(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "build": _ops.build_info(),
            **({"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}), "code": code_version()}
