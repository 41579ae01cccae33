"""Fact editing on the authors/books LM (seed 000 §5.4, App. A.3.4): MLP swap vs ROME, MEMIT, AlphaEdit.

The three weight editors change the fact expert's down projection W (d, h), a linear map from
the MLP's hidden keys k = σ(G z) ⊙ (A z) to its output, by the update rules of
:mod:`factkernels.editing` (keys (n, h), target outputs v* (n, d), C = E[k kᵀ] (h, h)). The
targets come from the seed's residual step: a vector δ added to the fact expert's output at the
last token of the edit prompt, trained for ``steps`` Adam steps at ``lr`` to make the new
author most likely, with the editors' norm clip (MEMIT/AlphaEdit), weight decay and early
stopping (ROME); v* = g(z) + δ. MLP swap instead builds a new FactMLP for the whole edited fact
set and puts it in the expert slot.

Metrics (the seed's names): efficacy = accuracy on the preserved facts, specificity = accuracy
on the altered facts (edit prompt), paraphrase = accuracy on the altered facts under the other
templates; score = their harmonic mean.

    split = make_split(task.num_facts, 105, 26, seed=0)
    result = compare_editors(model, task, split)   # best grid point per method
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F_nn

from .. import _ops
from ..datasets import BOOK_TEMPLATES
from ..editing import hparams, method_names, null_space_projector, update_weight
from ..mlp import FactMLP
from ..progress import progress_bar
from .lm import AuthorsBooks, AuthorsLM

EDIT_TEMPLATE = 0  # a single templated prompt per fact (App. A.3.4)
PARAPHRASE_TEMPLATES = list(range(1, len(BOOK_TEMPLATES)))
METHODS = method_names(toy_lm=True)  # ("rome", "memit", "alphaedit", "mlp_swap")
# (preserved, altered) fact counts of App. A.3.4, out of a 16,000-fact set.
SEED_SPLITS = ((6554, 1638), (3277, 819), (1311, 327))
SEED_FACTS = 16000
# Hyperparameter grids of App. A.3.4, by the registry's field names (train steps, λ, norm clip, tolerance:
# steps, mom2_weight, clamp_norm, nullspace_threshold).
SEED_GRIDS = {
    "memit": {"steps": (10, 25, 100), "lr": (0.005, 0.05, 0.5), "mom2_weight": (1.5e4, 1.5e3, 1.5e2, 1.0),
              "clamp_norm": (0.5, 0.75, 1.0)},
    "alphaedit": {"steps": (10, 25, 100), "lr": (0.005, 0.05, 0.5), "clamp_norm": (0.5, 0.75, None),
                  "nullspace_threshold": (1e-2, 1.0, 10.0)},
    "rome": {"steps": (10, 25, 100), "lr": (0.005, 0.05, 0.5), "weight_decay": (1.5e-3, 1.5e-4, 0.0),
             "early_stop": (5e-2, None)},
}
# The seed protocol's residual step: the norm clip for MEMIT and AlphaEdit, weight decay and early stop for ROME.
TARGET_OPTIONS = {"memit": ("clamp_norm",), "alphaedit": ("clamp_norm",), "rome": ("weight_decay", "early_stop")}


# ----------------------------------------------------------------------------- the fact expert's keys


def mlp_hidden(mlp: FactMLP, x: torch.Tensor) -> torch.Tensor:
    """Hidden keys σ(G x + b_G)[r mod h_g] ⊙ (A x + b_A) of a FactMLP: x (n, d) -> (n, h)."""
    gate = _ops.activate(F_nn.linear(x, mlp.gate_weight, mlp.gate_bias), mlp.activation)
    gate = gate.repeat(1, mlp.hidden_size // mlp.gate_weight.shape[0])
    return gate * F_nn.linear(x, mlp.up_weight, mlp.up_bias)


def with_down_weight(mlp: FactMLP, down_weight: torch.Tensor) -> FactMLP:
    """A copy of ``mlp`` with its down projection (d_out, h) replaced."""
    return FactMLP(mlp.gate_weight, mlp.gate_bias, mlp.up_weight, mlp.up_bias, down_weight, mlp.down_bias,
                   activation=mlp.activation)


KEY_POSITIONS = ("edit_prompt", "all")  # where the preserved facts' keys for C are read


@torch.no_grad()
def key_second_moment(model: AuthorsLM, task: AuthorsBooks, fact_ids: torch.Tensor, *,
                      positions: str = "edit_prompt", ridge: float = 1e-6) -> torch.Tensor:
    """C = E[k kᵀ] (h, h) of the fact expert's hidden keys of the facts ``fact_ids``, plus
    ``ridge`` times its mean diagonal so C is invertible (the model's own text stands in for the
    editors' Wikipedia statistics).

    positions="edit_prompt" (default, as the authors' released fact-editing code): one key per
    fact, at the last token of its edit prompt; "all": every real position of every template
    sentence (word positions too, so C spans more directions and protects more of the text).
    """
    if positions not in KEY_POSITIONS:
        raise ValueError(f"positions must be one of {KEY_POSITIONS}, got {positions!r}")
    if positions == "all":
        data = task.sentences(task.facts, fact_ids)
        x = model.mixer_input(data.tokens, data.mask)[data.mask]
    else:
        data = task.sentences(task.facts, fact_ids, [EDIT_TEMPLATE])
        x = model.mixer_input(data.tokens, data.mask)[torch.arange(len(data)), data.value_position]
    keys = mlp_hidden(model.moe.fact, model.moe.inputs(x)[0])
    cov = keys.T @ keys / keys.shape[0]
    return cov + ridge * cov.diagonal().mean() * torch.eye(cov.shape[0], dtype=cov.dtype)


# ----------------------------------------------------------------------------- protocol


@dataclass
class EditSplit:
    """preserved (n_p,) and altered (n_a,) fact indices (disjoint); new_facts (F,): the edited
    book -> author map (altered books get another altered book's author, the rest keep theirs)."""

    preserved: torch.Tensor
    altered: torch.Tensor
    new_facts: torch.Tensor


def make_split(facts: torch.Tensor, num_preserved: int, num_altered: int, *, seed: int) -> EditSplit:
    """Random disjoint preserved/altered subsets of the fact set ``facts`` (F,); the altered
    books' authors are shifted cyclically among them, so every altered fact changes."""
    num = facts.shape[0]
    if num_altered < 2 or num_preserved < 1 or num_preserved + num_altered > num:
        raise ValueError(f"need num_altered >= 2, num_preserved >= 1 and their sum <= {num} facts, "
                         f"got {num_preserved} preserved and {num_altered} altered")
    order = torch.randperm(num, generator=torch.Generator().manual_seed(seed))
    altered, preserved = order[:num_altered], order[num_altered:num_altered + num_preserved]
    new_facts = facts.clone()
    new_facts[altered] = facts[altered.roll(1)]
    return EditSplit(preserved.sort().values, altered, new_facts)


def scaled_split(num_facts: int, preserved: int, altered: int, total: int = SEED_FACTS) -> tuple[int, int]:
    """The seed's (preserved, altered) counts out of ``total`` facts, scaled to ``num_facts``."""
    return max(1, round(num_facts * preserved / total)), max(2, round(num_facts * altered / total))


def harmonic_mean(*scores: float) -> float:
    """Harmonic mean of accuracies in [0, 1] (0 when any is 0)."""
    return 0.0 if min(scores) <= 0 else len(scores) / sum(1.0 / s for s in scores)


@dataclass
class EditEvaluation:
    """The metric sets of a split, with everything an editor cannot change precomputed: the MoE
    input x at the value position (editors only touch the fact expert, which comes after it).

    sets: name -> (x (n, d), new-author vocabulary ids (n,)) for "efficacy" (preserved facts,
    edit prompt), "specificity" (altered facts, edit prompt) and "paraphrase" (altered facts,
    the other 15 templates).
    """

    sets: dict

    @classmethod
    @torch.no_grad()
    def build(cls, model: AuthorsLM, task: AuthorsBooks, split: EditSplit) -> "EditEvaluation":
        sets = {}
        for name, ids, templates in (("efficacy", split.preserved, [EDIT_TEMPLATE]),
                                     ("specificity", split.altered, [EDIT_TEMPLATE]),
                                     ("paraphrase", split.altered, PARAPHRASE_TEMPLATES)):
            data = task.sentences(split.new_facts, ids, templates)
            rows = torch.arange(len(data))
            x = model.mixer_input(data.tokens, data.mask)[rows, data.value_position]
            sets[name] = (x, data.targets()[rows, data.value_position])
        return cls(sets)

    @torch.no_grad()
    def metrics(self, model: AuthorsLM, fact: FactMLP) -> dict:
        """Efficacy, specificity, paraphrase and score of ``model`` with ``fact`` as its fact
        expert (the model's own expert is put back after)."""
        old = model.swap_fact_expert(fact)
        try:
            metrics = {name: float((model.logits(model.moe(x)).argmax(-1) == target).double().mean())
                       for name, (x, target) in self.sets.items()}
        finally:
            model.swap_fact_expert(old)
        metrics["score"] = harmonic_mean(metrics["efficacy"], metrics["specificity"], metrics["paraphrase"])
        return metrics


@dataclass
class EditPrompts:
    """The altered facts' edit prompts at their last token: fact-expert input z (n, d), router
    weights (n, 2), fact-expert output g (n, d), language-expert output (n, d), hidden keys
    (n, h) and the new authors' vocabulary ids (n,)."""

    z: torch.Tensor
    weights: torch.Tensor
    fact_out: torch.Tensor
    language_out: torch.Tensor
    keys: torch.Tensor
    targets: torch.Tensor

    @classmethod
    @torch.no_grad()
    def build(cls, model: AuthorsLM, task: AuthorsBooks, split: EditSplit) -> "EditPrompts":
        data = task.sentences(split.new_facts, split.altered, [EDIT_TEMPLATE])
        rows = torch.arange(len(data))
        moe = model.moe
        z, r = moe.inputs(model.mixer_input(data.tokens, data.mask)[rows, data.value_position])
        return cls(z, moe.router(r).softmax(-1), moe.fact(z), moe.language(r), mlp_hidden(moe.fact, z),
                   data.targets()[rows, data.value_position])


def edit_targets(model: AuthorsLM, prompts: EditPrompts, *, steps: int, lr: float,
                 clamp_norm: Optional[float] = None, weight_decay: float = 0.0,
                 early_stop: Optional[float] = None) -> torch.Tensor:
    """Target outputs v* = g(z) + δ (n, d) of the fact expert for the altered facts.

    δ (one row per fact) is added to the fact expert's output at the edit prompt's last token
    and trained with Adam for ``steps`` steps to minimise the new author's cross-entropy plus
    ``weight_decay`` ||δ||²/||g||² (ROME, as the seed protocol); ``clamp_norm`` keeps ||δ|| <= clamp_norm ||g|| (MEMIT,
    AlphaEdit); a fact stops updating once its loss is below ``early_stop`` (ROME).
    """
    delta = torch.zeros_like(prompts.fact_out, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=lr)
    out_norm = prompts.fact_out.norm(dim=1, keepdim=True)
    p_fact, p_lang = prompts.weights[:, :1], prompts.weights[:, 1:]
    for _ in range(steps):
        state = p_fact * (prompts.fact_out + delta) + p_lang * prompts.language_out
        losses = F_nn.cross_entropy(model.logits(state), prompts.targets, reduction="none")
        active = torch.ones_like(losses) if early_stop is None else (losses.detach() >= early_stop).to(losses.dtype)
        if not active.any():
            break
        decay = weight_decay * (delta.pow(2).sum(1) / out_norm.squeeze(1).pow(2))
        opt.zero_grad(set_to_none=True)
        ((losses + decay) * active).sum().backward()
        opt.step()
        if clamp_norm is not None:
            with torch.no_grad():
                delta.mul_(torch.clamp(clamp_norm * out_norm / delta.norm(dim=1, keepdim=True).clamp_min(1e-12),
                                       max=1.0))
    return (prompts.fact_out + delta).detach()


def _grid_points(grid: dict) -> list[dict]:
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


def _edited_expert(method: str, fact: FactMLP, keys: torch.Tensor, targets: torch.Tensor, cov: torch.Tensor,
                   config: dict, num_preserved: int) -> FactMLP:
    """The fact expert edited by ``method``'s rule (:func:`factkernels.editing.update_weight`). AlphaEdit's
    threshold applies to the eigenvalues of the preserved keys' Gram matrix K Kᵀ = num_preserved · C, as in
    the authors' released code; ROME inverts C as it is (its ridge is in C already)."""
    weight = fact.down_weight.detach()
    if fact.down_bias is not None:  # the editors fit W k + b = v*
        targets = targets - fact.down_bias.detach()
    rule = {k: v for k, v in config.items() if k in ("mom2_weight", "nullspace_threshold")}
    hp = hparams(method, **rule, **({"ridge": 0.0} if method == "rome" else {}))
    projector = (null_space_projector(num_preserved * cov, hp.nullspace_threshold) if method == "alphaedit"
                 else None)
    return with_down_weight(fact, update_weight(hp, weight, keys, targets, cov, projector=projector))


def grid_search(model: AuthorsLM, task: AuthorsBooks, split: EditSplit, method: str, grid: dict, *,
                cov: Optional[torch.Tensor] = None, evaluation: Optional[EditEvaluation] = None,
                key_positions: str = "edit_prompt", quiet: bool = False) -> dict:
    """Every grid point of ``method`` ("memit" | "alphaedit" | "rome"): its config and metrics,
    and the best one by score (ties: first). Returns {"best": {...}, "runs": [...]}."""
    if method not in TARGET_OPTIONS:
        raise ValueError(f"method must be one of {tuple(TARGET_OPTIONS)}, got {method!r}")
    missing = {"steps", "lr", *TARGET_OPTIONS[method]} - set(grid)
    if missing:
        raise ValueError(f"grid for {method} misses {sorted(missing)}")
    prompts = EditPrompts.build(model, task, split)
    cov = key_second_moment(model, task, split.preserved, positions=key_positions) if cov is None else cov
    evaluation = EditEvaluation.build(model, task, split) if evaluation is None else evaluation
    fact = model.moe.fact
    cache: dict[tuple, torch.Tensor] = {}
    runs = []
    for config in progress_bar(_grid_points(grid), desc=method, enabled=not quiet, leave=False):
        target_keys = ("steps", "lr", *TARGET_OPTIONS[method])
        options = tuple(config[k] for k in target_keys)
        if options not in cache:
            cache[options] = edit_targets(model, prompts, **{k: config[k] for k in target_keys})
        edited = _edited_expert(method, fact, prompts.keys, cache[options], cov, config, len(split.preserved))
        runs.append({"config": config, **evaluation.metrics(model, edited)})
    best = max(runs, key=lambda r: r["score"])
    return {"best": best, "runs": runs}


def mlp_swap(model: AuthorsLM, task: AuthorsBooks, split: EditSplit, *, seed: int = 0,
             evaluation: Optional[EditEvaluation] = None) -> dict:
    """The seed's editor: a new FactMLP of the same size storing the whole edited fact set, swapped in."""
    evaluation = EditEvaluation.build(model, task, split) if evaluation is None else evaluation
    return evaluation.metrics(model, model.matching_fact_expert(task, split.new_facts, seed=seed))


def compare_editors(model: AuthorsLM, task: AuthorsBooks, split: EditSplit, *, grids: Optional[dict] = None,
                    methods: tuple[str, ...] = METHODS, seed: int = 0, key_positions: str = "edit_prompt",
                    quiet: bool = False) -> dict:
    """Best-scoring metrics per method on one split: {method: {"best": ..., "runs": [...]}};
    ``key_positions`` says where C's keys are read (see :func:`key_second_moment`)."""
    grids = SEED_GRIDS if grids is None else grids
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    cov = key_second_moment(model, task, split.preserved, positions=key_positions)
    evaluation = EditEvaluation.build(model, task, split)
    results = {}
    for method in methods:
        if method == "mlp_swap":
            metrics = mlp_swap(model, task, split, seed=seed, evaluation=evaluation)
            results[method] = {"best": {"config": {}, **metrics}, "runs": [{"config": {}, **metrics}]}
        else:
            results[method] = grid_search(model, task, split, method, grids[method], cov=cov,
                                          evaluation=evaluation, quiet=quiet)
    return results
