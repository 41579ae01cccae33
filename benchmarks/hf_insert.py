"""Facts into the packaged SmolLM2-135M by construction: efficacy, paraphrase, neighborhood, text ppl/KL.

    python benchmarks/hf_insert.py --facts 10 100 [--gate detector] [--sharpness 100 --threshold 0.92] [--adaptive-threshold]
    python benchmarks/hf_insert.py --facts 1000 --layer 29 --threads 1     # keys at the last layer

One JSON per setting under benchmarks/results/hf/ (skipped when it exists: resumable). The shipped
text's "stats" split is the insertion's background; its held-out "eval" split is scored (never seen
by the insertion).
"""

import argparse
import json
import time
from pathlib import Path

import torch
import transformers

from factkernels import datasets, hf
from factkernels.environment import environment
from factkernels.hf.insert import default_layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--facts", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--gate", default="detector", choices=["detector", "generic"])
    parser.add_argument("--sharpness", type=float, default=100.0)
    parser.add_argument("--threshold", type=float, default=0.92)
    parser.add_argument("--adaptive-threshold", action="store_true",
                        help="per-unit thresholds above --threshold, halfway to the key (hf.insert.detector_mlp)")
    parser.add_argument("--contrast", type=int, default=2)
    parser.add_argument("--layer", type=int, default=None, help="insertion layer (default: insert_facts')")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default="benchmarks/results/hf")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    background, scored = datasets.natural_text("stats"), datasets.natural_text("eval")  # the scored texts are never seen
    model, tok = hf.load(args.model)
    layer = default_layer(model) if args.layer is None else args.layer
    for n in args.facts:
        path = Path(args.out) / (f"insert_{args.gate}_n{n}_s{args.sharpness:g}_t{args.threshold:g}"
                                 f"{'_adaptive' if args.adaptive_threshold else ''}_c{args.contrast}"
                                 f"_L{layer}_seed{args.seed}.json")
        if path.exists():
            print(f"{path} exists, skipped")
            continue
        facts = hf.book_requests(n, seed=args.seed)
        ref = hf.record_reference(model, tok, neighborhood=facts.neighborhood, texts=scored)
        before = hf.evaluate(model, tok, facts.requests, paraphrases=facts.paraphrases,
                             neighborhood=facts.neighborhood, texts=scored, reference=ref)
        start = time.perf_counter()
        ins = hf.insert_facts(model, tok, facts.requests, layer=layer, gate=args.gate, background=background,
                              sharpness=args.sharpness, threshold=args.threshold,
                              adaptive_threshold=args.adaptive_threshold, contrast=args.contrast, seed=args.seed)
        insert_seconds = time.perf_counter() - start
        after = hf.evaluate(model, tok, facts.requests, paraphrases=facts.paraphrases,
                            neighborhood=facts.neighborhood, texts=scored, reference=ref)
        ins.remove()
        payload = {"config": vars(args) | {"facts": n}, "insert_seconds": insert_seconds,
                   "report": ins.report.to_dict(), "scores_before": before, "scores": after,
                   "environment": environment() | {"transformers": transformers.__version__}}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1))
        print(n, {k: round(v, 4) if isinstance(v, float) else v for k, v in after.items()}, f"insert {insert_seconds:.0f}s",
              flush=True)


if __name__ == "__main__":
    main()
