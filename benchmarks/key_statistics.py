"""How the editors' C = E[k kᵀ] from 1.05M tokens of Wikipedia differs from C over less or model-written text.

For SmolLM2-135M's layers 3-8 (ROME's 5, MEMIT's 3-8, AlphaEdit's 4-8) C is computed (and cached, see
:mod:`factkernels.hf.statistics`) over the shipped English Wikipedia article leads (all 10,033, the
editors' default; and the first 100 and 1,000, to show how far C has settled) and over the 90 documents
SmolLM2 wrote itself (``mom2_dataset="smollm2_text"``, the statistics before). Against the full-Wikipedia C,
per layer: the relative Frobenius difference; the trace ratio; AlphaEdit's null-space size at its published
threshold 2e-2; and, at the sanity gate's known facts' bare-prompt subject keys k, the cosine between the
edit directions (C + ridge)⁻¹ k (ROME's u, with its ridge 1e-4 · mean diag; MEMIT's single-key direction).
With ``--gate NAME SMALL WIKI`` (repeatable) the sanity gate's results with both C
(``benchmarks/editor_sanity_gate.py --hparams '{"mom2_dataset": ...}'``) are set side by side on the facts
both scored.

    OMP_NUM_THREADS=1 python benchmarks/key_statistics.py --out benchmarks/results/hf/key_statistics.json \\
        [--gate memit SMALL.json WIKI.json]

Each corpus's C is kept in the cache, so a rerun only recomputes what is missing (the full pass: about half
an hour of one CPU core).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from factkernels import hf
from factkernels.editing import hparams
from factkernels.environment import environment
from factkernels.experiments import engine
from factkernels.hf.editors import context_keys
from factkernels.hf.statistics import key_second_moments, mom2_texts, second_moment_tokens

MODEL = "smollm2-135m"
LAYERS = (3, 4, 5, 6, 7, 8)
REFERENCE = "wikipedia"
CORPORA = {"wikipedia": ("wikipedia", None), "wikipedia_first_100": ("wikipedia", 100),
           "wikipedia_first_1000": ("wikipedia", 1000), "smollm2_text": ("smollm2_text", None)}
GATE_FACTS = Path(__file__).resolve().parent / "results" / "hf" / "editor_sanity_gate.json"


def edit_directions(cov: torch.Tensor, keys: torch.Tensor, ridge: float) -> torch.Tensor:
    """(C + ridge · mean diag C · I)⁻¹ kᵀ as rows (n, h), unit length."""
    cov = cov.double()
    eye = torch.eye(cov.shape[0], dtype=cov.dtype)
    rows = torch.linalg.solve(cov + ridge * cov.diagonal().mean() * eye, keys.double().T).T
    return rows / rows.norm(dim=1, keepdim=True)


def gate_summary(small_path: Path, wiki_path: Path) -> dict:
    """Each method's sanity-gate rows with the small C and with Wikipedia's C, on the facts both scored."""
    small, wiki = (json.loads(Path(p).read_text())["methods"] for p in (small_path, wiki_path))
    out = {}
    for method in sorted(set(small) & set(wiki)):
        rows_small = {r["subject"]: r for r in small[method]["rows"]}
        rows_wiki = {r["subject"]: r for r in wiki[method]["rows"]}
        common = [s for s in rows_wiki if s in rows_small]
        if not common:
            continue
        side = {}
        for name, rows, entry in (("smollm2_text", rows_small, small[method]), ("wikipedia", rows_wiki, wiki[method])):
            picked = [rows[s] for s in common]
            side[name] = {"stats_tokens": entry.get("stats_tokens"), "null_space_dims": entry.get("null_space_dims"),
                          "efficacy_score": sum(r["success"] for r in picked) / len(picked),
                          "exact_match": sum(r["exact"] for r in picked) / len(picked),
                          "magnitude": sum(r["new_logprob"] - r["true_logprob"] for r in picked) / len(picked),
                          "new_logprob": [r["new_logprob"] for r in picked],
                          "nll_target": [r["nll_target"] for r in picked]}
        out[method] = {"facts": common, "hparams": wiki[method]["hparams"], **side,
                       "files": {"smollm2_text": str(small_path), "wikipedia": str(wiki_path)}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gate", nargs=3, action="append", default=[], metavar=("METHOD", "SMALL", "WIKI"),
                        help="sanity-gate JSON files with the small C and with Wikipedia's C")
    args = parser.parse_args()
    load_before = os.getloadavg()
    model, tok = hf.load(MODEL)
    corpora, covs = {}, {}
    for name, (dataset, n_samples) in CORPORA.items():
        texts = mom2_texts(dataset, n_samples)
        cached = all(second_moment_tokens(model, layer, texts=texts) is not None for layer in LAYERS)
        wall, cpu = time.perf_counter(), time.process_time()
        covs[name] = key_second_moments(model, tok, LAYERS, texts=texts)
        corpora[name] = {"mom2_dataset": dataset, "mom2_n_samples": n_samples, "documents": len(texts),
                         "tokens": second_moment_tokens(model, LAYERS[0], texts=texts),
                         "seconds": None if cached else time.perf_counter() - wall,
                         "cpu_seconds": None if cached else time.process_time() - cpu}
        print(name, corpora[name], flush=True)
    facts = [hf.Request(f["prompt"], f["subject"], f["target_new"], f["target_true"])
             for f in json.loads(GATE_FACTS.read_text())["facts"]]
    ridge = hparams("rome").ridge
    alpha = hparams("alphaedit")
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
                          "null_space_dims_at_2e-2": int((eigenvalues < alpha.nullspace_threshold).sum()),
                          "smallest_eigenvalue": float(eigenvalues[0]),
                          "edit_direction_cosine_mean": float(cosines.mean()),
                          "edit_direction_cosine_min": float(cosines.min())}
        layers[layer] = rows
    payload = {"benchmark": "key_statistics", "model": MODEL, "layers": list(LAYERS), "reference": REFERENCE,
               "corpora": corpora, "per_layer": layers, "edit_direction_facts": len(facts),
               "rome_ridge": ridge, "alphaedit_nullspace_threshold": alpha.nullspace_threshold,
               "sanity_gate": {method: gate_summary(Path(small), Path(wiki)).get(method)
                               for method, small, wiki in args.gate},
               "threads": torch.get_num_threads(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
               "environment": environment()}
    engine.write_json(args.out, payload, indent=1)
    print(json.dumps({layer: {n: round(r["relative_frobenius_to_wikipedia"], 4) for n, r in rows.items()}
                      for layer, rows in layers.items()}))


if __name__ == "__main__":
    main()
