"""Write factkernels/datasets/known_facts.csv: the candidate facts the packaged SmolLM2-135M knows.

Every candidate of ``known_fact_candidates.csv`` is asked under each of its relation's 5 edit templates, and the
known ones under its 4 held-out templates (no prefix); an answer is right when greedy decoding produces the whole object (every object token is
the argmax, teacher-forced). A fact is kept when it is right under at least one of its edit templates
(:func:`factkernels.datasets.editing_benchmark.is_known`); its answers under the held-out templates are recorded
beside it (the unedited model's cross-template consistency, the ceiling of paraphrase scores). Counts per relation go to
benchmarks/results/hf/known_facts.json. Rerun (about 8 CPU-minutes; one thread is faster than two on a busy machine):

    OMP_NUM_THREADS=1 python benchmarks/make_known_facts.py
"""

from __future__ import annotations

import csv
import json
import time
from collections import Counter
from pathlib import Path

import torch

from factkernels.datasets.editing_benchmark import is_known, known_fact_candidates, relations
from factkernels.environment import environment
from factkernels.hf import fact_margins, load
from factkernels.hf.requests import Request

ROOT = Path(__file__).resolve().parents[1]


def answered(model, tok, asks: list[tuple[int, str]], candidates) -> dict[tuple[int, str], bool]:
    """{(candidate index, template): greedy whole object?} for the asked pairs, in batches, with progress."""
    requests = [Request(t, candidates[i].subject, " " + candidates[i].object) for i, t in asks]
    right: list[bool] = []
    for start in range(0, len(requests), 1024):
        with torch.no_grad():
            right += (fact_margins(model, tok, requests[start:start + 1024], batch_size=64) > 0).tolist()
        print(f"{start + len(requests[start:start + 1024])}/{len(requests)} prompts", flush=True)
    return dict(zip(asks, right))


def main() -> None:
    start = time.perf_counter()
    model, tok = load("smollm2-135m")
    rels = relations()
    candidates = known_fact_candidates()
    right = answered(model, tok, [(i, t) for i, f in enumerate(candidates) for t in rels[f.relation].edit],
                     candidates)
    known = [i for i, f in enumerate(candidates) if is_known(tuple(right[(i, t)] for t in rels[f.relation].edit))]
    right.update(answered(model, tok, [(i, t) for i in known for t in rels[candidates[i].relation].held_out],
                          candidates))
    rows, per_relation = [], {}
    for i, f in enumerate(candidates):
        rel = rels[f.relation]
        stats = per_relation.setdefault(f.relation, Counter())
        stats["candidates"] += 1
        stats["right_under_a_majority_of_edit_templates"] += 2 * sum(right[(i, t)] for t in rel.edit) > len(rel.edit)
        if i not in known:
            continue
        edit = [right[(i, t)] for t in rel.edit]
        held = [right[(i, t)] for t in rel.held_out]
        stats["known"] += 1
        stats["held_out_right"] += sum(held)
        stats["held_out_asked"] += len(held)
        rows.append([f.relation, f.subject, f.object, "".join("01"[b] for b in edit), "".join("01"[b] for b in held)])
    out = ROOT / "factkernels" / "datasets" / "known_facts.csv"
    with out.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["relation", "subject", "object", "edit_correct", "held_out_correct"])
        writer.writerows(rows)
    table = {name: {**stats, "held_out_consistency": stats["held_out_right"] / max(1, stats["held_out_asked"])}
             for name, stats in per_relation.items()}
    asked = sum(s["held_out_asked"] for s in per_relation.values())
    result = {"model": "smollm2-135m", "rule": "greedy whole object under at least one of the 5 edit templates",
              "candidates": len(candidates), "known": len(rows),
              "held_out_consistency": sum(s["held_out_right"] for s in per_relation.values()) / max(1, asked),
              "per_relation": table, "seconds": time.perf_counter() - start, "environment": environment()}
    path = ROOT / "benchmarks" / "results" / "hf" / "known_facts.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1))


if __name__ == "__main__":
    main()
