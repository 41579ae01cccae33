"""What δ does to text that names an edited subject, for settings of the subject-keyed value fit.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/hf_value_locality.py --n 10 \
        --settings '{"default": {}, "essence_4_w10": {"essence": 4, "essence_weight": 10.0}}'

A δ added at a subject's last token is read by every later token of a text naming that subject: at every known fact
of test draw 0 all of the held-out text's KL came from the texts naming an edited subject. Here the first ``n``
known-fact cases of a validation draw, ordered by how many held-out texts name their subject (the 22 held-out
texts, then 500 Wikipedia leads no insertion reads), are inserted with insert_facts(keys="subject", layer=10)
under each setting (options over the experiment's), and scored: CounterFact's efficacy / paraphrase /
neighbourhood scores (score_cases, no generations); KL and perplexity ratio on the held-out texts, split by
whether a text names an edited subject; the same on held-out Wikipedia leads naming an edited subject (up to
``--leads-per-subject`` each, ~128 tokens: the held-out texts name few validation subjects); the report's
certified efficacy, value steps and repairs, δ norms. Writes
benchmarks/results/hf/value_locality_<split><draw>_n<n>[_tag].json (a setting already there is kept: rerun to
add settings).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from factkernels import hf
from factkernels.datasets import natural_text, wikipedia_leads
from factkernels.datasets.editing_benchmark import known_draw
from factkernels.environment import environment
from factkernels.experiments.real_lm_editing import OURS_SETTINGS
from factkernels.hf.evaluate import mentions_any, record_reference, text_scores
from factkernels.hf.metrics import case_requests, record_baseline, score_cases

HELD_OUT_LEADS = slice(9000, 9500)  # as benchmarks/hf_text_locality.py: leads no insertion reads
KEPT = ("efficacy_score", "efficacy_exact", "paraphrase_score", "paraphrase_exact", "neighbourhood_score",
        "neighbourhood_exact", "score", "kl_mean", "kl_mean_unmentioned", "kl_mean_mentioned", "perplexity_ratio",
        "texts_mentioning", "text_tokens_mentioning")


def named_cases(split: str, draw: int, n: int, texts: list, leads: list) -> list:
    """The first ``n`` cases of the draw, those whose subject the held-out texts name first, then by how many
    held-out leads name it (stable: the draw's order breaks ties)."""
    cases = known_draw(split, draw)
    count = {s: (sum(mentions_any(t, [s]) for t in texts), sum(mentions_any(t, [s]) for t in leads))
             for s in dict.fromkeys(c.subject for c in cases)}
    return sorted(cases, key=lambda c: (-count[c.subject][0], -count[c.subject][1]))[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="validation")
    parser.add_argument("--draw", type=int, default=0)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--settings", default='{"default": {}}', help="{name: insert_facts options} (JSON)")
    parser.add_argument("--leads-per-subject", type=int, default=3)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", default="benchmarks/results/hf")
    args = parser.parse_args()
    if args.split == "test":
        raise SystemExit("settings are chosen on a validation draw; the test draws are for reporting")
    out = Path(args.out) / f"value_locality_{args.split}{args.draw}_n{args.n}{'_' + args.tag if args.tag else ''}.json"
    result = json.loads(out.read_text()) if out.exists() else {"settings": {}}
    model, tok = hf.load("smollm2-135m")
    texts = natural_text("eval")
    held_leads = wikipedia_leads()[HELD_OUT_LEADS]
    cases = named_cases(args.split, args.draw, args.n, texts, held_leads)
    subjects = list(dict.fromkeys(c.subject for c in cases))
    leads = [t for s in subjects for t in [t for t in held_leads if mentions_any(t, [s])][:args.leads_per_subject]]
    leads = list(dict.fromkeys(leads))
    requests = case_requests(cases)
    base = record_baseline(model, tok, cases, texts=texts, generate=0)
    lead_ref = record_reference(model, tok, texts=leads)
    result.update(split=args.split, draw=args.draw, n=args.n, subjects=subjects, requests=len(requests),
                  leads_mentioning=len(leads), unedited={k: base.scores[k] for k in KEPT if k in base.scores})
    for name, options in json.loads(args.settings).items():
        settings = {**OURS_SETTINGS, **options}
        t0, c0 = time.perf_counter(), time.process_time()
        ins = hf.insert_facts(model, tok, requests, progress=False, background=natural_text("stats"), **settings)
        seconds = {"insert_wall": time.perf_counter() - t0, "insert_cpu": time.process_time() - c0}
        try:
            scores = score_cases(model, tok, cases, base, texts=texts)
            lead_scores = text_scores(model, tok, leads, lead_ref)
        finally:
            ins.remove()
        rep = ins.report
        row = {"options": options, "seconds": seconds, **{k: scores.get(k) for k in KEPT},
               "leads_kl_mean": lead_scores["kl_mean"], "leads_perplexity_ratio": lead_scores["perplexity_ratio"],
               "certified_efficacy": rep.efficacy, "min_margin": rep.min_margin,
               "uncertified": len(rep.construction["uncertified"]), "delta_norm_mean": rep.delta_norm_mean,
               "values": rep.values, "timings": rep.timings}
        result["settings"][name] = row
        print(name, json.dumps({k: v for k, v in row.items() if k not in ("values", "timings")}),
              flush=True)
        result.update(command=" ".join(["python", *sys.argv]), device="cpu", load_average=os.getloadavg(),
                      environment=environment())
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
