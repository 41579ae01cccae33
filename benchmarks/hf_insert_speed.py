"""Seconds of hf.insert_facts(keys="subject") on the packaged SmolLM2-135M, stage by stage, wall and process CPU.

    OMP_NUM_THREADS=1 python benchmarks/hf_insert_speed.py --facts 50 100 --threads 1
    python benchmarks/hf_insert_speed.py --facts 960 --device cuda          # on a GPU
    PYTHONPATH=/tmp/old OMP_NUM_THREADS=1 python benchmarks/hf_insert_speed.py --facts 100 --label before
    OMP_NUM_THREADS=1 python benchmarks/hf_insert_speed.py --facts 100 --recheck-steps 1 --label every_step
    python benchmarks/hf_insert_speed.py --facts 960 --threads 2 --workers 2    # values chunks on 2 workers


A fact is one request (a case's new object under one edit template); n facts are the first n/5 cases of the editing
benchmark's known-fact validation draw, with their five edit templates each (the draw holds 192 cases: at most 960
facts; the 1,000-fact target is read from 960). Each size writes one JSON under benchmarks/results/hf/insert_speed/
(skipped when it exists): the report's timings (wall and CPU seconds of background, capture, values, construct,
verify, total), contexts, δ steps, efficacy, the load average before and after, threads, the values fit's workers
(``--workers``: chunks of subjects fit at once, each on one intra-op thread, hf.insert_facts' ``workers``; a count
other than 1 joins the file name as ``_w<n>``, "auto" as ``_wauto``), each values fit's (first, then each repair
round's) makespan: the CPU seconds until the last worker is done, each worker taking the next chunk when free
(chunk CPU seconds are a worker's own, so this holds on a loaded machine), beside the even split; the tokens the
values fit ran through the blocks after the layer with a graph and without (each repair round's too, in "repairs":
its work, which the load does not change) and the steps each subject ran (which ones run to the limit); device and
environment (``--label`` adds a suffix to the file name: the same size run by another version of the library, e.g.
a checkout of an earlier commit first on PYTHONPATH, for a before/after pair; the file records the commit the
library came from). ``--extrapolate`` adds, from the sizes already written, each stage's least-squares line in the
number of facts (a + b·n) and its value at 1,000 facts: an extrapolation, said so in the file (of CPU seconds on a
CPU, whose wall seconds carry the shared machine's load; of wall seconds on a GPU). With ``--label`` it
extrapolates from the sizes of that label only. ``--mlp-out FILE`` writes the inserted units' weights and every
context's margin (.safetensors, not committed: a δ is model data); ``--mlp-ref FILE`` (another run's ``--mlp-out``,
same requests) adds to the JSON how far this run's units and margins are from it (e.g. the δ moved by regrouping
the values fit's chunks).
"""

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import torch

from factkernels import hf
from factkernels.datasets.editing_benchmark import known_draw
from factkernels.environment import environment
from factkernels.hf import subject_values
from factkernels.hf.metrics import case_requests

OUT = Path(__file__).resolve().parent / "results" / "hf" / "insert_speed"
SETTINGS = {"keys": "subject", "layer": 10}
TEMPLATES = 5  # edit templates per case


def run(model, tok, facts: int, device: str, threads: int, workers, model_name: str, mlp_out=None,
        mlp_ref=None) -> dict:
    cases = known_draw("validation", 0, n=facts // TEMPLATES)
    requests = case_requests(cases)
    load_before = os.getloadavg()
    wall, cpu = time.perf_counter(), time.process_time()
    ins = hf.insert_facts(model, tok, requests, progress=False, device=device, workers=workers, **SETTINGS)
    seconds = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
    report = ins.report
    # the inserted units, kept only to save or compare them
    units = (None if mlp_out is None and mlp_ref is None
             else {**ins.mlp.swiglu_weights(), "margins": torch.tensor(report.margins)})
    ins.remove()
    if mlp_out is not None:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in units.items()}, str(mlp_out))
    return {"model": model_name, "facts": len(requests), "cases": len(cases), "settings": SETTINGS, "device": device, "threads": threads,
            "workers": workers, "recheck_steps": subject_values.RECHECK_STEPS,
            "value_workers": report.values.get("value_workers", 1),
            "value_chunks": report.values.get("value_chunks", 1),
            **{f"value_chunk_{k}": report.values.get(f"value_chunk_{k}")
               for k in ("seconds", "cpu", "steps", "tokens", "worker")},
            **{k: report.values.get(k) for k in ("value_tokens_graph", "value_tokens_measured", "value_subject_steps")},
            "makespan_cpu": makespans(report.values), "seconds": seconds, "timings": report.timings,
            "contexts": report.num_keys,
            "value_contexts": report.construction["value_contexts"], "subjects": report.construction["subjects"],
            "value_steps": report.values["value_steps"], "efficacy": report.efficacy,
            "min_margin": report.min_margin, "uncertified": report.construction["uncertified"],
            "repairs": report.values["repairs"], "peak_rss_mb": report.peak_rss_mb,
            "load_average_before": load_before, "load_average_after": os.getloadavg(), "commit": _commit(),
            **({} if mlp_ref is None else {"against": against(units, mlp_ref)}), "environment": environment()}


def makespan(chunk_cpu, workers: int) -> float:
    """CPU seconds until the last of ``workers`` workers is done, each taking the next chunk (``chunk_cpu``, in
    the order taken) when free: the wall seconds of that stage on an otherwise idle machine with a core each,
    whatever the load while it was measured (a worker's CPU seconds are its own)."""
    busy = [0.0] * workers
    for cpu in chunk_cpu:
        busy[busy.index(min(busy))] += cpu
    return max(busy)


