"""CPU seconds of a faithful weight editor's edit on the packaged SmolLM2-135M, stage by stage, and whether another
version of the library gives the same δ and weights.

    OMP_NUM_THREADS=1 python benchmarks/editor_speed.py --facts 16 --label after --compare memit_n16_cpu_before
    PYTHONPATH=/tmp/old OMP_NUM_THREADS=1 python benchmarks/editor_speed.py --facts 16 --label before

Stages: "residual", the residual step (:func:`factkernels.hf.residual.residual_targets`, δ per request at the
method's preset, in chunks of ``--chunk`` requests, default 8 as :func:`hf.edit`'s); "update", the rest of
:func:`hf.edit` with those δ reused (``targets=``: keys per layer over the contexts, the update; C read from the
cache, computed on first use and then not counted). A fact is one request (a case's new object under one edit
template): the first n of the known-fact test draw 0 (its first n/5 cases, five edit templates each). Each run
writes benchmarks/results/hf/editor_speed/{method}_n{facts}_{device}[_chunk{chunk}]_{label}.json: process CPU and
wall seconds per stage and per fact, the targets' mean NLL before / after δ and after the edit, threads, load
average, device, environment (its ``code`` the commit that ran). δ and the edited layers' weight changes go to the
cache (``~/.cache/factkernels/editor_speed/``, not committed); ``--compare NAME`` reads another run's (its file
name without the extension) and records the largest absolute differences (δ, each layer's weight change) beside
their sizes. ``--label`` names the version of the library that ran, e.g. "before" for an older checkout first on
PYTHONPATH.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from factkernels import hf
from factkernels.datasets.editing_benchmark import known_draw
from factkernels.environment import environment
from factkernels.hf.capture import encode_requests
from factkernels.hf.contexts import context_prefixes
from factkernels.hf.editors import resolve_hparams
from factkernels.hf.metrics import case_requests
from factkernels.hf.residual import residual_targets, target_nll
from factkernels.hf.statistics import default_cache_dir, key_second_moments, mom2_texts

OUT = Path(__file__).resolve().parent / "results" / "hf" / "editor_speed"
PRESET = "smollm2-135m"
TEMPLATES = 5  # edit templates per case
CHUNK = 8  # hf.edit's default δ chunk


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall}


def run(model, tok, method: str, facts: int, device: str, chunk: int = CHUNK) -> tuple[dict, dict]:
    """(the result's figures, the tensors to compare: δ and each edited layer's weight change)."""
    requests = case_requests(known_draw("test", 0, n=-(-facts // TEMPLATES)))[:facts]
    hp = resolve_hparams(model, method, None, {"preset": PRESET})
    model.to(device)
    stats = key_second_moments(model, tok, hp.layers, texts=mom2_texts(hp.mom2_dataset, hp.mom2_n_samples),
                               progress=False)  # cached: not part of an edit's cost once computed
    prefixes = context_prefixes(model, tok, hp.prefixes, hp.prefix_starts)
    step = {**{k: getattr(hp, k) for k in ("steps", "lr", "weight_decay", "clamp_norm", "kl_factor", "early_stop")},
            "clamp_to": "mlp" if method == "rome" else "layer", "prefixes": list(prefixes)}
    load_before = os.getloadavg()
    with torch.enable_grad():
        targets, residual = _timed(lambda: residual_targets(model, tok, requests, hp.layers[-1], **step, chunk=chunk,
                                                            progress=False))
    weights = {layer: model.model.layers[layer].mlp.down_proj.weight.detach().clone() for layer in hp.layers}
    applied, update = _timed(lambda: hf.edit(model, tok, requests, method=method, stats=stats, targets=targets,
                                             progress=False, preset=PRESET))
    changes = {f"layer{layer}": model.model.layers[layer].mlp.down_proj.weight.detach() - w
               for layer, w in weights.items()}
    with torch.no_grad():
        nll_edited = target_nll(model, encode_requests(tok, requests, with_target=True))
    applied.restore()
    result = {"method": method, "preset": PRESET, "facts": len(requests), "cases": -(-facts // TEMPLATES),
              "chunk": chunk, "layers": list(hp.layers), "contexts": 1 + len(prefixes), "device": device,
              "threads": torch.get_num_threads(),
              "seconds": {"residual": residual, "update": update},
              "cpu_seconds_per_fact": {"residual": residual["cpu"] / len(requests),
                                       "update": update["cpu"] / len(requests),
                                       "total": (residual["cpu"] + update["cpu"]) / len(requests)},
              "nll": {"before": float(targets.nll_before.mean()), "with_delta": float(targets.nll_after.mean()),
                      "edited": float(nll_edited.mean())},
              "delta_norm": float(targets.delta.norm(dim=1).mean()),
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "environment": environment()}
    tensors = {"delta": targets.delta.cpu(), **{k: v.cpu().contiguous() for k, v in changes.items()}}
    return result, tensors


def compare(tensors: dict, other: dict) -> dict:
    """Largest absolute difference and largest absolute value of each tensor against another run's."""
    return {name: {"max_abs_diff": float((t - other[name]).abs().max()), "max_abs": float(t.abs().max())}
            for name, t in tensors.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="memit", choices=("memit", "alphaedit"))
    parser.add_argument("--facts", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=CHUNK, help="requests per δ batch")
    parser.add_argument("--label", required=True, help="the library version that runs (file name suffix)")
    parser.add_argument("--compare", help="another run to compare δ and weights with: its file name without the "
                        "extension (e.g. memit_n16_cpu_before)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    name = f"{args.method}_n{args.facts}_{args.device.replace(':', '')}"
    name += f"_chunk{args.chunk}" if args.chunk != CHUNK else ""
    path = OUT / f"{name}_{args.label}.json"
    if path.exists():
        raise SystemExit(f"{path} exists")
    model, tok = hf.load(PRESET)
    result, tensors = run(model, tok, args.method, args.facts, args.device, args.chunk)
    kept = default_cache_dir() / "editor_speed"
    kept.mkdir(parents=True, exist_ok=True)
    save_file(tensors, kept / f"{name}_{args.label}.safetensors")
    if args.compare:
        other = load_file(kept / f"{args.compare}.safetensors")
        result["compared_with"] = {"label": args.compare, "tensors": compare(tensors, other)}
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("facts", "seconds", "cpu_seconds_per_fact", "nll")}
                     | ({"compared_with": result["compared_with"]} if args.compare else {})), flush=True)


if __name__ == "__main__":
    main()
