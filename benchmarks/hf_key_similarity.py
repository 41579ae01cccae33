"""How distinct are the prompt-end keys of different subjects? (why last-layer keys miss neighbours)

    python benchmarks/hf_key_similarity.py --facts 30 --layers 12 18 22 25 29

For book facts in the insertion template, the MLP input at the prompt's last token of each
neighbour (another book, same template) against the inserted facts' keys: the largest cosine and
the largest detector score s_i (whitened as insert_facts does, with and without contrast states).
Writes benchmarks/results/hf/key_similarity.json.
"""

import argparse
import json
from pathlib import Path

import torch

from factkernels import datasets, hf
from factkernels.environment import environment
from factkernels.hf.capture import pad_id, pad_right
from factkernels.hf.insert import capture_at_keys, background_states, contrast_states, key_positions


def detector_scores(keys: torch.Tensor, states: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    """s_i(x) = w_iᵀ(x − μ), w_i = Σ⁻¹(k_i − μ) / ‖k_i − μ‖²_Σ (ridge 1e-2), as in detector_mlp: (n_states, n_keys)."""
    x = background.double()
    mu = x.mean(0)
    c = x - mu
    sigma = c.T @ c / len(x)
    sigma += 1e-2 * sigma.diagonal().mean() * torch.eye(sigma.shape[0], dtype=torch.double)
    diff = keys.double() - mu
    w = torch.linalg.solve(sigma, diff.T).T
    w = w / (w * diff).sum(1, keepdim=True)
    return (states.double() - mu) @ w.T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--facts", type=int, default=30)
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 18, 22, 25, 29])
    parser.add_argument("--out", default="benchmarks/results/hf/key_similarity.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tok = hf.load("smollm2-135m")
    facts = hf.book_requests(args.facts, seed=0)
    batch = hf.encode_requests(tok, facts.requests, with_target=True)
    at = key_positions(batch, "target")
    first = torch.tensor([int((at.fact == i).nonzero()[0, 0]) for i in range(args.facts)])  # prompt-end keys
    ids, mask = pad_right([tok(p)["input_ids"] for p in facts.neighborhood], pad_id(tok))
    quantiles = torch.tensor([0.1, 0.5, 0.9, 1.0], dtype=torch.double)
    rows = []
    for layer in args.layers:
        keys = capture_at_keys(model, batch, layer, at, 32)
        neighbours = hf.capture(model, ids, mask, layer, positions=mask.sum(1) - 1)
        texts = background_states(model, tok, datasets.natural_text("stats")[:20], layer)
        contrast = contrast_states(model, tok, facts.requests, layer, "target", rounds=2)
        cos = torch.nn.functional.normalize(neighbours, dim=1) @ torch.nn.functional.normalize(keys[first], dim=1).T
        row = {"layer": layer, "cosine_max_quantiles": torch.quantile(cos.max(1).values.double(), quantiles).tolist()}
        for name, bg in (("text", texts), ("text+contrast", torch.cat([texts, contrast]))):
            s = detector_scores(keys[first], neighbours, bg)
            row[f"score_max_quantiles_{name}"] = torch.quantile(s.max(1).values, quantiles).tolist()
        rows.append(row)
        print(row, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": vars(args), "quantiles": quantiles.tolist(), "rows": rows,
                                          "environment": environment()}, indent=1))


if __name__ == "__main__":
    main()
