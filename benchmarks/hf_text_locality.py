"""Where the KL on held-out text comes from when many subject-keyed facts are inserted at once.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/hf_text_locality.py --split validation --n 10 100

For the first n known-fact cases of a draw, insert_facts(keys="subject", layer=10) (the real-lm-editing
experiment's settings) into SmolLM2-135M, then on the held-out text (natural_text("eval"), max_length 128):
per token, the appended units' output at layer 10 (each detector's pair silu(z) − silu(z − a) times δ/a, with z
the first unit's gate pre-activation, z ≤ 0 below the threshold τ) and the full-vocabulary KL(unedited ‖ edited).
The units' output is split into fires (z > 0: the score passed τ) and leaks (z ≤ 0: SiLU's negative tail,
≥ −0.278·δ/a per detector), and the KL is re-measured with a hook that keeps only one part (what an exact-zero
gate or a tighter threshold would leave). Writes benchmarks/results/hf/text_locality_<split><draw>_n<n>.json.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F_nn

from factkernels import hf
from factkernels.datasets import natural_text
from factkernels.datasets.editing_benchmark import known_draw
from factkernels.environment import environment
from factkernels.experiments.real_lm_editing import OURS_SETTINGS
from factkernels.hf.capture import capture, encode_texts
from factkernels.hf.evaluate import mentions_any
from factkernels.hf.layout import mlp_module
from factkernels.hf.metrics import case_requests
from factkernels.hf.subject_keys import default_prefixes, subject_contexts, subject_mentions

MAX_LENGTH = 128
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


def run(n, split, draw, model, tok, ref, texts, layer, settings, top):
    cases = known_draw(split, draw, n=n)
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
                "kl_share_of_top_tokens_unmentioned": kl_share, "per_token": per_token,
                "top_tokens_unmentioned": tops, "top_detectors_unmentioned": det_top, "old_mlp_out_norm": old_norm}
    finally:
        ins.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="validation")
    parser.add_argument("--draw", type=int, default=0)
    parser.add_argument("--n", nargs="+", default=["10", "100"], help="fact counts (or 'all')")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/results/hf")
    args = parser.parse_args()
    settings = dict(OURS_SETTINGS)
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
        result = run(count, args.split, args.draw, model, tok, ref, texts, layer, settings, args.top)
        result.update(split=args.split, draw=args.draw, settings=settings, max_length=MAX_LENGTH,
                      text_tokens=int(scored.sum()), texts=len(texts), kl_note="full-vocabulary KL (hf.evaluate "
                      "buckets the tail beyond its top 256: a lower bound of this)", seconds=time.perf_counter() - t,
                      device="cpu", load_average=os.getloadavg(), environment=environment())
        out = Path(args.out) / f"text_locality_{args.split}{args.draw}_n{n}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(out, json.dumps({"kl": result["kl"], "per_token": result["per_token"],
                               "share": result["kl_share_of_top_tokens_unmentioned"]}, indent=1), flush=True)
        for row in result["top_tokens_unmentioned"][:8]:
            print(round(row["added_norm"], 2), round(row["kl_next_5_tokens"], 3), repr(row["context"]), "|",
                  repr(row["after"]), [(d["subject"], round(d["fraction"], 3), round(d["z"], 1)) for d in row["detectors"]])


if __name__ == "__main__":
    main()
