"""The editors' residual step (ROME's ``compute_v``, MEMIT's and AlphaEdit's ``compute_z``) on real models.

For each fact, a vector δ is added to the output of ``layer``'s MLP at the subject's last token of the
prompt under every context (the bare prompt and the generated prefixes, :mod:`factkernels.hf.contexts`)
and of "{subject} is a". It is trained with Adam for ``steps`` iterations at ``lr`` on

    mean over contexts of the target's mean token NLL
    + kl_factor · KL(p_δ || p) of the next token after the subject in "{} is a"
    + weight_decay · ||δ|| / ||h||²

with ||δ|| clamped to ``clamp_norm`` · ||h|| after each step; h is the bare prompt's MLP output (ROME,
``clamp_to="mlp"``) or residual stream after the layer (MEMIT, AlphaEdit, "layer"), where the unedited
model has it. As the references, a fact stops when its loss falls below ``early_stop`` and the last
iteration only measures. Facts are independent, so they are trained a chunk at a time.

δ changes nothing before the subject's last token: one forward per chunk keeps the residual stream after
``layer`` from that token on and the later blocks' keys and values before it
(:func:`~factkernels.hf.capture.tail_start`), and every step runs only the later blocks on those positions
(a model whose tail does not match its full forward adds δ by a hook in the full forward instead).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import torch
import torch.nn.functional as F_nn

from ..progress import progress_bar
from .capture import PromptBatch, encode_requests, final_hidden, hidden_with_delta, logits_at, model_device, \
    tail_matches, tail_start, tail_with_delta
from .checkpoint import ChunkCheckpoint, fingerprint
from .contexts import with_prefixes
from .layout import mlp_module
from .requests import Request

KL_PROMPT = "{} is a"  # ROME/MEMIT's essence prompt for the KL term
CLAMP_TO = ("mlp", "layer")


@dataclass
class ResidualTargets:
    """Per fact (n rows): delta (n, d) the trained δ; mlp_out (n, d) the unedited MLP output and
    layer_out (n, d) the unedited residual stream after the layer, at the subject's last token of the bare
    prompt; nll_before / nll_after (n,) the target's mean NLL over the contexts without / with δ. layer and
    settings say how they were made, so a later edit can reuse them only where they apply;
    restored_seconds: the time earlier runs spent on the chunks read back from a checkpoint."""

    delta: torch.Tensor
    mlp_out: torch.Tensor
    layer_out: torch.Tensor
    nll_before: torch.Tensor
    nll_after: torch.Tensor
    layer: int = -1
    settings: dict = field(default_factory=dict)
    restored_seconds: float = 0.0


@contextmanager
def frozen(model: Any) -> Iterator[None]:
    """Model parameters without gradients (only δ is trained); restored afterwards."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)


