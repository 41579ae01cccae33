"""Tokenising requests and capturing hidden states with forward hooks.

Batches are right-padded, so every real token keeps its position (and its RoPE phase)
and causal attention never sees a pad before a real token; ``attention_mask`` marks the
real tokens. Three capture sites per decoder layer L:

* ``"mlp_in"``: the MLP's input ``post_attention_layernorm(h)`` (d,), what gate/up see —
  the keys of :func:`factkernels.hf.insert_facts`;
* ``"down_in"``: the down projection's input ``act(gate(x)) * up(x)`` (intermediate,) —
  the keys of ROME/MEMIT/AlphaEdit;
* ``"block_out"``: the residual stream after the whole layer (d,).

Several sites of one layer come from one forward (``site=("mlp_in", "block_out")``).

    batch = encode_requests(tok, requests)                                  # PromptBatch
    keys = capture(model, batch.input_ids, batch.attention_mask, layer=8,
                   site="mlp_in", positions=batch.subject_last)             # (n, d)
    keys = capture_keys(model, tok, requests, layer=8)                      # the same in one call
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

import torch
from torch import nn

from .layout import mlp_module
from .requests import Request

SITES = ("mlp_in", "down_in", "block_out")
POSITIONS = ("subject_last", "prompt_last")


@dataclass
class PromptBatch:
    """Right-padded token ids of request prompts (optionally followed by their target tokens).

    input_ids, attention_mask: (n, T) long; subject_last, prompt_last: (n,) long positions of
    the subject's last token and the prompt's last token; target_len: (n,) long number of
    target tokens appended after ``prompt_last`` (0 without targets). Target token t of row i
    sits at ``prompt_last[i] + 1 + t`` and is predicted by the logits at ``prompt_last[i] + t``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    subject_last: torch.Tensor
    prompt_last: torch.Tensor
    target_len: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, sl: "slice | torch.Tensor") -> "PromptBatch":
        """The requests in ``sl`` (a slice or an index tensor) as their own batch, trimmed to their widest row."""
        mask = self.attention_mask[sl]
        width = int(mask.sum(1).max()) if mask.shape[0] else 0
        return PromptBatch(self.input_ids[sl][:, :width], mask[:, :width], self.subject_last[sl],
                           self.prompt_last[sl], self.target_len[sl])

    def target_ids(self, i: int) -> list[int]:
        start = int(self.prompt_last[i]) + 1
        return self.input_ids[i, start:start + int(self.target_len[i])].tolist()

    def target_positions(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every target token, flattened: (rows, positions, tokens), each (target_len.sum(),) long; the
        logits at (rows, positions) predict ``tokens`` (teacher-forced)."""
        rows = torch.repeat_interleave(torch.arange(len(self)), self.target_len)
        offsets = torch.cat([torch.arange(int(n)) for n in self.target_len]) if len(self) else rows
        positions = self.prompt_last[rows] + offsets
        return rows, positions, self.input_ids[rows, positions + 1]


def _require_fast(tok: Any) -> None:
    if not getattr(tok, "is_fast", False):
        raise TypeError(f"tokenizer must be a fast (Rust) tokenizer, got {type(tok).__name__}: "
                        "subject positions come from its offset mapping")


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists -> (input_ids (n, T), attention_mask (n, T)), right-padded."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def pad_id(tok: Any) -> int:
    return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)


def encode_requests(tok: Any, requests: Sequence[Request], *, with_target: bool = False) -> PromptBatch:
    """Tokenise ``request.text`` (plus ``target_new`` when ``with_target``) and locate the subject.

    The subject's last token is the last token whose character span starts before the
    subject's end, read from the fast tokenizer's offset mapping (robust to BPE merges at
    the subject's boundary). Targets are tokenised on their own, without special tokens,
    as ROME/MEMIT do.
    """
    _require_fast(tok)
    rows, subject_last, prompt_last, target_len = [], [], [], []
    for i, r in enumerate(requests):
        enc = tok(r.text, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        _, end = r.subject_span
        inside = [t for t, (a, b) in enumerate(offsets) if b > a and a < end]
        if not inside:
            raise ValueError(f"request {i}: no token of subject {r.subject!r} found in {r.text!r}")
        subject_last.append(inside[-1])
        prompt_last.append(len(ids) - 1)
        target = tok(r.target_new, add_special_tokens=False)["input_ids"] if with_target else []
        if with_target and not target:
            raise ValueError(f"request {i}: target_new {r.target_new!r} tokenises to nothing")
        target_len.append(len(target))
        rows.append(ids + list(target))
    input_ids, attention_mask = pad_right(rows, pad_id(tok))
    return PromptBatch(input_ids, attention_mask, torch.tensor(subject_last), torch.tensor(prompt_last),
                       torch.tensor(target_len))


def encode_texts(tok: Any, texts: Sequence[str], *, max_length: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Natural text -> right-padded (input_ids (n, T), attention_mask (n, T)), each text cut to max_length tokens."""
    if isinstance(texts, str) or not all(isinstance(t, str) and t.strip() for t in texts) or not texts:
        raise ValueError("texts must be a non-empty list of non-empty strings")
    rows = [tok(t)["input_ids"][:max_length] for t in texts]
    return pad_right(rows, pad_id(tok))


def site_module(model: Any, layer: int, site: str) -> nn.Module:
    """The module whose input (output for "block_out") is captured at ``site`` of ``layer``."""
    if site not in SITES:
        raise ValueError(f"site must be one of {SITES}, got {site!r}")
    mlp = mlp_module(model, layer)
    if site == "block_out":
        return model.model.layers[layer]
    return mlp if site == "mlp_in" else mlp.down_proj


@contextmanager
def record_inputs(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Context manager: a list that collects the first positional input of every ``module`` call."""
    seen: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    try:
        yield seen
    finally:
        handle.remove()


def model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


def final_hidden(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states (b, T, d), after the final norm, without the unembedding:
    callers apply ``model.lm_head`` only where they need logits (it costs ~20 % of a forward per position)."""
    device = model_device(model)
    return model.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                       use_cache=False).last_hidden_state


def tail_hidden(model: Any, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states (b, T, d) (as :func:`final_hidden`) from the residual stream after
    block ``layer`` (b, T, d): only the blocks after it and the final norm run. The model's own forward runs
    with its block list cut to those blocks and ``hidden`` as its input embeddings, so masks and rotary
    positions are the model's. Right padding only (positions 0..T-1). Callers check it against
    :func:`final_hidden` once (:func:`tail_matches`): a model that transforms its input embeddings would differ."""
    inner = model.model
    blocks = inner.layers
    inner.layers = torch.nn.ModuleList(list(blocks)[layer + 1:])
    try:
        return inner(inputs_embeds=hidden, attention_mask=attention_mask.to(hidden.device),
                     use_cache=False).last_hidden_state
    finally:
        inner.layers = blocks


def hidden_with_delta(model: Any, layer: int, batch: "PromptBatch", states: Optional[torch.Tensor],
                      rows: torch.Tensor, positions: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Final hidden states (b, T, d) of ``batch`` with δ (k, d) added to ``layer``'s MLP output at (rows,
    positions) (k,) each, distinct pairs. From ``states`` (b, T' ≥ T, d), the unedited residual stream after the
    layer, only the later blocks run (:func:`tail_hidden`): adding δ to the MLP output at a position adds it to
    the block's output there, and the earlier blocks never see it. Without states, a forward hook adds δ in a
    full forward. Differentiable in δ."""
    if states is None:
        def add(_module: Any, _args: Any, out: torch.Tensor) -> torch.Tensor:
            return out + torch.zeros_like(out).index_put((rows.to(out.device), positions.to(out.device)), delta)

        handle = mlp_module(model, layer).register_forward_hook(add)
        try:
            return final_hidden(model, batch.input_ids, batch.attention_mask)
        finally:
            handle.remove()
    start = states[:, :batch.input_ids.shape[1]].index_put(
        (rows.to(states.device), positions.to(states.device)), delta, accumulate=True)
    return tail_hidden(model, layer, start, batch.attention_mask)


@torch.no_grad()
def tail_matches(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: int) -> bool:
    """Whether :func:`tail_hidden` from the states after ``layer`` reproduces the full forward on these rows."""
    full = final_hidden(model, input_ids, attention_mask)
    start = block_outputs(model, input_ids, attention_mask, layer)
    tail = tail_hidden(model, layer, start, attention_mask)
    real = attention_mask.to(full.device).bool()
    return bool(torch.allclose(tail[real], full[real], rtol=1e-4, atol=1e-4 * float(full[real].abs().max())))


@torch.no_grad()
def block_outputs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: int, *,
                  batch_size: int = 64) -> torch.Tensor:
    """The residual stream after block ``layer`` at every position of right-padded rows: (n, T, d), zero at
    padding (the forward stops at the block)."""
    flat = capture(model, input_ids, attention_mask, layer, site="block_out", batch_size=batch_size)
    out = flat.new_zeros(*input_ids.shape, flat.shape[1])
    out[attention_mask.to(flat.device).bool()] = flat  # row-major real tokens, as capture returns them
    return out


def logits_at(model: Any, hidden: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Float logits (n, vocab) at (rows, positions) of ``hidden`` (b, T, d)."""
    return model.lm_head(hidden[rows.to(hidden.device), positions.to(hidden.device)]).float()


def length_sorted_chunks(lengths: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """Row indices in chunks of ``batch_size`` rows of similar length (lengths (n,)): batches of
    right-padded prompts then carry little padding (results go back by index)."""
    order = torch.argsort(lengths, stable=True)
    return list(order.split(batch_size))


class _Captured(Exception):
    """Raised by a capture hook once it holds its input: the rest of the forward is skipped."""


@torch.no_grad()
def capture(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: int, *,
            site: Union[str, tuple[str, ...]] = "mlp_in", positions: Optional[torch.Tensor] = None,
            batch_size: int = 64) -> Union[torch.Tensor, tuple[torch.Tensor, ...]]:
    """States at ``site`` of ``layer`` for right-padded batches (the forward stops there).

    input_ids, attention_mask: (n, T). positions: (n,) long -> returns (n, width) (one
    position per row); None -> every real token, (attention_mask.sum(), width) in row-major
    order. width = d for "mlp_in" and "block_out", intermediate size for "down_in".
    A tuple of sites returns one tensor per site, all from the same forwards.
    """
    sites = (site,) if isinstance(site, str) else tuple(site)
    if not sites:
        raise ValueError("site must name at least one capture site")
    modules = [site_module(model, layer, s) for s in sites]
    last = max(SITES.index(s) for s in sites)  # SITES are in forward order: the last one ends the forward
    device = model_device(model)
    seen: dict = {}

    def hook(name: str):
        def record(_module: Any, args: tuple, *output: Any) -> None:
            state = output[0] if output else args[0]
            seen[name] = (state[0] if isinstance(state, tuple) else state).detach()
            if SITES.index(name) == last:
                raise _Captured
        return record

    handles = [m.register_forward_hook(hook(s)) if s == "block_out" else m.register_forward_pre_hook(hook(s))
               for s, m in zip(sites, modules)]
    lengths = attention_mask.sum(1)
    # rows of similar length run together, each batch trimmed to its widest row (right padding:
    # trimming changes no real token), and the states go back to the callers' order
    starts = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
    out: list[Optional[torch.Tensor]] = [None] * len(sites)
    try:
        for chunk in length_sorted_chunks(lengths, batch_size):
            width = int(lengths[chunk].max())
            mask = attention_mask[chunk, :width].to(device)
            seen.clear()
            try:
                model.model(input_ids=input_ids[chunk, :width].to(device), attention_mask=mask, use_cache=False)
            except _Captured:
                pass
            real = mask.bool()
            if positions is None:
                dest = (starts[chunk, None] + torch.arange(width)).to(device)[real]
            else:
                dest = chunk.to(device)
            for i, s in enumerate(sites):
                hidden = seen[s]  # (b, width, state width)
                rows = hidden[real] if positions is None else \
                    hidden[torch.arange(hidden.shape[0], device=device), positions[chunk].to(device)]
                if out[i] is None:
                    total = int(lengths.sum()) if positions is None else input_ids.shape[0]
                    out[i] = rows.new_empty(total, rows.shape[1])
                out[i][dest] = rows
    finally:
        for handle in handles:
            handle.remove()
    return out[0] if isinstance(site, str) else tuple(out)


def capture_keys(model: Any, tok: Any, requests: Sequence[Request], layer: int, *, site: str = "mlp_in",
                 position: str = "subject_last", batch_size: int = 64) -> torch.Tensor:
    """Hidden state at ``site`` of ``layer`` at each request's subject-last (or prompt-last) token: (n, width)."""
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    batch = encode_requests(tok, requests)
    positions = batch.subject_last if position == "subject_last" else batch.prompt_last
    return capture(model, batch.input_ids, batch.attention_mask, layer, site=site, positions=positions,
                   batch_size=batch_size)
