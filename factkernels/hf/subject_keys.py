"""Subject-keyed insertion (``insert_facts(..., keys="subject")``): a fact recalled however it is asked.

A prompt-keyed unit answers only the prompt it was built from. Here every subject gets one detector on its
last token's MLP input at layer L, trained to fire in any context, and one residual delta δ at that token,
fit over many contexts; later layers carry δ to wherever the question ends (as ROME's edits do).

* **Contexts.** Each request's prompt bare and under each prefix ("{prefix}. {prompt}"): keys are the subject's
  last-token states in all of them; δ is fit on the first ``value_prefixes`` + 1 of them.
* **Detector (an LDA filter).** One per subject; a subject that one detector cannot separate from its contrast
  and that some prompts open with gets two, one per placement (the state of a text's first tokens depends on
  them alone: see :func:`detector_groups`); both add the subject's δ and each is contrast for the other, so
  every context gets δ once. w_g = A⁻¹(μ_g − μ), A = Σ_neg + within·Σ_within +
  ridge·I, with μ_g the mean of the group's keys, Σ_within the pooled spread across contexts, μ, Σ_neg those
  of the negatives (ordinary text, every other position of the contexts). Scores s(x) = w_gᵀ(x − μ) are 1 at
  μ_g. The threshold τ_g sits at ``threshold`` of the way from the highest contrast score (negatives and every
  other group's keys, leaving out the tokens where the text names the subject: :func:`subject_mentions`) to
  the group's lowest context score. A filter that no threshold separates takes the cut with the fewest training
  errors (own contexts below it + contrast above it, :func:`_fewest_errors`); the own contexts it leaves out get
  a detector of their own (:func:`missed_groups`), and those that one leaves out too (``missed``) are reported
  unanswered and never refit (:func:`subject_detectors`).
* **Look-alikes.** Tokens that extend a subject's last token or sit next to it in embedding (" India": " Indian",
  " Indians", " Indiana") are put in its place in its contexts; each filter keeps its look-alikes' scores near 0
  (a penalty in the LDA objective, :func:`lda_detectors`) and they are contrast for every threshold. Without
  them " Indian" of "the Indian Ocean" fired India's (and Pakistan's) detector past its own contexts: at 100
  validation facts that one token was all of the held-out text's KL.
* **Look-alike subjects (optional).** Two subjects whose keys one filter cannot tell apart (invented names
  ending in one token: "Draemosea", "Korerimosea") each pass their whole δ at the other's contexts, and no δ
  answers a context given δ_A + δ_B. With ``partner_weight`` > 0 a filter that passes its δ at another
  subject's key gets that subject's keys as a penalty (a pairwise LDA: :func:`lda_detectors`).
* **Negatives.** Ordinary text (``background``), by default with the first :data:`WIKIPEDIA_NEGATIVES` shipped
  Wikipedia leads, and every other position of the contexts. A detector's tail on text it has not seen is what
  fires it off a mention: at 149 validation subjects 57 of 48k held-out Wikipedia tokens got some δ with the
  model-written background alone.
* **Essence (optional).** ``essence`` continuations the model writes after each subject join the δ fit as rows
  kept, not taught (:func:`~factkernels.hf.subject_values.fit_subject_deltas`): δ is read by every later token of a text naming the subject.
* **Units.** Two per detector on one gate row, silu(β(s − τ)) − silu(β(s − τ) − a), a = ``ramp``, β such that the
  lowest own score is 8 past the upper corner: a ramp that is 0 below τ and saturates at a on every training
  context, so each context receives the same δ (down columns ±δ/a) whatever its score.
* **Certified.** After appending, every training context (all prefixes) is checked: the report's efficacy
  and margins are the edited model's own teacher-forced margins on them. δ fit on some contexts need not carry
  to the others: on 10 validation facts with δ fit on the 50 bare prompts, 58 of 550 contexts were unanswered
  (46 of the 340 prefixed contexts of templates that open with the subject, 10 of the 160 of the others, 2
  bare prompts the fit left below the margin), while every unit gave its δ there to 3e-4: a value failure, not
  a detector one. So the subjects with an unanswered context get their δ refit over their contexts below the
  margin (:func:`refit_uncertified`) and everything is certified again; what stays unanswered is listed.
"""

from __future__ import annotations

import bisect
import resource
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F_nn

from ..mlp import FactMLP
from .capture import MidStates, PromptBatch, capture, encode_requests, encode_texts, mid_matches, mlp_inputs
from .checkpoint import resumable_subject_fit, value_workers
from .contexts import with_prefixes
from .essence import ESSENCE_TOKENS, continuations
from .evaluate import batch_margins
from .layout import mlp_module
from .requests import Request
from .subject_values import fit_subject_deltas
from .units import AppendedUnits, Insertion, InsertionReport, append_units, removed_on_failure


@dataclass
class SubjectContexts:
    """Every (request, prefix) row: requests (R,), subject (R,) long index into ``subjects``, prefix (R,) long
    (0 = no prefix), opens (R,) bool whether the subject opens the row's text, and ``batch`` their encoding
    with targets."""

    requests: list
    subject: torch.Tensor
    prefix: torch.Tensor
    subjects: list
    batch: PromptBatch
    opens: torch.Tensor


def subject_contexts(tok: Any, requests: Sequence[Request], prefixes: Sequence[str]) -> SubjectContexts:
    """Each request bare and under each prefix (:func:`~factkernels.hf.contexts.with_prefixes`), grouped by
    subject (first-seen order)."""
    subjects: dict[str, int] = {}
    for r in requests:
        subjects.setdefault(r.subject, len(subjects))
    rows = with_prefixes(requests, prefixes)
    subject = torch.tensor([subjects[r.subject] for r in requests for _ in range(1 + len(prefixes))])
    prefix = torch.tensor([p for _ in requests for p in range(1 + len(prefixes))])
    opens = torch.tensor([r.subject_span[0] == 0 for r in rows])
    return SubjectContexts(rows, subject, prefix, list(subjects), encode_requests(tok, rows, with_target=True), opens)


