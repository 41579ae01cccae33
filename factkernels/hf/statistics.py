"""Second moments C = E[k kᵀ] of a layer's down-projection inputs over natural text, cached on disk.

ROME, MEMIT and AlphaEdit weigh their edits by how the layer's keys k (the down projection's
input, ``act(gate(x)) * up(x)``) are spread over ordinary text; the published editors use
100k Wikipedia tokens, we use the shipped ``natural_text("stats")``. Computing C takes one
forward pass over the text, so it is cached under ``cache_dir`` (default
``$FACTKERNELS_CACHE`` or ``~/.cache/factkernels``) in a file named by a hash of the model's
weights up to that layer, the layer and the text.

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


@torch.no_grad()
def key_second_moments(model: Any, tok: Any, layers: Sequence[int], *, texts: Optional[Sequence[str]] = None,
                       cache_dir: Any = None, max_length: int = 128, batch_size: int = 16,
                       progress: Optional[bool] = None) -> dict[int, torch.Tensor]:
    """{layer: C} with C = E[k kᵀ] (intermediate, intermediate), float32, of each layer's down-projection
    inputs at every real token of ``texts`` (default: the shipped ``natural_text("stats")``), each cut to
    ``max_length`` tokens; the missing layers share one pass over the text. Read from / written to
    ``cache_dir`` (see the module docstring); ``cache_dir=False`` skips the cache.
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
    totals = {layer: torch.zeros(mlp_module(model, layer).down_proj.in_features, mlp_module(model, layer).down_proj.in_features,
                                 dtype=torch.float64) for layer in todo}
    count = 0
    with ExitStack() as stack:
        seen = {layer: stack.enter_context(record_inputs(mlp_module(model, layer).down_proj)) for layer in todo}
        for start in progress_bar(range(0, input_ids.shape[0], batch_size), desc=f"second moments, layers {todo}",
                                  enabled=progress is not False, leave=False):
            mask = attention_mask[start:start + batch_size].to(device)
            for inputs in seen.values():
                inputs.clear()
            model.model(input_ids=input_ids[start:start + batch_size].to(device), attention_mask=mask, use_cache=False)
            for layer, inputs in seen.items():
                keys = inputs[0][mask.bool()].to("cpu", torch.float64)
                totals[layer] += keys.T @ keys
            count += int(mask.sum())
    for layer in todo:
        found[layer] = (totals[layer] / count).to(torch.float32)
        path = paths[layer]
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")  # a killed run never leaves half a file
            save_file({"second_moment": found[layer].contiguous()}, str(tmp), metadata={"tokens": str(count)})
            tmp.replace(path)
    return {layer: found[layer] for layer in layers}
