"""MLP size W vs fact-set size F for usable fact MLPs (seed 000 §5.1, App. A.2.3, Fig. 3a; LM: App. A.3.3, Fig. 9a).

For each F, the smallest MLP whose fact-adaptive accuracy exceeds 99% (the best of several
seeds, as in the seed: 4 seeds, keep the maximum): double the size from a start until it is
usable, then bisect between the largest unusable and the smallest usable size until their
ratio is at most ``resolution``. Size means the code dimension m for constructed MLPs (hidden =
m·⌈1.5F/(d+1)⌉) and the hidden width for GD MLPs; W counts the MLP's parameters.

    point = usable_size(SSFRTask(256, 128, seed=0), "constructed", seeds=[0, 1, 2, 3])
    point.size, point.parameters, point.trace
    point = lm_usable_size(AuthorsBooks.build(256), dim=256, seeds=[0, 1, 2, 3], train=LMTrainConfig())   # Fig. 9a

A size whose swapped-in MLP stores fewer than 99% of its facts (capacity < target) cannot
reach the target in practice and is recorded as unusable without training a transformer.

A search can span several runs: ``on_trial`` gets each size's trial as it finishes (e.g. to write
it to disk) and ``done`` hands those trials back, so a rerun replays them instead of training again.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Sequence


from ..construct import construct
from ..progress import progress_bar
from .ssfr import SSFRTask
from .training import SEED_LR, build_fact_mlp, rescored_runs, run_fact_adaptive

if TYPE_CHECKING:
    from .lm import AuthorsBooks, LMTrainConfig

SEED_DIM = 128  # App. A.2.3
SEED_FACTS = [2 ** k for k in range(8, 15)]  # F in {2^8, ..., 2^14}
SEED_SEEDS = 4
TARGET = 0.99  # fact-adaptive accuracy > 99%


@dataclass
class ScalingPoint:
    """The smallest usable size for one fact set (None if none up to ``max_size``), its accuracy (SSFR:
    fact-adaptive accuracy; LM: value accuracy) and every size tried."""

    num_facts: int
    dim: int
    kind: str
    size: Optional[int]
    parameters: Optional[int]
    accuracy: Optional[float]
    trace: list[dict] = field(default_factory=list)
    swap: Optional[dict] = None  # LM only: Fig. 9b's swap on the best seed's LM at the smallest usable width

    def to_dict(self) -> dict:
        return asdict(self)


def usable_size(task: SSFRTask, kind: str = "constructed", *, seeds: Sequence[int] = (0,),
                lrs: Sequence[float] = (SEED_LR,), start: Optional[int] = None, max_size: int = 4096,
                resolution: float = 1.25, target: float = TARGET, new_facts_seed: int = 1, gd_steps: int = 20000,
                device: str = "cpu", split: str = "all", switches: Optional[dict] = None, progress: bool = True,
                done: Sequence[dict] = (), on_trial: Optional[Callable[[dict], None]] = None,
                **train_options) -> ScalingPoint:
    """Smallest MLP size with fact-adaptive accuracy > ``target`` on ``task`` (see module doc).

    start: first size (default: for "constructed" the smallest m whose JL decoder decodes every
    value, below which facts are lost; for "gd" the seed's default width ⌈F/d⌉·m at m = 8).
    split: the sequences fact-adaptive accuracy is scored on: "train" is the seed's J (the training junk
    tuples), "all" adds the held-out ones (stricter: a transformer stopped at full training accuracy
    often has not learnt to ignore unseen junk).
    switches go to :class:`~factkernels.transformer.model.FactTransformer` (default: the seed's
    modifications); train_options to :func:`~factkernels.transformer.training.train_ssfr` (steps, batch_size, ...).
    done / on_trial: trials of an interrupted search of the same settings, and a callback for new ones.
    """
    keys, values = task.mlp_keys, task.mlp_values
    if start is None:
        start = (construct(keys, values, task.facts, progress=False).report.m if kind == "constructed"
                 else 8 * math.ceil(task.num_keys / task.dim))
    new_facts = task.new_facts(new_facts_seed)
    trace: list[dict] = []
    bar = progress_bar(desc=f"W vs F, F={task.num_keys}", unit="size", enabled=progress, leave=False)

    def measure(size: int) -> dict:
        result = run_fact_adaptive(
            task, lambda f: build_fact_mlp(kind, keys, values, f, size, gd_steps=gd_steps), new_facts=new_facts,
            seeds=seeds, lrs=lrs, device=device, split=split, min_capacity=target, switches=switches,
            progress=progress, **train_options)
        ok = result.fact_adaptive_accuracy is not None and result.fact_adaptive_accuracy > target
        bar.update(1)
        bar.set_postfix(size=size, faa=result.fact_adaptive_accuracy)
        return {"size": size, "parameters": result.new_mlp.num_parameters, "usable": ok,
                "fact_adaptive_accuracy": result.fact_adaptive_accuracy, "capacity": result.capacity_new,
                "runs": result.runs}

    usable = _replaying(measure, trace, done, on_trial)
    storing = smallest_size(usable, start, max_size=max_size, resolution=resolution,
                            floor=1 if kind == "gd" else max(1, start // 2))
    bar.close()
    if storing is None:
        return ScalingPoint(task.num_keys, task.dim, kind, None, None, None, trace)
    best = next(t for t in trace if t["size"] == storing)
    return ScalingPoint(task.num_keys, task.dim, kind, storing, best["parameters"], best["fact_adaptive_accuracy"],
                        trace)


def rescored_trial(trial: dict, task: SSFRTask, source: str, split: str, target: float = TARGET) -> dict:
    """A trial of :func:`usable_size` scored on split ``source`` ("train" or "all"), scored on ``split``
    (:func:`~factkernels.transformer.training.rescored_runs`: both searches train the same transformers).
    The trial comes back with each run's accuracy, the best run, ``usable`` (best > target) and
    ``"rescored_from": source``; a trial without transformer runs (its MLP stores fewer than ``target``
    of the facts) does not depend on the split, and only gets the mark."""
    runs = rescored_runs(trial["runs"], source, split, junk_pairs=task.num_junk_pairs, test_pairs=task.num_test_pairs)
    if source == split:
        return trial
    if not runs:
        return {**trial, "rescored_from": source}
    best = max(run["fact_adaptive_accuracy"] for run in runs)
    return {**trial, "runs": runs, "fact_adaptive_accuracy": best, "usable": best > target, "rescored_from": source}


def _replaying(measure: Callable[[int], dict], trace: list[dict], done: Sequence[dict],
               on_trial: Optional[Callable[[dict], None]]) -> Callable[[int], bool]:
    """``usable(size)`` for :func:`smallest_size`: a size with a trial in ``done`` replays it, any other is
    measured (``measure(size)`` -> a trial dict with "size" and "usable") and handed to ``on_trial``; either
    way the trial joins ``trace``."""
    finished = {t["size"]: t for t in done}

    def usable(size: int) -> bool:
        trial = finished.get(size)
        if trial is None:
            trial = measure(size)
            if on_trial is not None:
                on_trial(trial)
        trace.append(trial)
        return trial["usable"]
    return usable


def smallest_size(usable: Callable[[int], bool], start: int, *, max_size: int, resolution: float,
                  floor: int = 1) -> Optional[int]:
    """The smallest size with ``usable(size)``, to within a ratio ``resolution``: double from ``start``
    until usable (None if ``max_size`` is not), then bisect between the largest unusable and the
    smallest usable size; a usable ``start`` bisects down towards ``floor`` (a size assumed unusable)."""
    if not resolution > 1:
        raise ValueError(f"resolution must be > 1 (ratio of the final bracket), got {resolution!r}")
    failing, size = None, start
    while not usable(size):
        if size >= max_size:
            return None
        failing, size = size, min(2 * size, max_size)
    storing = size
    if failing is None:
        failing = min(floor, storing)
    while storing / failing > resolution and storing - failing > 1:
        middle = (failing + storing) // 2
        if usable(middle):
            storing = middle
        else:
            failing = middle
    return storing


def lm_usable_size(task: "AuthorsBooks", *, dim: int, seeds: Sequence[int], train: "LMTrainConfig",
                   start: Optional[int] = None, max_size: int = 8192, resolution: float = 1.25,
                   target: float = TARGET, progress: bool = True, done: Sequence[dict] = (),
                   on_trial: Optional[Callable[[dict], None]] = None,
                   swap_seed: Optional[int] = None) -> ScalingPoint:
    """Smallest GD (MSE) fact-expert width whose authors/books LM recalls > ``target`` of its facts
    (seed 000 App. A.3.3, Fig. 9a): per width and seed, the LM of :func:`~factkernels.transformer.lm.trained_lm`
    with ``expert="gd"`` of that width, trained by ``train`` (its seed replaced); usable when the best
    seed's value accuracy (argmax over the vocabulary at the author position, every template) is
    above ``target``. A width whose expert alone decodes fewer than ``target`` of the facts is
    recorded as unusable without training the LM. start: default ⌈F/d⌉·8 (as for SSFR). done / on_trial:
    trials of an interrupted search of the same settings, and a callback for new ones.

    swap_seed: also run Fig. 9b's swap (:func:`~factkernels.transformer.lm.swap_report`, new facts and expert from
    this seed) on every usable LM (the seed swaps the fact experts of Fig. 9a's transformers); the point's ``swap``
    is the best seed's at the smallest usable width. A replayed trial without one trains that LM again."""
    from dataclasses import replace

    from .lm import AuthorsLM, evaluate, random_facts, swap_report, train_lm

    trace: list[dict] = []
    bar = progress_bar(desc=f"LM W vs F, F={task.num_facts}", unit="size", enabled=progress, leave=False)

    def trained(model: "AuthorsLM", seed: int) -> "AuthorsLM":
        train_lm(model, task, replace(train, seed=seed), quiet=True)
        return model

    def swapped(model: "AuthorsLM") -> dict:
        return swap_report(model, task, random_facts(task.num_facts, seed=swap_seed), seed=swap_seed)[0]

    def measure(width: int) -> dict:
        runs = []
        for seed in seeds:
            model = AuthorsLM(task, expert="gd", expert_hidden=width, dim=dim, seed=seed)
            expert = model.moe.fact
            emb = model.fact_embeddings  # (2F, d): books then authors
            decoded = (expert(emb[:task.num_facts]) @ emb.T).argmax(dim=1)
            capacity = float((decoded == task.facts + task.num_facts).double().mean())
            run = {"seed": seed, "capacity": capacity, "value_accuracy": None}
            if capacity >= target:
                trained(model, seed)
                run["value_accuracy"] = evaluate(model, task, task.facts)["value_accuracy"]
                if swap_seed is not None and run["value_accuracy"] > target:
                    run["swap"] = swapped(model)
            runs.append(run)
        accuracies = [r["value_accuracy"] for r in runs if r["value_accuracy"] is not None]
        best = max(accuracies) if accuracies else None
        bar.update(1)
        bar.set_postfix(width=width, accuracy=best)
        return {"size": width, "parameters": expert.num_parameters, "usable": best is not None and best > target,
                "value_accuracy": best, "runs": runs}

    start = 8 * math.ceil(task.num_facts / dim) if start is None else start
    storing = smallest_size(_replaying(measure, trace, done, on_trial), start, max_size=max_size,
                            resolution=resolution)
    bar.close()
    if storing is None:
        return ScalingPoint(task.num_facts, dim, "gd", None, None, None, trace)
    best = next(t for t in trace if t["size"] == storing)
    swap = None
    if swap_seed is not None:
        run = max((r for r in best["runs"] if r["value_accuracy"] is not None), key=lambda r: r["value_accuracy"])
        swap = run.get("swap")
        if swap is None:  # a trial replayed from a search that did not swap: the same seed trains the same LM
            seed = run["seed"]
            model = trained(AuthorsLM(task, expert="gd", expert_hidden=storing, dim=dim, seed=seed), seed)
            swap = {**swapped(model), "retrained": True}
        swap = {"seed": run["seed"], **swap}
    return ScalingPoint(task.num_facts, dim, "gd", storing, best["parameters"], best["value_accuracy"], trace, swap)

