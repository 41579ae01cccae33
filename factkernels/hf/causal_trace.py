"""Causal tracing (Meng et al. 2022, ROME §2.1): which hidden states carry a fact.

The subject's token embeddings are corrupted with Gaussian noise (``noise`` × the standard deviation of
the input embeddings, ROME's 3σ), which destroys the answer; then clean states at one token are put back
into the corrupted run. The probability of the answer's first token that this restores, averaged over
``samples`` noise draws, says how much the fact flows through those states. ``kind`` says which states:
"hidden" (the residual stream after layer l), "mlp" (the MLP outputs of the ``window`` layers around l,
ROME's ``trace_with_repatch`` with ``kind="mlp"``: layers max(0, l − w//2) .. l + ⌈w/2⌉ − 1). ROME edits
the MLP of the layer whose MLP restores most at the subject's last token.

    effect = causal_trace(model, tok, "The Eiffel Tower is in", subject="The Eiffel Tower", answer=" Paris")
    effect.scores          # (layers, tokens) answer probability with that state restored
    effect.clean, effect.corrupted
    layer, per_layer = traced_layer(model, tok, requests, kind="mlp", window=10)   # ROME's choice over facts
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from .capture import model_device
from .layout import mlp_layers
from .requests import Request, make_request, parse_requests
from .residual import layer_output

KINDS = ("hidden", "mlp")


@dataclass
class TraceResult:
    """scores (layers, tokens): the answer's probability with the clean states of layer l (see ``kind`` and
    ``window``) at token t restored into the corrupted run (NaN where not traced); clean / corrupted: the
    probability without noise / with noise and nothing restored; subject: [start, end) token range of the
    subject; tokens: the prompt's tokens; answer_id; kind; window."""

    scores: torch.Tensor
    clean: float
    corrupted: float
    subject: tuple[int, int]
    tokens: list[str]
    answer_id: int
    kind: str = "hidden"
    window: int = 1

    def subject_last(self) -> torch.Tensor:
        """Indirect effect per layer (layers,) at the subject's last token: restored minus corrupted."""
        return self.scores[:, self.subject[1] - 1] - self.corrupted

    def best_layer(self) -> int:
        """The layer whose states at the subject's last token restore the answer most."""
        return int(self.scores[:, self.subject[1] - 1].argmax())


