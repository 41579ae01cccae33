"""Where subject detectors fire off a mention and which contexts they leave out, under three rules for filters
that no threshold separates.

    python benchmarks/hf_unseparated_detectors.py --draw all      # the known-fact union (745 cases, ~20 CPU min)

The detectors of insert_facts(keys="subject") as the real-lm-editing experiment builds them (layer 10, partner
filter 0.01; no δ: the values fit is replaced by zeros), built three times from the same captured states:
"own_detector_for_missed" (the library: the cut with the fewest training errors, lda_detectors' ``_fewest_errors``,
then a detector of their own for the contexts it leaves out, subject_detectors' ``missed_groups``);
"fewest_errors" (the cut alone: those contexts stay unanswered) and "keep_own" (the rule before both: τ just below
the lowest own score, every own context kept). For each: the training tokens off a mention, the look-alike states,
the held-out eval text (natural_text("eval")) and held-out Wikipedia leads 400-1,400 (never negatives) that some
detector passes more than 1e-3 of its δ, which detectors do it, and the own contexts left out (bare prompts, the
ones efficacy scores, apart). Writes
benchmarks/results/hf/unseparated_detectors_<split><draw>.json.
"""

import argparse
import collections
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F_nn

import factkernels.hf.insert as insert
import factkernels.hf.subject_keys as sk
from factkernels import hf
from factkernels.datasets import natural_text, wikipedia_leads
from factkernels.datasets.editing_benchmark import all_test_draws, known_draw
from factkernels.environment import environment
from factkernels.hf.capture import encode_texts
from factkernels.hf.metrics import case_requests

FIRE = 1e-3
HELD_OUT_LEADS = slice(400, 1400)  # insert_facts takes the first 400 leads as negatives


