"""Tokenising requests and capturing hidden states with forward hooks.

Batches are right-padded, so every real token keeps its position (and its RoPE phase)
and causal attention never sees a pad before a real token; ``attention_mask`` marks the
real tokens. Four capture sites per decoder layer L:

* ``"mlp_residual"``: the residual stream ``h`` entering the MLP's norm (d,): nothing an MLP edit changes comes
  before it, so an edited model's forward can start there (:class:`MidStates`);
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
from torch.nn.functional import pad as F_pad

from .layout import mlp_module
from .requests import Request

SITES = ("mlp_residual", "mlp_in", "down_in", "block_out")
POSITIONS = ("subject_last", "prompt_last")


@dataclass
class PromptBatch:
    """Right-padded token ids of request prompts (optionally followed by their target tokens).

    input_ids, attention_mask: (n, T) long; subject_last, prompt_last: (n,) long positions of
    the subject's last token and the prompt's last token; subject_first: (n,) long the subject's first
    token (the tokens before it are the prompt's head, often shared across rows); target_len: (n,) long number of
    target tokens appended after ``prompt_last`` (0 without targets). Target token t of row i
    sits at ``prompt_last[i] + 1 + t`` and is predicted by the logits at ``prompt_last[i] + t``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    subject_last: torch.Tensor
    prompt_last: torch.Tensor
    target_len: torch.Tensor
    subject_first: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, sl: "slice | torch.Tensor") -> "PromptBatch":
        """The requests in ``sl`` (a slice or an index tensor) as their own batch, trimmed to their widest row."""
        mask = self.attention_mask[sl]
        # the widest real row (its targets included, even where the mask leaves the last token out)
        width = int(torch.maximum(mask.sum(1), self.prompt_last[sl] + self.target_len[sl] + 1).max()) \
            if mask.shape[0] else 0
        return PromptBatch(self.input_ids[sl][:, :width], mask[:, :width], self.subject_last[sl],
                           self.prompt_last[sl], self.target_len[sl], self.subject_first[sl])

    def scored_tokens(self) -> "PromptBatch":
        """The rows without their last token: teacher-forced target logits sit at the positions before it (the
        last token's own logits predict nothing scored), so forwards that only read them can leave it out."""
        mask = self.attention_mask.clone()
        mask[torch.arange(len(self)), mask.sum(1) - 1] = 0
        return PromptBatch(self.input_ids, mask, self.subject_last, self.prompt_last, self.target_len,
                           self.subject_first)

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
    rows, subject_first, subject_last, prompt_last, target_len = [], [], [], [], []
    for i, r in enumerate(requests):
        enc = tok(r.text, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        _, end = r.subject_span
        inside = [t for t, (a, b) in enumerate(offsets) if b > a and a < end]
        if not inside:
            raise ValueError(f"request {i}: no token of subject {r.subject!r} found in {r.text!r}")
        subject_first.append(next((t for t in inside if offsets[t][1] > r.subject_span[0]), inside[-1]))
        subject_last.append(inside[-1])
        prompt_last.append(len(ids) - 1)
        target = tok(r.target_new, add_special_tokens=False)["input_ids"] if with_target else []
        if with_target and not target:
            raise ValueError(f"request {i}: target_new {r.target_new!r} tokenises to nothing")
        target_len.append(len(target))
        rows.append(ids + list(target))
    input_ids, attention_mask = pad_right(rows, pad_id(tok))
    return PromptBatch(input_ids, attention_mask, torch.tensor(subject_last), torch.tensor(prompt_last),
                       torch.tensor(target_len), torch.tensor(subject_first))


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
    if site == "mlp_residual":
        norm = getattr(model.model.layers[layer], "post_attention_layernorm", None)
        if not isinstance(norm, nn.Module):
            raise ValueError(f"site 'mlp_residual' needs model.model.layers[{layer}].post_attention_layernorm")
        return norm
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
    with blocks_after(model, layer):
        return model.model(inputs_embeds=hidden, attention_mask=attention_mask.to(hidden.device),
                           use_cache=False).last_hidden_state


@contextmanager
def blocks_after(model: Any, layer: int) -> Iterator[None]:
    """Within it the decoder runs only its blocks after ``layer``: its input embeddings are then the residual
    stream after block ``layer`` (each block keeps its index into a KV cache)."""
    inner = model.model
    blocks = inner.layers
    inner.layers = torch.nn.ModuleList(list(blocks)[layer + 1:])
    try:
        yield
    finally:
        inner.layers = blocks


@dataclass
class MidStates:
    """The residual stream entering ``layer``'s MLP (site "mlp_residual") at every real token of a batch's rows,
    row-major as :func:`capture` returns a site: states (N, d), lengths (n,) long real tokens per row. Units
    appended to that MLP change nothing before it, so the edited model's forward starts there (block
    ``layer``'s output is h + mlp(post_attention_layernorm(h)) with the MLP as it is now) and runs only the
    later blocks (:func:`shared_head_forwards`; check a model with :func:`mid_matches`)."""

    layer: int
    states: torch.Tensor
    lengths: torch.Tensor

    def rows(self, index: torch.Tensor) -> "MidStates":
        """The states of rows ``index`` (k,) long only, in that order (as :meth:`PromptBatch.rows` picks them)."""
        starts = torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)[:-1]])
        tokens = torch.cat([torch.arange(int(s), int(s + n)) for s, n in zip(starts[index], self.lengths[index])]) \
            if len(index) else torch.zeros(0, dtype=torch.long)
        return MidStates(self.layer, self.states[tokens.to(self.states.device)], self.lengths[index])

    def block_output(self, model: Any, rows: torch.Tensor, begin: torch.Tensor, width: int) -> torch.Tensor:
        """Block ``layer``'s output in ``model`` now (k, width, d) at positions begin + t (begin (k,)) of
        ``rows`` (k,), zero past each row's end."""
        starts = torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)[:-1]])
        at = begin[:, None] + torch.arange(width)
        real = at < self.lengths[rows, None]
        h = self.states.new_zeros(len(rows), width, self.states.shape[1])
        h[real.to(h.device)] = self.states[(starts[rows, None] + at)[real].to(h.device)]
        block = model.model.layers[self.layer]
        return h + block.mlp(block.post_attention_layernorm(h))


