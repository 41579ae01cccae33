"""Natural text written by SmolLM2 and shipped with factkernels, for non-fact metrics and background states.

``smollm2_text.jsonl`` beside this module holds English prose written by SmolLM2-135M-Instruct
itself (see ``benchmarks/make_natural_text.py`` and ``README.md`` here): one document per line,
each in split ``"stats"`` (insertion's background states; the editors' key statistics with
``mom2_dataset="smollm2_text"``, a quick 22k-token stand-in for the shipped Wikipedia text) or
``"eval"`` (held out for perplexity / KL against the original model).

    texts = natural_text("stats")     # list[str]
"""

from __future__ import annotations

import importlib.resources
import json
from functools import lru_cache

TEXT_FILE = "smollm2_text.jsonl"
TEXT_SPLITS = ("stats", "eval")


@lru_cache(maxsize=None)
def _documents() -> tuple[dict, ...]:
    text = importlib.resources.files(__package__).joinpath(TEXT_FILE).read_text(encoding="utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def natural_text(split: str) -> list[str]:
    """The shipped documents of ``split`` ("stats" | "eval"), in file order."""
    if split not in TEXT_SPLITS:
        raise ValueError(f"split must be one of {TEXT_SPLITS}, got {split!r}")
    return [doc["text"] for doc in _documents() if doc["split"] == split]
