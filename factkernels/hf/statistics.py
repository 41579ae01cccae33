"""Second moments C = E[k kᵀ] of a layer's down-projection inputs over natural text, cached on disk.

ROME, MEMIT and AlphaEdit weigh their edits by how the layer's keys k (the down projection's
input, ``act(gate(x)) * up(x)``) are spread over ordinary text; the published editors use
100k Wikipedia tokens, we use the shipped ``natural_text("stats")`` by default (any ``texts`` can be
given). Computing C takes one forward pass over the text, so it is cached under ``cache_dir``
(default ``$FACTKERNELS_CACHE`` or ``~/.cache/factkernels``) in a file named by a hash of the
model's weights up to that layer, the layer and the text, with the token count in its metadata
(:func:`second_moment_tokens`). A long pass (a million tokens) keeps its running sums in a
``.partial`` file every ``save_every`` batches and a rerun resumes from there.

    covs = key_second_moments(model, tok, layers=[5, 6])   # {layer: (intermediate, intermediate) float32}
"""

from __future__ import annotations

import hashlib
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from safetensors.torch import load_file, save_file
from ..progress import progress_bar

from .capture import encode_texts, model_device, record_inputs
from ..datasets import natural_text
from .layout import mlp_module



def default_cache_dir() -> Path:
    """``$FACTKERNELS_CACHE`` if set, else ``~/.cache/factkernels`` (``$XDG_CACHE_HOME`` honoured)."""
    if os.environ.get("FACTKERNELS_CACHE"):
        return Path(os.environ["FACTKERNELS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "factkernels"


def _fingerprint(model: Any, layer: int, texts: Sequence[str], max_length: int) -> str:
    """Hash of everything C depends on: the weights that feed ``layer``'s keys and the text."""
    digest = hashlib.sha1()
    digest.update(f"{type(model).__name__}|{layer}|{max_length}".encode())
    feeding = [model.get_input_embeddings().weight]
    for module in [*model.model.layers[:layer], model.model.layers[layer].input_layernorm,
                   model.model.layers[layer].self_attn, model.model.layers[layer].post_attention_layernorm,
                   mlp_module(model, layer).gate_proj, mlp_module(model, layer).up_proj]:
        feeding.extend(p for p in module.parameters())
    for tensor in feeding:
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    return digest.hexdigest()[:16]


def _cache_path(model: Any, layer: int, texts: Sequence[str], max_length: int, cache_dir: Any) -> Optional[Path]:
    if cache_dir is False:
        return None
    folder = default_cache_dir() if cache_dir is None else Path(cache_dir)
    return folder / "mom2" / f"layer{layer}_{_fingerprint(model, layer, texts, max_length)}.safetensors"


def _save(path: Path, tensors: dict, metadata: dict) -> None:
    """Write atomically: a killed run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)


def second_moment_tokens(model: Any, layer: int, *, texts: Optional[Sequence[str]] = None, cache_dir: Any = None,
                         max_length: int = 2048) -> Optional[int]:
    """How many tokens the cached C of ``layer`` over ``texts`` (default the shipped text) was computed from;
    None when it is not cached."""
    from safetensors import safe_open

    texts = natural_text("stats") if texts is None else list(texts)
    path = _cache_path(model, layer, texts, max_length, cache_dir)
    if path is None or not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        return int(handle.metadata()["tokens"])


@torch.no_grad()
def key_second_moments(model: Any, tok: Any, layers: Sequence[int], *, texts: Optional[Sequence[str]] = None,
                       cache_dir: Any = None, max_length: int = 2048, batch_size: int = 4,
                       save_every: int = 50, progress: Optional[bool] = None) -> dict[int, torch.Tensor]:
    """{layer: C} with C = E[k kᵀ] (intermediate, intermediate), float32, of each layer's down-projection
    inputs at every real token of ``texts`` (default: the shipped ``natural_text("stats")``), each cut to
    ``max_length`` tokens (default: whole documents, as ROME's statistics take up to the model's context); the missing layers share one pass over the text. Read from / written to
    ``cache_dir`` (see the module docstring); ``cache_dir=False`` skips the cache. With a cache, the running
    sums are kept every ``save_every`` batches and an interrupted pass resumes from them.
    """
    layers = sorted({int(layer) for layer in layers})
    for layer in layers:
        mlp_module(model, layer)  # validates the layout and the layer index
    texts = natural_text("stats") if texts is None else list(texts)
    paths = {layer: _cache_path(model, layer, texts, max_length, cache_dir) for layer in layers}
    found = {layer: load_file(path)["second_moment"] for layer, path in paths.items()
             if path is not None and path.is_file()}
    todo = [layer for layer in layers if layer not in found]
    if not todo:
        return found
    input_ids, attention_mask = encode_texts(tok, texts, max_length=max_length)
    device = model_device(model)
    width = {layer: mlp_module(model, layer).down_proj.in_features for layer in todo}
    totals = {layer: torch.zeros(width[layer], width[layer], dtype=torch.float64) for layer in todo}
    count, first = 0, 0
    partial = None if paths[todo[0]] is None else paths[todo[0]].with_name(
        "partial_" + "_".join(paths[l].stem for l in todo) + ".safetensors")
    if partial is not None and partial.is_file():  # an interrupted pass over the same layers and text
        saved = load_file(str(partial))
        totals = {layer: saved[f"layer{layer}"] for layer in todo}
        count, first = int(saved["count"]), int(saved["next_batch"])
    starts = range(first * batch_size, input_ids.shape[0], batch_size)
    with ExitStack() as stack:
        seen = {layer: stack.enter_context(record_inputs(mlp_module(model, layer).down_proj)) for layer in todo}
        for i, start in enumerate(progress_bar(starts, desc=f"second moments, layers {todo}",
                                               enabled=progress is not False, leave=False), start=first):
            mask = attention_mask[start:start + batch_size].to(device)
            for inputs in seen.values():
                inputs.clear()
            model.model(input_ids=input_ids[start:start + batch_size].to(device), attention_mask=mask, use_cache=False)
            for layer, inputs in seen.items():
                keys = inputs[0][mask.bool()].to("cpu", torch.float64)
                totals[layer] += keys.T @ keys
            count += int(mask.sum())
            if partial is not None and (i + 1) % save_every == 0:
                _save(partial, {**{f"layer{l}": t for l, t in totals.items()},
                                "count": torch.tensor(count), "next_batch": torch.tensor(i + 1)}, {})
    for layer in todo:
        found[layer] = (totals[layer] / count).to(torch.float32)
        if paths[layer] is not None:
            _save(paths[layer], {"second_moment": found[layer].contiguous()}, {"tokens": str(count)})
    if partial is not None:
        partial.unlink(missing_ok=True)
    return {layer: found[layer] for layer in layers}
