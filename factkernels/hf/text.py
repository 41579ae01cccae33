"""Ordinary text shipped with the package, for background hidden states and non-fact perplexity/KL."""

from __future__ import annotations

import importlib.resources
import json

SAMPLES_FILE = "smollm2_samples.json"


def natural_texts() -> list[str]:
    """The shipped ordinary texts (model-generated samples, see factkernels/data/README.md): list of str."""
    text = importlib.resources.files("factkernels").joinpath("data", SAMPLES_FILE).read_text(encoding="utf-8")
    return list(json.loads(text))
