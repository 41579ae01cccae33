"""ROME, MEMIT and AlphaEdit on Hugging Face Llama-style models, for comparison with insertion.

Each editor changes the down projection W (d, intermediate) of one or more decoder layers'
MLPs. Its keys k are W's inputs ``act(gate(x)) * up(x)`` at the subject's last token of each
request's prompt; its targets come from the published residual step (ROME's ``compute_v``,
MEMIT's ``compute_z``): a vector δ added to the MLP output of the last edited layer at the
subject's last token, trained with Adam for ``steps`` steps at ``lr`` to make the prompt continue
with ``target_new`` (mean NLL over its tokens), plus ``kl_factor`` × the KL divergence of the
next-token distribution after "{subject} is a" from the unedited model's and ``weight_decay``
× ||δ||² / ||h||²; ||δ|| is clamped to ``clamp_norm`` × ||h|| after each step (h: the MLP output
for ROME, the residual stream after the layer for MEMIT/AlphaEdit, as published). A fact whose
NLL drops below ``early_stop`` keeps its δ. The update rules are those of
:mod:`factkernels.transformer.editing`, with C = E[k kᵀ] from
:func:`~factkernels.hf.statistics.key_second_moments`:

    rome       one layer; W + (v* − W k)(C⁻¹k)ᵀ / ((C⁻¹k)ᵀ k) per fact, in turn, v* = W k + δ
    memit      several layers, low to high; at layer l the remaining residual (z* − z)/(layers left)
               is written by W + R Kᵀ (λ C + K Kᵀ)⁻¹ (keys and z re-read after each layer's edit)
    alphaedit  as memit, with W + R Kᵀ P (K Kᵀ P + l2 I)⁻¹; P projects onto C's eigenvectors with
               eigenvalue < nullspace_tol (the directions natural text does not use)

Differences from the published code, all for CPU cost: no random context prefixes (the bare
prompt only) and every fact's δ is trained on the unedited model (ROME applies its rank-one
edits in turn, as the seed authors' protocol does, without re-optimising δ after each).

    result = edit(model, tok, requests, method="memit")     # in place
    result.report                                           # layers, hparams, NLLs, seconds
    result.restore()                                        # the original weights, bit for bit
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import torch
import torch.nn.functional as F_nn
from ..progress import progress_bar

from ..transformer.editing import alphaedit_update, memit_update, null_space_projector, rome_update
from .capture import (PromptBatch, capture, encode_requests, final_hidden, hidden_with_delta, logits_at, model_device,
                      tail_matches)
from .checkpoint import ChunkCheckpoint, fingerprint
from .layout import mlp_layers, mlp_module
from .requests import Request, parse_requests
from .statistics import key_second_moments

METHODS = ("rome", "memit", "alphaedit")

# Published hyperparameters (ROME/MEMIT on GPT-J, AlphaEdit on Llama3-8B), adapted to SmolLM2-135M's
# 30 layers: the edited layers keep their relative depth (GPT-J: ROME layer 5, MEMIT layers 3-8 of 28;
# Llama3-8B: AlphaEdit layers 4-8 of 32); the rest as published.
DEFAULT_HPARAMS: dict[str, dict[str, Any]] = {
    "rome": {"layers": (5,), "steps": 20, "lr": 0.5, "weight_decay": 0.5, "clamp_norm": 4.0,
             "kl_factor": 0.0625, "early_stop": 5e-2, "ridge": 1e-4},
    "memit": {"layers": (3, 4, 5, 6, 7, 8), "steps": 25, "lr": 0.5, "weight_decay": 0.5, "clamp_norm": 0.75,
              "kl_factor": 0.0625, "early_stop": 5e-2, "mom2_weight": 1.5e4},
    "alphaedit": {"layers": (4, 5, 6, 7, 8), "steps": 25, "lr": 0.1, "weight_decay": 0.5, "clamp_norm": 0.75,
                  "kl_factor": 0.0625, "early_stop": 5e-2, "nullspace_tol": 2e-2, "l2": 10.0},
}
KL_PROMPT = "{} is a"  # ROME/MEMIT's essence prompt for the KL term
# The hyperparameters of the residual step (δ); the rest of each method's are its update rule's.
TARGET_HPARAMS = ("steps", "lr", "weight_decay", "clamp_norm", "kl_factor", "early_stop")


# ----------------------------------------------------------------------------- the residual step


@dataclass
class ResidualTargets:
    """Per fact (n rows): delta (n, d) the trained δ; mlp_out (n, d) the unedited MLP output and
    layer_out (n, d) the unedited residual stream after the layer, at the subject's last token;
    nll_before / nll_after (n,) the target's mean NLL without / with δ. layer and settings (the
    δ hyperparameters, :data:`TARGET_HPARAMS`, and clamp_to) say how they were made, so a later
    :func:`edit` can reuse them only where they apply. restored_seconds: the time earlier runs spent
    on the chunks read back from a checkpoint."""

    delta: torch.Tensor
    mlp_out: torch.Tensor
    layer_out: torch.Tensor
    nll_before: torch.Tensor
    nll_after: torch.Tensor
    layer: int = -1
    settings: dict = field(default_factory=dict)
    restored_seconds: float = 0.0


@contextmanager
def _frozen(model: Any) -> Iterator[None]:
    """Model parameters without gradients (only δ is trained); restored afterwards."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)


