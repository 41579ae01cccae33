"""Why subject-keyed new facts stay uncertified: which detectors fire in each unanswered context, and its margin
with and without the other subjects' units.

    OMP_NUM_THREADS=1 python benchmarks/hf_new_fact_interference.py --facts 40 [--partner-weight 1.0]

Inserts the first ``--facts`` invented-subject facts of the editing benchmark's new-knowledge validation draw 0
(five edit templates each) with ``hf.insert_facts(keys="subject", layer=10)`` (the defaults, repairs included),
then, over every context (request × prefix), reads each detector's ramp fraction (0: none of its δ, 1: all of it)
at every token from the appended units themselves. A detector's subject is the one whose keys it passes most.
For each unanswered context: the detectors passing more than 1e-3 of their δ at some token, where (the subject's
key or another token), their subjects' names; its margin with every unit (the certified one) and with its own
subject's units only (every other δ zeroed). Hypothesis under test: another subject's detector adds a fraction of
its δ there, and the repair, which refits δ on the unedited model, never sees it. Then one more repair of the
subjects still unanswered, two ways (``refit_one_more_round``): δ refit over all their contexts on the unedited
model (the repair's way) and with every other subject's units in place (their contributions held fixed). Also the
edited model's exact-match efficacy (bare edit prompts) and held-out-template exact (paraphrase prompts), each a
mean over cases of per-case means as the editing benchmark scores them. ``--partner-weight`` > 0: the detectors'
pairwise penalty between look-alike subjects (``insert_facts(partner_weight=)``). Writes
benchmarks/results/hf/new_fact_interference_validation0_n{facts}[_partner{weight}].json.
"""

import argparse
import json
import os
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from factkernels import hf
from factkernels.datasets.editing_benchmark import new_knowledge_draw
from factkernels.environment import environment
from factkernels.hf.capture import capture
from factkernels.hf.evaluate import batch_margins
from factkernels.hf.metrics import case_requests, target_scores
from factkernels.hf.requests import Request
from factkernels.hf.subject_values import fit_subject_deltas
from factkernels.hf.subject_keys import default_prefixes, subject_contexts
from factkernels.hf.units import append_units
from factkernels.mlp import FactMLP

OUT = Path(__file__).resolve().parent / "results" / "hf"
LAYER, RAMP, FIRING = 10, 12.0, 1e-3


def ramp_fractions(mlp: FactMLP, states: torch.Tensor) -> torch.Tensor:
    """(N, G): each detector's share of its δ at states (N, d) (units g and g + G make one ramp)."""
    g = mlp.gate_weight.shape[0] // 2
    with torch.no_grad():
        z = states @ mlp.gate_weight[:g].T + mlp.gate_bias[:g]
        return (F.silu(z) - F.silu(z - RAMP)) / RAMP


def only_groups(mlp: FactMLP, keep: torch.Tensor) -> FactMLP:
    """The same units with the δ of detectors not in ``keep`` (G,) bool zeroed."""
    down = mlp.down_weight * torch.cat([keep, keep]).float()[None]
    return FactMLP(mlp.gate_weight, mlp.gate_bias, mlp.up_weight, mlp.up_bias, down, None)


def with_deltas(mlp: FactMLP, deltas: torch.Tensor) -> FactMLP:
    """The same detectors adding ``deltas`` (G, d), one per detector (ramp_units' down columns ±δ/ramp)."""
    down = (torch.cat([deltas, -deltas]) / RAMP).T.float()
    return FactMLP(mlp.gate_weight, mlp.gate_bias, mlp.up_weight, mlp.up_bias, down, None)


def margins_with(model, mlp: FactMLP, batch) -> torch.Tensor:
    appended = append_units(model, LAYER, mlp.swiglu_weights())
    try:
        with torch.no_grad():
            return batch_margins(model, batch, 32)
    finally:
        appended.remove()


