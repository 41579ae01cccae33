"""How the editors' C = E[k kᵀ] from 1.05M tokens of Wikipedia differs from C over less or model-written text.

For SmolLM2-135M's layers 0-5 (the layers causal tracing chose, ``benchmarks/causal_trace_layers.py``: ROME 5,
MEMIT 0-5, AlphaEdit 1-5) C is computed (and cached, see
:mod:`factkernels.hf.statistics`) over the shipped English Wikipedia article leads (all 10,033, the
editors' default; and the first 100, 1,000 and 2,508, to show how far C has settled) and over the 90 documents
SmolLM2 wrote itself (``mom2_dataset="smollm2_text"``, the statistics before). Against the full-Wikipedia C,
per layer: the relative Frobenius difference; the trace ratio; AlphaEdit's null-space size at its published
threshold 2e-2; and, at the sanity gate's known facts' bare-prompt subject keys k, the cosine between the
edit directions (C + ridge)⁻¹ k (ROME's u, with its ridge 1e-4 · mean diag; MEMIT's single-key direction).

Then the sanity gate (``benchmarks/editor_sanity_gate.py``'s protocol: one known fact edited, scored,
restored) for MEMIT and AlphaEdit at those layers (δ learning rate 0.5, the gate's passing setting) on the first ``--facts``
of its facts, paired: each fact's δ is trained once (kept in a checkpoint under ``--work``; both methods'
residual steps are the same at these settings) and the edit is written with the model-written C and with
Wikipedia's C, so the rows differ by C alone.

    OMP_NUM_THREADS=1 python benchmarks/key_statistics.py --out benchmarks/results/hf/key_statistics.json

Resumable: C's are cached, gate rows already in ``--out`` are kept, δ checkpoints are reused;
``--corpora smollm2_text`` runs only the gate rows that need no Wikipedia pass (about half an hour of one
CPU core for the full Wikipedia C of layers 0-5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import torch
from safetensors import safe_open

from factkernels import hf
from factkernels.editing import hparams
from factkernels.environment import environment
from factkernels.experiments import engine
from factkernels.hf.editors import context_keys
from factkernels.hf.metrics import target_scores
from factkernels.hf.statistics import (MOM2_DATASETS, default_cache_dir, key_second_moments, mom2_texts,
                                      second_moment_path, second_moment_tokens)

MODEL = "smollm2-135m"
LAYERS = (0, 1, 2, 3, 4, 5)
REFERENCE = "wikipedia"
CORPORA = {"wikipedia": ("wikipedia", None), "wikipedia_first_100": ("wikipedia", 100),
           "wikipedia_first_1000": ("wikipedia", 1000), "wikipedia_first_2508": ("wikipedia", 2508),
           "smollm2_text": ("smollm2_text", None)}
# AlphaEdit's published lr 0.1 misses the gate on this model; MEMIT's own is 0.5. Layers: causal tracing's.
GATE_HPARAMS = {"memit": {"lr": 0.5, "layers": (0, 1, 2, 3, 4, 5)}, "alphaedit": {"lr": 0.5, "layers": (1, 2, 3, 4, 5)}}
GATE_FACTS = Path(__file__).resolve().parent / "results" / "hf" / "editor_sanity_gate.json"


def edit_directions(cov: torch.Tensor, keys: torch.Tensor, ridge: float) -> torch.Tensor:
    """(C + ridge · mean diag C · I)⁻¹ kᵀ as rows (n, h), unit length."""
    cov = cov.double()
    eye = torch.eye(cov.shape[0], dtype=cov.dtype)
    rows = torch.linalg.solve(cov + ridge * cov.diagonal().mean() * eye, keys.double().T).T
    return rows / rows.norm(dim=1, keepdim=True)


def gate_rows(model, tok, facts, corpora, work: Path, result: dict, out: Path) -> None:
    """The paired sanity gate: rows {method, subject, corpus, new/true log-prob, success, exact, δ NLL} into
    ``result["sanity_gate"]["rows"]``, written to ``out`` after each; rows already there are skipped."""
    gate = result.setdefault("sanity_gate", {"methods": GATE_HPARAMS, "rows": []})
    done = {(r["method"], r["subject"], r["corpus"]) for r in gate["rows"]}
    for method in GATE_HPARAMS:
        for i, r in enumerate(facts):
            for corpus in corpora:
                if (method, r.subject, corpus) in done:
                    continue
                wall, cpu = time.perf_counter(), time.process_time()
                applied = hf.edit(model, tok, [r], method=method, progress=False, mom2_dataset=corpus,
                                  checkpoint=work / f"fact{i}.safetensors", **GATE_HPARAMS[method])
                try:
                    (new, true), (exact, _) = (t.tolist() for t in
                                               target_scores(model, tok, [r, dataclasses.replace(r, target_new=r.target_true)]))
                finally:
                    applied.restore()
                gate["rows"].append({"method": method, "subject": r.subject, "corpus": corpus, "new_logprob": new,
                                     "true_logprob": true, "success": new > true, "exact": exact,
                                     "nll_target": applied.report["nll_target"],
                                     "stats_tokens": applied.report["stats_tokens"],
                                     "null_space_dims": applied.report.get("null_space_dims"),
                                     "seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu})
                summarize(gate)
                engine.write_json(out, {**result, "environment": environment()}, indent=1)
                print(method, r.subject, corpus, gate["rows"][-1]["success"], f"{new:.3f} vs {true:.3f}", flush=True)


def summarize(gate: dict) -> None:
    """Per method and corpus, over the facts scored with every corpus: efficacy, exact match, magnitude."""
    summary = {}
    for method in GATE_HPARAMS:
        rows = [r for r in gate["rows"] if r["method"] == method]
        corpora = sorted({r["corpus"] for r in rows})
        paired = [s for s in dict.fromkeys(r["subject"] for r in rows)
                  if all(any(r["subject"] == s and r["corpus"] == c for r in rows) for c in corpora)]
        for corpus in corpora:
            picked = [r for s in paired for r in rows if r["subject"] == s and r["corpus"] == corpus]
            if picked:
                summary.setdefault(method, {})[corpus] = {
                    "facts": len(picked), "efficacy_score": sum(r["success"] for r in picked) / len(picked),
                    "exact_match": sum(r["exact"] for r in picked) / len(picked),
                    "magnitude": sum(r["new_logprob"] - r["true_logprob"] for r in picked) / len(picked),
                    "mean_new_logprob": sum(r["new_logprob"] for r in picked) / len(picked)}
    gate["summary"] = summary


def compare_covariances(model, tok, facts) -> tuple[dict, dict]:
    """(corpora: documents, tokens, seconds; per layer and corpus: the measures of the module docstring)."""
    corpora, covs = {}, {}
    for name, (dataset, n_samples) in CORPORA.items():
        texts = mom2_texts(dataset, n_samples)
        cached = all(second_moment_tokens(model, layer, texts=texts) is not None for layer in LAYERS)
        wall, cpu = time.perf_counter(), time.process_time()
        covs[name] = key_second_moments(model, tok, LAYERS, texts=texts)
        with safe_open(str(second_moment_path(model, LAYERS[0], texts=texts)), framework="pt") as handle:
            merged = handle.metadata().get("merged_from")  # filled from passes over parts of the text
        corpora[name] = {"mom2_dataset": dataset, "mom2_n_samples": n_samples, "documents": len(texts),
                         "tokens": second_moment_tokens(model, LAYERS[0], texts=texts), "merged_from": merged,
                         "seconds": None if cached else time.perf_counter() - wall,
                         "cpu_seconds": None if cached else time.process_time() - cpu}
        print(name, corpora[name], flush=True)
    ridge, threshold = hparams("rome").ridge, hparams("alphaedit").nullspace_threshold
    layers = {}
    for layer in LAYERS:
        _, keys, _ = context_keys(model, tok, facts, [], layer, layer)
        ref = covs[REFERENCE][layer].double()
        ref_dirs = edit_directions(ref, keys, ridge)
        rows = {}
        for name in CORPORA:
            cov = covs[name][layer].double()
            eigenvalues = torch.linalg.eigvalsh(cov)
            cosines = (edit_directions(cov, keys, ridge) * ref_dirs).sum(1)
            rows[name] = {"relative_frobenius_to_wikipedia": float((cov - ref).norm() / ref.norm()),
                          "trace": float(cov.trace()), "trace_ratio_to_wikipedia": float(cov.trace() / ref.trace()),
                          f"null_space_dims_at_{threshold:g}": int((eigenvalues < threshold).sum()),
                          "smallest_eigenvalue": float(eigenvalues[0]),
                          "edit_direction_cosine_mean": float(cosines.mean()),
                          "edit_direction_cosine_min": float(cosines.min())}
        layers[layer] = rows
    return corpora, layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--facts", type=int, default=8, help="sanity-gate facts per method")
    parser.add_argument("--corpora", nargs="+", default=list(MOM2_DATASETS), choices=MOM2_DATASETS,
                        help="the C's the gate runs with; the comparison of C's needs wikipedia")
    parser.add_argument("--work", type=Path, default=default_cache_dir() / "key_statistics",
                        help="where each fact's δ is kept between its two edits")
    args = parser.parse_args()
    torch.manual_seed(0)
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.setdefault("loadavg_before", os.getloadavg())
    model, tok = hf.load(MODEL)
    facts = [hf.Request(f["prompt"], f["subject"], f["target_new"], f["target_true"])
             for f in json.loads(GATE_FACTS.read_text())["facts"]]
    result.update({"benchmark": "key_statistics", "model": MODEL, "layers": list(LAYERS), "reference": REFERENCE,
                   "facts": len(facts), "gate_facts": args.facts})
    if REFERENCE in args.corpora and "per_layer" not in result:
        corpora, layers = compare_covariances(model, tok, facts)
        result.update({"corpora": corpora, "per_layer": layers, "rome_ridge": hparams("rome").ridge})
        engine.write_json(args.out, {**result, "environment": environment()}, indent=1)
        print(json.dumps({layer: {n: round(r["relative_frobenius_to_wikipedia"], 4) for n, r in rows.items()}
                          for layer, rows in layers.items()}), flush=True)
    gate_rows(model, tok, facts[:args.facts], args.corpora, args.work, result, args.out)
    result.update({"threads": torch.get_num_threads(), "loadavg_after": os.getloadavg()})
    engine.write_json(args.out, {**result, "environment": environment()}, indent=1)


if __name__ == "__main__":
    main()