def makespans(values: dict) -> dict:
    """:func:`makespan` of the values fit and of each repair round's refit, beside the even split (CPU / workers)."""
    fits = [("values", values), *((f"repair_{i + 1}", r) for i, r in enumerate(values.get("repairs", [])))]
    return {name: {"makespan": makespan(f["value_chunk_cpu"], f["value_workers"]),
                   "even": sum(f["value_chunk_cpu"]) / f["value_workers"], "chunks": f["value_chunks"]}
            for name, f in fits if f.get("value_chunk_cpu")}


def against(units: dict, path) -> dict:
    """How far ``units`` (the inserted MLP's weights and the margins) are from another run's ``--mlp-out`` file:
    each tensor's largest absolute difference (and its largest entry, for scale); the weights differ only
    through δ (the detectors do not depend on it)."""
    from safetensors.torch import load_file

    ref = load_file(str(path))
    return {"file": Path(path).name, **{k: {"max_abs_diff": float((v.float() - ref[k].float()).abs().max()),
                                             "max_abs": float(ref[k].float().abs().max())}
                                         for k, v in units.items() if k in ref and ref[k].shape == v.shape}}


def _commit() -> str:
    """The commit of the library that ran (its stages change as the insertion does): the repository holding the
    imported factkernels package, or, for an exported tree outside one, FACTKERNELS_COMMIT."""
    root = Path(hf.__file__).resolve().parent.parent.parent
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() or os.environ.get("FACTKERNELS_COMMIT", "unknown")


def extrapolate(device: str, label: str = "", target: int = 1000) -> dict:
    """Each stage's least-squares line a + b·facts through the written sizes, and its value at ``target``; the
    background states are a fixed cost (computed once per model, layer and texts, then kept: a later size in
    the same process reads them), so that stage is its largest measurement. The total is the stages' sum."""
    runs = sorted((json.loads(p.read_text()) for p in OUT.glob(f"subject_L10_n*_{device}{label}.json")),
                  key=lambda r: r["facts"])
    if len(runs) < 2:
        raise SystemExit(f"need two sizes on {device} to extrapolate, have {len(runs)}")
    n = torch.tensor([float(r["facts"]) for r in runs], dtype=torch.float64)
    design = torch.stack([torch.ones_like(n), n], 1)
    lines = {}
    # on a CPU the process CPU seconds (the wall ones carry the shared machine's load); on a GPU the wall ones
    cpu = device == "cpu"
    for stage in runs[-1]["timings"]:
        if stage.startswith("total") or stage.endswith("_cpu") != cpu:
            continue
        y = torch.tensor([float(r["timings"][stage]) for r in runs], dtype=torch.float64)
        if stage.startswith("background"):
            lines[stage] = {"fixed": float(y.max()), f"at_{target}": float(y.max())}
            continue
        a, b = torch.linalg.lstsq(design, y[:, None]).solution.flatten().tolist()
        lines[stage] = {"intercept": a, "per_fact": b, f"at_{target}": a + b * target}
    lines["total_cpu" if cpu else "total"] = {f"at_{target}": sum(v[f"at_{target}"] for v in lines.values())}
    return {"kind": "extrapolation (a straight line per stage through the measured sizes, not a measurement)",
            "seconds": "process CPU seconds, one thread" if cpu else "wall seconds",
            "device": device, "measured_facts": [r["facts"] for r in runs], "target_facts": target,
            "value_steps": [r["value_steps"] for r in runs], "commits": [r.get("commit") for r in runs],
            "load_averages": [r["load_average_before"] for r in runs], "stages": lines}


def workers_option(text: str):
    """--workers: "auto" or an int."""
    return text if text == "auto" else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, nargs="*", default=[50, 100])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=workers_option, default=1,
                        help='chunks of the values fit at once, an int or "auto" (hf.insert_facts workers)')
    parser.add_argument("--extrapolate", action="store_true")
    parser.add_argument("--label", default="", help="file name suffix (a before/after pair at one size)")
    parser.add_argument("--model", default="smollm2-135m",
                        help="the packaged short name, or the same .gguf file by path (a lent GPU machine has no package)")
    parser.add_argument("--mlp-out", type=Path, help="write the inserted units' weights and margins here")
    parser.add_argument("--mlp-ref", type=Path, help="another run's --mlp-out: record the difference from it")
    parser.add_argument("--recheck-steps", type=int,
                        help="the values fit's RECHECK_STEPS (1: every row at the margin measured at every step, as "
                             "before 7024eac); recorded in the JSON")
    args = parser.parse_args()
    if args.recheck_steps is not None:
        subject_values.RECHECK_STEPS = args.recheck_steps
    torch.set_num_threads(args.threads)
    OUT.mkdir(parents=True, exist_ok=True)
    model = tok = None
    label = ("" if args.workers == 1 else f"_w{args.workers}") + (f"_{args.label}" if args.label else "")
    for facts in args.facts:
        path = OUT / f"subject_L10_n{facts}_{args.device.replace(':', '')}{label}.json"
        if path.exists():
            print(f"{path} exists, skipped")
            continue
        if model is None:
            model, tok = hf.load(args.model)
        result = run(model, tok, facts, args.device, args.threads, args.workers, args.model, args.mlp_out,
                     args.mlp_ref)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: result[k] for k in ("facts", "seconds", "timings", "value_steps", "efficacy")}), flush=True)
    if args.extrapolate:
        path = OUT / f"subject_L10_extrapolated_{args.device.replace(':', '')}{label}.json"
        path.write_text(json.dumps(extrapolate(args.device.replace(":", ""), label), indent=1) + "\n")
        print(path.read_text())


if __name__ == "__main__":
    main()