def detector_groups(subject: torch.Tensor, opens: torch.Tensor,
                    split: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which detector each key row belongs to: one per subject, and for the subjects in ``split`` (S,) bool one
    per placement (rows that open the text, rows where other words come first). A causal LM's state at a text's
    first tokens depends on them alone (the first token is the attention sink), far from the same subject's
    states after other words: at layer 10 of SmolLM2 "{} has the chemical symbol" scored 0.35 on chlorine's
    detector, its prefixed contexts 0.93-0.98, and no threshold kept both without firing on ordinary text.
    Splitting every subject instead narrows the detectors (30 validation cases: paraphrase prompts given the
    whole δ 0.97 -> 0.84), so only those that need it are split. subject, opens (R,) -> (group (R,) long,
    group_subject (G,) long)."""
    placement = torch.where(split.to(subject.device)[subject], opens.long(), -1)  # split may sit on the keys' GPU
    pairs, group = torch.unique(torch.stack([subject, placement], 1), dim=0, return_inverse=True)
    return group, pairs[:, 0].contiguous()


def missed_groups(group: torch.Tensor, group_subject: torch.Tensor,
                  missed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A detector of their own for the contexts a filter's cut leaves out (``missed`` (R,) bool,
    :func:`_fewest_errors`): the missed rows of each group g become one new group of g's subject, numbered after
    the others. A subject's contexts that open the text share one state whatever the template ("Huawei" or
    "Jackson Pollock" first in every bare prompt that names them: 4 and 5 of the known-fact union's 25 contexts
    left out), far from its other keys and from ordinary text alike. group (R,) long, group_subject (G,) long ->
    (group (R,), group_subject (G + k,)) with k the groups that miss a context."""
    owners = torch.unique(group[missed])
    renumber = torch.zeros(len(group_subject), dtype=torch.long, device=group.device)
    renumber[owners] = torch.arange(len(owners), device=group.device) + len(group_subject)
    return torch.where(missed, renumber[group], group), torch.cat([group_subject, group_subject[owners.to(group_subject.device)]])


def subject_mentions(tok: Any, subjects: Sequence[str], input_ids: torch.Tensor,
                     attention_mask: torch.Tensor) -> torch.Tensor:
    """Where each subject is written: (N, S) bool over the real tokens of ``input_ids`` (n, T) in row-major
    order (as :func:`~factkernels.hf.capture.capture` returns their states), True at the last token of an
    occurrence of subject s's tokens (with or without a leading space). A detector should fire there (the
    text names the subject), so these states are not contrast for that subject's threshold."""
    ids = input_ids.masked_fill(attention_mask == 0, -1)
    out = torch.zeros(*ids.shape, len(subjects), dtype=torch.bool)
    for s, name in enumerate(subjects):
        for variant in {name, " " + name.lstrip()}:
            pattern = torch.tensor(tok(variant, add_special_tokens=False)["input_ids"], dtype=torch.long)
            if 0 < len(pattern) <= ids.shape[1]:
                hit = (ids.unfold(1, len(pattern), 1) == pattern).all(2)  # (n, T - L + 1) at the start
                out[:, len(pattern) - 1:, s] |= hit
    return out[attention_mask.bool()]


def lda_detectors(own: torch.Tensor, subject: torch.Tensor, negatives: torch.Tensor, *, within: float = 1.0,
                  ridge: float = 1e-2, threshold: float = 0.5, mentions: Optional[torch.Tensor] = None,
                  lookalikes: Optional[torch.Tensor] = None, lookalike_subject: Optional[torch.Tensor] = None,
                  lookalike_weight: float = 0.03, partner_weight: float = 0.0) -> dict:
    """One LDA filter per subject (see the module docstring), in float64.

    own (R, d): keys; subject (R,): their subject (or group) index (0..S-1); negatives (N, d): states that must
    stay silent; mentions (N, S) bool, optional: negatives that name subject s (not its contrast).
    lookalikes (L, d), lookalike_subject (L,) long, optional: states of tokens that look like subject s's last
    token (:func:`lookalike_states`). w_s = argmin wᵀAw + lookalike_weight·mean_l (w·(x_l − μ))² subject to
    w·(μ_s − μ) = 1, over s's own look-alikes: the filter keeps them near the background's score 0 (Woodbury on
    A's Cholesky factor); every look-alike is contrast for every threshold.
    partner_weight > 0: a filter that passes its δ (score above τ) at some key of another subject (or group), its
    *partner*, gets the partner's keys as a second penalty, partner_weight·mean_p (w·(x_p − μ))² over them (each
    partner's mean):
    the pairwise LDA between the two (their mean difference against the partner's spread) pushes the partner's
    scores to ~0 while its own stay near 1. Two invented names ending in one token ("Draemosea", "Korerimosea")
    had each detector passing the other's whole δ at every one of its contexts, and no refit of δ answers a
    pair that gets δ_A + δ_B (benchmarks/hf_new_fact_interference.py). Partners are looked for again on the new
    filters, up to :data:`PARTNER_ROUNDS` times. 0: no partner penalty (the filters as before).
    Returns w (S, d), mu (d,), tau (S,), own_min (S,) lowest own score kept (every own score of a separated
    filter; an unseparated one's fewest-errors cut, :func:`_fewest_errors`), missed (R,) bool the keys below
    their filter's cut, own_dropped (S,) long how many of each filter's, contrast_max (S,) highest score of a
    negative, a look-alike or another subject's key, lookalike_max (S,) highest look-alike score (-inf
    without), separated (S,) bool own_min > contrast_max, cross_firing (S,) long how many other groups' keys
    pass its τ (each gets its δ), partners (S,) long how many groups' keys penalise it.
    """
    work = torch.float64
    k = own.to(work)
    dev = k.device  # every tensor made here lives beside the keys (CUDA insertion)
    subject = subject.to(dev)
    n_subjects = int(subject.max()) + 1
    mu, sigma = _moments(negatives, work, dev)
    count = torch.zeros(n_subjects, dtype=work, device=dev).index_add(0, subject, torch.ones(len(k), dtype=work, device=dev))
    means = torch.zeros(n_subjects, k.shape[1], dtype=work, device=dev).index_add(0, subject, k) / count[:, None]
    spread = k - means[subject]
    sigma_within = spread.T @ spread / max(1, len(k) - n_subjects)
    a = sigma + within * sigma_within
    a += ridge * a.diagonal().mean() * torch.eye(a.shape[0], dtype=work, device=dev)
    diff = means - mu
    chol = torch.linalg.cholesky(a)
    plain = torch.cholesky_solve(diff.T, chol).T  # A⁻¹(μ_s − μ), before any penalty
    penalties = []  # (rows (P, d) centred, owner (P,) long, 1 / weight (P,)): one per kind
    if lookalikes is not None and len(lookalikes):
        lookalike_subject = lookalike_subject.to(dev)
        per = torch.zeros(n_subjects, dtype=work, device=dev).index_add(
            0, lookalike_subject, torch.ones(len(lookalikes), dtype=work, device=dev))
        penalties.append((lookalikes.to(work) - mu, lookalike_subject, per[lookalike_subject] / lookalike_weight))
    partners = torch.zeros(0, 2, dtype=torch.long, device=dev)  # (Q, 2) [s, t]: t's keys penalise filter s
    for search in range(1 + PARTNER_ROUNDS):
        w = _penalised(plain, a, chol, diff, penalties + _partner_penalty(k - mu, subject, partners, partner_weight))
        w = w / (w * diff).sum(1, keepdim=True)  # score 1 at the subject's mean key
        det = _thresholds(w, mu, k, subject, negatives, mentions, lookalikes, threshold)
        row, s = (det.pop("cross") > det["tau"]).nonzero(as_tuple=True)  # key row r passes filter s's τ
        if partner_weight <= 0 or search == PARTNER_ROUNDS:
            break
        found = torch.unique(torch.cat([partners, torch.stack([s, subject[row]], 1)]), dim=0)
        if len(found) == len(partners):
            break
        partners = found
    return {**det, "w": w, "mu": mu, "cross_firing": torch.bincount(s, minlength=n_subjects),
            "partners": torch.bincount(partners[:, 0], minlength=n_subjects)}


def subject_detectors(own: torch.Tensor, ctx: SubjectContexts, negatives: torch.Tensor, *, mentions: torch.Tensor,
                      alike_row: Optional[torch.Tensor] = None, own_for_missed: bool = True,
                      **options: Any) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The detectors of :func:`build_subject_units`: one LDA filter per subject (:func:`lda_detectors`); the
    subjects it cannot separate from their contrast, one per placement (:func:`detector_groups`); then, with
    ``own_for_missed``, the contexts a filter's cut still leaves out get a detector of their own
    (:func:`missed_groups`) where that one separates them from its contrast, kept if it leaves fewer out.

    own (R, d) every context's key; negatives (N, d); mentions (N, S) bool over the subjects; alike_row (L,) long
    the context each look-alike in ``options["lookalikes"]`` stands in for (None: none); options:
    :func:`lda_detectors`'. Returns (det, group (R,) long each context's detector, group_subject (G,) long each
    detector's subject)."""
    group, group_subject = ctx.subject, torch.arange(len(ctx.subjects))

    def filters(group: torch.Tensor, group_subject: torch.Tensor) -> dict:
        same = len(group_subject) == len(ctx.subjects)  # one detector per subject: the mentions as they are
        return lda_detectors(own, group, negatives, mentions=mentions if same else mentions[:, group_subject],
                             lookalike_subject=None if alike_row is None else group[alike_row], **options)

    det = filters(group, group_subject)
    split = detector_groups(ctx.subject, ctx.opens, ~det["separated"])
    if len(split[1]) > len(group_subject):
        group, group_subject = split
        det = filters(group, group_subject)
    missed = det["missed"].to(group.device)
    if own_for_missed and bool(missed.any()):
        regrouped = missed_groups(group, group_subject, missed)
        again = filters(*regrouped)
        # a new detector that no threshold separates keeps its few keys above τ whatever fires with them (a one-key
        # group has no cut that drops it): its contexts go back to their detector's cut, and the rest are filtered
        # again
        separated = missed & again["separated"].to(group.device)[regrouped[0]]
        if not torch.equal(separated, missed) and bool(separated.any()):
            regrouped = missed_groups(group, group_subject, separated)
            again = filters(*regrouped)
        if bool(separated.any()) and int(again["missed"].sum()) < int(det["missed"].sum()):
            det, (group, group_subject) = again, regrouped
    return det, group, group_subject


# How many times lda_detectors looks for new partners on the filters it just made (each may make new ones).
PARTNER_ROUNDS = 3

# Rows of the negatives (or states) handled at once. They are every non-key token of every context: at the 3,725
# requests of the known-fact union (~40k contexts) ~850k rows, whose float64 copy, centred copy and (N, S) scores
# against ~750 detectors took 5 GiB each and ran a 23 GiB machine out of memory.
NEGATIVE_ROWS = 65536


def _moments(x: torch.Tensor, work: torch.dtype, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (d,) and covariance (d, d) of x (N, d) in ``work`` precision on ``dev``, :data:`NEGATIVE_ROWS` rows at
    a time (two passes: the mean first, so the covariance sums centred rows)."""
    parts = x.split(NEGATIVE_ROWS)
    mu = sum(part.to(dev, work).sum(0) for part in parts) / len(x)
    sigma = torch.zeros(x.shape[1], x.shape[1], dtype=work, device=dev)
    for part in parts:
        centred = part.to(dev, work) - mu
        sigma += centred.T @ centred
    return mu, sigma / max(1, len(x) - 1)


def _partner_penalty(centred_keys: torch.Tensor, subject: torch.Tensor, partners: torch.Tensor,
                     weight: float) -> list:
    """lda_detectors' partner rows: for each filter s, every key of each of its partners t (partners (Q, 2) rows
    [s, t]), weight / (t's keys) each (returned as its inverse): every partner weighs as much, however many keys
    it has. centred_keys (R, d), subject (R,)."""
    if len(partners) == 0:
        return []
    rows = [(subject == t).nonzero().flatten() for t in partners[:, 1].tolist()]
    owner = torch.cat([torch.full((len(r),), s, device=subject.device) for r, s in zip(rows, partners[:, 0].tolist())])
    inverse = torch.cat([torch.full((len(r),), len(r) / weight, dtype=centred_keys.dtype, device=subject.device)
                         for r in rows])
    return [(centred_keys[torch.cat(rows)], owner, inverse)]


def _penalised(plain: torch.Tensor, a: torch.Tensor, chol: torch.Tensor, diff: torch.Tensor,
               penalties: list) -> torch.Tensor:
    """w_s = (A + Z_sᵀ C_s Z_s)⁻¹ (μ_s − μ) from plain (S, d) = A⁻¹(μ_s − μ), A (d, d), its Cholesky factor
    ``chol`` and diff (S, d) = μ_s − μ: penalties, a list of (rows (P, d) x − μ, owner (P,) long filter, 1 / c (P,)
    its weight's inverse), each row counting for its owner only. A filter with fewer penalty rows P_s than d
    solves Woodbury's (P_s, P_s) system; one with more (a subject with many partners, whose every key is a row)
    solves the (d, d) one: at the 3,725-request union a filter had thousands of rows, and the (P_s, P_s) systems
    ran the machine out of memory."""
    if not penalties:
        return plain
    z = torch.cat([p[0] for p in penalties])
    owner = torch.cat([p[1] for p in penalties])
    inverse = torch.cat([p[2] for p in penalties])
    w = plain.clone()
    for s in torch.unique(owner).tolist():
        at = (owner == s).nonzero().flatten()
        zs = z[at]
        if len(at) < len(a):
            # (A + ZᵀCZ)⁻¹ b = A⁻¹b − A⁻¹Zᵀ (C⁻¹ + Z A⁻¹ Zᵀ)⁻¹ Z A⁻¹b
            ys = torch.cholesky_solve(zs.T, chol).T  # A⁻¹ z_p: (P_s, d)
            small = torch.diag(inverse[at]) + zs @ ys.T
            w[s] = w[s] - ys.T @ torch.linalg.solve(small, zs @ w[s])
        else:
            w[s] = torch.linalg.solve(a + zs.T @ (zs / inverse[at, None]), diff[s])
    return w


def _thresholds(w: torch.Tensor, mu: torch.Tensor, k: torch.Tensor, subject: torch.Tensor, negatives: torch.Tensor,
                mentions: Optional[torch.Tensor], lookalikes: Optional[torch.Tensor], threshold: float) -> dict:
    """lda_detectors' scores and thresholds of filters w (S, d): tau, own_min, contrast_max, lookalike_max,
    separated (S,) and cross (R, S) every key's score on every other group's filter (-inf on its own).
    negatives (N, d), mentions (N, S) bool: scored :data:`NEGATIVE_ROWS` rows at a time."""
    n_subjects, dev = len(w), w.device
    own_scores = ((k - mu) * w[subject]).sum(1)
    own_min = torch.full((n_subjects,), float("inf"), dtype=w.dtype, device=dev).scatter_reduce(0, subject, own_scores, "amin")
    contrast_max = torch.full((n_subjects,), float("-inf"), dtype=w.dtype, device=dev)
    for start in range(0, len(negatives), NEGATIVE_ROWS):
        negative_scores = (negatives[start:start + NEGATIVE_ROWS].to(dev, w.dtype) - mu) @ w.T  # (rows, S)
        if mentions is not None:
            negative_scores.masked_fill_(mentions[start:start + NEGATIVE_ROWS].to(dev), float("-inf"))
        contrast_max = torch.maximum(contrast_max, negative_scores.amax(0))
    cross = (k - mu) @ w.T  # (R, S): other subjects' keys on each filter
    cross[torch.arange(len(k), device=dev), subject] = float("-inf")
    contrast_max = torch.maximum(contrast_max, cross.amax(0))
    lookalike_max = torch.full((n_subjects,), float("-inf"), dtype=w.dtype, device=dev)
    if lookalikes is not None and len(lookalikes):
        lookalike_max = ((lookalikes.to(w.dtype) - mu) @ w.T).amax(0)
        contrast_max = torch.maximum(contrast_max, lookalike_max)
    separated = own_min > contrast_max
    kept_min, rejected_max = own_min.clone(), contrast_max.clone()  # o*, c*: the lowest kept own, top rejected contrast
    unseparated = (~separated).nonzero().flatten()
    if len(unseparated):
        contrast = _contrast_scores(unseparated, w, mu, negatives, mentions, cross, lookalikes)
        for s, scores in zip(unseparated.tolist(), contrast):
            kept_min[s], rejected_max[s] = _fewest_errors(own_scores[subject == s], scores)
    tau = rejected_max + threshold * (kept_min - rejected_max)
    missed = own_scores < kept_min[subject]
    dropped = torch.zeros(n_subjects, dtype=torch.long, device=dev).index_add(0, subject, missed.long())
    return {"tau": tau, "own_min": kept_min, "own_dropped": dropped, "missed": missed, "contrast_max": contrast_max,
            "lookalike_max": lookalike_max,
            "separated": separated, "cross": cross}


def _contrast_scores(filters: torch.Tensor, w: torch.Tensor, mu: torch.Tensor, negatives: torch.Tensor,
                     mentions: Optional[torch.Tensor], cross: torch.Tensor,
                     lookalikes: Optional[torch.Tensor]) -> list[torch.Tensor]:
    """Every contrast score of each filter in ``filters`` (k,) long (rows of w (S, d)), ascending (1-D each): the
    negatives off its mentions, the other groups' keys (cross (R, S), -inf on its own) and the look-alikes; the
    negatives in one pass for all k."""
    parts = [[] for _ in filters.tolist()]
    for start in range(0, len(negatives), NEGATIVE_ROWS):
        scores = (negatives[start:start + NEGATIVE_ROWS].to(w.device, w.dtype) - mu) @ w[filters].T  # (rows, k)
        if mentions is not None:
            scores.masked_fill_(mentions[start:start + NEGATIVE_ROWS][:, filters.cpu()].to(w.device), float("-inf"))
        for i, column in enumerate(scores.T):
            parts[i].append(column)
    alike = (lookalikes.to(w.dtype) - mu) @ w[filters].T if lookalikes is not None and len(lookalikes) else None
    out = []
    for i, s in enumerate(filters.tolist()):
        every = torch.cat(parts[i] + [cross[:, s]] + ([alike[:, i]] if alike is not None else []))
        out.append(every[every > float("-inf")].sort().values)
    return out


def _fewest_errors(own: torch.Tensor, contrast: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cut of a filter that no threshold separates: (o*, c*), o* the lowest own score kept and c* the highest
    contrast score below it, with o* minimising the training errors (own scores below it + contrast scores at or
    above it), the lowest such o* (the most own contexts kept). own (k,), contrast (n,) ascending. One title
    ("A Brief History of Time", whose last token " Time" is ordinary text's) had one of its 52 contexts at 0.21
    against contrast up to 0.64: keeping that context put τ at 0.20 and the detector passed its whole δ at
    1.6k of the union's 622k training tokens off a mention (nine tenths of every firing) and 1.3k of 93k held-out
    Wikipedia tokens; a few subjects whose contrast is text that names them otherwise ("Alps" without "the")
    keep every context at the cost of a few tokens."""
    own = own.sort().values
    above = len(contrast) - torch.searchsorted(contrast, own)  # contrast scores >= each own score
    errors = torch.arange(len(own), device=own.device) + above
    best = own[int(errors.argmin())]
    below = contrast[contrast < best]
    return best, below[-1] if len(below) else best - 0.05 * best.abs().clamp_min(1e-3)


def lookalike_tokens(tok: Any, embeddings: torch.Tensor, own: torch.Tensor, *, extensions: int = 6,
                     neighbours: int = 6) -> dict[int, list[int]]:
    """Tokens that look like each subject's last token, which a detector must not take for it: the vocabulary's
    extensions of its text (" India" -> " Indian", " Indians", " Indiana": the ``extensions`` with the lowest
    ids, a BPE's commonest merges) and its ``neighbours`` nearest input embeddings (cosine). At 100 validation
    facts the held-out text's KL was one such fire (" Indian" of "the Indian Ocean" on India's detector, past
    its own contexts). own (k,) long: the subjects' last-token ids (none of them is anyone's look-alike: a
    text with them may name that subject); embeddings (vocab, d). Returns {own id: look-alike ids}."""
    strings = tok.convert_ids_to_tokens(list(range(len(embeddings))))
    banned = set(own.tolist()) | set(getattr(tok, "all_special_ids", []))
    banned |= {i for i, t in enumerate(strings) if not isinstance(t, str)}
    ordered = sorted((t, i) for i, t in enumerate(strings) if i not in banned)
    texts = [t for t, _ in ordered]
    unit = F_nn.normalize(embeddings.detach().float(), dim=1)
    out = {}
    for i in sorted(set(own.tolist())):
        found, at = [], bisect.bisect_right(texts, strings[i])  # the extensions follow it in sorted order
        while at < len(texts) and texts[at].startswith(strings[i]):
            found.append(ordered[at][1])
            at += 1
        chosen = sorted(found)[:extensions]
        if neighbours:
            similarity = unit @ unit[i]
            similarity[sorted(banned | set(chosen))] = float("-inf")
            top = similarity.topk(min(neighbours, len(similarity)))
            chosen += top.indices[top.values > float("-inf")].tolist()
        out[i] = chosen
    return out


# How many of a subject's contexts (spread over its templates and prefixes) each look-alike is placed in.
LOOKALIKE_CONTEXTS = 8


def lookalike_states(model: Any, ctx: SubjectContexts, layer: int, lookalikes: dict[int, list[int]], *,
                     contexts: int = LOOKALIKE_CONTEXTS, batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MLP inputs of ``layer`` at look-alikes of each subject's last token put in its place in up to ``contexts``
    of its contexts (the text up to there: a causal state depends on nothing after it). lookalikes: {last-token
    id: look-alike ids} (:func:`lookalike_tokens`). Returns states (L, d) and the context row (L,) long each
    stands in for (its subject and placement are that row's)."""
    ids, last = ctx.batch.input_ids, ctx.batch.subject_last
    rows, tokens = [], []
    for s in range(len(ctx.subjects)):
        own = (ctx.subject == s).nonzero().flatten()
        picked = own[torch.linspace(0, len(own) - 1, min(contexts, len(own))).round().long()]
        for r in picked.tolist():
            for t in lookalikes.get(int(ids[r, last[r]]), []):
                rows.append(r), tokens.append(t)
    if not rows:
        return torch.empty(0, model.config.hidden_size), torch.empty(0, dtype=torch.long)
    source = torch.tensor(rows)
    width = int(last[source].max()) + 1
    swapped = ids[source, :width].clone()
    swapped[torch.arange(len(source)), last[source]] = torch.tensor(tokens)
    mask = (torch.arange(width) <= last[source, None]).long()
    states = capture(model, swapped.masked_fill(mask == 0, 0), mask, layer, site="mlp_in", positions=last[source],
                     batch_size=batch_size, shared=last[source])
    return states, source


# How far past the ramp's upper corner the lowest own score sits (silu(x) - relu(x) ~ -x e^-x there).
RAMP_OVERSHOOT = 8.0


def ramp_units(det: dict, deltas: torch.Tensor, *, ramp: float = 12.0) -> FactMLP:
    """Two SwiGLU units per subject: silu(β(s − τ)) − silu(β(s − τ) − ramp) times δ/ramp, with β = (ramp +
    RAMP_OVERSHOOT) / (own_min − τ): every own context is past both corners and gets δ (to ~e^-8 relative), scores
    below τ get ≈ 0 (~ramp·e^-ramp). deltas (S, d)."""
    w, mu, tau = det["w"], det["mu"], det["tau"]
    beta = (ramp + RAMP_OVERSHOOT) / (det["own_min"] - tau)
    gate_w = beta[:, None] * w
    gate_b = -beta * (w @ mu + tau)
    n, d = w.shape
    gate = torch.cat([gate_w, gate_w]).float()
    bias = torch.cat([gate_b, gate_b - ramp]).float()
    down = torch.cat([deltas.double(), -deltas.double()]) / ramp  # (2S, d)
    return FactMLP(gate, bias, torch.zeros(2 * n, d), torch.ones(2 * n), down.T.float().contiguous(), None)


# The values' unembedding runs over this many chunks of rows at once: the (vocab, d) weight is then read once for
# all of them (at 32 rows a chunk ~20 % of a forward is the unembedding of ~70 target positions).
@dataclass
class SubjectUnits:
    """What the subject-keyed units are made of: ``ctx`` every training context; ``det`` the detectors
    (:func:`lda_detectors`, one per group), ``group_subject`` (G,) each detector's subject; ``deltas`` (S, d) one
    δ per subject; ``fit_rows`` (k,) the contexts δ was fit on; ``own`` (R, d) every context's key; ``ramp``; ``mid``
    the contexts' residual entering the MLP (certification starts there; None for a model where that differs);
    ``missed`` (R,) bool the contexts below their detector's kept cut (:func:`_fewest_errors`; None: none), which
    no δ answers and no repair refits."""

    ctx: SubjectContexts
    det: dict
    group_subject: torch.Tensor
    deltas: torch.Tensor
    fit_rows: torch.Tensor
    own: torch.Tensor
    ramp: float
    mid: Optional[MidStates] = None
    missed: Optional[torch.Tensor] = None

    def repairable(self, margins: torch.Tensor) -> torch.Tensor:
        """(R,) bool: the unanswered contexts (``margins`` (R,) <= 0) that their detector reaches."""
        return (margins <= 0) if self.missed is None else (margins <= 0) & ~self.missed

    def mlp(self) -> FactMLP:
        """The units (2 per detector), each adding its subject's δ."""
        return ramp_units(self.det, self.deltas[self.group_subject], ramp=self.ramp).to(self.own.device)

    def reached_rows(self, model: Any, subjects: torch.Tensor) -> Optional[torch.Tensor]:
        """(R,) bool: the contexts whose margins a new δ for ``subjects`` (k,) long may change: their own, and those
        with a token where one of their units passes more than :data:`REFIT_REACH` of its δ (at every other
        token a δ change reaches the MLP output scaled by less than that). None without mid states (then every
        context)."""
        if self.mid is None:
            return None
        own = torch.isin(self.ctx.subject, subjects.cpu())
        groups = torch.isin(self.group_subject, subjects.to(self.group_subject.device)).nonzero().flatten()
        if len(groups) == 0:  # the refit left every δ as it was: nothing can change
            return own
        det = {k: self.det[k][groups] for k in ("w", "tau", "own_min")}
        passed = torch.cat([detector_firing({**det, "mu": self.det["mu"]}, mlp_inputs(model, self.mid.layer, part),
                                            self.ramp, REFIT_REACH)
                            for part in self.mid.states.split(NEGATIVE_ROWS)])
        row = torch.repeat_interleave(torch.arange(len(self.mid.lengths)), self.mid.lengths)
        reached = torch.zeros(len(self.mid.lengths), dtype=torch.bool)
        reached[row[passed.cpu()]] = True
        return reached | own

    def value_error(self, mlp: FactMLP) -> float:
        """max over contexts of ‖mlp(key) − δ‖ over the mean ‖δ‖ (subjects whose targets already win by the
        margin keep δ = 0)."""
        with torch.no_grad():
            return float((mlp(self.own) - self.deltas[self.ctx.subject]).norm(dim=1).max()
                         / self.deltas.norm(dim=1).mean().clamp_min(1e-12))


# A repair round certifies again only the contexts where a refit subject's units pass more than this fraction of its
# δ at some token (SubjectUnits.reached_rows): elsewhere the new δ moves the MLP output by less than 1e-6 of its
# change, and the margins are the last certification's.
REFIT_REACH = 1e-6


def detector_firing(det: dict, states: torch.Tensor, ramp: float, fraction: float = 1e-3) -> torch.Tensor:
    """(N,) bool: some detector passes more than ``fraction`` of its subject's δ at states (N, d) (its ramp's
    output over ``ramp``), whatever the δ."""
    unit = ramp_units(det, torch.eye(len(det["w"]), dtype=torch.float64), ramp=ramp).to(states.device)
    with torch.no_grad():  # (rows, 2S) outputs a part: all N at once is N·2S floats
        return torch.cat([unit(part.float()).abs().amax(1) > fraction for part in states.split(NEGATIVE_ROWS)])


def build_subject_units(model: Any, tok: Any, requests: Sequence[Request], *, layer: int, background: torch.Tensor,
                      background_texts: Sequence[str], prefixes: Sequence[str], value_prefixes: int, within: float,
                      threshold: float, ramp: float, ridge: float, margin: float, value_steps: int, value_lr: float,
                      batch_size: int, progress: bool, lookalikes: int, lookalike_weight: float, essence: int = 0,
                      essence_weight: float = 1.0, partner_weight: float = 0.0,
                      checkpoint: Union[str, Path, None] = None,
                      workers: Union[int, str] = 1) -> tuple[SubjectUnits, dict]:
    """Build the subject-keyed units for ``requests`` (not yet appended): (units, stats).
    background (N, d): MLP inputs of ``layer`` at the real tokens of ``background_texts`` (ordinary text);
    essence: per subject, the model's continuations (:data:`~factkernels.hf.essence.ESSENCE_TOKENS` tokens) after it under the last
    ``essence`` prefixes, kept by the δ fit with ``essence_weight`` (:func:`~factkernels.hf.subject_values.fit_subject_deltas`; 0: none);
    checkpoint: where the values fit keeps its finished chunks
    (:func:`~factkernels.hf.checkpoint.resumable_subject_fit`; None: nothing written);
    workers: chunks of the values fit run at once (:func:`~factkernels.hf.checkpoint.value_workers`; one worker
    without a checkpoint: one joint fit);
    lookalikes: extensions and embedding neighbours (each) of every subject's last token (:func:`lookalike_tokens`)
    kept below its detector's threshold with ``lookalike_weight`` (:func:`lda_detectors`); partner_weight: the
    pairwise penalty between a detector and the other subjects' keys that pass its threshold (0: none)."""
    timings: dict = {}  # wall and process CPU seconds of each stage
    t, c = time.perf_counter(), time.process_time()
    ctx = subject_contexts(tok, requests, prefixes)
    # the residual entering the MLP, kept for certification (which then starts at the edited MLP); the keys are
    # its norm, as the MLP sees it
    residual = capture(model, ctx.batch.input_ids, ctx.batch.attention_mask, layer, site="mlp_residual",
                       batch_size=batch_size, shared=ctx.batch.subject_first)
    probe = ctx.batch.rows(slice(0, 2))
    mid = (MidStates(layer, residual, ctx.batch.attention_mask.sum(1))
           if mid_matches(model, probe.input_ids, probe.attention_mask, layer) else None)
    states = mlp_inputs(model, layer, residual)
    lengths = ctx.batch.attention_mask.sum(1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    key_index = offsets + ctx.batch.subject_last
    is_key = torch.zeros(len(states), dtype=torch.bool)
    is_key[key_index] = True
    own = states[key_index]
    negatives = torch.cat([background.to(states), states[~is_key]])
    text_ids, text_mask = encode_texts(tok, background_texts)
    mentions = torch.cat([subject_mentions(tok, ctx.subjects, text_ids, text_mask),
                          subject_mentions(tok, ctx.subjects, ctx.batch.input_ids, ctx.batch.attention_mask)[~is_key]])
    last_ids = ctx.batch.input_ids[torch.arange(len(ctx.requests)), ctx.batch.subject_last]
    similar = (lookalike_tokens(tok, model.get_input_embeddings().weight, last_ids, extensions=lookalikes,
                                neighbours=lookalikes) if lookalikes else {})
    alike, alike_row = lookalike_states(model, ctx, layer, similar, batch_size=batch_size)
    alike = alike.to(states)
    timings["capture"], timings["capture_cpu"] = time.perf_counter() - t, time.process_time() - c

    t, c = time.perf_counter(), time.process_time()
    fit_rows = (ctx.prefix <= value_prefixes).nonzero().flatten()
    fit_batch, fit_subject, kept = ctx.batch.rows(fit_rows), ctx.subject[fit_rows], None
    if essence:
        openers = [(p + ". {}", s) for s in ctx.subjects for p in prefixes[-essence:]]
        after = continuations(model, tok, [o.replace("{}", s) for o, s in openers], length=ESSENCE_TOKENS,
                              batch_size=batch_size)
        rows = [ctx.requests[i] for i in fit_rows.tolist()] + [Request(o, s, a or " .")
                                                               for (o, s), a in zip(openers, after)]
        fit_batch = encode_requests(tok, rows, with_target=True)
        fit_subject = torch.cat([fit_subject, torch.arange(len(ctx.subjects)).repeat_interleave(essence)])
        kept = torch.arange(len(rows)) >= len(fit_rows)
    workers = value_workers(workers, model, len(ctx.subjects))
    fit = (fit_subject_deltas if checkpoint is None and workers == 1
           else partial(resumable_subject_fit, fit_subject_deltas, checkpoint=checkpoint, workers=workers))
    deltas, value_info = fit(model, fit_batch, fit_subject, layer, margin=margin, steps=value_steps, lr=value_lr,
                             batch_size=batch_size, progress=progress, essence=kept, essence_weight=essence_weight)
    # chunks read from a checkpoint count the seconds they took then, so a resumed insertion's are one run's
    timings["values"] = time.perf_counter() - t + value_info.get("value_restored_seconds", 0.0)
    timings["values_cpu"] = time.process_time() - c + value_info.get("value_restored_cpu", 0.0)

    t, c = time.perf_counter(), time.process_time()
    options = dict(within=within, ridge=ridge, threshold=threshold, lookalikes=alike, lookalike_weight=lookalike_weight,
                   partner_weight=partner_weight)
    det, _, group_subject = subject_detectors(own, ctx, negatives, mentions=mentions, alike_row=alike_row, **options)
    missed = det.pop("missed").cpu()  # rows of the final filters' groups: every context once
    units = SubjectUnits(ctx, det, group_subject, deltas, fit_rows, own.float(), ramp, mid, missed)
    firing = detector_firing(det, negatives, ramp)
    alike_firing = detector_firing(det, alike, ramp) if len(alike) else torch.zeros(0, dtype=torch.bool)
    timings["construct"], timings["construct_cpu"] = time.perf_counter() - t, time.process_time() - c
    stats = {"subjects": len(ctx.subjects), "detectors": len(group_subject), "contexts": len(ctx.requests),
             "background_tokens": len(background),
             "separated": int(det["separated"].sum()), "own_min_mean": float(det["own_min"].mean()),
             "missed": int(missed.sum()),
             "cross_firing": int(det["cross_firing"].sum()), "partnered": int((det["partners"] > 0).sum()),
             "contrast_max_mean": float(det["contrast_max"].mean()), "tau_mean": float(det["tau"].mean()),
             "negatives_firing": float(firing.double().mean()),
             "negatives_firing_off_mention": float((firing & ~mentions.any(1).to(firing.device)).double().mean()),
             "lookalikes": len(alike), "lookalike_tokens": sum(map(len, similar.values())),
             "lookalikes_firing": int(alike_firing.sum()),
             "timings": timings, "values": value_info,
             "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    return units, stats


def refit_uncertified(model: Any, units: SubjectUnits, margins: torch.Tensor, *, layer: int, below: float,
                      margin: float, value_steps: int, value_lr: float, batch_size: int, progress: bool,
                      workers: Union[int, str] = 1) -> dict:
    """Refit δ (in ``units``, in place) of the subjects with a context the edited model does not answer
    (``margins`` (R,) <= 0, every context's certified margin), from their current δ, over their fit contexts
    plus every context of theirs whose margin is below ``below`` (those join ``units.fit_rows``): δ fit on some
    contexts need not carry to the others (a subject that opens the bare prompt sits at the text's first
    tokens). ``workers``: chunks of those subjects fit at once (:func:`~factkernels.hf.checkpoint.value_workers`).
    Returns the fit's info with the subjects and contexts added."""
    ctx = units.ctx
    failing = torch.unique(ctx.subject[units.repairable(margins)])
    ours = torch.isin(ctx.subject, failing)
    if units.missed is not None:
        ours &= ~units.missed
    added = ((margins < below) & ours).nonzero().flatten()
    units.fit_rows = torch.unique(torch.cat([units.fit_rows, added]))
    rows = units.fit_rows[ours[units.fit_rows]]
    workers = value_workers(workers, model, len(failing))
    fit = fit_subject_deltas if workers == 1 else partial(resumable_subject_fit, fit_subject_deltas, workers=workers)
    units.deltas, info = fit(model, ctx.batch.rows(rows), ctx.subject[rows], layer, margin=margin, steps=value_steps,
                             lr=value_lr, batch_size=batch_size, init=units.deltas, progress=progress)
    return {**info, "subjects": len(failing), "rows": len(rows)}


# Shipped Wikipedia leads (~40k tokens) that join the detectors' negatives by default (insert_facts'
# ``wikipedia_negatives``): the 2,794 held-out text tokens are too few to show a detector's tail on ordinary text,
# 500 held-out leads (48k tokens) are not (benchmarks/results/hf/text_locality_detectors_validation0_nall_wiki.json).
WIKIPEDIA_NEGATIVES = 400

# insert_facts' default ``partner_weight`` (lda_detectors' pairwise filter). At the 960 known-fact validation requests
# without it two detectors passed their δ at another subject's keys ("germanium" at "zirconium", both ending in
# "ium": 22 training contexts got a foreign δ, 9 of them half of it or more, and 5 of zirconium's stayed uncertified
# through every repair round); with 0.003-0.03 none did, the same 98.4 % of held-out-template keys got the whole δ
# and the same 22 held-out Wikipedia tokens off a mention got some δ
# (benchmarks/results/hf/text_locality_detectors_validation0_nall_partner.json). On invented subjects 0.01 left 0 of
# 1,650 validation contexts uncertified against 105 (hf_new_fact_interference.py).
PARTNER_WEIGHT = 0.01


def default_prefixes() -> list[str]:
    """The editing benchmark's edit prefixes (never its held-out ones)."""
    from ..datasets.editing_benchmark import prefixes

    return prefixes("edit")


def check_subject_options(value_prefixes: int, prefixes: Sequence[str], threshold: float, ramp: float,
                          within: float, repair_rounds: int, lookalikes: int, lookalike_weight: float, essence: int = 0,
                          essence_weight: float = 1.0, wikipedia_negatives: int = 0, partner_weight: float = 0.0) -> None:
    if not partner_weight >= 0:
        raise ValueError(f"partner_weight must be >= 0, got {partner_weight!r}")
    if isinstance(wikipedia_negatives, bool) or not isinstance(wikipedia_negatives, int) or wikipedia_negatives < 0:
        raise ValueError(f"wikipedia_negatives must be an int >= 0, got {wikipedia_negatives!r}")
    if isinstance(essence, bool) or not isinstance(essence, int) or not 0 <= essence <= len(prefixes):
        raise ValueError(f"essence must be an int in [0, {len(prefixes)}] (the number of prefixes), got {essence!r}")
    if not essence_weight >= 0:
        raise ValueError(f"essence_weight must be >= 0, got {essence_weight!r}")
    if isinstance(lookalikes, bool) or not isinstance(lookalikes, int) or lookalikes < 0:
        raise ValueError(f"lookalikes must be an int >= 0, got {lookalikes!r}")
    if not lookalike_weight > 0:
        raise ValueError(f"lookalike_weight must be > 0, got {lookalike_weight!r}")
    if isinstance(repair_rounds, bool) or not isinstance(repair_rounds, int) or repair_rounds < 0:
        raise ValueError(f"repair_rounds must be an int >= 0, got {repair_rounds!r}")
    if not 0 <= value_prefixes <= len(prefixes):
        raise ValueError(f"value_prefixes must be in [0, {len(prefixes)}] (the number of prefixes), got {value_prefixes}")
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1) for keys='subject' (its place between contrast and own "
                         f"scores), got {threshold}")
    if ramp <= 0 or within < 0:
        raise ValueError(f"ramp must be > 0 and within >= 0, got ramp={ramp}, within={within}")


def insert_subject_keyed(model: Any, tok: Any, requests: list[Request], *, layer: int, start_time: float,
                         start_cpu: float, background_seconds: tuple[float, float], repair_rounds: int,
                         **options: Any) -> Insertion:
    """``insert_facts(keys="subject")``: build (:func:`build_subject_units`), append, certify every context, and up
    to ``repair_rounds`` times refit the unanswered ones' subjects (:func:`refit_uncertified`) and certify again.
    options: :func:`build_subject_units`'s; start_time, start_cpu: when the call began (wall, process CPU);
    background_seconds: (wall, CPU) of the background states. With ``checkpoint`` only the first values fit is kept
    (:func:`~factkernels.hf.checkpoint.resumable_subject_fit`): a rerun captures, certifies and repairs again
    (repairs refit only the subjects with an unanswered context)."""
    built, stats = build_subject_units(model, tok, requests, layer=layer, ridge=1e-2, **options)
    ctx, batch_size, repairs = built.ctx, options["batch_size"], []
    # wall and process CPU seconds of each stage (the CPU ones count every thread; on a shared machine the wall
    # ones also count the others' load)
    timings = {"background": background_seconds[0], "background_cpu": background_seconds[1], **stats.pop("timings"),
               "verify": 0.0, "verify_cpu": 0.0, "repair": 0.0, "repair_cpu": 0.0}

    def timed(stage: str, t: float, c: float) -> None:
        timings[stage] += time.perf_counter() - t
        timings[stage + "_cpu"] += time.process_time() - c

    def certify(last: Optional[torch.Tensor] = None,
                rows: Optional[torch.Tensor] = None) -> tuple[FactMLP, AppendedUnits, torch.Tensor]:
        """Append the units and measure the contexts' margins: ``rows`` (k,) long only, the others kept from
        ``last`` (R,); every context without them."""
        t, c = time.perf_counter(), time.process_time()
        mlp = built.mlp()
        appended = append_units(model, layer, mlp.swiglu_weights())
        with removed_on_failure(appended), torch.no_grad():
            if rows is None:
                margins = batch_margins(model, ctx.batch, batch_size, shared=ctx.batch.subject_first, mid=built.mid)
            else:
                margins = last.clone()
                sub = ctx.batch.rows(rows)
                margins[rows] = batch_margins(model, sub, batch_size, shared=sub.subject_first, mid=built.mid.rows(rows))
        timed("verify", t, c)
        return mlp, appended, margins

    fact_mlp, units, margins = certify()
    while len(repairs) < repair_rounds and bool(built.repairable(margins).any()):
        units.remove()  # δ is fit on the unedited model
        t, c = time.perf_counter(), time.process_time()
        kept, best = (built.deltas, built.fit_rows), (fact_mlp, margins)
        repairs.append(refit_uncertified(model, built, margins, layer=layer, below=options["margin"],
                                         **{k: options[k] for k in ("margin", "value_steps", "value_lr",
                                                                    "batch_size", "progress", "workers")}))
        # only the contexts the refit subjects' units reach can change (and those within 0.01 of the sign flipping)
        reached = built.reached_rows(model, (built.deltas != kept[0]).any(1).nonzero().flatten())
        again = None if reached is None else (reached | (margins.abs() < 1e-2)).nonzero().flatten()
        timed("repair", t, c)
        fact_mlp, units, margins = certify(margins, again)
        repairs[-1]["recertified"] = len(ctx.requests) if again is None else len(again)
        left = int((margins <= 0).sum())
        repairs[-1].update(uncertified=left, kept=left < int((best[1] <= 0).sum()))
        if not repairs[-1]["kept"]:  # no fewer unanswered: undone (the same units give the same model and margins)
            units.remove()
            (built.deltas, built.fit_rows), (fact_mlp, margins) = kept, best
            units = append_units(model, layer, fact_mlp.swiglu_weights())
            break
    with removed_on_failure(units), torch.no_grad():
        background = options["background"]
        background_ratio = float(fact_mlp(background).norm(dim=1).mean()
                                 / mlp_module(model, layer)(background).norm(dim=1).mean())
    restored = (stats["values"].get("value_restored_seconds", 0.0), stats["values"].get("value_restored_cpu", 0.0))
    timings.update(total=time.perf_counter() - start_time + restored[0],
                   total_cpu=time.process_time() - start_cpu + restored[1])
    contexts = 1 + int(ctx.prefix.max())
    stats.update(uncertified=[[int(i) // contexts, int(i) % contexts] for i in (margins <= 0).nonzero().flatten()],
                 value_contexts=len(built.fit_rows))
    values, rss = {**stats.pop("values"), "repairs": repairs}, stats.pop("peak_rss_mb")
    report = InsertionReport(
        layer=layer, gate="lda-ramp", position="subject", num_facts=len(requests), num_keys=len(ctx.requests),
        hidden_added=fact_mlp.hidden_size, params_added=fact_mlp.num_parameters,
        efficacy=float((margins > 0).double().mean()), min_margin=float(margins.min()),
        margins=[round(float(m), 4) for m in margins], value_error=built.value_error(fact_mlp),
        delta_norm_mean=float(built.deltas.norm(dim=1).mean()), background_output_ratio=background_ratio,
        timings=timings, peak_rss_mb=rss, construction=stats, values=values)
    return Insertion(report, fact_mlp, units)