def window_layers(layer: int, window: int, num_layers: int) -> range:
    """ROME's restoring window around ``layer``: max(0, layer − window//2) up to layer + ⌈window/2⌉ (exclusive)."""
    return range(max(0, layer - window // 2), min(num_layers, layer - (-window // 2)))


def embedding_std(model: Any) -> float:
    """Standard deviation of every entry of the input embedding matrix (the default noise unit)."""
    return float(model.get_input_embeddings().weight.detach().float().std())


def subject_embedding_std(model: Any, tok: Any, requests: Sequence[Request]) -> float:
    """Standard deviation of the subjects' token embeddings (ROME's ``collect_embedding_std``)."""
    ids = sorted({i for r in requests for i in tok(r.subject, add_special_tokens=False)["input_ids"]})
    return float(model.get_input_embeddings().weight[ids].detach().float().std())


@torch.no_grad()
def causal_trace(model: Any, tok: Any, prompt: str, subject: str, answer: Optional[str] = None, *,
                 samples: int = 10, noise: float = 3.0, seed: int = 0, kind: str = "hidden", window: int = 1,
                 noise_std: Optional[float] = None, tokens: str = "all", batch_rows: int = 320) -> TraceResult:
    """Trace ``prompt`` (containing ``subject``, or with "{}" where it goes) for ``answer`` (default: the
    model's own greedy next token); see the module docstring. noise_std: the embedding standard deviation the
    noise is ``noise`` times (default :func:`embedding_std`). tokens: "all" or "subject_last" (only that
    column is traced, the rest NaN). batch_rows: rows per forward pass (restorations × samples)."""
    if samples < 1 or not noise > 0:
        raise ValueError(f"samples must be >= 1 and noise > 0, got samples={samples}, noise={noise}")
    if kind not in KINDS or window < 1:
        raise ValueError(f"kind must be one of {KINDS} and window >= 1, got kind={kind!r}, window={window!r}")
    if tokens not in ("all", "subject_last"):
        raise ValueError(f"tokens must be 'all' or 'subject_last', got {tokens!r}")
    request = make_request({"prompt": prompt, "subject": subject, "target_new": answer or " ?"})
    device = model_device(model)
    enc = tok(request.text, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]], device=device)
    start, end = request.subject_span
    inside = [t for t, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < end and b > start]
    span = (inside[0], inside[-1] + 1)
    layers = model.model.layers
    num_layers, length = len(mlp_layers(model)), ids.shape[1]
    sites = [layers[l] if kind == "hidden" else layers[l].mlp for l in range(num_layers)]
    embed = model.get_input_embeddings()
    scale = noise * (embedding_std(model) if noise_std is None else noise_std)
    clean_states: dict[int, torch.Tensor] = {}
    hooks = [site.register_forward_hook(lambda _m, _a, out, l=l: clean_states.__setitem__(l, layer_output(out)[0]))
             for l, site in enumerate(sites)]
    try:
        clean_logits = model(input_ids=ids).logits[0, -1].float()
    finally:
        for h in hooks:
            h.remove()
    answer_id = int(clean_logits.argmax()) if answer is None else tok(request.target_new, add_special_tokens=False)["input_ids"][0]
    clean = float(clean_logits.softmax(-1)[answer_id])
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randn(samples, span[1] - span[0], embed.weight.shape[1], generator=generator).to(device) * scale

    def probs(restorations: list[tuple[int, int]]) -> torch.Tensor:
        """Answer probability (len(restorations),) averaged over samples; (-1, -1) restores nothing."""
        groups = len(restorations)
        where: dict[int, list[tuple[int, int]]] = {}  # site layer -> [(group, token)]
        for g, (layer, token) in enumerate(restorations):
            if layer >= 0:
                for l in (window_layers(layer, window, num_layers) if kind == "mlp" else (layer,)):
                    where.setdefault(l, []).append((g, token))

        def corrupt(_m: Any, _a: Any, out: torch.Tensor) -> torch.Tensor:
            out = out.clone()
            out[:, span[0]:span[1]] += draws.repeat(groups, 1, 1).to(out.dtype)
            return out

        def put_back(l: int):
            def hook(_m: Any, _a: Any, out: Any) -> Any:
                hidden = layer_output(out).clone()
                for g, token in where[l]:
                    hidden[g * samples:(g + 1) * samples, token] = clean_states[l][token]
                return (hidden, *out[1:]) if isinstance(out, tuple) else hidden
            return hook

        handles = [embed.register_forward_hook(corrupt)]
        handles += [sites[l].register_forward_hook(put_back(l)) for l in where]
        try:
            logits = model(input_ids=ids.expand(groups * samples, -1)).logits[:, -1].float()
        finally:
            for h in handles:
                h.remove()
        return logits.softmax(-1)[:, answer_id].view(groups, samples).mean(1).cpu()

    corrupted = float(probs([(-1, -1)])[0])
    columns = range(length) if tokens == "all" else [span[1] - 1]
    todo = [(l, t) for l in range(num_layers) for t in columns]
    per_pass = max(1, batch_rows // samples)
    found = torch.cat([probs(todo[i:i + per_pass]) for i in range(0, len(todo), per_pass)])
    scores = torch.full((num_layers, length), float("nan"))
    scores[[l for l, _ in todo], [t for _, t in todo]] = found
    names = [tok.decode([i]) for i in enc["input_ids"]]
    return TraceResult(scores, clean, corrupted, span, names, answer_id, kind, window)


def traced_layer(model: Any, tok: Any, requests: Any, *, samples: int = 10, noise: float = 3.0, seed: int = 0,
                 kind: str = "hidden", window: int = 1) -> tuple[int, torch.Tensor]:
    """ROME's layer choice: (the layer whose states at the subject's last token restore the answer most on
    average over ``requests`` (their ``target_true``, else the model's own answer), the mean indirect effect
    per layer (layers,): restored minus corrupted probability). The noise is ``noise`` × the standard
    deviation of the requests' subject token embeddings, as ROME's ``collect_embedding_std``."""
    reqs = list(parse_requests(requests))
    std = subject_embedding_std(model, tok, reqs)
    effects = [causal_trace(model, tok, r.prompt, r.subject, r.target_true, samples=samples, noise=noise, seed=seed,
                            kind=kind, window=window, noise_std=std, tokens="subject_last").subject_last()
               for r in reqs]
    mean = torch.stack(effects).mean(0)
    return int(mean.argmax()), mean


def editor_layers(mlp_effect: torch.Tensor, counts: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The editors' layers from the mean MLP indirect effect per layer (layers,), as their authors chose them:
    ROME ("rome") the peak; the others ``counts[method]`` consecutive layers ending at the peak (MEMIT's GPT-2 XL
    layers 13-17 end at ROME's 17), moved up when the peak is too shallow to end there."""
    peak = int(mlp_effect.argmax())
    out = {}
    for method, count in counts.items():
        count = 1 if method == "rome" else min(count, len(mlp_effect))
        first = max(0, peak - count + 1)
        out[method] = tuple(range(first, first + count))
    return out


__all__ = ["causal_trace", "traced_layer", "editor_layers", "TraceResult", "window_layers", "embedding_std",
           "subject_embedding_std"]
