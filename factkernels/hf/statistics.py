"""Second moments C = E[k kᵀ] of a layer's down-projection inputs over natural text, cached on disk.

ROME, MEMIT and AlphaEdit weigh their edits by how the layer's keys k (the down projection's
input, ``act(gate(x)) * up(x)``) are spread over ordinary text; their reference code takes C from
Wikipedia (``mom2_dataset`` "wikipedia", ``mom2_n_samples`` articles). Ours come from a named shipped
corpus (:func:`mom2_texts`): "wikipedia", the 10,033 English Wikipedia article leads of
:func:`factkernels.datasets.wikipedia_leads` (about 1.05M SmolLM2 tokens, the default), or
"smollm2_text", 22k tokens of the model's own writing (quick runs); any ``texts`` can be given instead.
One pass streams the documents in batches of similar length (tokenised batch by batch, each forward
stopped after the highest layer asked for). C is cached under ``cache_dir`` (default
``$FACTKERNELS_CACHE`` or ``~/.cache/factkernels``) in a file named by a hash of the model's weights up
to that layer, the layer and the text, with the token and document counts in its metadata
(:func:`second_moment_tokens`); the running sums are kept in a ``partial_*`` file every ``save_every``
batches and a rerun resumes from there. A lock beside each cache file makes a second process that asks
for the same C wait for the first one's pass instead of repeating it.

    covs = key_second_moments(model, tok, layers=[5, 6])   # {layer: (intermediate, intermediate) float32}
    covs = key_second_moments(model, tok, [5], texts=mom2_texts("smollm2_text"))
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch
from safetensors.torch import load_file, save_file

from ..datasets import natural_text, wikipedia_leads
from ..progress import log_line, progress_bar
from .capture import encode_texts, model_device
from .layout import mlp_module

MOM2_DATASETS = ("wikipedia", "smollm2_text")


def mom2_texts(dataset: str = "wikipedia", n_samples: Optional[int] = None) -> list[str]:
    """The first ``n_samples`` documents (default: all) of a named statistics corpus: "wikipedia" (10,033
    Wikipedia article leads, ~1.05M tokens) or "smollm2_text" (``natural_text("stats")``: 90 documents
    written by SmolLM2, ~22k tokens)."""
    if dataset not in MOM2_DATASETS:
        raise ValueError(f"mom2_dataset must be one of {MOM2_DATASETS}, got {dataset!r}")
    if dataset == "wikipedia":
        return wikipedia_leads(n_samples)
    texts = natural_text("stats")
    if n_samples is not None and not 0 < n_samples <= len(texts):
        raise ValueError(f"mom2_n_samples must be in 1..{len(texts)} for {dataset!r}, got {n_samples!r}")
    return texts if n_samples is None else texts[:n_samples]


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


def second_moment_path(model: Any, layer: int, *, texts: Optional[Sequence[str]] = None, cache_dir: Any = None,
                       max_length: int = 2048) -> Optional[Path]:
    """The cache file of ``layer``'s C over ``texts`` (default :func:`mom2_texts`), whether or not it exists yet
    (None when ``cache_dir`` is False); its metadata holds "tokens" and "documents"."""
    if cache_dir is False:
        return None
    texts = mom2_texts() if texts is None else list(texts)
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
    """How many tokens the cached C of ``layer`` over ``texts`` (default :func:`mom2_texts`) was computed
    from; None when it is not cached."""
    from safetensors import safe_open

    path = second_moment_path(model, layer, texts=texts, cache_dir=cache_dir, max_length=max_length)
    if path is None or not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        return int(handle.metadata()["tokens"])


class _Done(Exception):
    """Raised by the highest layer's hook: the layers above it are not needed."""


def _length_batches(texts: Sequence[str], batch_size: int) -> list[list[int]]:
    """Document indices in batches of ``batch_size`` by character length (similar lengths pad little)."""
    order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


@contextmanager
def _locked(paths: Sequence[Path], logged: bool) -> Iterator[None]:
    """Hold an exclusive lock beside each cache file (in a fixed order): a second process asking for the same
    C waits for the first one's pass and then reads its result instead of repeating it."""
    with ExitStack() as stack:
        for path in sorted(paths):
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = stack.enter_context(open(path.with_suffix(".lock"), "w"))
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if logged:
                    log_line(f"waiting for another process computing {path.name}")
                fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@torch.no_grad()
