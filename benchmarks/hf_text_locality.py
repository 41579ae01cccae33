"""Where the KL on held-out text comes from when many subject-keyed facts are inserted at once.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/hf_text_locality.py --split validation --n 10 100

For the first n known-fact cases of a draw, insert_facts(keys="subject", layer=10) (the real-lm-editing
experiment's settings) into SmolLM2-135M, then on the held-out text (natural_text("eval"), max_length 128):
per token, the appended units' output at layer 10 (each detector's pair silu(z) − silu(z − a) times δ/a, with z
the first unit's gate pre-activation, z ≤ 0 below the threshold τ) and the full-vocabulary KL(unedited ‖ edited).
The units' output is split into fires (z > 0: the score passed τ) and leaks (z ≤ 0: SiLU's negative tail,
≥ −0.278·δ/a per detector), and the KL is re-measured with a hook that keeps only one part (what an exact-zero
gate or a tighter threshold would leave). Writes benchmarks/results/hf/text_locality_<split><draw>_n<n>[_tag].json.

    --settings '{"lookalikes": 0}' --tag no_lookalikes   # insert_facts options over the experiment's
    --named-first                                        # the cases whose subject a held-out text names first
    --detectors-only --lookalike-weights 0.01,0.03,0.1   # no values: where each detector fires (minutes)
    --detectors-only --wiki-negatives 0,400              # ... with the first N Wikipedia leads as negatives too
    --detectors-only --partner-weights 0,0.01            # ... and each pairwise partner filter weight

In texts that name an edited subject the KL is split by place: at the subject's last token, on the 5 tokens after
it, and on the rest of those texts. --detectors-only builds the detectors alone (no δ, nothing appended) with
look-alike contrast off and at each weight, and counts held-out tokens off a mention that a detector acts on,
look-alike states that pass a threshold, and the share of held-out-template (paraphrase) keys given the whole δ;
also off a mention on 500 held-out Wikipedia leads (~48k tokens, a rate the 2,794 held-out tokens are too few to
show), and with the first N leads added to the negatives (--wiki-negatives); and the training contexts given some
(or half) of another subject's δ, with each partner weight (--partner-weights).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F_nn

from factkernels import hf
from factkernels.datasets import natural_text, wikipedia_leads
from factkernels.datasets.editing_benchmark import known_draw
from factkernels.environment import environment
from factkernels.experiments.real_lm_editing import OURS_SETTINGS
from factkernels.hf.capture import capture, encode_requests, encode_texts
from factkernels.hf.evaluate import mentions_any
from factkernels.hf.layout import mlp_module
from factkernels.hf.metrics import case_requests
from factkernels.hf.insert import background_states
from factkernels.hf.requests import Request
from factkernels.hf.subject_keys import (LOOKALIKE_CONTEXTS, RAMP_OVERSHOOT, default_prefixes, lookalike_states,
                                         lookalike_tokens, subject_contexts, subject_detectors, subject_mentions)

MAX_LENGTH = 128
HELD_OUT_LEADS = slice(9000, 9500)  # Wikipedia leads no insertion reads (--wiki-negatives takes the first ones)
FIRE = 1e-3  # a detector "acts" on a token when |its fraction of δ| exceeds this


def appended(model, layer: int, count: int) -> dict:
    """The appended units of ``layer`` as detector pairs: gate weight (D, d), bias (D,), ramp a, δ (D, d)."""
    mlp = mlp_module(model, layer)
    wg, bg = mlp.gate_proj.weight[-count:].detach(), mlp.gate_proj.bias[-count:].detach()
    wd = mlp.down_proj.weight[:, -count:].detach().T
    half = count // 2
    ramp = float((bg[:half] - bg[half:]).mean())
    # the layout ramp_units builds: two units per detector on one gate row, down ±δ/a, up the constant 1
    assert torch.equal(wg[:half], wg[half:]) and torch.allclose(wd[half:], -wd[:half])
    assert float(mlp.up_proj.weight[-count:].abs().max()) == 0 and bool((mlp.up_proj.bias[-count:] == 1).all())
    return {"w": wg[:half], "b": bg[:half], "ramp": ramp, "delta": wd[:half] * ramp}


def fractions(units: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (n, d) -> z (n, D) first-unit gate pre-activations, frac (n, D) the fraction of each δ added."""
    z = x @ units["w"].T + units["b"]
    return z, (F_nn.silu(z) - F_nn.silu(z - units["ramp"])) / units["ramp"]


