"""factkernels: fact-storing MLPs by construction, fast kernels, capacity measurements.

    mlp = factkernels.construct(K, V, f, m=64)   # K (F, d), V (|V|, d), f (F,) long
    mlp(K)                                       # (F, d)
    mlp.predict(K, V)                            # (F,) == f
    print(mlp.report)
"""

from ._ops import build_info
from .construct import ConstructionReport, FactStorageError, construct
from .geometry import whiten
from .incremental import FactBuilder
from .mlp import FactMLP
from .ustar import decodability, margin_optimal_outputs

__version__ = "0.1.0"

__all__ = [
    "construct",
    "FactMLP",
    "FactBuilder",
    "ConstructionReport",
    "FactStorageError",
    "decodability",
    "margin_optimal_outputs",
    "whiten",
    "build_info",
    "__version__",
]