def _layer_output(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _target_nll(model: Any, batch: PromptBatch, hidden: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean NLL (n,) of each row's target tokens given its prompt (logits only where needed); hidden: the
    batch's final hidden states (n, T, d) when the caller ran the model already (else a forward runs here)."""
    device = model_device(model)
    if hidden is None:
        hidden = final_hidden(model, batch.input_ids, batch.attention_mask)
    rows, positions, targets = batch.target_positions()
    logits = logits_at(model, hidden, rows, positions)
    token_nll = F_nn.cross_entropy(logits, targets.to(device), reduction="none")
    return torch.zeros(len(batch), device=device).index_add(0, rows.to(device), token_nll) / batch.target_len.to(device)


def _last_log_probs(model: Any, batch: PromptBatch, hidden: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Next-token log-probabilities (n, vocab) after each row's prompt (hidden as in :func:`_target_nll`)."""
    if hidden is None:
        hidden = final_hidden(model, batch.input_ids, batch.attention_mask)
    return F_nn.log_softmax(logits_at(model, hidden, torch.arange(len(batch)), batch.prompt_last), dim=-1)


def _hidden_with_delta(model: Any, layer: int, batch: PromptBatch, states: Optional[torch.Tensor],
                       where: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """:func:`~factkernels.hf.capture.hidden_with_delta` with one δ (n, d) per row, at its position ``where`` (n,)."""
    return hidden_with_delta(model, layer, batch, states, torch.arange(len(batch)), where, delta)


def residual_targets(model: Any, tok: Any, requests: Sequence[Request], layer: int, *, steps: int, lr: float,
                     weight_decay: float, clamp_norm: float, clamp_to: str, kl_factor: float,
                     early_stop: Optional[float] = 5e-2, chunk: int = 32, progress: Optional[bool] = None,
                     checkpoint: Union[str, Path, None] = None) -> ResidualTargets:
    """Train δ at ``layer``'s MLP output for every request (see the module docstring); facts are
    independent, so they are trained ``chunk`` at a time. clamp_to: "mlp" (ROME) or "layer" (MEMIT).
    checkpoint: a .safetensors file (:class:`~factkernels.hf.checkpoint.ChunkCheckpoint`) where each finished
    chunk is written at once and from which a rerun reads the chunks it holds (hours at 1,000 facts on a CPU)."""
    if clamp_to not in ("mlp", "layer"):
        raise ValueError(f"clamp_to must be 'mlp' or 'layer', got {clamp_to!r}")
    if steps < 0 or not lr > 0:
        raise ValueError(f"steps must be >= 0 and lr > 0, got steps={steps}, lr={lr}")
    mlp = mlp_module(model, layer)
    block = model.model.layers[layer]
    device = model_device(model)
    settings = {"steps": steps, "lr": lr, "weight_decay": weight_decay, "clamp_norm": clamp_norm,
                "kl_factor": kl_factor, "early_stop": early_stop, "clamp_to": clamp_to}
    saved = None
    if checkpoint is not None:
        every = encode_requests(tok, list(requests), with_target=True)
        saved = ChunkCheckpoint(checkpoint, fingerprint(model, layer, (every.input_ids, every.attention_mask),
                                                        {**settings, "chunk": chunk}))
    names = ("delta", "mlp_out", "layer_out", "nll_before", "nll_after")
    parts: list[tuple[torch.Tensor, ...]] = []
    restored = 0.0
    with _frozen(model):
        # each step runs only the blocks after ``layer`` on its cached output (checked on two prompts against the
        # full forward; a model whose tail differs keeps the hooked full forward)
        probe = encode_requests(tok, list(requests[:2]), with_target=True)
        tail = tail_matches(model, probe.input_ids, probe.attention_mask, layer)
        for start in progress_bar(range(0, len(requests), chunk), desc=f"targets at layer {layer}",
                                  enabled=progress is not False, leave=False):
            if saved is not None and start in saved.chunks:
                tensors, info = saved.chunks[start]
                parts.append(tuple(tensors[name].to(device) for name in names))
                restored += info["seconds"]
                continue
            chunk_start = time.perf_counter()
            part = list(requests[start:start + chunk])
            facts = encode_requests(tok, part, with_target=True)
            essence = encode_requests(tok, [Request(KL_PROMPT, r.subject, r.target_new) for r in part])
            rows = torch.arange(len(part), device=device)
            seen: dict[str, torch.Tensor] = {}
            hooks = [mlp.register_forward_hook(lambda _m, _a, out: seen.__setitem__("mlp", out)),
                     block.register_forward_hook(lambda _m, _a, out: seen.__setitem__("layer", _layer_output(out)))]
            try:
                with torch.no_grad():
                    nll_before = _target_nll(model, facts)
                    where = facts.subject_last.to(device)
                    mlp_out, layer_out = seen["mlp"][rows, where], seen["layer"][rows, where]
                    fact_states = seen["layer"] if tail else None  # (b, T, d) after the layer
                    base_log_probs = _last_log_probs(model, essence) if kl_factor > 0 else None
                    essence_states = seen["layer"] if tail and kl_factor > 0 else None
            finally:
                for h in hooks:
                    h.remove()
            essence_where = essence.subject_last.to(device)
            ref_norm = (mlp_out if clamp_to == "mlp" else layer_out).norm(dim=1, keepdim=True)  # (b, 1)
            delta = torch.zeros_like(mlp_out, requires_grad=True)
            done = torch.zeros(len(part), dtype=torch.bool, device=device)
            kept = torch.zeros_like(mlp_out)
            opt = torch.optim.Adam([delta], lr=lr)
            for _ in range(steps):
                # facts are independent rows: only those not yet below early_stop run (same result, less work)
                act = (~done).nonzero().flatten()
                d_act = delta[act]
                sub = facts.rows(act.cpu())
                hidden = _hidden_with_delta(model, layer, sub, None if fact_states is None else fact_states[act],
                                            where[act], d_act)
                nll = _target_nll(model, sub, hidden)
                loss = nll + weight_decay * d_act.pow(2).sum(1) / ref_norm[act].squeeze(1).pow(2)
                if base_log_probs is not None:
                    sub_essence = essence.rows(act.cpu())
                    hidden = _hidden_with_delta(model, layer, sub_essence,
                                                None if essence_states is None else essence_states[act],
                                                essence_where[act], d_act)
                    log_probs = _last_log_probs(model, sub_essence, hidden)
                    kl = F_nn.kl_div(log_probs, base_log_probs[act], log_target=True, reduction="none").sum(1)
                    loss = loss + kl_factor * kl
                with torch.no_grad():  # facts already below early_stop keep the δ that got them there
                    newly = act[nll < early_stop] if early_stop is not None else act[:0]
                    kept[newly] = delta[newly]
                    done[newly] = True
                if bool(done.all()):
                    break
                opt.zero_grad(set_to_none=True)
                loss.sum().backward()
                opt.step()
                with torch.no_grad():
                    delta.mul_(torch.clamp(clamp_norm * ref_norm / delta.norm(dim=1, keepdim=True).clamp_min(1e-12),
                                           max=1.0))
                    delta[done] = kept[done]
            delta = delta.detach()
            with torch.no_grad():
                nll_after = _target_nll(model, facts, _hidden_with_delta(model, layer, facts, fact_states, where, delta))
            parts.append((delta, mlp_out, layer_out, nll_before, nll_after))
            if saved is not None:
                saved.put(start, dict(zip(names, parts[-1])), {"seconds": time.perf_counter() - chunk_start})
    return ResidualTargets(*(torch.cat(cols) for cols in zip(*parts)), layer=layer, settings=settings,
                           restored_seconds=restored)


# ----------------------------------------------------------------------------- the editors


@dataclass
class EditResult:
    """An applied edit: ``report`` (method, layers, hparams, NLLs, seconds), the residual
    ``targets`` it wrote (pass them to another :func:`edit` to try other update settings without
    re-training δ) and the original down projections by layer, which :meth:`restore` puts back."""

    method: str
    layers: tuple[int, ...]
    report: dict
    targets: Optional[ResidualTargets] = field(repr=False)
    _model: Any = field(repr=False)
    _original: dict[int, torch.Tensor] = field(repr=False)

    def restore(self) -> None:
        """Put the original down-projection weights back (bit for bit)."""
        mlps = mlp_layers(self._model)
        with torch.no_grad():
            for layer, weight in self._original.items():
                mlps[layer].down_proj.weight.copy_(weight)


def _resolve(method: str, layers: Optional[Sequence[int]], hparams: dict, num_layers: int) -> tuple[tuple[int, ...], dict]:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    defaults = dict(DEFAULT_HPARAMS[method])
    unknown = set(hparams) - set(defaults) - {"chunk"}
    if unknown:
        raise ValueError(f"unknown hyperparameters for {method}: {sorted(unknown)}; "
                         f"known: {sorted(k for k in defaults if k != 'layers')} and chunk")
    default_layers = defaults.pop("layers")
    if layers is None:
        # the published relative depth on a model of another size
        layers = sorted({min(num_layers - 1, round(l * num_layers / 30)) for l in default_layers})
    layers = tuple(int(l) for l in ([layers] if isinstance(layers, int) else layers))
    if not layers or (method == "rome" and len(layers) != 1):
        raise ValueError(f"layers for {method} must be {'one layer' if method == 'rome' else 'non-empty'}, "
                         f"got {layers!r}")
    if list(layers) != sorted(set(layers)):
        raise ValueError(f"layers must be increasing and distinct, got {layers!r}")
    return layers, {**defaults, **hparams}


def _check_targets(targets: ResidualTargets, n: int, layer: int, settings: dict) -> None:
    """Reused targets must be for these requests (count), this last layer and these δ settings."""
    if not isinstance(targets, ResidualTargets):
        raise TypeError(f"targets must be ResidualTargets (e.g. EditResult.targets), got {type(targets).__name__}")
    if targets.delta.shape[0] != n:
        raise ValueError(f"targets hold {targets.delta.shape[0]} facts but {n} requests were given")
    if targets.layer != layer:
        raise ValueError(f"targets were trained at layer {targets.layer}, this edit writes δ at layer {layer}")
    differ = {k: (targets.settings.get(k), v) for k, v in settings.items() if targets.settings.get(k) != v}
    if differ:
        raise ValueError("targets were trained with other residual-step settings (theirs, these): "
                         + ", ".join(f"{k}={a!r}/{b!r}" for k, (a, b) in differ.items()))


def edit(model: Any, tok: Any, requests: Any, method: str = "memit", layers: Optional[Sequence[int]] = None, *,
         stats: Optional[dict[int, torch.Tensor]] = None, cache_dir: Any = None, progress: Optional[bool] = None,
         targets: Optional[ResidualTargets] = None, checkpoint: Union[str, Path, None] = None,
         **hparams: Any) -> EditResult:
    """Apply ROME, MEMIT or AlphaEdit for ``requests`` to ``model`` in place (see the module docstring).

    requests: anything :func:`~factkernels.hf.requests.parse_requests` takes. layers: the edited
    layers (default: the published depth, :data:`DEFAULT_HPARAMS`). stats: {layer: C} to use instead
    of :func:`~factkernels.hf.statistics.key_second_moments` (computed and cached under ``cache_dir``).
    hparams: overrides of :data:`DEFAULT_HPARAMS` [method] (and ``chunk``, facts per δ batch).
    targets: the δ of an earlier edit of the same requests (``EditResult.targets``), reused instead
    of re-trained — an update-rule grid (MEMIT's ``mom2_weight``, AlphaEdit's ``l2`` /
    ``nullspace_tol``) then costs one residual step; they must match the last layer and the δ
    settings (:data:`TARGET_HPARAMS`), else ValueError. The model must be unedited either way.
    checkpoint: a .safetensors file keeping the residual step's finished chunks (see
    :func:`residual_targets`), so a long edit can be stopped and run again.
    """
    started = time.perf_counter()
    reqs = list(parse_requests(requests))
    mlps = mlp_layers(model)
    layers, hp = _resolve(method, layers, hparams, len(mlps))
    for layer in layers:
        mlp_module(model, layer)  # range check with the layout's message
    missing = [layer for layer in layers if stats is None or layer not in stats]
    covs = {**(stats or {}), **key_second_moments(model, tok, missing, cache_dir=cache_dir, progress=progress)}
    stats_seconds = time.perf_counter() - started
    original = {layer: mlps[layer].down_proj.weight.detach().clone() for layer in layers}
    last = layers[-1]
    target_settings = {k: hp[k] for k in TARGET_HPARAMS} | {"clamp_to": "mlp" if method == "rome" else "layer"}
    reused = targets is not None
    if reused:
        _check_targets(targets, len(reqs), last, target_settings)
    else:
        targets = residual_targets(model, tok, reqs, last, **target_settings, chunk=hp.get("chunk", 32),
                                   progress=progress, checkpoint=checkpoint)
    targets_wall = time.perf_counter() - started - stats_seconds
    # δ's cost as if it had run at once: chunks read from a checkpoint count the time they took then
    targets_seconds = targets_wall + (0.0 if reused else targets.restored_seconds)
    batch = encode_requests(tok, reqs)
    report: dict[str, Any] = {"method": method, "layers": list(layers), "facts": len(reqs),
                              "hparams": {k: v for k, v in hp.items()}}
    try:
        with torch.no_grad():
            if method == "rome":
                _apply_rome(model, batch, last, targets, covs[last], hp["ridge"])
            else:
                report["null_space_dims"] = _apply_spread(model, batch, layers, targets, covs, method, hp)
    except Exception:
        EditResult(method, layers, report, targets, model, original).restore()
        raise
    report.update({"nll_before": float(targets.nll_before.mean()), "nll_target": float(targets.nll_after.mean()),
                   "delta_norm": float(targets.delta.norm(dim=1).mean()), "stats_seconds": stats_seconds,
                   "targets_seconds": targets_seconds, "targets_reused": reused,
                   "update_seconds": time.perf_counter() - started - stats_seconds - targets_wall,
                   "seconds": time.perf_counter() - started})
    return EditResult(method, layers, report, targets, model, original)


def _keys(model: Any, batch: PromptBatch, layer: int) -> torch.Tensor:
    """Down-projection inputs (n, intermediate) at the subject's last token."""
    return capture(model, batch.input_ids, batch.attention_mask, layer, site="down_in", positions=batch.subject_last)


@torch.no_grad()
def _keys_and_state(model: Any, batch: PromptBatch, layer: int, state_layer: int,
                    batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """In one pass: ``layer``'s down-projection inputs (n, intermediate) and the residual stream after
    ``state_layer`` (n, d), both at the subject's last token."""
    device = model_device(model)
    seen: dict[str, torch.Tensor] = {}
    hooks = [mlp_module(model, layer).down_proj.register_forward_pre_hook(
                 lambda _m, args: seen.__setitem__("key", args[0])),
             model.model.layers[state_layer].register_forward_hook(
                 lambda _m, _a, out: seen.__setitem__("state", _layer_output(out)))]
    keys, states = [], []
    try:
        for start in range(0, len(batch), batch_size):
            stop = min(start + batch_size, len(batch))
            model.model(input_ids=batch.input_ids[start:stop].to(device),
                        attention_mask=batch.attention_mask[start:stop].to(device), use_cache=False)
            rows, where = torch.arange(stop - start, device=device), batch.subject_last[start:stop].to(device)
            keys.append(seen["key"][rows, where])
            states.append(seen["state"][rows, where])
    finally:
        for h in hooks:
            h.remove()
    return torch.cat(keys), torch.cat(states)


def _apply_rome(model: Any, batch: PromptBatch, layer: int, targets: ResidualTargets, cov: torch.Tensor,
                ridge: float) -> None:
    down = mlp_module(model, layer).down_proj
    weight = down.weight.detach()
    keys = _keys(model, batch, layer).to(weight)
    cov = cov.to(weight)
    cov = cov + ridge * cov.diagonal().mean() * torch.eye(cov.shape[0], dtype=weight.dtype, device=weight.device)
    down.weight.copy_(rome_update(weight, keys, (targets.mlp_out + targets.delta).to(weight), cov))


def _apply_spread(model: Any, batch: PromptBatch, layers: tuple[int, ...], targets: ResidualTargets,
                  covs: dict[int, torch.Tensor], method: str, hp: dict) -> dict[int, int]:
    """MEMIT's spreading of z* − z over ``layers`` (low to high) with MEMIT's or AlphaEdit's rule;
    returns AlphaEdit's null-space dimension per layer (empty for MEMIT)."""
    goal = targets.layer_out + targets.delta  # z* (n, d) after the last layer
    null_dims = {}
    for i, layer in enumerate(layers):
        keys, current = _keys_and_state(model, batch, layer, layers[-1])
        down = mlp_module(model, layer).down_proj
        weight = down.weight.detach()
        keys = keys.to(weight)
        values = keys @ weight.T + ((goal - current) / (len(layers) - i)).to(weight)
        cov = covs[layer].to(weight)
        if method == "memit":
            new = memit_update(weight, keys, values, cov, hp["mom2_weight"])
        else:
            projector = null_space_projector(cov, hp["nullspace_tol"])
            null_dims[layer] = int(round(float(projector.trace())))
            new = alphaedit_update(weight, keys, values, projector, hp["l2"])
        down.weight.copy_(new)
    return null_dims


__all__ = ["DEFAULT_HPARAMS", "METHODS", "TARGET_HPARAMS", "EditResult", "ResidualTargets", "edit",
           "residual_targets"]
