"""Essence rows: what the model itself writes after a subject, kept by the subject-keyed δ fit.

A δ added at a subject's last token is read by every later token of a text that names the subject, not only by
the question it was fit for: at 10 validation facts whose subject a held-out text names, the held-out text's KL
was all δ's (mean norm 140), read at the mention and by everything after it
(benchmarks/results/hf/text_locality_validation0_n10_named_first.json). ROME keeps one such position ("{} is
a"); here whole continuations the unedited model writes after "{prefix}. {subject}" are rows of the fit
(:func:`~factkernels.hf.subject_values.fit_subject_deltas`) whose KL to the unedited model's next-token
distributions joins the loss, over each position's top :data:`ESSENCE_TOP` tokens and the rest as one bucket, so
the reference costs k numbers a position instead of the vocabulary.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .capture import PromptBatch, length_sorted_chunks, model_device, pad_id


@torch.no_grad()
def continuations(model: Any, tok: Any, texts: Sequence[str], *, length: int = 16, batch_size: int = 32) -> list[str]:
    """The model's greedy continuation (``length`` new tokens, decoded) of each text, batched with left padding
    (positions from the mask, as ``generate`` does). Deterministic: the same model gives the same texts."""
    device = model_device(model)
    side, tok.padding_side = tok.padding_side, "left"
    out = []
    try:
        for i in range(0, len(texts), batch_size):
            enc = tok(list(texts[i:i + batch_size]), return_tensors="pt", padding=True).to(device)
            ids = model.generate(**enc, max_new_tokens=length, min_new_tokens=length, do_sample=False,
                                 pad_token_id=pad_id(tok))
            out += tok.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tok.padding_side = side
    return out


# How many of the unedited model's likeliest next tokens the essence KL keeps apart (the rest is one bucket).
ESSENCE_TOP = 64
# How many tokens the model writes after each subject for the essence rows.
ESSENCE_TOKENS = 16


def bucketed_kl(ref_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) (n,) over k named tokens and the rest as one bucket: ref_logp (n, k) log p of the named tokens,
    logp (n, k) log q of the same tokens. A lower bound of the full KL, exact when the named tokens hold p."""
    p = ref_logp.exp()
    rest_p = (1 - p.sum(1)).clamp_min(1e-12)
    rest_q = (1 - logp.exp().sum(1)).clamp_min(1e-12)
    return (p * (ref_logp - logp)).sum(1) + rest_p * (rest_p.log() - rest_q.log())


@torch.no_grad()
def essence_reference(essence: torch.Tensor, from_start: torch.Tensor, batch: PromptBatch, batch_size: int,
                      logits_of: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The unedited model's top :data:`ESSENCE_TOP` next tokens at every target position of the ``essence`` rows
    (R,) bool: (ids (R, T, k) long, log-probs (R, T, k)), T the longest target, k at most the vocabulary; zero
    elsewhere.
    logits_of(chunk, sub) -> (logits, rows, tokens) without δ."""
    width = int(batch.target_len[essence].max()) if bool(essence.any()) else 0
    ids = logp = torch.zeros(len(batch), width, 0)
    rows = essence.nonzero().flatten()
    for part in length_sorted_chunks(from_start[rows], batch_size) if len(rows) else []:
        chunk = rows[part]
        sub = batch.rows(chunk)
        logits, t_rows, _ = logits_of(chunk, sub)
        top = logits.log_softmax(-1).topk(min(ESSENCE_TOP, logits.shape[1]), dim=1)
        if not ids.shape[2]:
            ids = torch.zeros(len(batch), width, top.indices.shape[1], dtype=torch.long)
            logp = torch.zeros(len(batch), width, top.indices.shape[1])
        offset = sub.target_positions()[1] - sub.prompt_last[t_rows]
        ids[chunk[t_rows], offset] = top.indices.cpu()
        logp[chunk[t_rows], offset] = top.values.float().cpu()
    return ids, logp


__all__ = ["ESSENCE_TOKENS", "ESSENCE_TOP", "bucketed_kl", "continuations", "essence_reference"]
