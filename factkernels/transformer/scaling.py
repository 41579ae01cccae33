"""MLP size W vs fact-set size F for usable fact MLPs (seed 000 §5.1, App. A.2.3, Fig. 3a).

For each F, the smallest MLP whose fact-adaptive accuracy exceeds 99% (the best of several
seeds, as in the seed: 4 seeds, keep the maximum): double the size from a start until it is
usable, then bisect between the largest unusable and the smallest usable size until their
ratio is at most ``resolution``. Size means the code dimension m for constructed MLPs (hidden =
m·⌈1.5F/(d+1)⌉) and the hidden width for GD MLPs; W counts the MLP's parameters.

    point = usable_size(SSFRTask(256, 128, seed=0), "constructed", seeds=[0, 1, 2, 3])
    point.size, point.parameters, point.trace

A size whose swapped-in MLP stores fewer than 99% of its facts (capacity < target) cannot
reach the target in practice and is recorded as unusable without training a transformer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence


from ..construct import construct
from ..progress import progress_bar
from .ssfr import SSFRTask
from .training import SEED_LR, build_fact_mlp, run_fact_adaptive

SEED_DIM = 128  # App. A.2.3
SEED_FACTS = [2 ** k for k in range(8, 15)]  # F in {2^8, ..., 2^14}
SEED_SEEDS = 4
TARGET = 0.99  # fact-adaptive accuracy > 99%


@dataclass
class ScalingPoint:
    """The smallest usable size for one fact set (None if none up to ``max_size``) and every size tried."""

    num_facts: int
    dim: int
    kind: str
    size: Optional[int]
    parameters: Optional[int]
    fact_adaptive_accuracy: Optional[float]
    trace: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def usable_size(task: SSFRTask, kind: str = "constructed", *, seeds: Sequence[int] = (0,),
                lrs: Sequence[float] = (SEED_LR,), start: Optional[int] = None, max_size: int = 4096,
                resolution: float = 1.25, target: float = TARGET, new_facts_seed: int = 1, gd_steps: int = 20000,
                device: str = "cpu", progress: bool = True, **train_options) -> ScalingPoint:
    """Smallest MLP size with fact-adaptive accuracy > ``target`` on ``task`` (see module doc).

    start: first size (default: for "constructed" the smallest m whose JL decoder decodes every
    value, below which facts are lost; for "gd" the seed's default width ⌈F/d⌉·m at m = 8).
    train_options go to :func:`~factkernels.transformer.training.train_ssfr` (steps, batch_size, ...).
    """
    if not resolution > 1:
        raise ValueError(f"resolution must be > 1 (ratio of the final bracket), got {resolution!r}")
    keys, values = task.mlp_keys, task.mlp_values
    if start is None:
        start = (construct(keys, values, task.facts, progress=False).report.m if kind == "constructed"
                 else 8 * math.ceil(task.num_keys / task.dim))
    new_facts = task.new_facts(new_facts_seed)
    trace: list[dict] = []
    bar = progress_bar(desc=f"W vs F, F={task.num_keys}", unit="size", enabled=progress, leave=False)

    def usable(size: int) -> bool:
        result = run_fact_adaptive(
            task, lambda f: build_fact_mlp(kind, keys, values, f, size, gd_steps=gd_steps), new_facts=new_facts,
            seeds=seeds, lrs=lrs, device=device, min_capacity=target, progress=progress, **train_options)
        ok = result.fact_adaptive_accuracy is not None and result.fact_adaptive_accuracy > target
        trace.append({"size": size, "parameters": result.new_mlp.num_parameters, "usable": ok,
                      "fact_adaptive_accuracy": result.fact_adaptive_accuracy, "capacity": result.capacity_new,
                      "runs": result.runs})
        bar.update(1)
        bar.set_postfix(size=size, faa=result.fact_adaptive_accuracy)
        return ok

    failing, size = None, start
    while not usable(size):
        if size >= max_size:
            bar.close()
            return ScalingPoint(task.num_keys, task.dim, kind, None, None, None, trace)
        failing, size = size, min(2 * size, max_size)
    storing = size
    if failing is None:  # the start was already usable: bisect down towards the smallest sensible size
        failing = 1 if kind == "gd" else max(1, start // 2)
    while storing / failing > resolution and storing - failing > 1:
        middle = (failing + storing) // 2
        if usable(middle):
            storing = middle
        else:
            failing = middle
    bar.close()
    best = next(t for t in trace if t["size"] == storing)
    return ScalingPoint(task.num_keys, task.dim, kind, storing, best["parameters"], best["fact_adaptive_accuracy"],
                        trace)

