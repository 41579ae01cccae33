"""Scoring an edited model — the same function for every method (construction, ROME, MEMIT, AlphaEdit).

    ref = record_reference(model, tok, neighborhood=facts.neighborhood, texts=natural_text("eval"))   # before editing
    ... edit the model ...
    scores = evaluate(model, tok, facts.requests, paraphrases=facts.paraphrases,
                      neighborhood=facts.neighborhood, texts=natural_text("eval"), reference=ref)

* efficacy: fraction of requests whose greedy continuation is the whole ``target_new`` (every
  target token is the argmax, teacher-forced — exactly what greedy decoding reproduces);
* paraphrase: the same on other prompts of the same facts;
* neighborhood: fraction of other subjects' prompts whose top-1 next token is unchanged;
* text: perplexity on ordinary text and its ratio to the original (also in log space: text_nll and
  log_perplexity_ratio stay finite where the ratio overflows to inf), and the mean KL(original ‖ edited)
  per token. The reference keeps, per text token, the original top-k log-probabilities and the
  remaining mass as one bucket, so KL is that of the (k+1)-bucket distributions: a lower bound of
  the full KL, exact up to the tail's own spread (k = 256 holds nearly all the mass).
"""

from __future__ import annotations

import math
import re
import resource
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch

from .capture import (MidStates, PromptBatch, encode_requests, encode_texts, final_hidden, length_sorted_chunks,
                      logits_at, model_device, pad_id, pad_right, shared_head_forwards)
from .requests import Request, parse_requests


@dataclass
class Reference:
    """What evaluation needs from the original model.

    neighborhood_top1: (n_prompts,) long; text_topk_index, text_topk_logp: (N, k) at the N scored
    text positions; text_rest_logp: (N,) log of the probability mass outside the top k; text_nll: mean
    next-token NLL of the original on the texts.
    """

    neighborhood_top1: torch.Tensor
    text_topk_index: torch.Tensor
    text_topk_logp: torch.Tensor
    text_rest_logp: torch.Tensor
    text_nll: float


def _prompt_last_logits(model: Any, tok: Any, prompts: Sequence[str], batch_size: int) -> torch.Tensor:
    """Next-token logits after each prompt: (n, vocab)."""
    rows = [tok(p)["input_ids"] for p in prompts]
    chunks = length_sorted_chunks(torch.tensor([len(r) for r in rows]), batch_size)
    out = []
    for chunk in chunks:
        ids, mask = pad_right([rows[i] for i in chunk.tolist()], pad_id(tok))
        out.append(logits_at(model, final_hidden(model, ids, mask), torch.arange(len(ids)), mask.sum(1) - 1).cpu())
    return torch.cat(out)[torch.argsort(torch.cat(chunks))]  # back to the prompts' order


def _text_logprobs(model: Any, tok: Any, texts: Sequence[str], batch_size: int, max_length: int):
    """Yield (log-probs (n_pos, vocab), next tokens (n_pos,), text index (n_pos,)) per batch at positions that
    have a next token."""
    ids, mask = encode_texts(tok, texts, max_length=max_length)
    device = model_device(model)
    for start in range(0, len(ids), batch_size):
        b_ids, b_mask = ids[start:start + batch_size], mask[start:start + batch_size]
        logits = model(input_ids=b_ids.to(device), attention_mask=b_mask.to(device)).logits.float().cpu()
        scored = (b_mask[:, 1:] & b_mask[:, :-1]).bool()
        text_index = torch.arange(start, start + len(b_ids))[:, None].expand_as(scored)[scored]
        yield logits[:, :-1][scored].log_softmax(-1), b_ids[:, 1:][scored], text_index


@torch.no_grad()
def record_reference(model: Any, tok: Any, *, neighborhood: Sequence[str] = (), texts: Sequence[str] = (), top_k: int = 256,
              batch_size: int = 16, max_length: int = 128) -> Reference:
    """Record the (unedited) model's neighborhood top-1 and text distributions for :func:`evaluate`."""
    top1 = (_prompt_last_logits(model, tok, list(neighborhood), batch_size).argmax(1) if neighborhood
            else torch.empty(0, dtype=torch.long))
    index, logp, rest, nll = [], [], [], []
    if texts:
        for lp, nxt, _ in _text_logprobs(model, tok, texts, batch_size, max_length):
            top = lp.topk(min(top_k, lp.shape[1]), dim=1)
            index.append(top.indices), logp.append(top.values)
            rest.append(torch.log1p(-top.values.exp().sum(1).clamp(max=1 - 1e-7)))
            nll.append(-lp.gather(1, nxt[:, None]).squeeze(1))
    cat = lambda xs, shape: torch.cat(xs) if xs else torch.empty(shape)  # noqa: E731
    nll_all = cat(nll, (0,))
    return Reference(top1, cat(index, (0, top_k)).long(), cat(logp, (0, top_k)), cat(rest, (0,)),
                     float(nll_all.mean()) if nll_all.numel() else float("nan"))


