"""Chunk checkpoints: the finished chunks of a long per-request computation, kept in one safetensors file.

Optimising residual deltas through a 30-layer model takes hours for 1,000 requests on a CPU. Requests (or
subjects: :func:`resumable_subject_fit`) are independent there, so the work runs in chunks and each finished
chunk is written at once; run again with the same file, the chunks it holds are read instead of computed. The file records a fingerprint of what
it was made for (model, layer, token ids, settings) and is refused for anything else.

File: tensors "{start}/{name}" per chunk (``start`` = the chunk's first request), metadata
{"fingerprint", "infos": {start: info dict}}; rewritten whole and atomically after each chunk.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch

from .capture import PromptBatch, model_device
from .layout import mlp_module


# Config fields that say where the model was loaded from and by which transformers, not what it computes: a
# checkpoint made before a reinstall (another path or version) stays readable.
LOAD_METADATA = ("_name_or_path", "transformers_version")


def fingerprint(model: Any, layer: int, tensors: Sequence[torch.Tensor], settings: dict) -> str:
    """A digest of the model (config less :data:`LOAD_METADATA`, and ``layer``'s down projection),
    ``tensors`` (token ids, positions) and ``settings`` (JSON-able)."""
    digest = hashlib.sha1()
    config = {k: v for k, v in model.config.to_dict().items() if k not in LOAD_METADATA}
    digest.update(json.dumps({"config": config, "layer": layer, "settings": settings},
                             sort_keys=True, default=str).encode())
    for t in (*tensors, mlp_module(model, layer).down_proj.weight):
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class ChunkCheckpoint:
    """``chunks``: {start: ({name: tensor}, info)} read from ``path`` (empty when it does not exist yet)."""

    def __init__(self, path: Union[str, Path], fingerprint: str) -> None:
        from safetensors import safe_open

        self.path, self.fingerprint = Path(path), fingerprint
        self.chunks: dict[int, tuple[dict[str, torch.Tensor], dict]] = {}
        if not self.path.exists():
            return
        with safe_open(str(self.path), framework="pt") as fh:
            meta = fh.metadata() or {}
            if meta.get("fingerprint") != fingerprint:
                raise ValueError(f"checkpoint {self.path} was made for other requests, layer, model or settings; "
                                 "remove it or pass another path")
            tensors: dict[int, dict[str, torch.Tensor]] = {}
            for key in fh.keys():
                start, name = key.split("/", 1)
                tensors.setdefault(int(start), {})[name] = fh.get_tensor(key)
        self.chunks = {int(k): (tensors.get(int(k), {}), info) for k, info in json.loads(meta["infos"]).items()}

    def put(self, start: int, tensors: dict[str, torch.Tensor], info: dict) -> None:
        """Keep chunk ``start`` and rewrite the file."""
        from safetensors.torch import save_file

        self.chunks[start] = ({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, info)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")  # a killed run never leaves half a file
        flat = {f"{s}/{name}": t for s, (named, _) in self.chunks.items() for name, t in named.items()}
        save_file(flat, str(tmp), metadata={"fingerprint": self.fingerprint,
                                            "infos": json.dumps({str(s): i for s, (_, i) in self.chunks.items()})})
        tmp.replace(self.path)


# Subjects per chunk of a resumable subject values fit: ~250 rows, a few CPU minutes at layer 10 of SmolLM2-135M.
VALUE_CHUNK_SUBJECTS = 100


def resumable_subject_fit(fit: Callable[..., tuple[torch.Tensor, dict]], model: Any, batch: PromptBatch,
                          subject: torch.Tensor, layer: int, *, checkpoint: Union[str, Path],
                          essence: Optional[torch.Tensor] = None, subjects_per_chunk: int = VALUE_CHUNK_SUBJECTS,
                          **options: Any) -> tuple[torch.Tensor, dict]:
    """``fit`` (:func:`~factkernels.hf.subject_values.fit_subject_deltas`) in chunks of ``subjects_per_chunk``
    subjects, each chunk's δ written to ``checkpoint`` (a .safetensors file, or a folder: then a file in it named by
    the fingerprint) the moment it is done and read back instead of fit on a rerun. A subject's δ sees only its own
    rows and Adam is elementwise (a subject at the margin stays frozen), so chunks give one joint fit's δ up to float
    rounding. The file records the model (every weight), layer, rows and settings and is refused for others.
    subject (R,) 0..S-1, rows for every subject; essence (R,) bool; options: fit's (margin, steps, lr, batch_size,
    progress, essence_weight). Returns δ (S, d) and fit's info (steps: the most of any chunk) with
    "value_restored_seconds" / "value_restored_cpu": wall and CPU seconds earlier runs spent on chunks read back."""
    essence = torch.zeros(len(batch), dtype=torch.bool) if essence is None else essence.cpu().bool()
    settings = {k: options.get(k) for k in ("margin", "steps", "lr", "essence_weight")}
    key = fingerprint(model, layer, (batch.input_ids, batch.attention_mask, batch.subject_last, batch.prompt_last,
                                     batch.target_len, subject, essence, *model.parameters()),
                      {**settings, "subjects_per_chunk": subjects_per_chunk})
    path = Path(checkpoint)
    saved = ChunkCheckpoint(path if path.suffix == ".safetensors" else path / f"values_{key[:20]}.safetensors", key)
    n_subjects, width = int(subject.max()) + 1, model.config.hidden_size
    deltas = torch.zeros(n_subjects, width, device=model_device(model))
    restored, infos = [0.0, 0.0], []
    for start in range(0, n_subjects, subjects_per_chunk):
        end = min(n_subjects, start + subjects_per_chunk)
        if start in saved.chunks:
            info = saved.chunks[start][1]
            restored = [restored[0] + info["seconds"], restored[1] + info["cpu"]]
        else:
            t, c = time.perf_counter(), time.process_time()
            rows = ((subject >= start) & (subject < end)).nonzero().flatten()
            part, info = fit(model, batch.rows(rows), subject[rows] - start, layer, essence=essence[rows],
                             init=torch.zeros(end - start, width), **options)
            saved.put(start, {"delta": part}, {**info, "seconds": time.perf_counter() - t,
                                               "cpu": time.process_time() - c})
        tensors, info = saved.chunks[start]
        deltas[start:end] = tensors["delta"].to(deltas)
        infos.append(info)
    margins = [i["value_min_margin"] for i in infos if i["value_min_margin"] is not None]
    return deltas, {"value_steps": max(i["value_steps"] for i in infos), "value_min_margin": min(margins, default=None),
                    "value_chunks": len(infos), "value_restored_seconds": restored[0],
                    "value_restored_cpu": restored[1]}