def text_logits(model, ids, mask, layer: int, units: dict = None, keep=None) -> torch.Tensor:
    """Log-probs (n_real_tokens, vocab) of every real token of ``ids``; with ``keep`` (z, frac) -> (.., D) bool
    mask, the appended units' output is replaced by that of the kept detectors only (hook on layer's MLP)."""
    handle = None
    if keep is not None:
        def hook(module, inputs, output):
            z, frac = fractions(units, inputs[0])
            drop = (frac * ~keep(z, frac)) @ units["delta"]
            return output - drop
        handle = mlp_module(model, layer).register_forward_hook(hook)
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
    finally:
        if handle is not None:
            handle.remove()
    return logits[mask.bool()].log_softmax(-1)


def token_scores(ref: torch.Tensor, own: torch.Tensor, nxt: torch.Tensor, scored: torch.Tensor) -> dict:
    """Per real token KL(ref ‖ own) (n,), and NLLs of the next token at scored positions."""
    kl = (ref.exp() * (ref - own)).sum(1).clamp_min(0)
    return {"kl": kl, "nll": -own[scored].gather(1, nxt[:, None]).squeeze(1),
            "ref_nll": -ref[scored].gather(1, nxt[:, None]).squeeze(1)}


def summary(kl, scored, named, nll=None, ref_nll=None) -> dict:
    k = kl[scored]
    out = {"kl_mean": float(k.mean()), "kl_mean_unmentioned": float(k[~named[scored]].mean()),
           "kl_mean_mentioned": float(k[named[scored]].mean()) if bool(named[scored].any()) else None}
    if nll is not None:
        out["perplexity_ratio"] = float(torch.exp(nll.mean() - ref_nll.mean()))
    return out


def draw_cases(split: str, draw: int, n, texts, named_first: bool) -> list:
    """The first n cases of the draw; with ``named_first`` those whose subject a text names come first."""
    cases = known_draw(split, draw)
    if named_first:
        cases = sorted(cases, key=lambda c: not any(mentions_any(t, [c.subject]) for t in texts))
    return cases if n is None else cases[:n]


