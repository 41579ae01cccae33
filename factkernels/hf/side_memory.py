"""GRACE and WISE side memories on real models (model-free rules in :mod:`factkernels.editing.side_memory`).

GRACE: a codebook at ``layer``'s down projection. Each edit's key is the projection's input at the prompt's
last token; its value (cold start: uniform random, seeded) is trained with Adam so that, put in place of
the projection's output at that token, the model continues with the target. At run time every position
whose input lies within a key's radius gets that key's value as output (as in generation, where each new
token is the last). Each entry's edits train one after another, different entries' values at once, ``chunk``
rows a batch (the values those of one edit at a time, up to the batch's float rounding). WISE: a side copy W' of
the down projection, trained by SGD on a random subset of its entries (clamped to W ± norm_constraint) on the target's NLL under the bare prompt and the generated context
prefixes (EasyEdit's ``get_context_templates``: 5 of 5 tokens and 5 of 10) plus the routing margins against one
unrelated text, each edit until WISE's early stop (loss <= 0.02, moved <= 1e-4) or ``steps``; a sequence whose
activation distance reaches act_ratio × the smallest mean distance seen on an edit's contexts is computed with
W', any other with W. One side memory (no sharding or merging: those start at 500 edits in the published
settings). The trained memory (:class:`WiseMemory`) is the result's ``targets``: routing it with another act_ratio
needs no training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F_nn

from ..datasets import natural_text
from ..editing import GRACEHparams, GraceCodebook, WISEHparams, as_dict, wise_activation_distance, wise_margin_loss
from ..progress import progress_bar
from .capture import (block_outputs, capture, encode_requests, encode_texts, final_hidden, hidden_with_delta,
                      length_sorted_chunks, model_device, tail_hidden)
from .checkpoint import ChunkCheckpoint, fingerprint
from .contexts import context_prefixes, with_prefixes
from .layout import mlp_module
from .requests import Request
from .residual import frozen, target_nll


def edit_side_memory(model: Any, tok: Any, requests: Sequence[Request], method: str, hp: Any, *,
                     progress: Any = None, targets: Optional["WiseMemory"] = None, chunk: int = 8,
                     checkpoint: Union[str, Path, None] = None) -> Any:
    """Edit ``requests`` one after another into a GRACE codebook or a WISE side memory (see the module
    docstring); returns an :class:`~factkernels.hf.editors.EditResult` whose restore() removes it and, for
    WISE, whose ``targets`` is the trained :class:`WiseMemory` (pass it back as ``targets`` to route the same
    memory with another act_ratio without training it again). chunk: GRACE's edits trained at once.
    checkpoint: WISE keeps its memory after each edit there (a .safetensors file, or a folder where the file is
    named by the model, requests and settings), and a run stopped part-way continues after the last edit kept."""
    from .editors import EditResult

    started = time.perf_counter()
    with frozen(model):
        trained = None
        if isinstance(hp, GRACEHparams):
            if targets is not None or checkpoint is not None:
                raise ValueError("grace trains its own values in minutes; targets and checkpoint apply to wise and "
                                 "the weight editors")
            undo, extra = _grace(model, tok, requests, hp, progress, chunk)
        elif isinstance(hp, WISEHparams):
            undo, extra, trained = _wise(model, tok, requests, hp, progress, targets, checkpoint)
        else:
            raise TypeError(f"hp must be GRACE or WISE hyperparameters, got {type(hp).__name__}")
    report = {"method": method, "layers": [hp.layer], "facts": len(requests), "hparams": as_dict(hp),
              "seconds": time.perf_counter() - started, **extra}
    return EditResult(method, (hp.layer,), report, trained, undo)


def _grace(model: Any, tok: Any, requests: Sequence[Request], hp: GRACEHparams, progress: Any, chunk: int):
    down = mlp_module(model, hp.layer).down_proj
    book = GraceCodebook()
    generator = torch.Generator().manual_seed(0)
    reqs = list(requests)
    batch = encode_requests(tok, reqs, with_target=True)
    # keys, outputs and states of the unedited layer (the codebook's hook is not in place yet)
    queries = capture(model, batch.input_ids, batch.attention_mask, hp.layer, site="down_in",
                      positions=batch.prompt_last)
    with torch.no_grad():
        own = down(queries)
    # the codebook's updates (keys, radii, labels) need no values: each edit's entry, in order
    entry = torch.tensor([book.add(q, r.target_new, torch.rand(down.out_features, generator=generator).to(q), hp.eps)
                          for q, r in zip(queries, reqs)])
    # an entry's value trains its edits one after another, different entries' values apart: wave w holds each
    # entry's w-th edit, and its rows train at once (Adam is elementwise and the loss sums the rows' NLL, so each
    # value moves as alone; only the batch's float rounding differs)
    wave = torch.zeros(len(reqs), dtype=torch.long)
    seen: dict[int, int] = {}
    for i, e in enumerate(entry.tolist()):
        wave[i], seen[e] = seen.get(e, 0), seen.get(e, 0) + 1
    waves = int(wave.max()) + 1  # hf.edit refuses an empty request list
    losses = torch.zeros(len(reqs))
    bar = progress_bar(total=len(reqs), desc="grace", enabled=progress is not False, leave=False)
    for w in range(waves):
        members = (wave == w).nonzero().flatten()
        for part in length_sorted_chunks(batch.attention_mask.sum(1)[members], chunk):
            rows = members[part]
            sub = batch.rows(rows)
            states = block_outputs(model, sub.input_ids, sub.attention_mask, hp.layer)
            value = book.values[entry[rows]].clone().requires_grad_(True)
            opt = torch.optim.Adam([value], lr=hp.lr)
            here, where = torch.arange(len(rows)), sub.prompt_last.to(model_device(model))
            for _ in range(hp.steps):  # the value in place of the output at the key: the later blocks only run
                hidden = hidden_with_delta(model, hp.layer, sub, states, here, where, value - own[rows])
                loss = target_nll(model, sub, hidden)
                opt.zero_grad(set_to_none=True)
                loss.sum().backward()
                opt.step()
            book.values[entry[rows]] = value.detach()
            losses[rows] = loss.detach().float().cpu()
            bar.update(len(rows))
    bar.close()

    def hook(_m: Any, args: tuple, out: torch.Tensor) -> torch.Tensor:
        hit, nearest = book.lookup(args[0].reshape(-1, args[0].shape[-1]))
        if not bool(hit.any()):
            return out
        flat = out.reshape(-1, out.shape[-1]).clone()
        flat[hit] = book.values[nearest[hit]].to(flat)
        return flat.view_as(out)

    handle = down.register_forward_hook(hook)
    extra = {"codebook_entries": len(book), "radii_mean": float(book.radii.mean()),
             "final_loss_mean": float(losses.mean()), "waves": waves}
    return handle.remove, extra


@dataclass
class WiseMemory:
    """A trained WISE side memory: the side copy of the down projection (d, intermediate), the smallest mean
    activation distance seen on an edit (routing threshold = ``min_act`` × act_ratio) and the settings it was
    trained with. The routing ratio enters only at run time, so one memory serves every act_ratio
    (``hf.edit(method="wise", targets=...)``, as the weight editors' δ serves every λ)."""

    weight: torch.Tensor
    min_act: float
    settings: dict


def early_stopped(losses: Sequence[float], *, below: float = 0.02, change: float = 1e-4) -> bool:
    """WISE's EarlyStopMeter: an edit stops once its last loss is <= ``below`` and moved <= ``change`` since the
    one before."""
    return len(losses) >= 2 and losses[-1] <= below and abs(losses[-1] - losses[-2]) <= change


def _wise_training_settings(hp: WISEHparams, n: int) -> dict:
    return {**{k: v for k, v in as_dict(hp).items() if k != "act_ratio"}, "requests": n}


def _wise(model: Any, tok: Any, requests: Sequence[Request], hp: WISEHparams, progress: Any,
          trained: Optional[WiseMemory], checkpoint: Union[str, Path, None]):
    down = mlp_module(model, hp.layer).down_proj
    weight = down.weight.detach()
    settings = _wise_training_settings(hp, len(requests))
    if trained is not None:
        if not isinstance(trained, WiseMemory):
            raise TypeError(f"targets for wise must be a WiseMemory (EditResult.targets), got {type(trained).__name__}")
        differ = sorted(k for k in settings if trained.settings.get(k) != settings[k])
        if differ:
            raise ValueError(f"the side memory was trained with other settings ({', '.join(differ)}); only act_ratio "
                             "may differ")
    alpha, beta, gamma = hp.act_margin
    # generated before the hooks go in: the unedited model writes them
    prefixes = context_prefixes(model, tok, hp.prefixes, hp.prefix_starts) if trained is None else ()
    state: dict = {"editing": False, "weight": None if trained is None else trained.weight.to(weight)}

    def record_mask(_m: Any, _args: tuple, kwargs: dict) -> None:
        state["attention"] = kwargs.get("attention_mask")

    def hook(_m: Any, args: tuple, out: torch.Tensor) -> torch.Tensor:
        side_out = F_nn.linear(args[0], state["weight"])
        attention = state.get("attention")
        real = torch.ones(out.shape[:2], device=out.device) if attention is None else attention.to(out.device)
        if state["editing"]:
            state["dist"] = wise_activation_distance(out, side_out, real)
            return side_out
        state["dist"] = wise_activation_distance(out, side_out, real, top1_beyond=100)
        routed = state["dist"] >= state["min_act"] * hp.act_ratio
        return torch.where(routed[:, None, None], side_out, out)

    handles = [model.model.register_forward_pre_hook(record_mask, with_kwargs=True),
               down.register_forward_hook(hook)]

    def undo() -> None:
        for h in handles:
            h.remove()
    try:
        extra = {}
        if trained is None:
            kept = None if checkpoint is None else _wise_checkpoint(model, tok, requests, hp, prefixes, settings,
                                                                    checkpoint)
            trained, extra = _train_wise(model, tok, requests, hp, prefixes, state, weight, (alpha, beta, gamma),
                                         settings, progress, kept)
        state["weight"], state["min_act"] = trained.weight.to(weight), trained.min_act
        with torch.no_grad():  # which edit prompts (with their new targets) the memory answers
            routed = []
            for r in requests:
                batch = encode_requests(tok, [r], with_target=True)
                state["attention"] = batch.attention_mask
                final_hidden(model, batch.input_ids, batch.attention_mask)
                routed.append(float(state["dist"][0]) >= trained.min_act * hp.act_ratio)
    except BaseException:  # an interrupt too: no hook is left behind
        undo()
        raise
    extra = {**extra, "routing_threshold": trained.min_act * hp.act_ratio, "min_act": trained.min_act,
             "edits_routed": sum(routed) / max(len(routed), 1),
             "side_memory_change": float((trained.weight.to(weight) - weight).norm())}
    return undo, extra, trained


def _wise_checkpoint(model: Any, tok: Any, requests: Sequence[Request], hp: WISEHparams, prefixes: Sequence[str],
                     settings: dict, checkpoint: Union[str, Path]) -> ChunkCheckpoint:
    """The file keeping WISE's memory after its last finished edit, refused for other requests, model or settings."""
    ids = encode_requests(tok, requests, with_target=True).input_ids
    digest = fingerprint(model, hp.layer, [ids], {**settings, "prefixes": list(prefixes), "side_memory": "wise"})
    path = Path(checkpoint)
    if path.suffix != ".safetensors":
        path = path / f"wise_{digest[:20]}.safetensors"
    return ChunkCheckpoint(path, digest)


def _train_wise(model: Any, tok: Any, requests: Sequence[Request], hp: WISEHparams, prefixes: Sequence[str],
                state: dict, weight: torch.Tensor, margins: tuple, settings: dict,
                progress: Any, kept: Optional[ChunkCheckpoint] = None) -> tuple[WiseMemory, dict]:
    """Train the side memory edit by edit (each: the request under the bare prompt and every context prefix,
    one unrelated text for the margins); returns it and a report. ``kept``: the memory after the last edit
    finished before is read from it and each finished edit is written to it (SGD keeps no state between edits:
    the memory, the smallest distance and the steps are all there is)."""
    alpha, beta, gamma = margins
    generator = torch.Generator().manual_seed(hp.seed)
    mask = (torch.rand(weight.shape, generator=generator) < hp.mask_ratio).to(weight)
    unrelated = natural_text("eval")
    side_param = weight.clone().requires_grad_(True)
    state["weight"] = side_param
    min_act, steps_run, first, restored = float("inf"), [], 0, 0.0
    if kept is not None and 0 in kept.chunks:
        tensors, info = kept.chunks[0]
        with torch.no_grad():
            side_param.copy_(tensors["weight"])
        min_act, steps_run, first, restored = info["min_act"], list(info["steps_run"]), info["done"], info["seconds"]
    started = time.perf_counter()
    todo = list(requests)[first:]
    for i, r in enumerate(progress_bar(todo, desc="wise", enabled=progress is not False, leave=False), start=first):
        batch = encode_requests(tok, with_prefixes([r], prefixes), with_target=True)
        other_ids, other_mask = encode_texts(tok, [unrelated[i % len(unrelated)]], max_length=32)
        opt = torch.optim.SGD([side_param], lr=hp.lr, weight_decay=1e-5)
        # the blocks before the side memory never change: each step runs from the states before it
        edit_in = block_outputs(model, batch.input_ids, batch.attention_mask, hp.layer - 1) if hp.layer else None
        other_in = block_outputs(model, other_ids, other_mask, hp.layer - 1) if hp.layer else None
        state["editing"] = True
        losses: list[float] = []
        for _ in range(hp.steps):
            if early_stopped(losses):
                break
            state["attention"] = batch.attention_mask
            hidden = (tail_hidden(model, hp.layer - 1, edit_in, batch.attention_mask) if hp.layer else
                      final_hidden(model, batch.input_ids, batch.attention_mask))
            ft = target_nll(model, batch, hidden).mean()
            in_scope = state["dist"]
            state["attention"] = other_mask
            if hp.layer:
                tail_hidden(model, hp.layer - 1, other_in, other_mask)
            else:
                final_hidden(model, other_ids, other_mask)
            loss = ft + wise_margin_loss(in_scope, state["dist"], alpha, beta, gamma)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            side_param.grad.mul_(mask)
            opt.step()
            with torch.no_grad():
                side_param.copy_(torch.maximum(torch.minimum(side_param, weight + hp.norm_constraint),
                                               weight - hp.norm_constraint))
            losses.append(float(loss.detach()))
        steps_run.append(len(losses))
        with torch.no_grad():  # the edit's mean activation distance over its contexts with the trained memory
            state["attention"] = batch.attention_mask
            final_hidden(model, batch.input_ids, batch.attention_mask)
            min_act = min(min_act, float(state["dist"].mean()))
        state["editing"] = False
        if kept is not None:
            kept.put(0, {"weight": side_param}, {"done": i + 1, "min_act": min_act, "steps_run": steps_run,
                                                 "seconds": restored + time.perf_counter() - started})
    memory = WiseMemory(side_param.detach().clone(), min_act, settings)
    return memory, {"contexts": 1 + len(prefixes), "prefixes": list(prefixes),
                    "steps_mean": sum(steps_run) / max(len(steps_run), 1), "edits_restored": first,
                    "targets_restored_seconds": restored}


__all__ = ["edit_side_memory", "WiseMemory", "early_stopped"]