@torch.no_grad()
def mlp_inputs(model: Any, layer: int, residual: torch.Tensor, *, chunk: int = 65536) -> torch.Tensor:
    """Site "mlp_in" from site "mlp_residual" of ``layer``: its MLP's norm of ``residual`` (N, d), per token
    (in chunks of ``chunk`` tokens: the norm works in float32)."""
    norm = model.model.layers[layer].post_attention_layernorm
    return torch.cat([norm(part) for part in residual.split(chunk)]) if len(residual) else residual.clone()


@torch.no_grad()
def mid_matches(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: int) -> bool:
    """Whether a forward from :class:`MidStates` of ``layer`` reproduces the full forward on these rows."""
    full = final_hidden(model, input_ids, attention_mask)
    mid = MidStates(layer, capture(model, input_ids, attention_mask, layer, site="mlp_residual"),
                    attention_mask.sum(1))
    n, width = input_ids.shape
    start = mid.block_output(model, torch.arange(n), torch.zeros(n, dtype=torch.long), width)
    tail = tail_hidden(model, layer, start, attention_mask)
    real = attention_mask.to(full.device).bool()
    return bool(torch.allclose(tail[real], full[real], rtol=1e-4, atol=1e-4 * float(full[real].abs().max())))


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
def tail_start(model: Any, batch: PromptBatch, layer: int, start: torch.Tensor, *,
               batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, Past]:
    """What the blocks after ``layer`` need to rerun each row of ``batch`` from position start[i] (n,) on, when
    nothing before it changes (δ added at the subject's last token): (states (n, S, d) the residual after
    ``layer`` at positions start + s, mask (n, S) long real ones, past: the keys and values of positions
    < start at the blocks after ``layer`` (:class:`Past`, None at the others)). One full forward per chunk."""
    lengths = batch.attention_mask.sum(1)
    span = int((lengths - start).max())
    n, blocks = len(batch), model.model.layers
    keys: list = [None] * len(blocks)
    values: list = [None] * len(blocks)
    width = max(1, int(start.max()))
    states = None
    past_mask = (torch.arange(width) < start[:, None]).long()
    seen: dict = {}
    handle = blocks[layer].register_forward_hook(
        lambda _m, _a, out: seen.__setitem__("out", out[0] if isinstance(out, tuple) else out))
    from transformers import DynamicCache

    try:
        for chunk in length_sorted_chunks(lengths, batch_size):
            cut = int(lengths[chunk].max())
            cache = DynamicCache()
            forward_after(model, batch.input_ids[chunk, :cut], batch.attention_mask[chunk, :cut], None, cache=cache)
            out = seen.pop("out")
            at = (start[chunk, None] + torch.arange(span)).clamp(max=cut - 1).to(out.device)
            if states is None:
                states = out.new_zeros(n, span, out.shape[-1])
            states[chunk.to(out.device)] = out.gather(1, at[..., None].expand(-1, -1, out.shape[-1]))
            for i in range(layer + 1, len(blocks)):
                k, v = cache.layers[i].keys[..., :width, :], cache.layers[i].values[..., :width, :]
                if k.shape[2] < width:
                    pad = (0, 0, 0, width - k.shape[2])
                    k, v = F_pad(k, pad), F_pad(v, pad)
                if keys[i] is None:
                    keys[i] = k.new_zeros(n, *k.shape[1:])
                    values[i] = v.new_zeros(n, *v.shape[1:])
                keys[i][chunk.to(k.device)], values[i][chunk.to(k.device)] = k, v
    finally:
        handle.remove()
    mask = (start[:, None] + torch.arange(span) < lengths[:, None]).long()
    return states, mask, Past(keys, values, past_mask)