def run(n, split, draw, model, tok, ref, texts, layer, settings, top, named_first=False):
    cases = draw_cases(split, draw, n, texts, named_first)
    requests = case_requests(cases)
    subjects = list(dict.fromkeys(c.subject for c in cases))
    t0, c0 = time.perf_counter(), time.process_time()
    ins = hf.insert_facts(model, tok, requests, progress=False, background=natural_text("stats"), **settings)
    insert_seconds = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
    try:
        units = appended(model, layer, ins.report.hidden_added)
        # which subject each detector serves: the subject whose training contexts it fires on most
        ctx = subject_contexts(tok, requests, default_prefixes())
        states = capture(model, ctx.batch.input_ids, ctx.batch.attention_mask, layer, site="mlp_in", batch_size=32)
        lengths = ctx.batch.attention_mask.sum(1)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        _, own_frac = fractions(units, states[offsets + ctx.batch.subject_last])
        n_det = units["w"].shape[0]
        votes = torch.zeros(n_det, len(ctx.subjects)).index_add_(1, ctx.subject, (own_frac.T > 0.5).float())
        det_subject = [ctx.subjects[int(i)] for i in votes.argmax(1)]
        own_min_frac = float(own_frac.max(1).values.min())

        ids, mask = ref["ids"], ref["mask"]
        x = capture(model, ids, mask, layer, site="mlp_in", batch_size=32)
        z, frac = fractions(units, x)
        out_all = frac @ units["delta"]
        fired = z > 0
        out_fire, out_leak = (frac * fired) @ units["delta"], (frac * ~fired) @ units["delta"]
        mention_tok = subject_mentions(tok, ctx.subjects, ids, mask).any(1)
        named_text = torch.tensor([mentions_any(t, subjects) for t in texts])[ref["text"]]
        starts_of = torch.cat([torch.zeros(1, dtype=torch.long), mask.sum(1).cumsum(0)[:-1]])[ref["text"]]

        variants = {"edited": lambda z, f: torch.ones_like(f, dtype=torch.bool),
                    "none": lambda z, f: torch.zeros_like(f, dtype=torch.bool),
                    "fires_only (exact-zero gate below tau)": lambda z, f: z > 0,
                    "leaks_only": lambda z, f: z <= 0}
        for u in (0.25, 0.5):  # z/(a + 8) = (s − τ)/(own_min − τ): where the score sits between τ and own_min
            variants[f"fires_above_{u}"] = lambda z, f, u=u: z > u * (units["ramp"] + 8)
        kls = {}
        for name, keep in variants.items():
            own = text_logits(model, ids, mask, layer, units, keep)
            s = token_scores(ref["logp"], own, ref["next"], ref["scored"])
            kls[name] = s["kl"]
            kls[name + "/summary"] = summary(s["kl"], ref["scored"], named_text, s["nll"], s["ref_nll"])
        kl = kls["edited"]
        # texts naming an edited subject: the KL at the subject's last token, on the next 5 tokens, elsewhere
        after = torch.zeros_like(mention_tok)
        for i in mention_tok.nonzero().flatten().tolist():
            same_text = ref["text"][i + 1:i + 6] == ref["text"][i]
            after[i + 1:i + 1 + int(same_text.sum())] = True
        places = {"at_mention": mention_tok, "next_5_tokens": after & ~mention_tok,
                  "rest_of_mentioning_texts": named_text & ~mention_tok & ~after}
        acting_here = (frac.abs() > FIRE).any(1)
        places["acting_off_mention"] = named_text & ~mention_tok & acting_here  # a detector past its subject's name
        mentioned_kl = {name: {"tokens": int((where & ref["scored"]).sum()),
                               "kl_sum": float(kl[where & ref["scored"]].sum()),
                               "kl_mean": float(kl[where & ref["scored"]].mean()) if bool((where & ref["scored"]).any())
                               else None} for name, where in places.items()}
        mentioned_top = [{"context": tok.decode(ids[mask.bool()][max(int(starts_of[i]), i - 8):i + 1]),
                          "next": tok.decode(ids[mask.bool()][i + 1:i + 2]), "kl": float(kl[i]),
                          "at_mention": bool(mention_tok[i]), "detector_acting": bool(acting_here[i])}
                         for i in kl.masked_fill(~(named_text & ref["scored"]), -1).argsort(descending=True)[:top].tolist()
                         if bool(named_text[i])]
        # the full model's KL (no hook) checks the hook's algebra
        plain = token_scores(ref["logp"], text_logits(model, ids, mask, layer), ref["next"], ref["scored"])["kl"]
        acting = frac.abs() > FIRE
        unm = ~named_text
        old_norm = float(mlp_module(model, layer)(x[:64]).norm(dim=1).mean())  # with units; first tokens are sinks
        per_token = {
            "added_norm_mean": float(out_all.norm(dim=1).mean()),
            "added_norm_mean_unmentioned": float(out_all[unm].norm(dim=1).mean()),
            "fire_norm_mean_unmentioned": float(out_fire[unm].norm(dim=1).mean()),
            "leak_norm_mean_unmentioned": float(out_leak[unm].norm(dim=1).mean()),
            "tokens_with_a_fire_unmentioned": float(fired[unm].any(1).double().mean()),
            "fires_per_token_unmentioned": float(fired[unm].sum(1).double().mean()),
            "acting_detectors_per_token_unmentioned": float(acting[unm].sum(1).double().mean()),
            "leak_frac_min": float(frac[~fired].min()), "leak_frac_mean_unmentioned": float(frac[unm][~fired[unm]].mean()),
            "z_quantiles_unmentioned": {q: float(torch.quantile(z[unm].flatten(), q)) for q in (0.5, 0.9, 0.99, 0.999)},
            "delta_norm_mean": float(units["delta"].norm(dim=1).mean()),
            "delta_norm_max": float(units["delta"].norm(dim=1).max()),
            "mlp_in_norm_mean": float(x.norm(dim=1).mean()),
            "kl_vs_added_norm_spearman_unmentioned": float(torch.corrcoef(torch.stack([
                out_all[unm].norm(dim=1).argsort().argsort().double(), kl[unm].argsort().argsort().double()]))[0, 1]),
            "max_abs_kl_hook_vs_plain": float((plain - kl).abs().max()),
            "own_contexts_min_fraction": own_min_frac,
        }
        order = out_all.norm(dim=1).masked_fill(~unm, -1).argsort(descending=True)[:top]
        flat_ids = ids[mask.bool()]
        starts = torch.cat([torch.zeros(1, dtype=torch.long), mask.sum(1).cumsum(0)[:-1]])[ref["text"]]
        tops = []
        for i in order.tolist():
            lo = max(int(starts[i]), i - 10)
            dets = frac[i].abs().argsort(descending=True)[:3].tolist()
            tops.append({"token": tok.decode(flat_ids[i:i + 1]), "context": tok.decode(flat_ids[lo:i + 1]),
                         "after": tok.decode(flat_ids[i + 1:i + 3]), "text": int(ref["text"][i]),
                         "added_norm": float(out_all[i].norm()), "fire_norm": float(out_fire[i].norm()),
                         "leak_norm": float(out_leak[i].norm()), "kl_here": float(kl[i]),
                         "kl_next_5_tokens": float(kl[i:i + 6].sum()), "mentions_subject": bool(mention_tok[i]),
                         "detectors": [{"subject": det_subject[d], "fraction": float(frac[i, d]), "z": float(z[i, d]),
                                        "score_position": float(z[i, d] / (units["ramp"] + 8))} for d in dets]})
        # how the unmentioned KL spreads over tokens: the share of the KL summed over its largest tokens
        sorted_kl = kl[unm & ref["scored"]].sort(descending=True).values
        kl_share = {str(k): float(sorted_kl[:k].sum() / sorted_kl.sum()) for k in (5, 20, 100)}
        # per detector: how much it adds over the unmentioned text (fires and leaks)
        det_load = (frac[unm].abs() * units["delta"].norm(dim=1)).sum(0)
        det_top = [{"subject": det_subject[d], "summed_added_norm": float(det_load[d]),
                    "fires": int(fired[unm][:, d].sum()), "delta_norm": float(units["delta"][d].norm())}
                   for d in det_load.argsort(descending=True)[:10].tolist()]
        return {"n": n, "num_facts": len(cases), "requests": len(requests), "subjects": len(subjects),
                "report": {k: v for k, v in ins.report.to_dict().items() if k != "margins"},
                "insert_seconds": insert_seconds, "detectors": n_det, "ramp": units["ramp"],
                "texts_mentioning": int(sum(mentions_any(t, subjects) for t in texts)),
                "kl": {k: v for k, v in kls.items() if k.endswith("/summary")},
                "kl_in_mentioning_texts": mentioned_kl, "top_tokens_mentioning": mentioned_top,
                "kl_share_of_top_tokens_unmentioned": kl_share, "per_token": per_token,
                "top_tokens_unmentioned": tops, "top_detectors_unmentioned": det_top, "old_mlp_out_norm": old_norm}
    finally:
        ins.remove()


