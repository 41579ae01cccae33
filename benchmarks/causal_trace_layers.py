"""Which SmolLM2-135M layers the weight editors edit, chosen by causal tracing as their authors chose them.

Known facts of the editing benchmark's validation draw (``known_draw("validation")``, the first ``--facts``)
are traced under their first edit template the unedited model answers (``known_facts.csv``), for their true
object, with :func:`factkernels.hf.causal_trace` at the subject's last token: 10 noise samples of 3 × the
embedding standard deviation of the first 30 validation subjects' tokens (ROME's ``collect_embedding_std``), restoring the MLP outputs of a
window of layers (ROME's ``kind="mlp"``; window 1 and ROME's code default 10). The mean indirect effect per
layer (restored minus corrupted answer probability) picks the layers (:func:`factkernels.hf.causal_trace.editor_layers`): ROME
the peak of the MLP effect with ROME's window 10; MEMIT and AlphaEdit their published number of layers (6 of
GPT-J's 28, 5 of Llama3-8B's 32, kept) ending at that peak, as MEMIT's GPT-2 XL layers 13-17 end at ROME's 17.

    OMP_NUM_THREADS=1 python benchmarks/causal_trace_layers.py    # ~7 CPU-s per fact and trace; resumable

Writes benchmarks/results/hf/causal_trace_layers.json (per fact and mean effects, the chosen layers, seconds).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from factkernels import hf
from factkernels.datasets.editing_benchmark import known_draw, known_facts, relations
from factkernels.editing import hparams
from factkernels.environment import environment
from factkernels.experiments import engine
from factkernels.hf.causal_trace import editor_layers, subject_embedding_std
from factkernels.hf.requests import Request

MODEL = "smollm2-135m"
OUT = Path(__file__).resolve().parent / "results" / "hf" / "causal_trace_layers.json"
TRACES = {"mlp_w1": ("mlp", 1), "mlp_w10": ("mlp", 10)}
CHOICE = "mlp_w10"
NOISE_SUBJECTS = 30
"""The noise unit is the embedding std of the first 30 validation subjects' tokens, whatever --facts is."""


def traced_requests(n: int) -> list[Request]:
    """The first ``n`` validation cases as (first edit template the unedited model answers, subject, true object)."""
    flags = {(k.fact.relation, k.fact.subject): k.edit_correct for k in known_facts()}
    rels = relations()
    out = []
    for c in known_draw("validation", 0, n=n):
        ok = flags[(c.relation, c.subject)]
        template = next(t for t, right in zip(rels[c.relation].edit, ok) if right)
        out.append(Request(template, c.subject, " " + c.target_true, " " + c.target_true))
    return out


def summary(mean: dict[str, torch.Tensor], chosen: dict) -> list[str]:
    """Plain-text table: the mean indirect effect per layer of each trace, then the chosen layers."""
    lines = ["layer  " + "  ".join(f"{name:>8}" for name in mean)]
    for layer in range(len(next(iter(mean.values())))):
        lines.append(f"{layer:5d}  " + "  ".join(f"{float(v[layer]):8.4f}" for v in mean.values()))
    return lines + [f"{m}: layers {list(v)}" for m, v in chosen.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=20)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    model, tok = hf.load(MODEL)
    reqs = traced_requests(args.facts)
    std = subject_embedding_std(model, tok, traced_requests(NOISE_SUBJECTS))
    result = engine.read_json(args.out) if args.out.exists() else {}
    rows = result.get("rows", [])
    for r in reqs[len(rows):]:
        row = {"prompt": r.prompt, "subject": r.subject, "answer": r.target_true, "effects": {}, "cpu_seconds": 0.0}
        for name, (kind, window) in TRACES.items():
            wall, cpu = time.perf_counter(), time.process_time()
            trace = hf.causal_trace(model, tok, r.prompt, r.subject, r.target_true, samples=args.samples,
                                    kind=kind, window=window, noise_std=std, tokens="subject_last")
            row.update({"clean": trace.clean, "corrupted": trace.corrupted})
            row["effects"][name] = trace.subject_last().tolist()
            row["cpu_seconds"] += time.process_time() - cpu
            row["seconds"] = row.get("seconds", 0.0) + time.perf_counter() - wall
        rows.append(row)
        result = report(rows, std, args.samples)
        engine.write_json(args.out, result, indent=1)
        print(len(rows), r.subject, f"{row['cpu_seconds']:.1f} cpu-s", result["peak_layer"], flush=True)
    result = report(rows, std, args.samples)
    engine.write_json(args.out, result, indent=1)
    print("\n".join(result["summary"]))


def report(rows: list[dict], std: float, samples: int) -> dict:
    """The result file's content from the traced rows."""
    mean = {name: torch.tensor([x["effects"][name] for x in rows]).mean(0) for name in TRACES}
    num_layers = len(mean[CHOICE])
    counts = {m: len(hparams(m).layers) for m in ("rome", "memit", "alphaedit")}
    chosen = editor_layers(mean[CHOICE], counts)
    return {"benchmark": "causal_trace_layers", "model": MODEL, "facts": len(rows), "samples": samples,
              "noise": f"3 x the embedding std of the first {NOISE_SUBJECTS} validation subjects' tokens", "noise_std": std, "position": "subject last token",
              "traces": {k: {"kind": v[0], "window": v[1]} for k, v in TRACES.items()}, "choice_from": CHOICE,
              "mean_effect": {k: v.tolist() for k, v in mean.items()},
              "peak_layer": {k: int(v.argmax()) for k, v in mean.items()},
              "mean_clean": sum(x["clean"] for x in rows) / len(rows),
              "mean_corrupted": sum(x["corrupted"] for x in rows) / len(rows),
              "chosen_layers": {m: list(v) for m, v in chosen.items()},
              "published_layers_moved": {m: list(hparams(m, num_layers=num_layers, mlp_width=1536).layers)
                                         for m in counts},
              "load_average": list(os.getloadavg()),
              "summary": summary(mean, chosen), "rows": rows, "environment": environment()}


if __name__ == "__main__":
    main()