def tail_from(model: Any, layer: int, states: torch.Tensor, mask: torch.Tensor, past: Past) -> torch.Tensor:
    """The decoder's last hidden states (b, S, d) of rows continuing ``past`` from the residual stream after
    block ``layer`` at their positions from there on (``states`` (b, S, d), ``mask`` (b, S); see
    :func:`tail_start`): only the later blocks and the final norm run. Differentiable in ``states``."""
    with blocks_after(model, layer):
        return forward_after(model, None, mask, past, inputs_embeds=states).last_hidden_state


def tail_with_delta(model: Any, layer: int, cached: tuple, rows: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states (k, S, d) of rows ``rows`` (k,) long of a :func:`tail_start` result
    ``cached`` (states, mask, past) with δ (k, d) added to ``layer``'s MLP output at each row's start (its first
    state): only the later blocks run, on the rows' positions from their start on. Differentiable in δ."""
    states, mask, past = cached
    rows = rows.cpu()
    span = int(mask[rows].sum(1).max())
    start = states[rows.to(states.device), :span]
    start = torch.cat([start[:, :1] + delta[:, None], start[:, 1:]], 1)
    return tail_from(model, layer, start, mask[rows, :span], past.rows(rows))


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
    return [chunk for chunk in order.split(batch_size) if len(chunk)]  # none for no rows


# What one more forward costs, in padded tokens: an estimate (one CPU thread: a 576-wide matrix product runs at ~49
# GFLOP/s over 32 rows against ~60 over 256, plus the blocks' per-call work). Rows of a batch sorted by length are
# cut into pieces where their padding would cost more than this; before, fixed pieces of 32 rows padded the values
# fit's forwards by 28 % (20.6k real of 28.8k tokens, 50 validation requests)
PIECE_OVERHEAD = 12.0
# On a GPU a forward of a few hundred short rows is bound by its kernel launches, not its tokens (960 validation
# requests on an H200: the host thread busy for the whole 183 s insertion at 32 rows a forward), so rows run in
# larger batches and a padded token costs next to nothing against one more forward. Reasoned, not yet measured.
GPU_BATCH_SIZE = 256
GPU_PIECE_OVERHEAD = 2048.0


def default_batch_size(model: Any) -> int:
    """Rows a forward of the insertion runs at once when the caller does not say: 32 on a CPU, :data:`GPU_BATCH_SIZE`
    on another device."""
    return 32 if model_device(model).type == "cpu" else GPU_BATCH_SIZE


def piece_overhead(model: Any) -> float:
    """What one more forward costs in padded tokens on ``model``'s device (:func:`padding_pieces`)."""
    return PIECE_OVERHEAD if model_device(model).type == "cpu" else GPU_PIECE_OVERHEAD


def padding_pieces(lengths: torch.Tensor, max_rows: int, overhead: float = PIECE_OVERHEAD) -> list[torch.Tensor]:
    """Consecutive pieces (index tensors) of rows sorted by length (lengths (n,) ascending) of at most ``max_rows``
    rows each, cut where the padded tokens (rows x the piece's longest) plus ``overhead`` per piece are fewest
    (dynamic programming over the cut points). Rows of one length then share a piece; a few long rows do not
    pad many short ones."""
    n, size = len(lengths), lengths.tolist()
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for end in range(1, n + 1):
        for begin in range(max(0, end - max_rows), end):
            cost = best[begin] + (end - begin) * size[end - 1] + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    pieces, end = [], n
    while end:
        pieces.append(torch.arange(cut[end], end))
        end = cut[end]
    return pieces[::-1]


class _Captured(Exception):
    """Raised by a capture hook once it holds its input: the rest of the forward is skipped."""


@dataclass
class Past:
    """Keys and values of tokens that came before each row, per decoder layer: keys[l], values[l]
    (b, kv_heads, P, head_dim), or None for a layer that will not run (blocks up to an edited layer);
    mask (b, P) long, 1 at a row's real slots (the first ``mask[i].sum()``)."""

    keys: list
    values: list
    mask: torch.Tensor

    def cache(self) -> Any:
        """A fresh transformers DynamicCache holding these states (a forward appends to the one it gets);
        layers that will not run hold zeros of the same shape (masks read their length)."""
        from transformers import DynamicCache

        like = next(k for k in self.keys if k is not None)
        cache = DynamicCache()
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is None:
                k = v = like.new_zeros(()).expand(like.shape)
            cache.update(k, v, i)
        return cache

    def rows(self, index: torch.Tensor) -> "Past":
        """The past of rows ``index`` (k,) long, trimmed to their longest."""
        width = max(1, int(self.mask[index].sum(1).max())) if len(index) else 1
        at = index.to(next(k for k in self.keys if k is not None).device)
        pick = lambda t: None if t is None else t[at, :, :width]  # noqa: E731
        return Past([pick(k) for k in self.keys], [pick(v) for v in self.values], self.mask[index, :width])


def _cache_argument(model: Any) -> str:
    """The name of the decoder's cache argument (``cache`` from transformers 5.x's rename, else
    ``past_key_values``)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"


def forward_after(model: Any, input_ids: Optional[torch.Tensor], attention_mask: torch.Tensor,
                  past: Optional[Past], *, inputs_embeds: Optional[torch.Tensor] = None, use_cache: bool = False,
                  cache: Any = None) -> Any:
    """``model.model`` on right-padded rows (b, T) that continue ``past`` (or none): row i's tokens sit at
    positions past.mask[i].sum() + t and attend to its real past slots, as if the past's tokens came first in
    the same forward (the KV cache of generation). ``cache``: a DynamicCache to fill (the past's, when
    given, is a fresh copy). Returns the decoder's output."""
    device = model_device(model)
    mask = attention_mask.to(device)
    kwargs: dict = {"input_ids": None if input_ids is None else input_ids.to(device), "inputs_embeds": inputs_embeds}
    if past is not None:
        offset = past.mask.to(device).sum(1, keepdim=True)
        kwargs["position_ids"] = offset + torch.arange(mask.shape[1], device=device)
        mask = torch.cat([past.mask.to(device), mask], 1)
        cache = past.cache()
        use_cache = True
    if cache is not None:
        kwargs[_cache_argument(model)] = cache
        use_cache = True
    return model.model(attention_mask=mask, use_cache=use_cache, **kwargs)


def heads(input_ids: torch.Tensor, shared: torch.Tensor) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """The distinct heads of rows (b, T) whose first ``shared[i]`` tokens (b,) may repeat across rows (a
    context prefix, a template's words before the subject): (heads as token tuples, head of each row (b,) long)."""
    index: dict[tuple[int, ...], int] = {}
    owner = [index.setdefault(tuple(input_ids[i, :int(s)].tolist()), len(index)) for i, s in enumerate(shared)]
    return list(index), torch.tensor(owner, dtype=torch.long)


def shared_head_forwards(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, shared: torch.Tensor,
                         batch_size: int, mid: Optional[MidStates] = None) -> Iterator[tuple[str, Any]]:
    """Forwards of right-padded rows (b, T) whose first ``shared`` (b,) tokens repeat across rows: each
    distinct head runs once, then every row runs from its head's keys and values (:func:`forward_after`),
    so a row costs only its own tokens. Yields, after each forward, ("heads", (head rows (h,) long: a row
    of each head, widths (h,) long)) or ("rows", (rows (k,) long, start (k,) long: where each row's forward
    began, its output or None)); a capture hook may end a forward early (:class:`_Captured`). Heads run in
    batches of ``batch_size`` heads (the keys and values of one batch are held at a time), their rows sorted by
    length and cut by :func:`padding_pieces`. mid: the rows' :class:`MidStates` (the model's MLP at ``mid.layer`` edited since): the
    forwards start at that MLP and run only the later blocks."""
    head_list, owner = heads(input_ids, shared)

    def forward(rows: torch.Tensor, ids: torch.Tensor, begin: torch.Tensor, mask: torch.Tensor, past: Optional[Past],
                cache: Any = None) -> Any:
        if mid is None:
            return forward_after(model, ids, mask, past, cache=cache)
        start = mid.block_output(model, rows, begin, mask.shape[1])  # before the block list is cut
        with blocks_after(model, mid.layer):
            return forward_after(model, None, mask, past, cache=cache, inputs_embeds=start)

    lengths = attention_mask.sum(1)
    widths = torch.tensor([len(h) for h in head_list], dtype=torch.long)
    order = torch.argsort(widths, stable=True)
    empty = int((widths == 0).sum())  # rows without a head run alone (an all-padding head row is not run)
    batches = ([order[:empty]] if empty else []) + [b for b in order[empty:].split(batch_size) if len(b)]
    for batch in batches:
        width = int(widths[batch].max())
        first_row = torch.tensor([int((owner == int(h)).nonzero()[0]) for h in batch])
        past = None
        if width > 0:
            head_mask = (torch.arange(width) < widths[batch, None]).long()
            from transformers import DynamicCache

            cache = DynamicCache()
            try:
                forward(first_row, input_ids[first_row, :width], torch.zeros(len(batch), dtype=torch.long), head_mask,
                        None, cache)
            except _Captured:
                pass
            yield "heads", (first_row, widths[batch])
            ran = [i > mid.layer if mid is not None else True for i in range(len(cache.layers))]
            past = Past([layer.keys if r else None for layer, r in zip(cache.layers, ran)],
                        [layer.values if r else None for layer, r in zip(cache.layers, ran)], head_mask)
        local = torch.full((len(head_list),), -1, dtype=torch.long)
        local[batch] = torch.arange(len(batch))
        rows = (local[owner] >= 0).nonzero().flatten()
        start = widths[owner[rows]]
        order = torch.argsort(lengths[rows] - start, stable=True)
        for piece in padding_pieces((lengths[rows] - start)[order], batch_size, piece_overhead(model)):
            chunk, begin = rows[order[piece]], start[order[piece]]
            span = int((lengths[chunk] - begin).max())
            at = begin[:, None] + torch.arange(span)
            real = at < lengths[chunk, None]
            ids = input_ids[chunk].gather(1, at.clamp(max=input_ids.shape[1] - 1))
            out = None
            try:
                out = forward(chunk, ids, begin, real.long(), None if past is None else past.rows(local[owner[chunk]]))
            except _Captured:
                pass
            yield "rows", (chunk, begin, out)


@torch.no_grad()
def capture(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: int, *,
            site: Union[str, tuple[str, ...]] = "mlp_in", positions: Optional[torch.Tensor] = None,
            batch_size: int = 64, shared: Optional[torch.Tensor] = None) -> Union[torch.Tensor, tuple[torch.Tensor, ...]]:
    """States at ``site`` of ``layer`` for right-padded batches (the forward stops there).

    input_ids, attention_mask: (n, T). positions: (n,) long -> returns (n, width) (one
    position per row); None -> every real token, (attention_mask.sum(), width) in row-major
    order. width = d for "mlp_in" and "block_out", intermediate size for "down_in".
    A tuple of sites returns one tensor per site, all from the same forwards.
    shared: (n,) long, how many leading tokens of each row are a head that other rows repeat (a context
    prefix and a template's words before the subject): each distinct head runs once and the rows continue
    from its keys and values (:func:`shared_head_forwards`; the same states up to float rounding).
    """
    sites = (site,) if isinstance(site, str) else tuple(site)
    if not sites:
        raise ValueError("site must name at least one capture site")
    modules = [site_module(model, layer, s) for s in sites]
    last = max(SITES.index(s) for s in sites)  # SITES are in forward order: the last one ends the forward
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
    starts = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
    total = int(lengths.sum()) if positions is None else input_ids.shape[0]
    out: list[Optional[torch.Tensor]] = [None] * len(sites)

    def put(rows: torch.Tensor, begin: torch.Tensor, real: torch.Tensor, source: Optional[torch.Tensor] = None) -> None:
        """seen's states (b, width, w) at positions begin + t (begin (k,)) of rows (k,) where ``real`` (k, width);
        source (k,): which of seen's rows holds each row's states (default: the k rows in order)."""
        for i, s in enumerate(sites):
            hidden = seen[s]
            device = hidden.device
            if out[i] is None:
                out[i] = hidden.new_empty(total, hidden.shape[-1])
            if positions is None:
                dest = (starts[rows, None] + begin[:, None] + torch.arange(real.shape[1]))[real]
                out[i][dest.to(device)] = hidden[source][real.to(device)] if source is not None else hidden[real.to(device)]
            else:
                offset = positions[rows] - begin
                inside = (offset >= 0) & (offset < real.shape[1])
                picked = offset.clamp(0, real.shape[1] - 1)
                src = (source if source is not None else torch.arange(len(rows)))
                states = hidden[src.to(device), picked.to(device)]
                out[i][rows[inside].to(device)] = states[inside.to(device)]

    try:
        if shared is None:
            # rows of similar length run together, each batch trimmed to its widest row (right padding:
            # trimming changes no real token), and the states go back to the callers' order
            for chunk in length_sorted_chunks(lengths, batch_size):
                width = int(lengths[chunk].max())
                mask = attention_mask[chunk, :width]
                seen.clear()
                try:
                    forward_after(model, input_ids[chunk, :width], mask, None)
                except _Captured:
                    pass
                put(chunk, torch.zeros(len(chunk), dtype=torch.long), mask.bool())
        else:
            _, owner = heads(input_ids, shared)
            seen.clear()
            for kind, (rows, begin, *_) in shared_head_forwards(model, input_ids, attention_mask, shared, batch_size):
                if kind == "heads":  # rows: one row per head; begin: the heads' widths
                    width = int(begin.max())
                    local = torch.full((int(owner.max()) + 1,), -1, dtype=torch.long)
                    local[owner[rows]] = torch.arange(len(rows))
                    every = (local[owner] >= 0).nonzero().flatten()
                    source = local[owner[every]]
                    real = torch.arange(width) < begin[source, None]
                    put(every, torch.zeros(len(every), dtype=torch.long), real, source)
                else:
                    span = seen[sites[0]].shape[1]
                    real = begin[:, None] + torch.arange(span) < lengths[rows, None]
                    put(rows, begin, real)
                seen.clear()
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