def detector_probe(n, split, draw, model, tok, ref, texts, layer, weights, wiki_negatives=(0,),
                   named_first=False, partner_weights=(0.0,)) -> dict:
    """The detectors alone (see the module docstring): without look-alike contrast and at each weight, each with the
    first ``wiki_negatives`` leads (each count) as negatives too, and each pairwise partner weight
    (lda_detectors' ``partner_weight``)."""
    cases = draw_cases(split, draw, n, texts, named_first)
    requests = case_requests(cases)
    t0, c0 = time.perf_counter(), time.process_time()
    ctx = subject_contexts(tok, requests, default_prefixes())
    states = capture(model, ctx.batch.input_ids, ctx.batch.attention_mask, layer, site="mlp_in", batch_size=32,
                     shared=ctx.batch.subject_first)
    lengths = ctx.batch.attention_mask.sum(1)
    key_index = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]) + ctx.batch.subject_last
    is_key = torch.zeros(len(states), dtype=torch.bool)
    is_key[key_index] = True
    background = natural_text("stats")
    negatives = torch.cat([background_states(model, tok, background, layer), states[~is_key]])
    bg_ids, bg_mask = encode_texts(tok, background)
    mentions = torch.cat([subject_mentions(tok, ctx.subjects, bg_ids, bg_mask),
                          subject_mentions(tok, ctx.subjects, ctx.batch.input_ids, ctx.batch.attention_mask)[~is_key]])
    last_ids = ctx.batch.input_ids[torch.arange(len(ctx.requests)), ctx.batch.subject_last]
    similar = lookalike_tokens(tok, model.get_input_embeddings().weight, last_ids)
    alike, alike_row = lookalike_states(model, ctx, layer, similar)

    def wiki(leads):
        ids, mask = encode_texts(tok, leads, max_length=MAX_LENGTH)
        x = torch.cat([capture(model, ids[i:i + 64], mask[i:i + 64], layer, site="mlp_in", batch_size=16)
                       for i in range(0, len(ids), 64)])
        return x, subject_mentions(tok, ctx.subjects, ids, mask), ids[mask.bool()]

    leads = wikipedia_leads()
    wiki_x, wiki_mention, wiki_flat = wiki(leads[HELD_OUT_LEADS])
    extra = wiki(leads[:max(wiki_negatives)]) if max(wiki_negatives) else None
    lead_tokens = torch.tensor([0] + [min(len(tok(t)["input_ids"]), MAX_LENGTH) for t in leads[:max(wiki_negatives)]])
    held_out = capture(model, ref["ids"], ref["mask"], layer, site="mlp_in", batch_size=32)
    held_mention = subject_mentions(tok, ctx.subjects, ref["ids"], ref["mask"])
    para = encode_requests(tok, [Request(p, c.subject, " " + c.target_new) for c in cases for p in c.paraphrase_prompts])
    para_x = capture(model, para.input_ids, para.attention_mask, layer, site="mlp_in", positions=para.subject_last,
                     batch_size=32)
    para_subject = torch.tensor([ctx.subjects.index(c.subject) for c in cases for _ in c.paraphrase_prompts])
    seconds = {"capture_wall": time.perf_counter() - t0, "capture_cpu": time.process_time() - c0}
    flat = ref["ids"][ref["mask"].bool()]

    def fraction(x, det, ramp=12.0):  # the ramp units' fraction of δ at states x (n, G)
        out = []
        for i in range(0, len(x), 16384):
            z = (ramp + RAMP_OVERSHOOT) / (det["own_min"] - det["tau"]) * (
                (x[i:i + 16384].double() - det["mu"]) @ det["w"].T - det["tau"])
            out.append(((F_nn.silu(z) - F_nn.silu(z - ramp)) / ramp).float())
        return torch.cat(out)

    own, rows = states[key_index], []
    for count in wiki_negatives:
        tokens = int(lead_tokens[:count + 1].sum())  # the first ``count`` leads' real tokens
        neg, neg_mentions = negatives, mentions
        if count:
            neg = torch.cat([negatives, extra[0][:tokens]])
            neg_mentions = torch.cat([mentions, extra[1][:tokens]])
        for weight, partner in [(w, p) for w in [None, *weights] for p in partner_weights]:
            options = {"partner_weight": partner}
            if weight is not None:
                options.update(lookalikes=alike, lookalike_weight=weight)
            det, _, group_subject = subject_detectors(own, ctx, neg, mentions=neg_mentions,
                                                      alike_row=None if weight is None else alike_row, **options)
            off = fraction(held_out, det) * ~held_mention[:, group_subject]
            acting = off.abs() > FIRE
            wiki_off = fraction(wiki_x, det) * ~wiki_mention[:, group_subject]
            wiki_acting = wiki_off.abs() > FIRE
            mine = group_subject[None, :] == para_subject[:, None]
            para_own = (fraction(para_x, det) * mine).sum(1)
            # the training contexts' keys: the share of its δ each other subject's detector passes there
            foreign = (fraction(own, det) * (group_subject[None, :] != ctx.subject[:, None])).abs()
            rows.append({"lookalike_weight": weight, "partner_weight": partner, "wiki_negative_leads": count,
                         "wiki_negative_tokens": tokens, "detectors": len(group_subject),
                         "separated": int(det["separated"].sum()),
                         "gap_mean": float((det["own_min"] - det["contrast_max"]).mean()),
                         "held_out_tokens_acting_off_mention": int(acting.any(1).sum()),
                         "held_out_fraction_sum_off_mention": float(off.abs().sum()),
                         "wiki_held_out_tokens": len(wiki_x),
                         "wiki_tokens_acting_off_mention": int(wiki_acting.any(1).sum()),
                         "wiki_fraction_sum_off_mention": float(wiki_off.abs().sum()),
                         "lookalike_states_acting": int((fraction(alike, det).abs() > FIRE).any(1).sum()),
                         "paraphrase_keys_full_delta": float((para_own > 0.99).double().mean()),
                         "paraphrase_keys_under_half": float((para_own < 0.5).double().mean()),
                         "cross_firing_detectors": int((det["cross_firing"] > 0).sum()),
                         "partnered_detectors": int((det["partners"] > 0).sum()),
                         "contexts_given_foreign_delta": int((foreign > FIRE).any(1).sum()),
                         "contexts_given_half_a_foreign_delta": int((foreign > 0.5).any(1).sum()),
                         "training_contexts": len(own),
                         "acting": [{"context": tok.decode(flat[max(0, i - 8):i + 1]),
                                     "subject": ctx.subjects[int(group_subject[g])], "fraction": float(off[i, g])}
                                    for i, g in acting.nonzero().tolist()[:10]],
                         "wiki_acting": [{"context": tok.decode(wiki_flat[max(0, i - 8):i + 1]),
                                          "subject": ctx.subjects[int(group_subject[g])],
                                          "fraction": float(wiki_off[i, g])}
                                         for i, g in wiki_acting.nonzero().tolist()[:40]]})
            print(json.dumps({k: v for k, v in rows[-1].items() if "acting" != k[-6:]}), flush=True)
    return {"n": n, "num_facts": len(cases), "subjects": len(ctx.subjects), "lookalike_states": len(alike),
            "lookalike_contexts": LOOKALIKE_CONTEXTS,
            "lookalike_examples": {tok.decode([i]): [tok.decode([j]) for j in similar[i]] for i in list(similar)[:12]},
            "wiki_held_out_leads": [HELD_OUT_LEADS.start, HELD_OUT_LEADS.stop],
            "paraphrase_keys": len(para_x), "seconds": seconds, "weights": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="validation")
    parser.add_argument("--draw", type=int, default=0)
    parser.add_argument("--n", nargs="+", default=["10", "100"], help="fact counts (or 'all')")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/results/hf")
    parser.add_argument("--settings", default="{}", help="insert_facts options over the experiment's (JSON)")
    parser.add_argument("--tag", default="", help="suffix of the JSON's name")
    parser.add_argument("--named-first", action="store_true", help="cases whose subject a held-out text names first")
    parser.add_argument("--detectors-only", action="store_true")
    parser.add_argument("--lookalike-weights", default="0.01,0.03,0.1,0.3")
    parser.add_argument("--wiki-negatives", default="0", help="first N Wikipedia leads as negatives too (list)")
    parser.add_argument("--partner-weights", default="0", help="lda_detectors' partner_weight (list)")
    args = parser.parse_args()
    settings = {**OURS_SETTINGS, **json.loads(args.settings)}
    layer = settings["layer"]
    model, tok = hf.load("smollm2-135m")
    texts = natural_text("eval")
    ids, mask = encode_texts(tok, texts, max_length=MAX_LENGTH)
    logp = text_logits(model, ids, mask, layer)
    real = mask.bool()
    # a real token is scored when the next one is real too (the KL convention of hf.evaluate)
    scored = torch.cat([real[:, 1:] & real[:, :-1], torch.zeros(len(ids), 1, dtype=torch.bool)], 1)[real]
    nxt = torch.cat([ids[:, 1:], ids[:, :1]], 1)[real][scored]
    text = torch.arange(len(ids))[:, None].expand_as(ids)[real]
    ref = {"ids": ids, "mask": mask, "logp": logp, "scored": scored, "next": nxt, "text": text}
    for n in args.n:
        count = None if n == "all" else int(n)
        t = time.perf_counter()
        tag = ("_" + args.tag if args.tag else "") + ("_named_first" if args.named_first else "")
        if args.detectors_only:
            weights = [float(w) for w in args.lookalike_weights.split(",")]
            result = detector_probe(count, args.split, args.draw, model, tok, ref, texts, layer, weights,
                                    [int(k) for k in args.wiki_negatives.split(",")], args.named_first,
                                    [float(p) for p in args.partner_weights.split(",")])
            result.update(split=args.split, draw=args.draw, layer=layer, named_first=args.named_first,
                          seconds_total=time.perf_counter() - t, command=" ".join(["python", *sys.argv]),
                          device="cpu", load_average=os.getloadavg(), environment=environment())
            out = Path(args.out) / f"text_locality_detectors_{args.split}{args.draw}_n{n}{tag}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
            print(out, json.dumps([{k: v for k, v in r.items() if k != "acting"} for r in result["weights"]], indent=1))
            continue
        result = run(count, args.split, args.draw, model, tok, ref, texts, layer, settings, args.top, args.named_first)
        result.update(split=args.split, draw=args.draw, settings=settings, named_first=args.named_first,
                      command=" ".join(["python", *sys.argv]), max_length=MAX_LENGTH,
                      text_tokens=int(scored.sum()), texts=len(texts), kl_note="full-vocabulary KL (hf.evaluate "
                      "buckets the tail beyond its top 256: a lower bound of this)", seconds=time.perf_counter() - t,
                      device="cpu", load_average=os.getloadavg(), environment=environment())
        out = Path(args.out) / f"text_locality_{args.split}{args.draw}_n{n}{tag}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(out, json.dumps({"kl": result["kl"], "in_mentioning": result["kl_in_mentioning_texts"],
                               "per_token": result["per_token"],
                               "share": result["kl_share_of_top_tokens_unmentioned"]}, indent=1), flush=True)
        for row in result["top_tokens_unmentioned"][:8]:
            print(round(row["added_norm"], 2), round(row["kl_next_5_tokens"], 3), repr(row["context"]), "|",
                  repr(row["after"]), [(d["subject"], round(d["fraction"], 3), round(d["z"], 1)) for d in row["detectors"]])


if __name__ == "__main__":
    main()
