"""``factkernels insert``: facts into a real model by construction, saved as a stock HF checkpoint."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _run_insert(args: argparse.Namespace) -> int:
    from . import evaluate, insert_facts, load, parse_requests

    requests = parse_requests(args.requests)
    print(f"loading {args.model}", flush=True)
    model, tok = load(args.model)
    ins = insert_facts(model, tok, requests, layer=args.layer, position=args.position, gate=args.gate,
                       seed=args.seed, progress=not args.quiet)
    scores = evaluate(model, tok, requests)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    report = {"model": args.model, "requests": str(args.requests), "report": ins.report.to_dict(), "scores": scores}
    (out / "factkernels_insert.json").write_text(json.dumps(report, indent=2))
    summary = {k: v for k, v in ins.report.to_dict().items() if k != "margins"}
    print(json.dumps(summary | {"scores": scores}, indent=2))
    print(f"wrote {out} (stock {type(model).__name__}) and {out / 'factkernels_insert.json'}")
    return 0 if ins.report.efficacy == 1.0 else 1


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Register ``insert`` on the top-level parser."""
    p = sub.add_parser("insert", help="insert facts into a real causal LM by construction (needs the hf extra)")
    p.add_argument("--model", default="smollm2-135m", help="packaged name, local HF folder or .gguf file")
    p.add_argument("--requests", required=True, help=".json or .csv of {prompt, subject, target_new}")
    p.add_argument("--out", required=True, help="folder for the edited model (save_pretrained) and the JSON report")
    p.add_argument("--layer", type=int, default=None, help="decoder layer (default: the last)")
    p.add_argument("--position", choices=["target", "subject"], default="target")
    p.add_argument("--gate", choices=["detector", "generic"], default="detector")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=_run_insert)
