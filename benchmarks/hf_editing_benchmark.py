"""The editing benchmark on the packaged SmolLM2-135M: one draw, one method, every metric beside the unedited model's.

    # the unedited model on the validation draw and the three test draws, with 95 % t-intervals over the test draws
    OMP_NUM_THREADS=2 python benchmarks/hf_editing_benchmark.py unedited
    # one JSON over draws: mean and 95 % t-interval of each run of the named results
    python benchmarks/hf_editing_benchmark.py summarize --sources subject_test0 subject_test1 subject_test2 \
        --name subject_tests
    # our insertion on the first 30 cases of the validation draw, under each options dict (hf.insert_facts kwargs)
    OMP_NUM_THREADS=2 python benchmarks/hf_editing_benchmark.py insert --split validation --n 30 \
        --options '[{}, {"keys": "subject", "layer": 10}]' --name validation_n30

Writes benchmarks/results/hf/editing_benchmark/{name}.json: the scores of factkernels.hf.metrics.score_cases,
the settings, the seconds and the environment.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from factkernels.datasets.editing_benchmark import NUM_TEST_DRAWS, known_draw, new_knowledge_draw
from factkernels.environment import environment
from factkernels.datasets import natural_text
from factkernels.hf import insert_facts, load
from factkernels.hf.metrics import case_requests, over_draws, record_baseline, score_cases

OUT = Path(__file__).resolve().parent / "results" / "hf" / "editing_benchmark"


def draw(kind: str, split: str, index: int, n: int | None):
    return (known_draw if kind == "known" else new_knowledge_draw)(split, index, n=n)


def unedited(args: argparse.Namespace, model, tok) -> dict:
    """The unedited model's scores on every draw (its values are the 'unedited' column of every result)."""
    texts = natural_text("eval")
    draws = {"validation": draw(args.kind, "validation", 0, args.n)}
    draws.update({f"test{i}": draw(args.kind, "test", i, args.n) for i in range(NUM_TEST_DRAWS)})
    per_draw = {}
    for name, cases in draws.items():
        start = time.perf_counter()
        base = record_baseline(model, tok, cases, texts=texts, generate=args.generate)
        per_draw[name] = {**base.scores, "seconds": time.perf_counter() - start}
    tests = [per_draw[f"test{i}"] for i in range(NUM_TEST_DRAWS)]
    return {"per_draw": per_draw, "test_draws": over_draws(tests)}


def insert(args: argparse.Namespace, model, tok) -> dict:
    """insert_facts under each options dict of --options (one dict or a list), each scored then removed."""
    texts = natural_text("eval")
    cases = draw(args.kind, args.split, args.index, args.n)
    base = record_baseline(model, tok, cases, texts=texts, generate=args.generate)
    settings = json.loads(args.options)
    runs = []
    for options in settings if isinstance(settings, list) else [settings]:
        start = time.perf_counter()
        ins = insert_facts(model, tok, case_requests(cases), progress=False, **options)
        seconds = time.perf_counter() - start
        scores = score_cases(model, tok, cases, base, texts=texts)
        report = {k: v for k, v in ins.report.to_dict().items() if k != "margins"}
        ins.remove()
        runs.append({"options": options, "insert_seconds": seconds, "report": report, "scores": scores})
        print(json.dumps({k: v for k, v in scores.items() if not isinstance(v, dict)}), flush=True)
    return {"unedited": base.scores, "runs": runs}


def summarize(names: list[str]) -> dict:
    """Mean and 95 % t-interval over draws of each run (by position) of the named result files."""
    results = [json.loads((OUT / f"{name}.json").read_text()) for name in names]
    runs = []
    for i, first in enumerate(results[0]["runs"]):
        per_draw = [r["runs"][i]["scores"] for r in results]
        runs.append({"options": first["options"], "draws": [f"{r['split']}{r['index']}" for r in results],
                     "over_draws": over_draws(per_draw)})
    return {"sources": names, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("method", choices=("unedited", "insert", "summarize"))
    parser.add_argument("--sources", nargs="*", default=[], help="summarize: result names, one per draw")
    parser.add_argument("--kind", choices=("known", "new"), default="known")
    parser.add_argument("--split", choices=("validation", "test"), default="validation")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--n", type=int, default=None, help="the first n cases of each draw (all when left out)")
    parser.add_argument("--generate", type=int, default=50, help="cases with fluency/consistency generations")
    parser.add_argument("--options", default="{}", help="insert_facts keyword arguments, as JSON")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    if args.method == "summarize":
        OUT.joinpath(f"{args.name}.json").write_text(json.dumps(summarize(args.sources), indent=1) + "\n")
        return
    torch.manual_seed(0)
    model, tok = load("smollm2-135m")
    start = time.perf_counter()
    with torch.no_grad() if args.method == "unedited" else torch.enable_grad():
        result = unedited(args, model, tok) if args.method == "unedited" else insert(args, model, tok)
    name = args.name or (f"unedited_{args.kind}" if args.method == "unedited" else f"insert_{args.kind}_{args.split}")
    result = {"method": args.method, "kind": args.kind, "split": args.split, "index": args.index, "n": args.n,
              "generate": args.generate, **result, "seconds": time.perf_counter() - start, "environment": environment()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("environment",)}, indent=1)[:4000])


if __name__ == "__main__":
    main()