def keep_own(own: torch.Tensor, contrast: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule before the fewest-errors cut: every own context kept, τ = own_min − 0.05·|own_min|."""
    low = own.min()
    return low, low - 0.1 * low.abs().clamp_min(1e-3)


def capture_inputs(model, tok, requests) -> dict:
    """The insertion's lda_detectors inputs (first call) and its contexts, without values."""
    saved, library_lda, library_alike = {}, sk.lda_detectors, sk.lookalike_states

    def recording_lda(own, subject, negatives, **kw):
        saved.setdefault("first", dict(own=own, subject=subject, negatives=negatives, **kw))
        return library_lda(own, subject, negatives, **kw)

    def recording_alike(*args, **kw):
        states, rows = library_alike(*args, **kw)
        saved["alike_row"] = rows
        return states, rows

    class Built(Exception):
        pass

    def build_only(model, tok, requests, *, layer, start_time, start_cpu, background_seconds, repair_rounds, **options):
        units, _ = sk.build_subject_units(model, tok, requests, layer=layer, ridge=1e-2, **options)
        saved["ctx"] = units.ctx
        raise Built

    sk.lda_detectors, sk.lookalike_states = recording_lda, recording_alike
    sk.fit_subject_deltas = lambda model, batch, subject, layer, **kw: (
        torch.zeros(int(subject.max()) + 1, model.config.hidden_size), {"value_min_margin": None})
    insert.insert_subject_keyed = build_only
    try:
        hf.insert_facts(model, tok, requests, keys="subject", layer=10, partner_weight=0.01, value_lr=1.0,
                        progress=False, workers=1, background=natural_text("stats"))
    except Built:
        pass
    sk.lda_detectors, sk.lookalike_states = library_lda, library_alike
    return saved


def detectors(first: dict, ctx, alike_row, rule, own_detector_for_missed: bool) -> tuple[dict, torch.Tensor]:
    """build_subject_units' detectors (subject_detectors) under ``rule`` (a _fewest_errors), with or without the
    pass that gives the contexts a cut leaves out a detector of their own: (det, group_subject)."""
    library = sk._fewest_errors
    sk._fewest_errors = rule
    try:
        kw = {k: v for k, v in first.items() if k not in ("own", "subject", "negatives", "lookalike_subject")}
        det, _, group_subject = sk.subject_detectors(first["own"], ctx, first["negatives"], alike_row=alike_row,
                                                     own_for_missed=own_detector_for_missed, **kw)
        return det, group_subject
    finally:
        sk._fewest_errors = library


def firing(det, x, mentions, group_subject, subjects, flat=None, tok=None) -> dict:
    """Tokens of x (N, d) off a mention (mentions (N, S)) that some detector passes more than FIRE of its δ."""
    beta = (sk.RAMP_OVERSHOOT + 12.0) / (det["own_min"] - det["tau"])
    best, which = [], []
    for part in x.split(sk.NEGATIVE_ROWS):
        z = beta * ((part.double() - det["mu"]) @ det["w"].T - det["tau"])
        m, a = ((F_nn.silu(z) - F_nn.silu(z - 12.0)) / 12.0).abs().max(1)
        best.append(m)
        which.append(a)
    best, which = torch.cat(best), torch.cat(which)
    off = ~mentions.any(1)  # the token names no edited subject
    fire = (best > FIRE) & off
    top = collections.Counter(subjects[int(group_subject[g])] for g in which[fire].tolist()).most_common(8)
    out = {"tokens": len(x), "off_mention": int(off.sum()), "firing": int(fire.sum()),
           "rate": float(fire.sum()) / max(1, int(off.sum())), "fraction_sum": float(best[off].sum()),
           "top_subjects": top}
    if flat is not None:
        out["examples"] = [{"context": tok.decode(flat[max(0, i - 6):i + 1]),
                            "subject": subjects[int(group_subject[which[i]])], "fraction": round(float(best[i]), 3)}
                           for i in fire.nonzero().flatten()[:12].tolist()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="test")
    parser.add_argument("--draw", default="all", help="a draw number or 'all' (every test draw at once)")
    parser.add_argument("--n", type=int, default=None, help="the first n cases of the draw (default: all)")
    parser.add_argument("--out", default="benchmarks/results/hf")
    args = parser.parse_args()
    wall, cpu = time.perf_counter(), time.process_time()
    model, tok = hf.load("smollm2-135m")
    cases = (all_test_draws("known", n=args.n) if args.draw == "all"
             else known_draw(args.split, int(args.draw), n=args.n))
    saved = capture_inputs(model, tok, case_requests(cases))
    ctx, first = saved["ctx"], saved["first"]
    held = {}
    for name, texts in (("eval_text", natural_text("eval")), ("wikipedia_400_1400", wikipedia_leads()[HELD_OUT_LEADS])):
        ids, mask = encode_texts(tok, texts)
        held[name] = (insert.background_states(model, tok, texts, 10), sk.subject_mentions(tok, ctx.subjects, ids, mask),
                      ids[mask.bool()])
    result = {"split": args.split, "draw": args.draw, "cases": len(cases), "contexts": len(ctx.requests),
              "subjects": len(ctx.subjects), "rules": {}}
    variants = (("own_detector_for_missed", sk._fewest_errors, True), ("fewest_errors", sk._fewest_errors, False),
                ("keep_own", keep_own, False))
    for name, rule, regroup in variants:
        det, group_subject = detectors(first, ctx, saved["alike_row"], rule, regroup)
        missed = det["missed"].cpu()
        row = {"detectors": len(group_subject), "separated": int(det["separated"].sum()),
               "own_contexts_left_out": int(missed.sum()),
               "bare_prompts_left_out": int((missed & (ctx.prefix == 0)).sum()),
               "left_out": [[ctx.subjects[int(ctx.subject[r])], int(ctx.prefix[r])] for r in missed.nonzero().flatten()],
               "training_negatives": firing(det, first["negatives"], first["mentions"], group_subject, ctx.subjects),
               "lookalike_states": firing(det, first["lookalikes"],
                                          torch.zeros(len(first["lookalikes"]), len(ctx.subjects), dtype=torch.bool),
                                          group_subject, ctx.subjects)}
        for text, (x, men, flat) in held.items():
            row[text] = firing(det, x, men, group_subject, ctx.subjects, flat, tok)
        result["rules"][name] = row
        print(name, json.dumps({k: (v if not isinstance(v, dict) else {a: b for a, b in v.items() if a != "examples"})
                                for k, v in row.items() if k != "left_out"}), flush=True)
    result.update(seconds={"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu},
                  environment=environment())
    out = Path(args.out) / f"unseparated_detectors_{args.split}{args.draw}{'' if args.n is None else f'_n{args.n}'}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
