"""GRACE and WISE side memories on real models (model-free rules in :mod:`factkernels.editing.side_memory`).

GRACE: a codebook at ``layer``'s down projection. Each edit's key is the projection's input at the prompt's
last token; its value (cold start: uniform random, seeded) is trained with Adam so that, put in place of
the projection's output at that token, the model continues with the target. At run time every position
whose input lies within a key's radius gets that key's value as output (as in generation, where each new
token is the last). WISE: a side copy W' of the down projection, trained by SGD on a random subset of its
entries (clamped to W ± norm_constraint) on the target's NLL plus the routing margins against one
unrelated text; a sequence whose activation distance reaches act_ratio × the smallest distance seen on an
edit is computed with W', any other with W. One side memory (no sharding or merging: those start at 500
edits in the published settings).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch
import torch.nn.functional as F_nn

from ..datasets import natural_text
from ..editing import GRACEHparams, GraceCodebook, WISEHparams, as_dict, wise_activation_distance, wise_margin_loss
from ..progress import progress_bar
from .capture import (block_outputs, capture, encode_requests, encode_texts, final_hidden, hidden_with_delta,
                      model_device, tail_hidden)
from .layout import mlp_module
from .requests import Request
from .residual import frozen, target_nll


def edit_side_memory(model: Any, tok: Any, requests: Sequence[Request], method: str, hp: Any, *,
                     progress: Any = None) -> Any:
    """Edit ``requests`` one after another into a GRACE codebook or a WISE side memory (see the module
    docstring); returns an :class:`~factkernels.hf.editors.EditResult` whose restore() removes it."""
    from .editors import EditResult

    started = time.perf_counter()
    with frozen(model):
        if isinstance(hp, GRACEHparams):
            undo, extra = _grace(model, tok, requests, hp, progress)
        elif isinstance(hp, WISEHparams):
            undo, extra = _wise(model, tok, requests, hp, progress)
        else:
            raise TypeError(f"hp must be GRACE or WISE hyperparameters, got {type(hp).__name__}")
    report = {"method": method, "layers": [hp.layer], "facts": len(requests), "hparams": as_dict(hp),
              "seconds": time.perf_counter() - started, **extra}
    return EditResult(method, (hp.layer,), report, None, undo)


def _grace(model: Any, tok: Any, requests: Sequence[Request], hp: GRACEHparams, progress: Any):
    down = mlp_module(model, hp.layer).down_proj
    book = GraceCodebook()
    generator = torch.Generator().manual_seed(0)

    def hook(_m: Any, args: tuple, out: torch.Tensor) -> torch.Tensor:
        hit, nearest = book.lookup(args[0].reshape(-1, args[0].shape[-1]))
        if not bool(hit.any()):
            return out
        flat = out.reshape(-1, out.shape[-1]).clone()
        flat[hit] = book.values[nearest[hit]].to(flat)
        return flat.view_as(out)

    handle = down.register_forward_hook(hook)
    losses = []
    try:
        for r in progress_bar(list(requests), desc="grace", enabled=progress is not False, leave=False):
            batch = encode_requests(tok, [r], with_target=True)
            where = batch.prompt_last.to(model_device(model))
            handle.remove()  # the query, output and states of the unedited layer
            query = capture(model, batch.input_ids, batch.attention_mask, hp.layer, site="down_in",
                            positions=batch.prompt_last)[0]
            with torch.no_grad():
                own = down(query)
            states = block_outputs(model, batch.input_ids, batch.attention_mask, hp.layer)
            handle = down.register_forward_hook(hook)
            init = torch.rand(down.out_features, generator=generator).to(query)
            index = book.add(query, r.target_new, init, hp.eps)
            value = book.values[index].clone().requires_grad_(True)
            opt = torch.optim.Adam([value], lr=hp.lr)
            rows = torch.zeros(1, dtype=torch.long)
            for _ in range(hp.steps):  # the value in place of the output at the key: the later blocks only run
                hidden = hidden_with_delta(model, hp.layer, batch, states, rows, where, (value - own)[None])
                loss = target_nll(model, batch, hidden).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            book.values[index] = value.detach()
            losses.append(float(loss.detach()))
    except Exception:
        handle.remove()
        raise
    extra = {"codebook_entries": len(book), "radii_mean": float(book.radii.mean()) if len(book) else 0.0,
             "final_loss_mean": sum(losses) / max(len(losses), 1)}
    return handle.remove, extra


def _wise(model: Any, tok: Any, requests: Sequence[Request], hp: WISEHparams, progress: Any):
    down = mlp_module(model, hp.layer).down_proj
    weight = down.weight.detach()
    side = weight.clone()
    generator = torch.Generator().manual_seed(hp.seed)
    mask = (torch.rand(weight.shape, generator=generator) < hp.mask_ratio).to(weight)
    alpha, beta, gamma = hp.act_margin
    unrelated = natural_text("eval")
    state: dict = {"editing": False, "min_act": None, "mask": None}

    def record_mask(_m: Any, _args: tuple, kwargs: dict) -> None:
        state["attention"] = kwargs.get("attention_mask")

    def hook(_m: Any, args: tuple, out: torch.Tensor) -> torch.Tensor:
        side_out = F_nn.linear(args[0], state["weight"])
        attention = state.get("attention")
        real = torch.ones(out.shape[:2], device=out.device) if attention is None else attention.to(out.device)
        if state["editing"]:
            state["dist"] = wise_activation_distance(out, side_out, real)
            return side_out
        dist = wise_activation_distance(out, side_out, real, top1_beyond=100)
        routed = dist >= state["min_act"] * hp.act_ratio
        return torch.where(routed[:, None, None], side_out, out)

    side_param = side.clone().requires_grad_(True)
    state["weight"] = side_param
    handles = [model.model.register_forward_pre_hook(record_mask, with_kwargs=True),
               down.register_forward_hook(hook)]
    min_act = float("inf")
    try:
        for i, r in enumerate(progress_bar(list(requests), desc="wise", enabled=progress is not False, leave=False)):
            batch = encode_requests(tok, [r], with_target=True)
            other_ids, other_mask = encode_texts(tok, [unrelated[i % len(unrelated)]], max_length=32)
            opt = torch.optim.SGD([side_param], lr=hp.lr, weight_decay=1e-5)
            # the blocks before the side memory never change: each step runs from the states before it
            edit_in = block_outputs(model, batch.input_ids, batch.attention_mask, hp.layer - 1) if hp.layer else None
            other_in = block_outputs(model, other_ids, other_mask, hp.layer - 1) if hp.layer else None
            state["editing"] = True
            for _ in range(hp.steps):
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
                out_scope = state["dist"]
                loss = ft + wise_margin_loss(in_scope, out_scope, alpha, beta, gamma)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                side_param.grad.mul_(mask)
                opt.step()
                with torch.no_grad():
                    side_param.copy_(torch.maximum(torch.minimum(side_param, weight + hp.norm_constraint),
                                                   weight - hp.norm_constraint))
            with torch.no_grad():  # the edit's activation distance with the trained side memory
                final_hidden(model, batch.input_ids, batch.attention_mask)
                min_act = min(min_act, float(state["dist"].mean()))
            state["editing"] = False
        state["weight"] = side_param.detach()
        state["min_act"] = min_act
    except Exception:
        for h in handles:
            h.remove()
        raise

    def undo() -> None:
        for h in handles:
            h.remove()
    return undo, {"routing_threshold": min_act * hp.act_ratio, "side_memory_change": float((state["weight"] - weight).norm())}


__all__ = ["edit_side_memory"]
