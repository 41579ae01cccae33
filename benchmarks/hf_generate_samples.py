"""Regenerate factkernels/data/smollm2_samples.json: ordinary text sampled from the packaged SmolLM2-135M.

    python benchmarks/hf_generate_samples.py [--out factkernels/data/smollm2_samples.json]
"""

import argparse
import json

import torch

from factkernels import hf

OPENINGS = [
    "The history of the city begins", "In the morning, the farmers", "Water boils at", "The main idea of the theory is",
    "She opened the letter and", "The recipe calls for", "During the war, the army", "Scientists have discovered that",
    "The river flows through", "My grandfather used to tell me", "The committee decided to",
    "To install the software, first", "The weather in the mountains", "Mathematics is the study of",
    "The ship sailed across", "Children learn languages by", "The museum displays", "In economics, inflation",
    "The old house at the end of the street", "Music has always been", "The football match ended",
    "Photosynthesis is the process", "The king ordered his soldiers", "A healthy diet includes",
    "The train was late because", "Computers store information", "On the island there lived",
    "The doctor told the patient", "Birds migrate south", "The story of the first bicycle",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="factkernels/data/smollm2_samples.json")
    args = parser.parse_args()
    model, tok = hf.load("smollm2-135m")
    torch.manual_seed(0)
    texts = []
    for opening in OPENINGS:
        ids = tok(opening, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=90, do_sample=True, temperature=0.7, top_p=0.9,
                             pad_token_id=tok.eos_token_id)
        texts.append(tok.decode(out[0], skip_special_tokens=True))
    with open(args.out, "w") as fh:
        json.dump(texts, fh, indent=1)


if __name__ == "__main__":
    main()