def key_second_moments(model: Any, tok: Any, layers: Sequence[int], *, texts: Optional[Sequence[str]] = None,
                       cache_dir: Any = None, max_length: int = 2048, batch_size: int = 16,
                       save_every: int = 50, progress: Optional[bool] = None) -> dict[int, torch.Tensor]:
    """{layer: C} with C = E[k kᵀ] (intermediate, intermediate), float32, of each layer's down-projection
    inputs at every real token of ``texts`` (default: :func:`mom2_texts`, the shipped Wikipedia leads), each
    cut to ``max_length`` tokens (as ROME's statistics take up to the model's context). The missing layers
    share one streamed pass over the text, ``batch_size`` documents at a time, accumulated in float64 (each
    batch's kᵀk in float32). Read from / written to ``cache_dir`` (see the module docstring);
    ``cache_dir=False`` skips the cache. With a cache, the running sums are kept every ``save_every``
    batches and an interrupted pass resumes from them; a process asking for a C that another is computing
    waits for it.
    """
    layers = sorted({int(layer) for layer in layers})
    for layer in layers:
        mlp_module(model, layer)  # validates the layout and the layer index
    texts = mom2_texts() if texts is None else list(texts)
    paths = {layer: second_moment_path(model, layer, texts=texts, cache_dir=cache_dir, max_length=max_length)
             for layer in layers}
    logged = progress is not False and not sys.stderr.isatty()

    def cached() -> dict[int, torch.Tensor]:
        return {layer: load_file(path)["second_moment"] for layer, path in paths.items()
                if path is not None and path.is_file()}

    found = cached()
    todo = [layer for layer in layers if layer not in found]
    if not todo:
        return found
    if cache_dir is False:
        computed = _second_moments(model, tok, todo, texts, None, max_length, batch_size, save_every, progress)
        found.update({layer: cov for layer, (cov, _) in computed.items()})
        return found
    with _locked([paths[layer] for layer in todo], logged):
        found = cached()  # what another process finished while this one waited
        todo = [layer for layer in layers if layer not in found]
        if todo:
            partial = paths[todo[0]].with_name("partial_" + "_".join(paths[l].stem for l in todo) + ".safetensors")
            computed = _second_moments(model, tok, todo, texts, partial, max_length, batch_size, save_every, progress)
            for layer, (cov, tokens) in computed.items():
                _save(paths[layer], {"second_moment": cov.contiguous()},
                      {"tokens": str(tokens), "documents": str(len(texts))})
                found[layer] = cov
            partial.unlink(missing_ok=True)
    return {layer: found[layer] for layer in layers}


def _second_moments(model: Any, tok: Any, todo: Sequence[int], texts: Sequence[str], partial: Optional[Path],
                    max_length: int, batch_size: int, save_every: int,
                    progress: Optional[bool]) -> dict[int, tuple[torch.Tensor, int]]:
    """{layer: (C, tokens)} from one streamed pass over ``texts`` (resumed from / saved to ``partial``)."""
    batches = _length_batches(texts, batch_size)
    device = model_device(model)
    width = {layer: mlp_module(model, layer).down_proj.in_features for layer in todo}
    totals = {layer: torch.zeros(width[layer], width[layer], dtype=torch.float64) for layer in todo}
    count, first = 0, 0
    if partial is not None and partial.is_file():  # an interrupted pass over the same layers and text
        saved = load_file(str(partial))
        totals = {layer: saved[f"layer{layer}"] for layer in todo}
        count, first = int(saved["count"]), int(saved["next_batch"])
    real = {}  # the current batch's attention mask, read by the hooks

    def accumulate(layer: int):
        def hook(_module: Any, args: tuple) -> None:
            keys = args[0][real["mask"]].float()  # (real tokens, intermediate)
            totals[layer] += (keys.T @ keys).to("cpu", torch.float64)
            if layer == todo[-1]:
                raise _Done
        return hook

    hooks = [mlp_module(model, layer).down_proj.register_forward_pre_hook(accumulate(layer)) for layer in todo]
    logged = progress is not False and not sys.stderr.isatty()
    try:
        for i in progress_bar(range(first, len(batches)), desc=f"second moments, layers {list(todo)}",
                              unit="batch", enabled=progress is not False, leave=False):
            input_ids, attention_mask = encode_texts(tok, [texts[j] for j in batches[i]], max_length=max_length)
            real["mask"] = attention_mask.to(device).bool()
            try:
                model.model(input_ids=input_ids.to(device), attention_mask=real["mask"].long(), use_cache=False)
            except _Done:
                pass
            count += int(attention_mask.sum())
            if partial is not None and (i + 1) % save_every == 0:
                _save(partial, {**{f"layer{l}": t for l, t in totals.items()},
                                "count": torch.tensor(count), "next_batch": torch.tensor(i + 1)}, {})
                if logged:
                    log_line(f"second moments, layers {list(todo)}: batch {i + 1}/{len(batches)}, {count:,} tokens")
    finally:
        for handle in hooks:
            handle.remove()
    return {layer: ((totals[layer] / count).to(torch.float32), count) for layer in todo}
