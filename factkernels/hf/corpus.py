"""Natural text shipped with factkernels, for second-moment statistics and non-fact metrics.

``factkernels/data/smollm2_text.jsonl`` holds English prose written by SmolLM2-135M-Instruct
itself (see ``benchmarks/make_natural_text.py`` and ``factkernels/data/README.md``): one document
per line, each in split ``"stats"`` (the editors' key statistics) or ``"eval"`` (held out
for perplexity / KL against the original model).

    texts = natural_text("stats")     # list[str]
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

TEXT_FILE = Path(__file__).resolve().parents[1] / "data" / "smollm2_text.jsonl"
SPLITS = ("stats", "eval")


@lru_cache(maxsize=None)
def _documents() -> tuple[dict, ...]:
    with TEXT_FILE.open(encoding="utf-8") as handle:
        return tuple(json.loads(line) for line in handle if line.strip())


def natural_text(split: str) -> list[str]:
    """The shipped documents of ``split`` ("stats" | "eval"), in file order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [doc["text"] for doc in _documents() if doc["split"] == split]