def refit(model, ctx, mlp: FactMLP, group_subject: torch.Tensor, reach: torch.Tensor, margins: torch.Tensor,
          hold_others: bool) -> dict:
    """One more repair of the subjects with an unanswered context: δ refit over all their contexts (from their δ,
    the insertion's value settings), on the unedited model (the repair's way) or with every other subject's units
    appended (``hold_others``: what they add there, at the key and elsewhere, is in the fit). Then the contexts
    the refit subjects' units reach (``reach`` (R, G) bool: some token passes more than 1e-6 of the δ) are
    measured again. margins (R,): the insertion's."""
    failing = torch.unique(ctx.subject[margins <= 0])
    refit_groups = torch.isin(group_subject, failing)
    deltas = torch.zeros(len(ctx.subjects), mlp.down_weight.shape[0])
    deltas[group_subject] = mlp.down_weight[:, :len(group_subject)].T * RAMP
    rows = torch.isin(ctx.subject, failing).nonzero().flatten()
    held = append_units(model, LAYER, only_groups(mlp, ~refit_groups).swiglu_weights()) if hold_others else None
    cpu = time.process_time()
    try:
        new, info = fit_subject_deltas(model, ctx.batch.rows(rows), ctx.subject[rows], LAYER, margin=3.0, steps=60,
                                       lr=0.5, batch_size=32, init=deltas, progress=False)
    finally:
        if held is not None:
            held.remove()
    again = (reach[:, refit_groups].any(1) | torch.isin(ctx.subject, failing)).nonzero().flatten()
    after = margins.clone()
    after[again] = margins_with(model, with_deltas(mlp, new[group_subject]), ctx.batch.rows(again))
    return {"held_others": hold_others, "subjects": len(failing), "fit_rows": len(rows), "recertified": len(again),
            "uncertified_before": int((margins <= 0).sum()), "uncertified_after": int((after <= 0).sum()),
            "uncertified_subjects_after": len(torch.unique(ctx.subject[after <= 0])),
            "min_margin_after": float(after.min()), **info, "cpu_seconds": time.process_time() - cpu}


def case_exact(model, tok, cases, mlp: FactMLP) -> dict:
    """With the units appended: exact-match of the new target on each case's edit prompts (bare) and paraphrase
    prompts, means over cases of per-case means."""
    kinds = {"efficacy_exact": "edit_prompts", "held_out_exact": "paraphrase_prompts"}
    rows = [(kind, i, Request(p, c.subject, " " + c.target_new)) for kind, field in kinds.items()
            for i, c in enumerate(cases) for p in getattr(c, field)]
    appended = append_units(model, LAYER, mlp.swiglu_weights())
    try:
        _, exact = target_scores(model, tok, [r for _, _, r in rows])
    finally:
        appended.remove()
    out = {}
    for kind in kinds:
        at = torch.tensor([k == kind for k, _, _ in rows])
        case = torch.tensor([i for k, i, _ in rows if k == kind])
        per_case = torch.zeros(len(cases)).index_add(0, case, exact[at].float()) / torch.bincount(case, minlength=len(cases))
        out[kind] = float(per_case.mean())
    return out


