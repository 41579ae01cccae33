"""Where subject detectors fire: separation, held-out text, paraphrases, held-out prefixes, neighbours.

    OMP_NUM_THREADS=1 python benchmarks/hf_subject_detectors.py --split validation --n 30

For the known-fact cases of one draw, the subject keys of insert_facts(keys="subject") (every edit template x
edit prefix at layer 10 of SmolLM2-135M) and their LDA detectors under each variant of the construction
(one detector per subject as before, or one per subject and placement; subject mentions in the negatives as
contrast or not; the within-subject weight). No δ is fit: each detector's ramp activation (the fraction of its δ
a state receives, 0..1) is measured on the held-out text (natural_text("eval"), where KL is measured), on the
cases' held-out paraphrase prompts, on the edit templates under the held-out prefixes, and on the neighbour
prompts (other subjects, whose answers must not move). Writes benchmarks/results/hf/subject_detectors_*.json.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch

from factkernels.datasets import natural_text
from factkernels.datasets.editing_benchmark import known_draw, prefixes
from factkernels.environment import environment
from factkernels.hf import load
from factkernels.hf.capture import capture, encode_requests, encode_texts
from factkernels.hf.contexts import with_prefixes
from factkernels.hf.metrics import case_requests
from factkernels.hf.requests import Request
from factkernels.hf.subject_keys import lda_detectors, ramp_units, subject_contexts, subject_mentions

FIRE = 1e-3  # activation above which a state counts as receiving part of a δ


def subject_activation(det: dict, group_subject: torch.Tensor, n_subjects: int, states: torch.Tensor) -> torch.Tensor:
    """(n, S): the fraction of each subject's δ that ``states`` (n, d) receive (its groups' ramps summed)."""
    onehot = torch.zeros(len(group_subject), n_subjects, dtype=torch.float64)
    onehot[torch.arange(len(group_subject)), group_subject] = 1.0
    with torch.no_grad():
        return ramp_units(det, onehot)(states.float()).double()


def keys_of(model, tok, requests, layer):
    batch = encode_requests(tok, requests)
    return capture(model, batch.input_ids, batch.attention_mask, layer, positions=batch.subject_last, batch_size=32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="validation")
    parser.add_argument("--draw", type=int, default=0)
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--layer", type=int, default=10)
    parser.add_argument("--within", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    args = parser.parse_args()
    wall, cpu = time.perf_counter(), time.process_time()
    model, tok = load("smollm2-135m")
    cases = known_draw(args.split, args.draw, n=args.n)
    ctx = subject_contexts(tok, case_requests(cases), prefixes("edit"))
    states = capture(model, ctx.batch.input_ids, ctx.batch.attention_mask, args.layer, batch_size=32)
    lengths = ctx.batch.attention_mask.sum(1)
    is_key = torch.zeros(len(states), dtype=torch.bool)
    is_key[torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]) + ctx.batch.subject_last] = True
    texts = {name: encode_texts(tok, natural_text(name)) for name in ("stats", "eval")}
    text_states = {name: capture(model, ids, mask, args.layer, batch_size=16) for name, (ids, mask) in texts.items()}
    negatives = torch.cat([text_states["stats"], states[~is_key]])
    mentions = torch.cat([subject_mentions(tok, ctx.subjects, *texts["stats"]),
                          subject_mentions(tok, ctx.subjects, ctx.batch.input_ids, ctx.batch.attention_mask)[~is_key]])
    eval_mentions = subject_mentions(tok, ctx.subjects, *texts["eval"])
    eval_tokens = texts["eval"][0][texts["eval"][1].bool()]
    subject_index = {s: i for i, s in enumerate(ctx.subjects)}
    paraphrases = [Request(p, c.subject, " " + c.target_new) for c in cases for p in c.paraphrase_prompts]
    held = [r for i, r in enumerate(with_prefixes([Request(p, c.subject, " x") for c in cases for p in c.edit_prompts],
                                                  prefixes("held_out"))) if i % (1 + len(prefixes("held_out")))]
    neighbours = [Request(nb.prompt, nb.subject, " " + nb.target) for c in cases for nb in c.neighbours]
    probes = {name: (keys_of(model, tok, reqs, args.layer), torch.tensor([subject_index.get(r.subject, -1) for r in reqs]))
              for name, reqs in (("paraphrase", paraphrases), ("held_out_prefix", held), ("neighbour", neighbours))}

    def measure(grouped: bool, with_mentions: bool, within: float) -> dict:
        group, group_subject = (ctx.group, ctx.group_subject) if grouped else (ctx.subject, torch.arange(len(ctx.subjects)))
        det = lda_detectors(states[is_key], group, negatives, within=within,
                            mentions=mentions[:, group_subject] if with_mentions else None)
        n_subjects = len(ctx.subjects)
        out = {"grouped": grouped, "mentions_excluded": with_mentions, "within": within, "detectors": len(group_subject),
               "separated": int(det["separated"].sum()),
               "unseparated_subjects": sorted({ctx.subjects[int(group_subject[g])] for g in (~det["separated"]).nonzero().flatten()})}
        on_eval = subject_activation(det, group_subject, n_subjects, text_states["eval"]).masked_fill(eval_mentions, 0.0)
        firing = (on_eval > FIRE).nonzero().tolist()
        out["eval_tokens"] = len(eval_tokens)
        out["eval_tokens_firing"] = len({i for i, _ in firing})
        out["eval_firing"] = [{"subject": ctx.subjects[s], "activation": round(float(on_eval[i, s]), 4),
                               "text": tok.decode(eval_tokens[max(0, i - 6):i + 1])} for i, s in firing[:20]]
        on_negatives = subject_activation(det, group_subject, n_subjects, negatives).masked_fill(mentions, 0.0)
        out["negatives_firing"] = int((on_negatives > FIRE).any(1).sum())
        for name, (keys, owner) in probes.items():
            act = subject_activation(det, group_subject, n_subjects, keys)
            if name == "neighbour":
                out["neighbour_prompts_firing"] = int((act > FIRE).any(1).sum())
                continue
            mine = act[torch.arange(len(act)), owner]
            act[torch.arange(len(act)), owner] = 0.0
            out[f"{name}_full"] = float(((mine - 1).abs() < 0.01).double().mean())  # the whole δ (± 1 %)
            out[f"{name}_half"] = float((mine > 0.5).double().mean())
            out[f"{name}_other_subject_firing"] = int((act > FIRE).any(1).sum())
        return out

    variants = [measure(False, False, 1.0), measure(False, True, 1.0), measure(True, False, 1.0)]
    variants += [measure(True, True, w) for w in args.within]
    result = {"split": args.split, "draw": args.draw, "n": args.n, "layer": args.layer, "subjects": len(ctx.subjects),
              "contexts": len(ctx.requests), "paraphrase_prompts": len(paraphrases),
              "held_out_prefix_prompts": len(held), "neighbour_prompts": len(neighbours), "fire_threshold": FIRE,
              "variants": variants, "wall_seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu,
              "load_average": os.getloadavg(), "environment": environment()}
    out = Path(__file__).resolve().parent / "results" / "hf" / f"subject_detectors_{args.split}{args.draw}_n{args.n}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    for v in variants:
        print(json.dumps({k: v[k] for k in v if k != "eval_firing"}))


if __name__ == "__main__":
    main()
