"""Causal tracing (Meng et al. 2022, ROME §2.1): which hidden states carry a fact.

The subject's token embeddings are corrupted with Gaussian noise (``noise`` × the standard deviation of
the model's input embeddings, ROME's 3σ), which destroys the answer; then the clean run's hidden state
after one layer at one token is put back into the corrupted run. The probability of the answer's first
token that this restores, averaged over ``samples`` noise draws, says how much the fact flows through that
state. ROME edits the MLP of the layer whose subject-last-token states restore most.

    effect = causal_trace(model, tok, "The Eiffel Tower is in", subject="The Eiffel Tower", answer=" Paris")
    effect.scores          # (layers, tokens) answer probability with that state restored
    effect.clean, effect.corrupted
    layer, per_layer = traced_layer(model, tok, requests)   # ROME's choice over a set of facts
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .capture import model_device
from .layout import mlp_layers
from .requests import make_request
from .residual import layer_output


@dataclass
class TraceResult:
    """scores (layers, tokens): the answer's probability with the clean state after layer l at token t restored
    into the corrupted run; clean / corrupted: the probability without noise / with noise and nothing
    restored; subject: [start, end) token range of the subject; tokens: the prompt's tokens; answer_id."""

    scores: torch.Tensor
    clean: float
    corrupted: float
    subject: tuple[int, int]
    tokens: list[str]
    answer_id: int

    def best_layer(self) -> int:
        """The layer whose state at the subject's last token restores the answer most."""
        return int(self.scores[:, self.subject[1] - 1].argmax())


@torch.no_grad()
def causal_trace(model: Any, tok: Any, prompt: str, subject: str, answer: Optional[str] = None, *,
                 samples: int = 10, noise: float = 3.0, seed: int = 0) -> TraceResult:
    """Trace ``prompt`` (containing ``subject``, or with "{}" where it goes) for ``answer`` (default: the
    model's own greedy next token); see the module docstring. Returns a :class:`TraceResult`."""
    if samples < 1 or not noise > 0:
        raise ValueError(f"samples must be >= 1 and noise > 0, got samples={samples}, noise={noise}")
    request = make_request({"prompt": prompt, "subject": subject, "target_new": answer or " ?"})
    device = model_device(model)
    enc = tok(request.text, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]], device=device)
    start, end = request.subject_span
    inside = [t for t, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < end and b > start]
    span = (inside[0], inside[-1] + 1)
    layers = model.model.layers
    num_layers, tokens = len(mlp_layers(model)), ids.shape[1]
    embed = model.get_input_embeddings()
    scale = noise * float(embed.weight.float().std())
    clean_states: dict[int, torch.Tensor] = {}
    hooks = [layers[l].register_forward_hook(lambda _m, _a, out, l=l: clean_states.__setitem__(l, layer_output(out)))
             for l in range(num_layers)]
    try:
        clean_logits = model(input_ids=ids).logits[0, -1].float()
    finally:
        for h in hooks:
            h.remove()
    if answer is None:
        answer_id = int(clean_logits.argmax())
    else:
        answer_id = tok(request.target_new, add_special_tokens=False)["input_ids"][0]
    clean = float(clean_logits.softmax(-1)[answer_id])
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randn(samples, span[1] - span[0], embed.weight.shape[1], generator=generator).to(device) * scale
    batch = ids.expand(samples, -1)

    def corrupt(_m: Any, _a: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[:, span[0]:span[1]] += draws.to(out.dtype)
        return out

    def answer_prob(restore: Optional[tuple[int, int]]) -> float:
        handles = [embed.register_forward_hook(corrupt)]
        if restore is not None:
            layer, token = restore

            def put_back(_m: Any, _a: Any, out: Any) -> Any:
                hidden = layer_output(out).clone()
                hidden[:, token] = clean_states[layer][0, token]
                return (hidden, *out[1:]) if isinstance(out, tuple) else hidden
            handles.append(layers[layer].register_forward_hook(put_back))
        try:
            logits = model(input_ids=batch).logits[:, -1].float()
        finally:
            for h in handles:
                h.remove()
        return float(logits.softmax(-1)[:, answer_id].mean())

    corrupted = answer_prob(None)
    scores = torch.tensor([[answer_prob((l, t)) for t in range(tokens)] for l in range(num_layers)])
    names = [tok.decode([i]) for i in enc["input_ids"]]
    return TraceResult(scores, clean, corrupted, span, names, answer_id)


def traced_layer(model: Any, tok: Any, requests: Any, *, samples: int = 10, noise: float = 3.0,
                 seed: int = 0) -> tuple[int, torch.Tensor]:
    """ROME's layer choice: (the layer whose state at the subject's last token restores the answer most on
    average over ``requests`` (their ``target_true``, else the model's own answer), the mean indirect
    effect per layer (layers,): restored minus corrupted probability)."""
    from .requests import parse_requests

    effects = []
    for r in parse_requests(requests):
        trace = causal_trace(model, tok, r.prompt, r.subject, r.target_true, samples=samples, noise=noise, seed=seed)
        effects.append(trace.scores[:, trace.subject[1] - 1] - trace.corrupted)
    mean = torch.stack(effects).mean(0)
    return int(mean.argmax()), mean


__all__ = ["causal_trace", "traced_layer", "TraceResult"]
