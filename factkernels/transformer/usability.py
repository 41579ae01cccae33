"""Capacity vs usability and the Lipschitz constant of fact MLPs (seed 000 §5.2–5.3, App. A.2.4–A.2.5).

    capacity  = # facts the MLP stores / # facts
    usability = fact-adaptive accuracy / capacity
    Lip(Vᵀ MLP(rms(·))) ≈ max_i σ₁(J(k_i)),  J(x) = ∂ Vᵀ MLP(RMSNorm(x)) / ∂x      (eq. 8)

:func:`lipschitz` estimates eq. 8 on 100 random keys (torch.func.jacrev + the spectral norm).
:func:`run_usability` sweeps the condition number κ of the transformer embeddings and the
whitening strength α of the MLP embeddings; for each (κ, α) it builds the MLPs on whitened
embeddings (whitening folded into the weights), trains transformers with several seeds and
learning rates, keeps the best fact-adaptive accuracy and records capacity, usability and the
Lipschitz estimate of the swapped-in MLP.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from scipy import stats
from torch import nn

from ..progress import progress_bar
from ..ustar import decodability
from .ssfr import SSFRTask
from .training import SEED_LR, build_fact_mlp, run_fact_adaptive

SEED_ALPHAS = [0.0, 0.01, 0.022, 0.046, 0.1, 0.22, 0.46, 1.0]  # App. A.2.4
SEED_KAPPAS = [1.1, 1e1, 2.5e1, 5e1, 2.5e2, 1e3, 1e4, 1e6]  # SwiGLU MLPs, App. A.2.4
SEED_LRS = [2e-6, 2e-5, 2e-4, 2e-3, 2e-2]  # App. A.2.4
SEED_LIPSCHITZ_SAMPLES = 100  # App. A.2.5
SEED_CLAIMS = {
    "capacity_vs_usability": "tradeoff: less-whitened MLPs store fewer facts but are more usable, highly "
                             "whitened MLPs store more but are harder for transformers to use (Fig. 3b, 8a)",
    "lipschitz_vs_usability": "a larger Lipschitz constant max_i sigma1(J(k_i)) goes with lower usability (Fig. 3c, 8b)",
}


def lipschitz(mlp: nn.Module, keys: torch.Tensor, values: torch.Tensor, *, num_samples: int = SEED_LIPSCHITZ_SAMPLES,
              seed: int = 0, chunk: int = 16) -> float:
    """max_i σ₁(J(k_i)) over ``num_samples`` random transformer keys (all if fewer), eq. 8.

    J(x) = ∂ Vᵀ mlp(x / ‖x‖) / ∂x, (|V|, d): the frozen pre-MLP RMSNorm projects onto the sphere.
    keys: (F, d) transformer key embeddings (not normalized), values: (|V|, d).
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    generator = torch.Generator().manual_seed(seed)
    picked = keys[torch.randperm(keys.shape[0], generator=generator)[:num_samples]]

    def mlp_on_sphere(x: torch.Tensor) -> torch.Tensor:  # (d,) -> (d,)
        return mlp(x / x.norm())

    jacobian = torch.func.vmap(torch.func.jacrev(mlp_on_sphere))
    best = 0.0
    for start in range(0, picked.shape[0], chunk):
        inner = jacobian(picked[start:start + chunk])  # (n, d_out, d) Jacobian of the MLP behind the norm
        sigma = torch.linalg.matrix_norm(values @ inner, ord=2)  # (n,) spectral norms of (|V|, d) Jacobians
        best = max(best, float(sigma.max()))
    return best


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation of two equal-length sequences (scipy; average ranks for ties).

    NaN when either sequence is constant (no ranking to correlate).
    """
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"x and y must have the same length >= 2, got {len(x)} and {len(y)}")
    if len(set(x)) < 2 or len(set(y)) < 2:
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


def run_usability(*, num_keys: int, dim: int, size: int, kind: str = "gd", kappas: Sequence[float] = (1.1,),
                  alphas: Sequence[float] = (0.0, 1.0), lrs: Sequence[float] = (SEED_LR,), seeds: Sequence[int] = (0,),
                  task_seed: int = 0, new_facts_seed: int = 1, gd_steps: int = 20000,
                  lipschitz_samples: int = SEED_LIPSCHITZ_SAMPLES, device: str = "cpu",
                  switches: Optional[dict] = None, progress: bool = True, **train_options) -> list[dict]:
    """One row per (κ, α): rho of the embeddings, capacity, fact-adaptive accuracy, usability, Lipschitz.

    size: code dimension m ("constructed") or hidden width ("gd") of every MLP.
    switches go to :class:`~factkernels.transformer.model.FactTransformer` (default: the seed's
    modifications); train_options to :func:`~factkernels.transformer.training.train_ssfr`.
    """
    rows = []
    grid = [(kappa, alpha) for kappa in kappas for alpha in alphas]
    for kappa, alpha in progress_bar(grid, desc="usability", enabled=progress):
        task = SSFRTask(num_keys, dim, kappa=kappa, seed=task_seed)
        keys, values = task.mlp_keys, task.mlp_values
        result = run_fact_adaptive(
            task, lambda f: build_fact_mlp(kind, keys, values, f, size, whiten=alpha, seed=task_seed, gd_steps=gd_steps),
            new_facts=task.new_facts(new_facts_seed), seeds=seeds, lrs=lrs, device=device, switches=switches,
            progress=progress, **train_options)
        rows.append({
            "kappa": kappa, "alpha": alpha, "rho_values": decodability(values),
            "capacity": result.capacity_new, "capacity_train_mlp": result.capacity_train,
            "fact_adaptive_accuracy": result.fact_adaptive_accuracy, "usability": result.usability,
            "lipschitz": lipschitz(result.new_mlp, task.embeddings[task.key_tokens], values,
                                   num_samples=lipschitz_samples, seed=task_seed),
            "runs": result.runs,
        })
    return rows
