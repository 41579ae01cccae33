"""Training a FactTransformer on SSFR and measuring fact-adaptive accuracy (seed 000 §5.1, A.2.2).

    result = train_ssfr(model, task, steps=2000, batch_size=64, lr=2e-4, seed=0)
    acc = accuracy(model, task.sequences(task.facts, split="test"))
    faa = fact_adaptive_accuracy(model, task, new_mlp, new_facts)   # swap, evaluate, swap back
    trial = run_fact_adaptive(task, lambda f: build_fact_mlp("constructed", task.mlp_keys, task.mlp_values, f, 64),
                              new_facts=task.new_facts(1), seeds=[0, 1], lrs=[2e-3])

The seed trains with AdamW at learning rate 2e-4 on 4.8M sequences sampled from the task "or
until convergence" on a 1-layer GPT-2 after Karpathy's nanoGPT. It names no schedule; the default
here is nanoGPT's (linear warmup, cosine decay to lr/10), ``schedule="constant"`` keeps the rate
fixed. Training stops early once the accuracy on every training sequence reaches ``target_accuracy``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F_nn
from torch import nn

from .. import _ops, geometry
from ..baselines import gd_mlp
from ..construct import construct
from ..mlp import FactMLP
from ..progress import progress_bar
from .model import FactTransformer
from .ssfr import NUM_JUNK_PAIRS, NUM_TEST_PAIRS, SSFRBatch, SSFRTask

SEED_LR = 2e-4  # App. A.2.2
SEED_SEQUENCES = 4_800_000  # App. A.2.2
MLP_KINDS = ("constructed", "gd")
SCHEDULES = ("cosine", "constant")
WARMUP_FRACTION = 0.05  # of the steps, for the cosine schedule
MIN_LR_FRACTION = 0.1  # nanoGPT's min_lr = lr / 10


@dataclass
class TrainResult:
    """steps and sequences trained, whether ``target_accuracy`` was reached, and the curves
    (loss per logged step, training accuracy per evaluation: None where it stopped at a wrong sequence)."""

    steps: int
    sequences: int
    converged: bool
    final_accuracy: float
    losses: list[tuple[int, float]] = field(default_factory=list)
    accuracies: list[tuple[int, Optional[float]]] = field(default_factory=list)


@torch.no_grad()
def accuracy(model: FactTransformer, batch: SSFRBatch, chunk: int = 4096, *,
             stop_at_miss: bool = False) -> Optional[float]:
    """Fraction of sequences whose last-position argmax over the output vocabulary is the target,
    scored ``chunk`` sequences at a time. stop_at_miss: None as soon as a chunk holds a wrong sequence
    (a stop test that needs every sequence right learns all it needs there)."""
    device = model.embedding_table.device
    correct = 0
    for start in range(0, len(batch), chunk):
        tokens = batch.tokens[start:start + chunk].to(device)
        mask = batch.padding_mask[start:start + chunk].to(device)
        logits = model(tokens, mask, last_only=True)
        right = int((logits.argmax(-1).cpu() == batch.targets[start:start + chunk]).sum())
        if stop_at_miss and right < tokens.shape[0]:
            return None
        correct += right
    return correct / max(len(batch), 1)


def train_ssfr(model: FactTransformer, task: SSFRTask, *, facts: Optional[torch.Tensor] = None, steps: int = 2000,
               batch_size: int = 64, lr: float = SEED_LR, weight_decay: float = 0.01, eval_every: int = 100,
               target_accuracy: float = 1.0, schedule: str = "cosine", seed: int = 0,
               progress: bool = True) -> TrainResult:
    """Train the trainable parts of ``model`` (attention, norms, junk embeddings) with AdamW.

    Each step draws ``batch_size`` training sequences (uniform keys and training junk pairs) and
    minimises the cross-entropy of the final value token. Every ``eval_every`` steps the accuracy
    on all training sequences is measured; training stops once it reaches ``target_accuracy``.
    With the default target 1 an evaluation before the last step stops at its first chunk with a
    wrong sequence and records None; the steps trained are the same. (At F = 4,096, scoring all 65,536
    training sequences every 100 steps of 64 is ~3× the forward and backward work of those steps.)
    """
    for name, value in (("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if not 0.0 < target_accuracy <= 1.0:
        raise ValueError(f"target_accuracy must be in (0, 1], got {target_accuracy!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    facts = task.facts if facts is None else facts
    device = model.embedding_table.device
    generator = torch.Generator().manual_seed(seed)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    warmup = max(1, int(WARMUP_FRACTION * steps))

    def rate(step: int) -> float:  # multiplier of lr at 0-based step
        if schedule == "constant":
            return 1.0
        if step < warmup:
            return (step + 1) / warmup
        progress_ = (step - warmup) / max(1, steps - warmup)
        return MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress_))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    train_set = task.sequences(facts, split="train")
    result = TrainResult(0, 0, False, 0.0)
    model.train()
    with progress_bar(total=steps, desc="ssfr train", enabled=progress, leave=False) as bar:
        for step in range(1, steps + 1):
            batch = task.sample(batch_size, generator, facts).to(device)
            loss = F_nn.cross_entropy(model(batch.tokens, batch.padding_mask, last_only=True), batch.targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            result.steps, result.sequences = step, step * batch_size
            bar.update(1)
            if step % eval_every == 0 or step == steps:
                result.losses.append((step, float(loss.detach())))
                model.eval()
                scored = accuracy(model, train_set, stop_at_miss=target_accuracy == 1.0 and step < steps)
                model.train()
                result.accuracies.append((step, scored))
                bar.set_postfix(loss=f"{float(loss.detach()):.3g}", acc="<1" if scored is None else f"{scored:.3f}")
                if scored is not None:
                    result.final_accuracy = scored
                    if scored >= target_accuracy:
                        result.converged = True
                        break
    model.eval()
    return result


def fact_adaptive_accuracy(model: FactTransformer, task: SSFRTask, mlp: nn.Module, facts: torch.Tensor,
                           split: str = "all") -> float:
    """Accuracy on the SSFR sequences of fact set ``facts`` (F,) after swapping ``mlp`` (built for
    ``facts`` on the task's MLP embeddings) into ``model``; the model's own MLP is put back after."""
    old = model.swap_mlp(mlp)
    try:
        return accuracy(model, task.sequences(facts, split=split))
    finally:
        model.swap_mlp(old)


def build_model(task: SSFRTask, mlp: nn.Module, *, seed: int = 0, **switches) -> FactTransformer:
    """The seed's SSFR transformer for ``task``: key and value embeddings frozen, junk embeddings
    trained, logits over the value tokens; ``switches`` go to :class:`FactTransformer`. The
    attention weights are initialised from ``seed`` (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return FactTransformer(task.embeddings, mlp, frozen_tokens=torch.cat([task.key_tokens, task.value_tokens]),
                               output_tokens=task.value_tokens, **switches)


def build_fact_mlp(kind: str, keys: torch.Tensor, values: torch.Tensor, facts: torch.Tensor, size: int, *,
                   whiten: float = 0.0, seed: int = 0, gd_steps: int = 20000) -> FactMLP:
    """A fact MLP for the transformer's MLP slot, built on whitened embeddings (strength ``whiten``)
    with the whitening folded into its weights, so it reads the unwhitened MLP keys.

    kind "constructed": :func:`factkernels.construct` with code dimension m = ``size`` (not-stored
    facts are allowed and show up as capacity < 1). kind "gd": a SwiGLU MLP of width ``size``
    trained with cross-entropy (:func:`factkernels.baselines.gd_mlp`, at most ``gd_steps`` steps).
    keys (F, d), values (|V|, d), facts (F,).
    """
    if kind not in MLP_KINDS:
        raise ValueError(f"kind must be one of {MLP_KINDS}, got {kind!r}")
    if kind == "constructed":
        return construct(keys, values, facts, m=size, whiten=whiten, verify="report", seed=seed, progress=False)
    key_map = geometry.whitening_transform(keys, whiten)  # (d, d) symmetric
    value_map = geometry.whitening_transform(values, whiten)
    net = gd_mlp(keys @ key_map, values @ value_map, facts, hidden=size, steps=gd_steps, seed=seed, progress=False)
    # g(x) = g~(W_K x) and <g~, W_V v> = <W_V g~, v>: fold W_K into gate/up and W_V into down.
    return FactMLP(net.gate_weight @ key_map, net.gate_bias, net.up_weight @ key_map, net.up_bias,
                   value_map @ net.down_weight, value_map @ net.down_bias, activation=net.activation)


@torch.no_grad()
def capacity(mlp: nn.Module, keys: torch.Tensor, values: torch.Tensor, facts: torch.Tensor) -> float:
    """Fraction of facts the MLP stores: argmax_j <mlp(k_i), v_j> = f(i). keys (F, d), values (|V|, d)."""
    return float((_ops.decode(mlp(keys), values)[0] == facts).double().mean())


@dataclass
class FactAdaptiveResult:
    """One fact-adaptive measurement: the best fact-adaptive accuracy over (seed, lr) runs (None
    when training was skipped), the capacities of the training MLP (A) and the swapped-in MLP (B),
    and every run."""

    fact_adaptive_accuracy: Optional[float]
    capacity_train: float
    capacity_new: float
    runs: list[dict]
    new_mlp: nn.Module = field(repr=False)

    @property
    def usability(self) -> Optional[float]:
        """fact-adaptive accuracy / capacity of the swapped-in MLP (seed 000 §5.2)."""
        if self.fact_adaptive_accuracy is None or self.capacity_new == 0:
            return None
        return self.fact_adaptive_accuracy / self.capacity_new


def rescored_runs(runs: Sequence[dict], source: str, split: str, *, junk_pairs: int = NUM_JUNK_PAIRS,
                  test_pairs: int = NUM_TEST_PAIRS) -> list[dict]:
    """Runs of :func:`run_fact_adaptive` scored on split ``source`` ("train", the seed's J, or "all"), with
    their fact-adaptive accuracy on ``split`` instead. Exact: training never sees the split it is scored on,
    every split holds one sequence per (key, junk tuple), and each run records its accuracy on the held-out
    tuples ("test"), so a run's count on J is its count on "all" less its count on "test", and the other way
    round. junk_pairs / test_pairs: the task's training and held-out junk tuples (the defaults of SSFRTask)."""
    scored = ("train", "all")
    if source not in scored or split not in scored:
        raise ValueError(f"source and split must be 'train' or 'all', got {source!r} and {split!r}")
    if source == split:
        return list(runs)
    pairs = {"train": junk_pairs, "test": test_pairs, "all": junk_pairs + test_pairs}
    out = []
    for run in runs:
        if run.get("fact_adaptive_test_accuracy") is None:
            raise ValueError("rescoring needs each run's accuracy on the held-out junk tuples "
                             "(fact_adaptive_test_accuracy); this run's task had none")
        held_out = run["fact_adaptive_test_accuracy"] * pairs["test"]
        correct = run["fact_adaptive_accuracy"] * pairs[source] + (-held_out if split == "train" else held_out)
        out.append({**run, "fact_adaptive_accuracy": correct / pairs[split]})
    return out


def run_fact_adaptive(task: SSFRTask, make_mlp: Callable[[torch.Tensor], nn.Module], *, new_facts: torch.Tensor,
                      seeds: Sequence[int] = (0,), lrs: Sequence[float] = (SEED_LR,), device: str = "cpu",
                      split: str = "all", min_capacity: float = 0.0, switches: Optional[dict] = None,
                      progress: bool = True, done: Sequence[dict] = (),
                      on_run: Optional[Callable[[dict], None]] = None, **train_options) -> FactAdaptiveResult:
    """The seed's protocol (§5.1): build MLP A for ``task.facts`` and MLP B for ``new_facts`` (same
    embeddings) with ``make_mlp(facts)``; for every seed and learning rate train a transformer
    with A, swap in B and measure the accuracy on B's sequences of ``split`` (the seed's J: "train";
    "all" adds the held-out junk tuples); keep the best run. Each run also records B's accuracy on
    the held-out junk tuples alone (``fact_adaptive_test_accuracy``, None without them).
    No transformer is trained (accuracy None) when B stores fewer than ``min_capacity`` of its facts.
    switches go to :class:`FactTransformer` (default: the seed's modifications), train_options to
    :func:`train_ssfr`. ``done`` holds runs an interrupted call finished (their seed and lr are not
    trained again: at d = 128 and the seed's length one run is ~35 min of a CPU core); ``on_run`` is
    called with each new run as it finishes, so a caller can keep it.
    """
    keys, values = task.mlp_keys, task.mlp_values
    mlp_new = make_mlp(new_facts)
    capacity_new = capacity(mlp_new, keys, values, new_facts)
    if capacity_new < min_capacity:
        return FactAdaptiveResult(None, float("nan"), capacity_new, [], mlp_new)
    mlp_train = make_mlp(task.facts)
    finished = {(run["seed"], run["lr"]): run for run in done}
    runs = []
    for seed in seeds:
        for lr in lrs:
            if (seed, lr) in finished:
                runs.append(finished[seed, lr])
                continue
            model = build_model(task, mlp_train.cpu(), seed=seed, **(switches or {})).to(device)
            result = train_ssfr(model, task, lr=lr, seed=seed, progress=progress, **train_options)
            test = accuracy(model, task.sequences(split="test")) if task.num_test_pairs else None
            runs.append({"seed": seed, "lr": lr, "steps": result.steps, "sequences": result.sequences,
                         "train_accuracy": result.final_accuracy, "test_accuracy": test,
                         "fact_adaptive_accuracy": fact_adaptive_accuracy(model, task, mlp_new, new_facts,
                                                                          split=split),
                         "fact_adaptive_test_accuracy": fact_adaptive_accuracy(model, task, mlp_new, new_facts,
                                                                               split="test")
                         if task.num_test_pairs else None})
            if on_run is not None:
                on_run(runs[-1])
    # the MLPs are shared between runs: give them back to the CPU, where the task's embeddings live
    mlp_train.cpu()
    mlp_new.cpu()
    best = max((run["fact_adaptive_accuracy"] for run in runs), default=None)
    return FactAdaptiveResult(best, capacity(mlp_train, keys, values, task.facts), capacity_new, runs, mlp_new)