def layer_output(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def target_nll(model: Any, batch: PromptBatch, hidden: Optional[torch.Tensor] = None,
               begin: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean NLL (n,) of each row's target tokens given its prompt (logits only where needed); hidden: the
    batch's final hidden states (n, T, d) when the caller ran the model already (else a forward runs here),
    from position begin (n,) long of each row on (default 0)."""
    device = model_device(model)
    if hidden is None:
        hidden = final_hidden(model, batch.input_ids, batch.attention_mask)
    rows, positions, targets = batch.target_positions()
    logits = logits_at(model, hidden, rows, positions if begin is None else positions - begin[rows])
    token_nll = F_nn.cross_entropy(logits, targets.to(device), reduction="none")
    return torch.zeros(len(batch), device=device).index_add(0, rows.to(device), token_nll) / batch.target_len.to(device)


def delta_penalty(delta: torch.Tensor, ref_norm: torch.Tensor, weight_decay: float) -> torch.Tensor:
    """The references' weight decay (n,): weight_decay · ||δ|| / ||h||² for δ (n, d) and ||h|| (n,)."""
    return weight_decay * delta.norm(dim=1) / ref_norm.pow(2)


def subject_log_probs(model: Any, batch: PromptBatch, hidden: Optional[torch.Tensor] = None,
                      begin: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Next-token log-probabilities (n, vocab) at each row's subject's last token; hidden, begin: as
    :func:`target_nll`."""
    if hidden is None:
        hidden = final_hidden(model, batch.input_ids, batch.attention_mask)
    positions = batch.subject_last if begin is None else batch.subject_last - begin
    return F_nn.log_softmax(logits_at(model, hidden, torch.arange(len(batch)), positions), dim=-1)


@dataclass
class _DeltaRows:
    """Rows that take a δ at their subject's last token: ``batch`` and, where the model's tail matches its full
    forward, ``cached`` = :func:`~factkernels.hf.capture.tail_start` from the subject's last token (states (n, S,
    d), mask (n, S), past), else None (δ by a hook in the full forward)."""

    batch: PromptBatch
    cached: Optional[tuple] = None

    @classmethod
    def of(cls, model: Any, layer: int, batch: PromptBatch, tail: bool, last: torch.Tensor) -> "_DeltaRows":
        """The rows of ``batch``, cached when ``tail``, each read up to position last (n,) long (the forward
        ends there: nothing after it is scored)."""
        if not tail:
            return cls(batch)
        upto = torch.arange(batch.input_ids.shape[1]) <= last[:, None]
        cut = PromptBatch(batch.input_ids, batch.attention_mask * upto, batch.subject_last, batch.prompt_last,
                          batch.target_len, batch.subject_first)
        return cls(batch, tail_start(model, cut, layer, batch.subject_last, batch_size=len(batch)))

    def hidden(self, model: Any, layer: int, index: torch.Tensor,
               delta: torch.Tensor) -> tuple[PromptBatch, torch.Tensor, Optional[torch.Tensor]]:
        """Rows ``index`` (k,) long with δ (k, d) added to ``layer``'s MLP output at their subject's last token:
        (their batch, final hidden states (k, S, d), the position (k,) of each row's first state or None for 0).
        Differentiable in δ."""
        sub = self.batch.rows(index.cpu())
        if self.cached is None:
            return sub, hidden_with_delta(model, layer, sub, None, torch.arange(len(sub)), sub.subject_last,
                                          delta), None
        return sub, tail_with_delta(model, layer, self.cached, index, delta), sub.subject_last


def residual_targets(model: Any, tok: Any, requests: Sequence[Request], layer: int, *, steps: int, lr: float,
                     weight_decay: float, clamp_norm: Optional[float], clamp_to: str, kl_factor: float,
                     early_stop: Optional[float] = 5e-2, prefixes: Sequence[str] = (), chunk: int = 8,
                     progress: Optional[bool] = None,
                     checkpoint: Union[str, Path, None] = None) -> ResidualTargets:
    """Train δ at ``layer``'s MLP output for every request (see the module docstring) under the bare prompt
    and each of ``prefixes``. clamp_to: "mlp" (ROME) or "layer" (MEMIT, AlphaEdit); clamp_norm None: no clamp.
    checkpoint: a .safetensors file (:class:`~factkernels.hf.checkpoint.ChunkCheckpoint`) where each finished
    chunk is written at once and from which a rerun reads the chunks it holds."""
    if clamp_to not in CLAMP_TO:
        raise ValueError(f"clamp_to must be one of {CLAMP_TO}, got {clamp_to!r}")
    if steps < 1 or not lr > 0:
        raise ValueError(f"steps must be >= 1 and lr > 0, got steps={steps}, lr={lr}")
    mlp_module(model, layer)  # validates the layout and the layer
    device = model_device(model)
    settings = {"steps": steps, "lr": lr, "weight_decay": weight_decay, "clamp_norm": clamp_norm,
                "kl_factor": kl_factor, "early_stop": early_stop, "clamp_to": clamp_to, "prefixes": list(prefixes)}
    saved = None
    if checkpoint is not None:
        every = encode_requests(tok, with_prefixes(list(requests), prefixes), with_target=True)
        saved = ChunkCheckpoint(checkpoint, fingerprint(model, layer, (every.input_ids, every.attention_mask),
                                                        {**settings, "chunk": chunk}))
    names = ("delta", "mlp_out", "layer_out", "nll_before", "nll_after")
    parts: list[tuple[torch.Tensor, ...]] = []
    restored = 0.0
    with frozen(model):
        # each step runs only the blocks after ``layer`` from the subject's last token on (the tail checked on two
        # prompts against the full forward; a model whose tail differs keeps the hooked full forward)
        probe = encode_requests(tok, list(requests[:2]), with_target=True)
        tail = tail_matches(model, probe.input_ids, probe.attention_mask, layer)
        for start in progress_bar(range(0, len(requests), chunk), desc=f"targets at layer {layer}",
                                  enabled=progress is not False, leave=False):
            if saved is not None and start in saved.chunks:
                tensors, info = saved.chunks[start]
                parts.append(tuple(tensors[name].to(device) for name in names))
                restored += info["seconds"]
                continue
            chunk_start = time.perf_counter()
            part = list(requests[start:start + chunk])
            parts.append(_train_chunk(model, tok, part, layer, prefixes, tail, steps=steps, lr=lr,
                                      weight_decay=weight_decay, clamp_norm=clamp_norm, clamp_to=clamp_to,
                                      kl_factor=kl_factor, early_stop=early_stop))
            if saved is not None:
                saved.put(start, dict(zip(names, parts[-1])), {"seconds": time.perf_counter() - chunk_start})
    return ResidualTargets(*(torch.cat(cols) for cols in zip(*parts)), layer=layer, settings=settings,
                           restored_seconds=restored)


def _train_chunk(model: Any, tok: Any, part: list[Request], layer: int, prefixes: Sequence[str], tail: bool, *,
                 steps: int, lr: float, weight_decay: float, clamp_norm: Optional[float], clamp_to: str,
                 kl_factor: float, early_stop: Optional[float]) -> tuple[torch.Tensor, ...]:
    """δ for one chunk of facts: rows are fact-major (fact f, context c at f·contexts + c)."""
    device = model_device(model)
    mlp, block = mlp_module(model, layer), model.model.layers[layer]
    contexts, n = 1 + len(prefixes), len(part)
    facts = encode_requests(tok, with_prefixes(part, prefixes), with_target=True)
    essence = encode_requests(tok, [Request(KL_PROMPT, r.subject, r.target_new) for r in part])
    owner = torch.arange(n, device=device).repeat_interleave(contexts)  # (n·contexts,) fact of each row
    bare = torch.arange(n, device=device) * contexts  # the bare prompt's row of each fact
    seen: dict[str, torch.Tensor] = {}
    hooks = [mlp.register_forward_hook(lambda _m, _a, out: seen.__setitem__("mlp", out)),
             block.register_forward_hook(lambda _m, _a, out: seen.__setitem__("layer", layer_output(out)))]
    try:
        with torch.no_grad():
            row_nll = target_nll(model, facts)
            where = facts.subject_last.to(device)
            rows = torch.arange(len(facts), device=device)
            mlp_out, layer_out = seen["mlp"][rows, where][bare], seen["layer"][rows, where][bare]
            base_log_probs = subject_log_probs(model, essence) if kl_factor > 0 else None
    finally:
        for h in hooks:
            h.remove()
    # the steps read the targets' logits (up to the last target's predecessor) and the essence prompt's at its
    # subject's last token only
    fact_rows = _DeltaRows.of(model, layer, facts, tail, facts.prompt_last + facts.target_len - 1)
    essence_rows = _DeltaRows.of(model, layer, essence, tail, essence.subject_last) if kl_factor > 0 else None
    nll_before = row_nll.view(n, contexts).mean(1)
    ref_norm = (mlp_out if clamp_to == "mlp" else layer_out).norm(dim=1, keepdim=True)  # (n, 1)
    delta = torch.zeros_like(mlp_out, requires_grad=True)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    kept = torch.zeros_like(mlp_out)
    opt = torch.optim.Adam([delta], lr=lr)
    for it in range(steps):
        # facts are independent: only those still training run (same result, less work)
        act = (~done).nonzero().flatten()
        act_rows = (act[:, None] * contexts + torch.arange(contexts, device=device)).flatten()
        sub, hidden, begin = fact_rows.hidden(model, layer, act_rows, delta[owner[act_rows]])
        nll = target_nll(model, sub, hidden, begin).view(len(act), contexts).mean(1)
        d_act = delta[act]
        loss = nll + delta_penalty(d_act, ref_norm[act].squeeze(1), weight_decay)
        if essence_rows is not None:
            sub, hidden, begin = essence_rows.hidden(model, layer, act, d_act)
            log_probs = subject_log_probs(model, sub, hidden, begin)
            # KL(p_δ || p), as the references' kl_div(init, current, log_target=True)
            kl = (log_probs.exp() * (log_probs - base_log_probs[act])).sum(1)
            loss = loss + kl_factor * kl
        with torch.no_grad():  # a fact below early_stop, or at the last iteration, keeps its δ
            stop = (loss < early_stop) if early_stop is not None else torch.zeros_like(loss, dtype=torch.bool)
            newly = act if it == steps - 1 else act[stop]
            kept[newly] = delta[newly]
            done[newly] = True
        if bool(done.all()):
            break
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        opt.step()
        with torch.no_grad():
            if clamp_norm is not None:
                delta.mul_(torch.clamp(clamp_norm * ref_norm / delta.norm(dim=1, keepdim=True).clamp_min(1e-12),
                                       max=1.0))
            delta[done] = kept[done]
    delta = kept.detach()
    with torch.no_grad():
        sub, hidden, begin = fact_rows.hidden(model, layer, rows, delta[owner])
        nll_after = target_nll(model, sub, hidden, begin).view(n, contexts).mean(1)
    return delta, mlp_out, layer_out, nll_before, nll_after


__all__ = ["KL_PROMPT", "ResidualTargets", "residual_targets", "target_nll", "frozen", "delta_penalty",
           "subject_log_probs"]
