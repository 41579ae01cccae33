"""ROME, MEMIT, AlphaEdit, GRACE and WISE on Hugging Face Llama-style models, configured as their reference code.

The weight editors change the down projection W (d, intermediate) of one or more decoder layers' MLPs.
Their keys k are W's inputs ``act(gate(x)) * up(x)`` at the subject's last token, averaged over the
bare prompt and generated context prefixes (:mod:`factkernels.hf.contexts`); their targets come from
the residual step (:mod:`factkernels.hf.residual`); the update rules and hyperparameters are
:mod:`factkernels.editing`'s, with C = E[k kᵀ] from :func:`~factkernels.hf.statistics.key_second_moments`:

    rome       one layer; facts one after another, each with its δ trained on the model as edited so far,
               W + (v* − W k)(C⁻¹u)ᵀ / ((C⁻¹u)ᵀ k), k the bare prompt's key, u the key over the contexts
    memit      every δ on the unedited model, then layers low to high: the remaining residual
               (z* − z)/(layers left) written by W + R Kᵀ (λ C + K Kᵀ)⁻¹ (keys and z re-read per layer)
    alphaedit  as memit in sequential batches of ``batch_size`` (δ of a batch on the model edited by the
               earlier ones), W + R Kᵀ P (P (K Kᵀ + K_p K_pᵀ) + l2 I)⁻¹ with P C's null-space projector and
               K_p the earlier batches' keys
    grace, wise  side memories at one layer (:mod:`factkernels.hf.side_memory`)

    result = edit(model, tok, requests, method="memit")     # in place
    result.report                                           # layers, hparams, prefixes, NLLs, seconds
    result.restore()                                        # the original model, bit for bit
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch

from ..editing import (AlphaEditHparams, MEMITHparams, ROMEHparams, as_dict, get_method, hparams as make_hparams,
                       null_space_projector, nullspace_threshold, update_weight)
from .capture import capture, encode_requests
from .checkpoint import fingerprint
from .contexts import context_prefixes, with_prefixes
from .layout import mlp_layers, mlp_module
from .requests import Request, parse_requests
from .residual import ResidualTargets, residual_targets
from .statistics import key_second_moments, mom2_texts, second_moment_tokens

WEIGHT_EDITORS = ("rome", "memit", "alphaedit")


@dataclass
class EditResult:
    """An applied edit: ``report`` (method, layers, hparams, NLLs, seconds), the residual ``targets`` it wrote
    when every δ was trained on the unedited model (MEMIT, one-batch AlphaEdit, one-fact ROME: pass them to
    another :func:`edit` to try other update settings without re-training δ; WISE: its trained side memory, to
    route with another act_ratio; else None), and how to undo it."""

    method: str
    layers: tuple[int, ...]
    report: dict
    targets: Any = field(repr=False)
    _undo: Callable[[], None] = field(repr=False)

    def restore(self) -> None:
        """Put the original model back (weights bit for bit, side memories removed)."""
        self._undo()


def weight_restorer(model: Any, layers: Sequence[int]) -> Callable[[], None]:
    """A function that puts the current down projections of ``layers`` back."""
    mlps = mlp_layers(model)
    original = {layer: mlps[layer].down_proj.weight.detach().clone() for layer in layers}

    def undo() -> None:
        with torch.no_grad():
            for layer, weight in original.items():
                mlps[layer].down_proj.weight.copy_(weight)
    return undo


def hparams_for_shape(method: str, num_layers: int, mlp_width: int, layers: Optional[Sequence[int]],
                      overrides: dict) -> Any:
    """The hyperparameters :func:`edit` resolves for a model of ``num_layers`` layers and MLP width ``mlp_width``
    (registry defaults moved to them), with ``layers`` and ``overrides``; raises ValueError for unknown ones."""
    get_method(method)
    if method not in WEIGHT_EDITORS + ("grace", "wise"):
        raise ValueError(f"method must be one of {WEIGHT_EDITORS + ('grace', 'wise')}, got {method!r}")
    if layers is not None:
        layers = (int(layers),) if isinstance(layers, int) else tuple(int(l) for l in layers)
        if method in ("grace", "wise"):
            if len(layers) != 1:
                raise ValueError(f"layers for {method} must be one layer, got {layers!r}")
            overrides = {**overrides, "layer": layers[0]}
        else:
            overrides = {**overrides, "layers": layers}
    return make_hparams(method, num_layers=num_layers, mlp_width=mlp_width, **overrides)


def resolve_hparams(model: Any, method: str, layers: Optional[Sequence[int]], overrides: dict) -> Any:
    """The method's hyperparameters for this model (:func:`hparams_for_shape` at its depth and width); raises
    ValueError for unknown ones or bad layers."""
    mlps = mlp_layers(model)
    hp = hparams_for_shape(method, len(mlps), mlps[0].down_proj.in_features, layers, overrides)
    chosen = (hp.layer,) if method in ("grace", "wise") else hp.layers
    if not chosen or (method == "rome" and len(chosen) != 1):
        raise ValueError(f"layers for {method} must be {'one layer' if method == 'rome' else 'non-empty'}, "
                         f"got {chosen!r}")
    if list(chosen) != sorted(set(chosen)):
        raise ValueError(f"layers must be increasing and distinct, got {chosen!r}")
    for layer in chosen:
        mlp_module(model, layer)  # range check with the layout's message
    return hp


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
         targets: Optional[Any] = None, checkpoint: Union[str, Path, None] = None,
         chunk: int = 8, device: Union[str, torch.device, None] = None, **hparams: Any) -> EditResult:
    """Apply ``method`` ("rome" | "memit" | "alphaedit" | "grace" | "wise") for ``requests`` to ``model`` in
    place (see the module docstring).

    requests: anything :func:`~factkernels.hf.requests.parse_requests` takes. layers: the edited layers
    (default: the published depth, :func:`factkernels.editing.hparams`). stats: {layer: C} to use instead of
    :func:`~factkernels.hf.statistics.key_second_moments` over the hparams' ``mom2_dataset`` /
    ``mom2_n_samples`` (default: the shipped Wikipedia leads, ~1.05M tokens; computed once and cached under
    ``cache_dir``).
    hparams: overrides of the method's dataclass fields, or ``preset="smollm2-135m"`` for the settings chosen
    for that model (:data:`factkernels.editing.TUNED`: traced layers, validation-draw sweep). targets: the δ of
    an earlier edit of the same requests (``EditResult.targets``), reused instead of re-trained where every δ
    is trained on the unedited model; they must match the last layer and the δ settings, else ValueError.
    For WISE, the trained side memory of an earlier edit of the same requests (``EditResult.targets``), routed
    with this edit's act_ratio instead of trained again (every other setting must match).
    checkpoint: a .safetensors file keeping the residual step's finished chunks (MEMIT and one-batch
    AlphaEdit), so a long edit can be stopped and run again; or a folder (any other path), where that file is
    named by everything δ depends on (:func:`targets_file`): edits that train the same δ share it (MEMIT and
    AlphaEdit with the same residual settings; a grid over λ or the null-space threshold, which enter only
    the update, as in the references' ``execute_memit`` and ``get_project``), and a sequential edit (ROME,
    AlphaEdit's batches) keeps one file per batch, named by the weights the earlier batches left, so a rerun
    reads back every batch up to the one it stopped in. WISE keeps its side memory after each edit in such a
    file (or folder) and continues after the last edit kept. chunk: facts per δ batch (GRACE: values trained at
    once). device: where the model runs ("cpu", "cuda", ...): moved there in place (``model.to(device)``) once
    the arguments are checked, and it stays; default: where it is.
    """
    started = time.perf_counter()
    reqs = list(parse_requests(requests))
    hp = resolve_hparams(model, method, layers, hparams)
    if device is not None:
        model.to(device)
    if method in ("grace", "wise"):
        from .side_memory import edit_side_memory

        return edit_side_memory(model, tok, reqs, method, hp, progress=progress, targets=targets, chunk=chunk,
                                checkpoint=checkpoint)
    missing = [layer for layer in hp.layers if stats is None or layer not in stats]
    stats_texts = mom2_texts(hp.mom2_dataset, hp.mom2_n_samples) if missing else []
    covs = {**(stats or {}), **key_second_moments(model, tok, missing, texts=stats_texts, cache_dir=cache_dir,
                                                  progress=progress)}
    stats_seconds = time.perf_counter() - started
    prefixes = context_prefixes(model, tok, hp.prefixes, hp.prefix_starts)
    undo = weight_restorer(model, hp.layers)
    batches = _batches(method, hp, len(reqs))
    shared = len(batches) == 1
    if targets is not None and not shared:
        raise ValueError(f"{method} over {len(reqs)} facts trains δ on the edited model (sequential); "
                         "targets can be reused only where every δ is trained on the unedited model")
    step = {**{k: getattr(hp, k) for k in ("steps", "lr", "weight_decay", "clamp_norm", "kl_factor", "early_stop")},
            "clamp_to": "mlp" if method == "rome" else "layer", "prefixes": list(prefixes)}
    report: dict[str, Any] = {"method": method, "layers": list(hp.layers), "facts": len(reqs),
                              "hparams": as_dict(hp), "prefixes": list(prefixes), "batches": len(batches),
                              "stats_tokens": {layer: second_moment_tokens(model, layer, texts=stats_texts, cache_dir=cache_dir)
                                               for layer in missing}}
    last = hp.layers[-1]
    previous = {layer: None for layer in hp.layers}  # AlphaEdit's earlier batches' key Gram per layer
    projectors = {}
    if isinstance(hp, AlphaEditHparams):
        for layer in hp.layers:
            threshold = nullspace_threshold(hp, covs[layer])
            projectors[layer] = null_space_projector(covs[layer].to(mlp_module(model, layer).down_proj.weight),
                                                     threshold)
            report.setdefault("nullspace_threshold_used", {})[layer] = threshold
            report.setdefault("null_space_dims", {})[layer] = int(round(float(projectors[layer].trace())))
    parts, targets_seconds, restored, reused = [], 0.0, 0.0, targets is not None
    try:
        for batch_reqs in batches:
            batch_reqs = [reqs[i] for i in batch_reqs]
            t0 = time.perf_counter()
            if reused:
                _check_targets(targets, len(reqs), last, step)
                batch_targets = targets
            else:
                saved = None
                if checkpoint is not None and Path(checkpoint).suffix == ".safetensors":
                    saved = Path(checkpoint) if shared else None  # one file holds one batch's δ
                elif checkpoint is not None:  # named by the weights too: a later batch's file by the edited model
                    saved = targets_file(checkpoint, model, batch_reqs, last, step, chunk)
                batch_targets = residual_targets(model, tok, batch_reqs, last, **step, chunk=chunk,
                                                 progress=progress and len(batches) == 1, checkpoint=saved)
                restored += batch_targets.restored_seconds
            targets_seconds += time.perf_counter() - t0  # plus, below, what earlier runs spent on restored chunks
            parts.append(batch_targets)
            with torch.no_grad():
                if isinstance(hp, ROMEHparams):
                    _apply_rome(model, tok, batch_reqs, prefixes, hp, batch_targets, covs[last])
                else:
                    _apply_spread(model, tok, batch_reqs, prefixes, hp, batch_targets, covs, projectors, previous)
    except BaseException:  # an interrupt too: the model is left as it was
        undo()
        raise
    nll_before = torch.cat([p.nll_before for p in parts])
    nll_after = torch.cat([p.nll_after for p in parts])
    delta = torch.cat([p.delta for p in parts])
    report.update({"nll_before": float(nll_before.mean()), "nll_target": float(nll_after.mean()),
                   "delta_norm": float(delta.norm(dim=1).mean()), "stats_seconds": stats_seconds,
                   "targets_seconds": targets_seconds + restored, "targets_restored_seconds": restored,
                   "targets_reused": reused,
                   "seconds": time.perf_counter() - started})
    if isinstance(hp, MEMITHparams):
        report["mom2_weight_used"] = hp.mom2_weight
    return EditResult(method, tuple(hp.layers), report, parts[0] if shared else None, undo)


def targets_file(folder: Union[str, Path], model: Any, requests: Sequence[Request], layer: int, step: dict,
                 chunk: int) -> Path:
    """The residual step's checkpoint in ``folder`` for these requests, δ at ``layer`` with the residual
    settings ``step`` (prefixes included) and ``chunk``, on this model (every weight): the same name for
    the same δ."""
    settings = {"requests": [r.to_dict() for r in requests], "step": step, "chunk": chunk}
    return Path(folder) / f"targets_{fingerprint(model, layer, tuple(model.parameters()), settings)[:20]}.safetensors"


def _batches(method: str, hp: Any, n: int) -> list[list[int]]:
    """Request indices per sequential step: ROME one fact at a time, AlphaEdit ``batch_size``, MEMIT all."""
    size = 1 if method == "rome" else hp.batch_size if method == "alphaedit" else n
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def context_keys(model: Any, tok: Any, requests: Sequence[Request], prefixes: Sequence[str], layer: int,
                 state_layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keys averaged over the bare prompt and ``prefixes`` (n, intermediate), the bare prompt's keys
    (n, intermediate), the bare prompt's residual stream after ``state_layer`` (n, d)), at the subject's
    last token: MEMIT's ``compute_ks`` and the current z. Each forward stops at the layer it reads, and the
    tokens before a subject (a prefix, a template's words) run once for every row that repeats them
    (:func:`~factkernels.hf.capture.capture`'s shared heads)."""
    contexts = 1 + len(prefixes)
    batch = encode_requests(tok, with_prefixes(requests, prefixes))
    keys = capture(model, batch.input_ids, batch.attention_mask, layer, site="down_in", positions=batch.subject_last,
                   shared=batch.subject_first).view(len(requests), contexts, -1)
    bare = encode_requests(tok, requests)  # context 0's rows
    states = capture(model, bare.input_ids, bare.attention_mask, state_layer, site="block_out",
                     positions=bare.subject_last, shared=bare.subject_first)
    return keys.mean(1), keys[:, 0], states


def _apply_rome(model: Any, tok: Any, reqs: Sequence[Request], prefixes: Sequence[str], hp: ROMEHparams,
                targets: ResidualTargets, cov: torch.Tensor) -> None:
    layer = hp.layers[0]
    down = mlp_module(model, layer).down_proj
    weight = down.weight.detach()
    mean_keys, keys, _ = context_keys(model, tok, reqs, prefixes, layer, layer)
    values = (targets.mlp_out + targets.delta).to(weight)
    down.weight.copy_(update_weight(hp, weight, keys.to(weight), values, cov.to(weight),
                                    directions=mean_keys.to(weight)))


def _apply_spread(model: Any, tok: Any, reqs: Sequence[Request], prefixes: Sequence[str], hp: Any,
                  targets: ResidualTargets, covs: dict[int, torch.Tensor], projectors: dict[int, torch.Tensor],
                  previous: dict[int, Optional[torch.Tensor]]) -> None:
    """MEMIT's spreading of z* − z over the layers (low to high) with MEMIT's or AlphaEdit's rule; AlphaEdit's
    ``previous`` key Grams grow by this batch's keys (read after the batch's edits, as its reference: a layer's
    keys depend only on the layers below it, so they are the ones its own update used)."""
    goal = targets.layer_out + targets.delta  # z* (n, d) after the last layer
    layers = hp.layers
    for i, layer in enumerate(layers):
        mean_keys, _, current = context_keys(model, tok, reqs, prefixes, layer, layers[-1])
        down = mlp_module(model, layer).down_proj
        weight = down.weight.detach()
        keys = mean_keys.to(weight)
        values = keys @ weight.T + ((goal - current) / (len(layers) - i)).to(weight)
        down.weight.copy_(update_weight(hp, weight, keys, values, covs[layer].to(weight),
                                        projector=projectors.get(layer), previous=previous[layer]))
        if isinstance(hp, AlphaEditHparams):
            gram = mean_keys.to(torch.float64).T @ mean_keys.to(torch.float64)
            previous[layer] = gram if previous[layer] is None else previous[layer] + gram


__all__ = ["WEIGHT_EDITORS", "EditResult", "edit", "hparams_for_shape", "resolve_hparams", "context_keys",
           "weight_restorer", "targets_file"]
