"""English Wikipedia text shipped with factkernels: the lead sections of the 10,033 Level-4 Vital Articles.

``wikipedia_leads.jsonl.xz`` beside this module (CC BY-SA 4.0, Wikipedia contributors; see ``README.md``
here and ``benchmarks/make_wikipedia_leads.py``) holds one article's lead per line, ``{"title", "topic",
"text"}``, in a seeded shuffle, so the first n are a fair sample: about 1.05M SmolLM2 tokens in all. It is
the real text of the editors' key statistics (ROME, MEMIT and AlphaEdit take theirs from Wikipedia).

    texts = wikipedia_leads()          # list[str], 10,033 documents
    texts = wikipedia_leads(1000)      # the first 1,000
"""

from __future__ import annotations

import importlib.resources
import json
import lzma
from functools import lru_cache
from typing import Optional

LEADS_FILE = "wikipedia_leads.jsonl.xz"


@lru_cache(maxsize=None)
def _leads() -> tuple[str, ...]:
    raw = importlib.resources.files(__package__).joinpath(LEADS_FILE).read_bytes()
    return tuple(json.loads(line)["text"] for line in lzma.decompress(raw).decode("utf-8").splitlines())


def wikipedia_leads(n: Optional[int] = None) -> list[str]:
    """The first ``n`` (default: all) shipped article leads, in file order."""
    texts = _leads()
    if n is not None and not 0 < n <= len(texts):
        raise ValueError(f"n must be in 1..{len(texts)} (the shipped Wikipedia leads), got {n!r}")
    return list(texts if n is None else texts[:n])