def run(facts: int, cache: Optional[Path] = None, partner_weight: float = 0.0) -> dict:
    """The measurement (module docstring); cache: a file keeping the insertion (report, units) between runs."""
    model, tok = hf.load("smollm2-135m")
    cases = new_knowledge_draw("validation", 0, n=facts)
    requests = case_requests(cases)
    case_of = [i for i, c in enumerate(cases) for _ in c.edit_prompts]
    if cache is not None and cache.exists():
        report, mlp, seconds = torch.load(cache, weights_only=False)
    else:
        wall, cpu = time.perf_counter(), time.process_time()
        ins = hf.insert_facts(model, tok, requests, keys="subject", layer=LAYER, partner_weight=partner_weight,
                              progress=False)
        seconds = {"insert_wall": time.perf_counter() - wall, "insert_cpu": time.process_time() - cpu}
        ins.remove()  # the layer-10 MLP inputs do not depend on its own units; margins append them again below
        report, mlp = ins.report, ins.mlp
        if cache is not None:
            torch.save((report, mlp, seconds), cache)
    ctx = subject_contexts(tok, requests, default_prefixes())
    contexts_per_request = 1 + len(default_prefixes())
    states = capture(model, ctx.batch.input_ids, ctx.batch.attention_mask, LAYER, site="mlp_in", batch_size=32)
    fractions = ramp_fractions(mlp, states)  # (tokens, G)
    lengths = ctx.batch.attention_mask.sum(1)
    row = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    key = offsets + ctx.batch.subject_last
    n_subjects = len(ctx.subjects)
    at_keys = torch.zeros(n_subjects, fractions.shape[1]).index_add(0, ctx.subject, fractions[key])
    group_subject = at_keys.argmax(0)  # (G,)
    foreign = group_subject[None, :] != ctx.subject[row][:, None]  # (tokens, G)
    foreign_max = torch.zeros(len(lengths)).scatter_reduce(0, row, (fractions * foreign).amax(1), "amax")
    margins = torch.tensor(report.margins)
    failing = (margins <= 0).nonzero().flatten()
    cases_out = []
    for s in torch.unique(ctx.subject[failing]).tolist():
        rows = failing[ctx.subject[failing] == s]
        own_only = margins_with(model, only_groups(mlp, group_subject == s), ctx.batch.rows(rows))
        for r, m_own in zip(rows.tolist(), own_only.tolist()):
            tokens = (row == r).nonzero().flatten()
            fired = []
            for g in (fractions[tokens] > FIRING).any(0).nonzero().flatten().tolist():
                at = int(fractions[tokens, g].argmax())
                fired.append({"detector": g, "subject": ctx.subjects[int(group_subject[g])],
                              "own": int(group_subject[g]) == s, "max_fraction": float(fractions[tokens[at], g]),
                              "token": tok.decode(int(ctx.batch.input_ids[r, at])), "at_key": bool(tokens[at] == key[r]),
                              "fraction_at_key": float(fractions[key[r], g])})
            cases_out.append({"context": [r // contexts_per_request, r % contexts_per_request],
                              "subject": ctx.subjects[s], "relation": cases[case_of[r // contexts_per_request]].relation,
                              "prompt": ctx.requests[r].prompt.format(ctx.requests[r].subject),
                              "target": ctx.requests[r].target_new, "margin": float(margins[r]),
                              "margin_own_units_only": m_own, "fired": fired})
    reach = torch.zeros(len(margins), fractions.shape[1]).index_add_(0, row, (fractions > 1e-6).float()) > 0
    refits = [refit(model, ctx, mlp, group_subject, reach, margins, hold) for hold in (False, True)] if len(failing) else []
    certified = margins > 0
    fired_foreign = foreign_max > FIRING
    return {
        "draw": "new-knowledge validation 0", "facts": facts, "subjects": n_subjects, "contexts": len(margins),
        "settings": {"keys": "subject", "layer": LAYER, "partner_weight": partner_weight}, "firing_fraction": FIRING,
        "detectors": report.construction["detectors"], "separated": report.construction["separated"],
        "cross_firing": report.construction.get("cross_firing"), "partnered": report.construction.get("partnered"),
        **case_exact(model, tok, cases, mlp),
        "repairs": report.values["repairs"], "efficacy_contexts": report.efficacy,
        "uncertified": len(failing), "uncertified_subjects": len(torch.unique(ctx.subject[failing])),
        "contexts_with_foreign_firing": {"uncertified": int((fired_foreign & ~certified).sum()),
                                         "certified": int((fired_foreign & certified).sum())},
        "uncertified_answered_with_own_units_only": sum(c["margin_own_units_only"] > 0 for c in cases_out),
        "detectors_reaching_other_subjects": [
            {"detector": g, "subject": ctx.subjects[int(group_subject[g])],
             "other_contexts": len(torch.unique(row[(fractions[:, g] > FIRING) & foreign[:, g]])),
             "other_subjects": sorted({ctx.subjects[int(ctx.subject[r])]
                                       for r in torch.unique(row[(fractions[:, g] > FIRING) & foreign[:, g]]).tolist()})}
            for g in range(fractions.shape[1]) if bool(((fractions[:, g] > FIRING) & foreign[:, g]).any())],
        "refit_one_more_round": refits, "cases": cases_out, "seconds": seconds, "environment": environment()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=40)
    parser.add_argument("--cache", type=Path, help="keep the insertion here (rerun the analysis without it)")
    parser.add_argument("--partner-weight", type=float, default=0.0,
                        help="insert_facts(partner_weight=): pairwise penalty between look-alike subjects (0: none)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    result = run(args.facts, args.cache, args.partner_weight)
    result["load_average"] = os.getloadavg()
    suffix = f"_partner{args.partner_weight:g}" if args.partner_weight else ""
    path = OUT / f"new_fact_interference_validation0_n{args.facts}{suffix}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("cases", "environment")}, indent=1))


if __name__ == "__main__":
    main()
