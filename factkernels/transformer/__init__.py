"""Fact-storing MLPs inside transformers (seed 000 §5): building blocks, SSFR task,
1-layer transformer with a FactMLP slot, fact-adaptive accuracy, W vs F scaling,
usability vs capacity and the Lipschitz estimate.

    from factkernels.transformer import SSFRTask, FactTransformer, build_model, train_ssfr
    task = SSFRTask(num_keys=64, dim=32, seed=0)
    model = build_model(task, factkernels.construct(task.mlp_keys, task.mlp_values, task.facts))
    train_ssfr(model, task, steps=1500, lr=5e-3)
    model.swap_mlp(factkernels.construct(task.mlp_keys, task.mlp_values, task.new_facts(1)))  # new facts
"""

from .layers import CausalSelfAttention, RMSNorm, RotaryEmbedding
from .model import FactTransformer, swap_mlp
from .scaling import ScalingPoint, rescored_trial, usable_size
from .ssfr import SSFRBatch, SSFRTask
from .training import (FactAdaptiveResult, TrainResult, accuracy, build_fact_mlp, build_model, capacity,
                       fact_adaptive_accuracy, rescored_runs, run_fact_adaptive, train_ssfr)
from .usability import lipschitz, run_usability

__all__ = [
    "RMSNorm", "RotaryEmbedding", "CausalSelfAttention",
    "SSFRTask", "SSFRBatch", "FactTransformer", "swap_mlp",
    "build_model", "build_fact_mlp", "train_ssfr", "accuracy", "capacity", "fact_adaptive_accuracy",
    "run_fact_adaptive", "rescored_runs", "FactAdaptiveResult", "TrainResult",
    "usable_size", "rescored_trial", "ScalingPoint", "lipschitz", "run_usability",
]