@torch.no_grad()
def fact_margins(model: Any, tok: Any, requests: Sequence[Request], *, batch_size: int = 16) -> torch.Tensor:
    """Per request: min over target tokens of (target logit − best other), teacher-forced; > 0 iff greedy
    decoding produces the whole ``target_new``. (n,)."""
    if not requests:
        return torch.empty(0)
    return batch_margins(model, encode_requests(tok, requests, with_target=True), batch_size)


def token_margin(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logits (n, vocab), tokens (n,) -> (n,) target logit minus best other."""
    own = logits.gather(1, tokens[:, None]).squeeze(1)
    return own - logits.scatter(1, tokens[:, None], float("-inf")).amax(1)


def fact_min(values: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """Per request (n,): the minimum of ``values`` over its target tokens (``rows`` says whose)."""
    return torch.full((n,), float("inf"), device=values.device).scatter_reduce(0, rows, values, "amin")


@torch.no_grad()
def batch_margins(model: Any, batch: PromptBatch, batch_size: int, shared: Optional[torch.Tensor] = None,
                  mid: Optional[MidStates] = None) -> torch.Tensor:
    """Teacher-forced target margins of every row of ``batch``, in slices: per request, the min over its
    target tokens of (target logit − best other logit); > 0 iff greedy decoding produces the whole
    target. Logits only at the target positions. (n,)
    shared: (n,) long, leading tokens of each row that other rows repeat (before the subject): each distinct
    head runs once and the rows continue from its keys and values, as generation does
    (:func:`~factkernels.hf.capture.shared_head_forwards`).
    mid: the rows' :class:`~factkernels.hf.capture.MidStates` at a layer whose MLP alone changed since they were
    captured (units appended): the forwards start at that MLP (needs ``shared``; the same margins up to float
    rounding, without re-running the blocks before it)."""
    out = torch.empty(len(batch))
    batch = batch.scored_tokens()

    def put(chunk: torch.Tensor, hidden: torch.Tensor, begin: torch.Tensor) -> None:
        sub = batch.rows(chunk)
        rows, positions, tokens = sub.target_positions()
        logits = logits_at(model, hidden, rows, positions - begin[rows])
        out[chunk] = fact_min(token_margin(logits, tokens.to(logits.device)), rows.to(logits.device), len(sub)).cpu()

    if mid is not None and shared is None:
        raise ValueError("mid states need shared heads (zeros: none)")
    if shared is None:
        for chunk in length_sorted_chunks(batch.attention_mask.sum(1), batch_size):
            sub = batch.rows(chunk)
            put(chunk, final_hidden(model, sub.input_ids, sub.attention_mask), torch.zeros(len(chunk), dtype=torch.long))
        return out
    if bool((shared > batch.prompt_last).any()):
        raise ValueError("shared heads must end before each row's last prompt token (the first target logit)")
    for kind, (rows, begin, *output) in shared_head_forwards(model, batch.input_ids, batch.attention_mask, shared,
                                                              batch_size, mid=mid):
        if kind == "rows":
            put(rows, output[0].last_hidden_state, begin)
    return out


def _exp_or_inf(log_value: float) -> float:
    """exp, inf past a float's range: a broken edit's NLL is unbounded, and math.exp raises there."""
    return math.exp(log_value) if log_value < 709 else math.inf


@torch.no_grad()
def evaluate(model: Any, tok: Any, requests: Union[str, Sequence[Union[Request, dict]]], *,
             paraphrases: Sequence[Union[Request, dict]] = (), neighborhood: Sequence[str] = (),
             texts: Sequence[str] = (), reference: Optional[Union[Reference, Any]] = None, batch_size: int = 16,
             max_length: int = 128) -> dict:
    """Scores of an (edited) model; see the module docstring. ``reference`` is a :class:`Reference` made
    before editing, or the unedited model itself (a separate copy); without it neighborhood, perplexity
    ratio and KL are left out. Returns a flat dict of floats (and counts)."""
    start = time.perf_counter()
    requests = parse_requests(requests)
    paraphrases = parse_requests(paraphrases) if len(paraphrases) else []
    if reference is not None and not isinstance(reference, Reference):
        reference = record_reference(reference, tok, neighborhood=neighborhood, texts=texts,
                                           batch_size=batch_size, max_length=max_length)
    margins = fact_margins(model, tok, requests, batch_size=batch_size)
    scores: dict = {"num_requests": len(requests), "efficacy": float((margins > 0).double().mean()),
                    "efficacy_margin_mean": float(margins.mean())}
    parts = [scores["efficacy"]]
    if paraphrases:
        para = fact_margins(model, tok, paraphrases, batch_size=batch_size)
        scores.update(num_paraphrases=len(paraphrases), paraphrase=float((para > 0).double().mean()))
        parts.append(scores["paraphrase"])
    if neighborhood and reference is not None:
        if reference.neighborhood_top1.numel() != len(neighborhood):
            raise ValueError(f"reference has {reference.neighborhood_top1.numel()} neighborhood prompts, "
                             f"got {len(neighborhood)}: make the reference with the same neighborhood")
        top1 = _prompt_last_logits(model, tok, list(neighborhood), batch_size).argmax(1)
        scores.update(num_neighborhood=len(neighborhood),
                      neighborhood=float((top1 == reference.neighborhood_top1).double().mean()))
        parts.append(scores["neighborhood"])
    scores["score"] = len(parts) / sum(1.0 / max(p, 1e-12) for p in parts)  # harmonic mean, as ROME reports
    if texts:
        scores.update(text_scores(model, tok, texts, reference, batch_size=batch_size, max_length=max_length))
    scores["eval_seconds"] = time.perf_counter() - start
    scores["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return scores


def mentions_any(text: str, subjects: Sequence[str]) -> bool:
    """Whether ``text`` names one of ``subjects`` (whole words, any case; a leading "the " of a subject is
    optional: "the United Kingdom" is named by "United Kingdom")."""
    for subject in subjects:
        name = re.sub(r"^the\s+", "", subject.strip(), flags=re.IGNORECASE)
        if name and re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", text, flags=re.IGNORECASE):
            return True
    return False


@torch.no_grad()
def text_scores(model: Any, tok: Any, texts: Sequence[str], reference: Optional[Reference] = None, *,
                subjects: Sequence[str] = (), batch_size: int = 16, max_length: int = 128) -> dict:
    """Perplexity on ``texts`` and, with a :class:`Reference` of the same texts, its ratio to the original's and
    the mean per-token KL(original ‖ model) (see the module docstring): {"text_tokens", "text_nll", "perplexity"[,
    "log_perplexity_ratio", "perplexity_ratio", "kl_mean"]}.

    With the edited ``subjects``, KL is also split by whether a text names one of them
    (:func:`mentions_any`): "kl_mean_unmentioned" over the texts that name none (locality: an edit should
    leave them alone; None when every text names one) and "kl_mean_mentioned" over the others (where a
    change is the edit generalizing; None when none does), with "texts_mentioning" and
    "text_tokens_mentioning" counting the latter."""
    scores: dict = {}
    nll, kl, text_index, offset = [], [], [], 0
    for lp, nxt, index in _text_logprobs(model, tok, texts, batch_size, max_length):
        nll.append(-lp.gather(1, nxt[:, None]).squeeze(1))
        text_index.append(index)
        if reference is not None:
            rows = slice(offset, offset + lp.shape[0])
            ref_logp, idx = reference.text_topk_logp[rows], reference.text_topk_index[rows]
            if idx.shape[0] != lp.shape[0]:
                raise ValueError("reference texts differ from texts: make the reference with the same texts")
            own = lp.gather(1, idx)
            own_rest = torch.log1p(-own.exp().sum(1).clamp(max=1 - 1e-7))
            ref_rest = reference.text_rest_logp[rows]
            token_kl = (ref_logp.exp() * (ref_logp - own)).sum(1) + ref_rest.exp() * (ref_rest - own_rest)
            kl.append(token_kl.clamp_min(0.0))  # a KL of bucketed distributions is >= 0: below is float rounding
        offset += lp.shape[0]
    mean_nll = float(torch.cat(nll).mean())
    scores.update(text_tokens=offset, text_nll=mean_nll, perplexity=_exp_or_inf(mean_nll))
    if reference is not None:
        log_ratio = mean_nll - reference.text_nll
        token_kl = torch.cat(kl)
        scores.update(log_perplexity_ratio=log_ratio, perplexity_ratio=_exp_or_inf(log_ratio),
                      kl_mean=float(token_kl.mean()))
        if subjects:
            text_named = torch.tensor([mentions_any(t, subjects) for t in texts], dtype=torch.bool)
            named = text_named[torch.cat(text_index)]
            mean_or_none = lambda x: float(x.mean()) if x.numel() else None  # noqa: E731
            scores.update(kl_mean_unmentioned=mean_or_none(token_kl[~named]),
                          kl_mean_mentioned=mean_or_none(token_kl[named]),
                          texts_mentioning=int(text_named.sum()),
                          text_tokens_mentioning=int(named.sum()))
    return scores
