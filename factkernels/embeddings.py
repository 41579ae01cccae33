"""Fact sets for experiments: spherical, tied, anisotropic and real-token embeddings.

:func:`random_fact_set` samples keys K (F, d), values V (|V|, d) and a map f (F,); the
families of the seed's capacity sweeps (A.1.1) are options of it:

=============  ==========================================================================
spherical      i.i.d. uniform on S^{d-1} (keys and values drawn independently)
tied           K = V (the seed's default, like tied word embeddings; needs F = |V|)
anisotropic    ``kappa`` > 1: V's singular values rescaled log-affinely to condition
               number kappa (:func:`anisotropic`); tied keys follow
tokens         ``source="tokens"``: real all-MiniLM-L6-v2 token embeddings (below), a
               seeded sample of tokens, centred, projected on the top-d principal
               directions of the shipped slice and scaled to unit norm
=============  ==========================================================================

Maps: "bijective" (a random permutation, needs F = |V|; the seed's protocol) or "random"
(i.i.d. uniform value per key). :data:`FAMILIES` names the combinations the experiments use.

Real token embeddings: :func:`factkernels.datasets.token_embeddings` (all-MiniLM-L6-v2, shipped).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import torch
from safetensors.torch import load_file

from .datasets import token_embeddings
from .validation import check_matrix, check_positive_int


def anisotropic(E: torch.Tensor, kappa: float) -> torch.Tensor:
    """Rescale the singular values of ``E`` to condition number ``kappa`` (Appendix A.1.1).

    With ``E = A diag(s) B^T`` (thin SVD), the left and right singular vectors
    are kept and the singular values are rescaled log-affinely so that the
    largest is preserved and the smallest becomes ``s_max / kappa``::

        log s'_k = log s_max + (log s_k - log s_max) * log(kappa) / (log s_max - log s_min)

    (the relative order and the log-spacing pattern of the spectrum are kept).
    ``kappa = 1`` makes all singular values ``s_max``.  If all singular values
    are equal, they are spread log-linearly by index: ``s'_k = s_max kappa^(-k/(r-1))``.

    Args:
        E: (F, d) floating tensor of full rank ``r = min(F, d)``.
        kappa: target condition number ``s'_max / s'_min``, finite and >= 1.

    Returns:
        (F, d) tensor with the singular vectors of ``E`` and condition number
        ``kappa`` (dtype/device of E).
    """
    E = check_matrix(E, "E", min_rows=1)
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not math.isfinite(kappa) or kappa < 1:
        raise ValueError(f"kappa must be a finite float >= 1 (target condition number), got {kappa!r}")
    with torch.no_grad():
        Ed = E.detach().to(torch.float64)
        A, s, Bh = torch.linalg.svd(Ed, full_matrices=False)
        r = s.numel()
        smax, smin = s[0], s[-1]
        if float(smin) <= float(smax) * 1e-15 or float(smax) == 0.0:
            raise ValueError(
                "E is rank deficient (its smallest singular value is 0); anisotropic needs full rank"
            )
        lk = math.log(float(kappa))
        spread = float(torch.log(smax) - torch.log(smin))
        if spread <= 1e-12:
            t = torch.arange(r, dtype=torch.float64, device=Ed.device) / max(r - 1, 1)
            logs = torch.log(smax) - t * lk
        else:
            logs = torch.log(smax) + (torch.log(s) - torch.log(smax)) * (lk / spread)
        out = (A * torch.exp(logs)[None, :]) @ Bh
    return out.to(E.dtype)


def spherical(
    n: int,
    d: int,
    *,
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``n`` i.i.d. points uniform on the unit sphere ``S^{d-1}``.

    Args:
        n: number of points (>= 1).
        d: dimension (>= 1).
        generator: optional ``torch.Generator`` (same seed, same result); the
            points are created on the generator's device.
        dtype: floating dtype of the result.

    Returns:
        (n, d) tensor with unit-norm rows.
    """
    for name, val in (("n", n), ("d", d)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    device = generator.device if generator is not None else torch.device("cpu")
    X = torch.randn(n, d, generator=generator, dtype=torch.float64, device=device)
    nrm = X.norm(dim=1, keepdim=True)
    while bool((nrm == 0).any()):  # probability 0, but never return a zero row
        zero = (nrm == 0)[:, 0]
        X[zero] = torch.randn(int(zero.sum()), d, generator=generator, dtype=torch.float64, device=device)
        nrm = X.norm(dim=1, keepdim=True)
    return (X / nrm).to(dtype)


# ----------------------------------------------------------------------------- fact sets

EMBEDDING_SOURCES = ("spherical", "tokens")
FACT_MAPS = ("bijective", "random")


class FactSet(NamedTuple):
    """Keys K (F, d), values V (|V|, d), map f (F,) int64."""

    K: torch.Tensor
    V: torch.Tensor
    f: torch.Tensor


@functools.lru_cache(maxsize=1)
def _centred_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """The shipped slice centred, float64 (4096, 384), and its principal directions (384, 384)."""
    table = token_embeddings(source="shipped", center=True)[0].double()
    _, vectors = torch.linalg.eigh(table.T @ table)  # ascending eigenvalues; the d x d problem is the cheap one
    return table, vectors.flip(1).T.contiguous()


def token_points(n: int, dim: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """n distinct real token embeddings in R^dim: (n, dim), unit-norm rows.

    A seeded sample of the shipped tokens, centred (their large shared direction would
    otherwise dominate every inner product) and projected on the top-``dim`` principal
    directions of the whole shipped slice, so the anisotropy of the real spectrum is kept.
    """
    table, right = _centred_tokens()
    if n > table.shape[0]:
        raise ValueError(f"asked for {n} token embeddings, the package ships {table.shape[0]}")
    if dim > table.shape[1]:
        raise ValueError(f"dim must be <= {table.shape[1]} for token embeddings, got {dim}")
    rows = torch.randperm(table.shape[0], generator=generator)[:n]
    points = table[rows] @ right[:dim].T
    return (points / points.norm(dim=1, keepdim=True)).to(dtype)


def random_fact_set(num_facts: int, num_values: int, dim: int, *, seed: int, tied: bool = False,
                    kappa: float = 1.0, source: str = "spherical", fact_map: Optional[str] = None,
                    dtype: torch.dtype = torch.float32) -> FactSet:
    """Keys, values and a map f from one of the embedding families (module docstring).

    Args:
        num_facts: F keys; num_values: |V| values; dim: d.
        seed: seeds every random choice (same seed, same fact set).
        tied: K = V (needs F = |V|). kappa: condition number of the values (1 = unchanged).
        source: "spherical" or "tokens" (real token embeddings; F + |V| <= 4096, d <= 384).
        fact_map: "bijective" (needs F = |V|) or "random"; default bijective when F = |V|.
        dtype: float32 or float64.

    Returns:
        :class:`FactSet` (K (F, d), V (|V|, d), f (F,) int64).
    """
    check_positive_int("num_facts", num_facts)
    check_positive_int("num_values", num_values)
    check_positive_int("dim", dim)
    if source not in EMBEDDING_SOURCES:
        raise ValueError(f"source must be one of {EMBEDDING_SOURCES}, got {source!r}")
    if fact_map is None:
        fact_map = "bijective" if num_facts == num_values else "random"
    if fact_map not in FACT_MAPS:
        raise ValueError(f"fact_map must be one of {FACT_MAPS}, got {fact_map!r}")
    if fact_map == "bijective" and num_facts != num_values:
        raise ValueError(f"a bijective map needs facts == values, got {num_facts} and {num_values}; "
                         "use fact_map='random'")
    if tied and num_facts != num_values:
        raise ValueError(f"tied keys need facts == values, got {num_facts} and {num_values}")
    gen = torch.Generator().manual_seed(seed)
    if source == "tokens":
        points = token_points(num_values + (0 if tied else num_facts), dim, generator=gen, dtype=dtype)
        values, keys = points[:num_values], points[num_values:]
    else:
        values = spherical(num_values, dim, generator=gen, dtype=dtype)
    if kappa > 1:
        values = anisotropic(values, kappa)
    if tied:
        keys = values.clone()
    elif source == "spherical":
        keys = spherical(num_facts, dim, generator=gen, dtype=dtype)
    if fact_map == "bijective":
        facts = torch.randperm(num_values, generator=gen)
    else:
        facts = torch.randint(num_values, (num_facts,), generator=gen)
    return FactSet(keys, values, facts)


# name -> random_fact_set options; every family is tied and bijective (F = |V|) as in the seed.
FAMILIES: dict[str, dict] = {
    "spherical": {"tied": True},
    "anisotropic-4": {"tied": True, "kappa": 4.0},
    "anisotropic-16": {"tied": True, "kappa": 16.0},
    "anisotropic-64": {"tied": True, "kappa": 64.0},
    "anisotropic-256": {"tied": True, "kappa": 256.0},
    "anisotropic-1024": {"tied": True, "kappa": 1024.0},
    "tokens": {"tied": True, "source": "tokens"},
}


def family_fact_set(family: str, num_facts: int, dim: int, *, seed: int,
                    dtype: torch.dtype = torch.float32) -> FactSet:
    """A tied bijective fact set (F = |V|) of the named family in :data:`FAMILIES`."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family!r}")
    return random_fact_set(num_facts, num_facts, dim, seed=seed, dtype=dtype, **FAMILIES[family])


# ----------------------------------------------------------------------------- the user's own files

MATRIX_SUFFIXES = (".safetensors", ".npy", ".pt")
FACTS_SUFFIXES = (".npy", ".csv")


def load_matrix(path, name: str = "matrix") -> torch.Tensor:
    """An (n, d) float matrix from ``.safetensors`` (one tensor), ``.npy`` or ``.pt`` (a tensor).

    No pickle: ``.npy`` loads with ``allow_pickle=False`` and ``.pt`` with ``weights_only=True``.
    ``name`` (e.g. "keys") names the argument in errors.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in MATRIX_SUFFIXES:
        raise ValueError(f"{name} file {path} must end in one of {MATRIX_SUFFIXES}")
    if not path.is_file():
        raise FileNotFoundError(f"{name} file {path} does not exist")
    if suffix == ".safetensors":
        tensors = load_file(str(path))
        if len(tensors) != 1:
            raise ValueError(f"{name} file {path} must hold exactly one tensor, found {sorted(tensors)}")
        matrix = next(iter(tensors.values()))
    elif suffix == ".npy":
        matrix = torch.from_numpy(np.load(path, allow_pickle=False))
    else:
        matrix = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(matrix, torch.Tensor):
            raise ValueError(f"{name} file {path} must hold one tensor, found {type(matrix).__name__}")
    if matrix.dim() != 2 or not matrix.dtype.is_floating_point:
        raise ValueError(f"{name} in {path} must be a 2-D float matrix, got shape {tuple(matrix.shape)} {matrix.dtype}")
    return matrix


def load_facts(path, num_values: int) -> torch.Tensor:
    """The map f (F,) int64 from ``.npy`` or ``.csv`` (integers, one per line or comma-separated).

    Every entry must index a value row: 0 <= f[i] < num_values.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FACTS_SUFFIXES:
        raise ValueError(f"facts file {path} must end in one of {FACTS_SUFFIXES}")
    if not path.is_file():
        raise FileNotFoundError(f"facts file {path} does not exist")
    array = np.load(path, allow_pickle=False) if suffix == ".npy" else np.loadtxt(path, delimiter=",", ndmin=1)
    facts = torch.from_numpy(np.asarray(array)).reshape(-1)
    if facts.dtype.is_floating_point:
        if not bool((facts == facts.round()).all()):
            raise ValueError(f"facts in {path} must be integers")
        facts = facts.round()
    elif facts.dtype == torch.bool:
        raise ValueError(f"facts in {path} must be integers, got booleans")
    facts = facts.to(torch.int64)
    if facts.numel() == 0:
        raise ValueError(f"facts file {path} is empty")
    if int(facts.min()) < 0 or int(facts.max()) >= num_values:
        raise ValueError(f"facts in {path} must lie in [0, {num_values}) (the rows of values), "
                         f"got [{int(facts.min())}, {int(facts.max())}]")
    return facts
