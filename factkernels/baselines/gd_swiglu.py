"""The GD MLP baseline (seed 000, A.1.3): a SwiGLU MLP trained with full-batch Adam to store facts.

Cross-entropy on the dot-product logits g(K) Vᵀ (cosine learning rate 1e-3 -> 1e-6, up to 20000 steps) is
the capacity baseline; MSE to the target values is the fact experts of the seed's language model (App. A.3.2).
:func:`gd_mlp_batch` trains B independent models (one per fact set, width and seed) as one stacked model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence, Union

import torch

from .. import _ops
from ..embeddings import FactSet
from ..mlp import FactMLP
from ..validation import check_positive_int as _check_count
from .batched_adam import ActiveRows, check_rates, fit, per_model_counts, per_model_seeds, stack_fact_sets
from .stacked_swiglu import (all_decoded_near, batched_cross_entropy, decoding_radii, init_stacked_swiglu,
                             stacked_swiglu_forward, unstack_swiglu)


GD_LOSSES = ("ce", "mse")
# When a GD MLP stops: "stored", at the first step whose forward pass stores every fact (the capacity searches);
# "converged", after its whole cosine schedule or once its loss per output coordinate falls to CONVERGED_LOSS
# (the authors' released fact experts: 10,000 full-batch Adam steps, cutoff 1e-7 on the mean squared error).
GD_STOPS = ("stored", "converged")
CONVERGED_LOSS = 1e-7


def gd_mlp_batch(
    fact_sets: Sequence[FactSet],
    hiddens: Union[int, Sequence[int]],
    seeds: Sequence[int],
    *,
    steps: int = 20000,
    lr: float = 1e-3,
    final_lr: float = 1e-6,
    activation: str = "silu",
    loss: str = "ce",
    until: str = "stored",
    progress: bool = True,
    backend: str = "auto",
) -> list[FactMLP]:
    """B SwiGLU MLPs trained as one batch: model b stores fact set b with width hiddens[b] from seed seeds[b].

    fact_sets: B triples (K (F, d_in), V (|V|, d_out), f (F,)) of one shape (the same one B times
    for several seeds on one fact set). Otherwise as :func:`gd_mlp`, which is the batch of one.
    """
    K, V, facts = stack_fact_sets(fact_sets)
    count = K.shape[0]
    hiddens = per_model_counts("hidden", hiddens, count)
    seeds = per_model_seeds(seeds, count)
    _check_count("steps", steps)
    check_rates(lr, final_lr)
    _ops.check_activation(activation)
    if loss not in GD_LOSSES:
        raise ValueError(f"loss must be one of {GD_LOSSES}, got {loss!r}")
    if until not in GD_STOPS:
        raise ValueError(f"until must be one of {GD_STOPS}, got {until!r}")
    if backend not in _ops.BACKENDS:
        raise ValueError(f"backend must be one of {_ops.BACKENDS}, got {backend!r}")
    cutoff = CONVERGED_LOSS * (1 if loss == "ce" else V.shape[2])  # the MSE below sums over the d_out coordinates
    targets = torch.gather(V, 1, facts.unsqueeze(2).expand(-1, -1, V.shape[2]))  # (B, F, d_out)
    # MSE checks decoding only where an output is not already inside its target's decoding region (a converged
    # run never checks decoding while it trains, so it needs no radii)
    radii = (decoding_radii(V, facts) if loss == "mse" and until == "stored"
             else torch.zeros(facts.shape, device=K.device))
    training = ActiveRows(K, V, facts, targets, radii)

    def objective(params: list[torch.Tensor], active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values, rows, wanted, radius = training(active)
        outputs = stacked_swiglu_forward(params, keys, activation)  # (b, F, d_out)
        if loss == "ce":
            value, hit = batched_cross_entropy(torch.bmm(outputs, values.transpose(1, 2)), rows, backend)  # (b, F, |V|)
            value = value.mean(1)
            return value, (hit.all(1) if until == "stored" else value.detach() <= cutoff)
        errors = (outputs - wanted).square().sum(2)
        value = errors.mean(1)
        if until == "converged":
            return value, value.detach() <= cutoff
        return value, all_decoded_near(outputs.detach(), values, rows, errors.detach(), radius)

    initial = init_stacked_swiglu(K.shape[2], hiddens, [V.shape[2]] * count, seeds, K)
    params, results = fit(initial, objective, steps=steps, lr=lr, final_lr=final_lr, progress=progress, desc=f"gd mlp x{count} h<={max(hiddens)}")
    mlps = []
    for b, (hidden, result) in enumerate(zip(hiddens, results)):
        mlp = unstack_swiglu(params, b, hidden, activation)
        if until == "converged":  # fit's "solved" said converged: record whether it stores every fact
            result = replace(result, solved=bool((mlp.predict(K[b], V[b]) == facts[b]).all()))
        mlp.fit_results = {"mlp": result}
        mlps.append(mlp)
    return mlps


def gd_mlp(
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    hidden: int,
    *,
    steps: int = 20000,
    lr: float = 1e-3,
    final_lr: float = 1e-6,
    activation: str = "silu",
    loss: str = "ce",
    until: str = "stored",
    seed: int = 0,
    progress: bool = True,
    backend: str = "auto",
) -> FactMLP:
    """A SwiGLU MLP of width ``hidden`` trained to store f with full-batch Adam.

    loss "ce": CE(g(K) Vᵀ, f) (the capacity baseline); "mse": mean_i ||g(k_i) − v_f(i)||²
    (the fact experts of the seed's language model, App. A.3.2).
    K: (F, d_in), V: (|V|, d_out), f: (F,). ``until`` (one of :data:`GD_STOPS`): "stored" stops early once
    every fact is stored; "converged" trains through the schedule unless the loss reaches :data:`CONVERGED_LOSS`.
    backend: the cross-entropy's (:func:`_ops.softmax_cross_entropy`): "auto", "kernels" or "torch".
    Returns a FactMLP with biases (gate/up (hidden, d_in), down (d_out, hidden)); its
    ``fit_results`` attribute holds {"mlp": :class:`FitResult`}.
    """
    _check_count("hidden", hidden)
    return gd_mlp_batch([FactSet(K, V, f)], [hidden], [seed], steps=steps, lr=lr, final_lr=final_lr,
                        activation=activation, loss=loss, until=until, progress=progress, backend=backend)[0]
