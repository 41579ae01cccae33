"""Chunk checkpoints: the finished chunks of a long per-request computation, kept in one safetensors file.

Optimising residual deltas through a 30-layer model takes hours for 1,000 requests on a CPU. Requests are
independent there, so the work runs in chunks and each finished chunk is written at once; run again with
the same file, the chunks it holds are read instead of computed. The file records a fingerprint of what
it was made for (model, layer, token ids, settings) and is refused for anything else.

File: tensors "{start}/{name}" per chunk (``start`` = the chunk's first request), metadata
{"fingerprint", "infos": {start: info dict}}; rewritten whole and atomically after each chunk.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence, Union

import torch

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
