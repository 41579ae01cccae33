"""Write factkernels/datasets/known_facts.csv: the candidate facts the packaged SmolLM2-135M knows.

Every candidate of ``known_fact_candidates.csv`` is asked under each of its relation's 5 edit templates, and the
known ones under its 4 held-out templates (no prefix); an answer is right when greedy decoding produces the whole object (every object token is
the argmax, teacher-forced). A fact is kept when it is right under at least one of its edit templates
(:func:`factkernels.datasets.editing_benchmark.is_known`); its answers under the held-out templates are recorded
beside it (the unedited model's cross-template consistency, the ceiling of paraphrase scores). Counts per relation go to
benchmarks/results/hf/known_facts.json. Rerun (about 8 CPU-minutes; one thread is faster than two on a busy machine):

    OMP_NUM_THREADS=1 python benchmarks/make_known_facts.py
    python benchmarks/make_known_facts.py --summary-only     # recount the shipped CSV into the JSON only
"""

from __future__ import annotations

import argparse
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
KNOWN_CSV = ROOT / "factkernels" / "datasets" / "known_facts.csv"


def answered(model, tok, asks: list[tuple[int, str]], candidates) -> dict[tuple[int, str], bool]:
    """{(candidate index, template): greedy whole object?} for the asked pairs, in batches, with progress."""
    requests = [Request(t, candidates[i].subject, " " + candidates[i].object) for i, t in asks]
    right: list[bool] = []
    for start in range(0, len(requests), 1024):
        with torch.no_grad():
            right += (fact_margins(model, tok, requests[start:start + 1024], batch_size=64) > 0).tolist()
        print(f"{start + len(requests[start:start + 1024])}/{len(requests)} prompts", flush=True)
    return dict(zip(asks, right))


def filter_candidates() -> None:
    """Ask the packaged model every candidate under its edit templates, the known ones under the held-out ones;
    write known_facts.csv."""
    model, tok = load("smollm2-135m")
    rels = relations()
    candidates = known_fact_candidates()
    right = answered(model, tok, [(i, t) for i, f in enumerate(candidates) for t in rels[f.relation].edit],
                     candidates)
    known = [i for i, f in enumerate(candidates) if is_known(tuple(right[(i, t)] for t in rels[f.relation].edit))]
    right.update(answered(model, tok, [(i, t) for i in known for t in rels[candidates[i].relation].held_out],
                          candidates))
    rows = []
    for i in known:
        f, rel = candidates[i], rels[candidates[i].relation]
        flags = ["".join("01"[right[(i, t)]] for t in templates) for templates in (rel.edit, rel.held_out)]
        rows.append([f.relation, f.subject, f.object, *flags])
    with KNOWN_CSV.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["relation", "subject", "object", "edit_correct", "held_out_correct"])
        writer.writerows(rows)


def summary() -> dict:
    """Counts per relation of the shipped known_facts.csv (read fresh) against the candidates."""
    candidates = Counter(f.relation for f in known_fact_candidates())
    with KNOWN_CSV.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    table = {}
    for relation, count in candidates.items():
        mine = [r for r in rows if r["relation"] == relation]
        held = [c == "1" for r in mine for c in r["held_out_correct"]]
        table[relation] = {"candidates": count, "known": len(mine),
                           "right_under_a_majority_of_edit_templates": sum(
                               2 * r["edit_correct"].count("1") > len(r["edit_correct"]) for r in mine),
                           "held_out_right": sum(held), "held_out_asked": len(held),
                           "held_out_consistency": sum(held) / max(1, len(held))}
    asked = sum(t["held_out_asked"] for t in table.values())
    return {"model": "smollm2-135m", "rule": "greedy whole object under at least one of the 5 edit templates",
            "candidates": sum(candidates.values()), "known": len(rows),
            "held_out_consistency": sum(t["held_out_right"] for t in table.values()) / max(1, asked),
            "per_relation": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary-only", action="store_true",
                        help="only recount the shipped known_facts.csv into the JSON (no model)")
    args = parser.parse_args()
    start = time.perf_counter()
    if not args.summary_only:
        filter_candidates()
    result = {**summary(), "filter_seconds": None if args.summary_only else time.perf_counter() - start,
              "environment": environment()}
    path = ROOT / "benchmarks" / "results" / "hf" / "known_facts.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1))


if __name__ == "__main__":
    main()
