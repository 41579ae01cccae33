"""The values of subject-keyed insertion: one residual δ per subject, fit jointly over its contexts.

Split from :mod:`factkernels.hf.subject_keys` (the detectors, units and certification) so that each module holds one
concept; :func:`fit_subject_deltas` is what :func:`~factkernels.hf.checkpoint.resumable_subject_fit` runs in chunks.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F_nn

from ..progress import progress_bar
from .capture import (PromptBatch, hidden_with_delta, length_sorted_chunks, model_device, padding_pieces,
                      piece_overhead, tail_matches, tail_start, tail_with_delta)
from .essence import bucketed_kl, essence_reference

UNEMBED_CHUNKS = 4

# The values fit measures a row that reached the margin again at every step only while it is within RECHECK_SLACK
# of it; above that, every RECHECK_STEPS steps (and before its subject is called done). At 100 validation requests
# a row never fell from that far above in fewer steps in the first fit, where these runs were 13 % of the work,
# and 8 times in 48 rows x 31 steps of the repair round, where they were 45 % (benchmarks/results/hf/insert_speed/).
RECHECK_STEPS = 4
RECHECK_SLACK = 0.5

# Adam's learning rate and betas for δ. Its steps are about lr per coordinate whatever the gradient's scale, and a
# subject's δ grows to a norm of ~100-200 over its ~10-60 steps. At 100 validation requests lr 1.0 with β2 0.9 (the
# second moment following the few rows still below the margin, not the first steps' large gradients) ran the first
# fit in 31 % fewer weighted tokens than lr 0.5 with β2 0.999, every subject reaching the margin, δ's norm ~1.5x
# (benchmarks/results/hf/insert_speed/subject_L10_n100_cpu_v32_{before,after}.json).
SUBJECT_VALUE_LR = 1.0
ADAM_BETAS = (0.9, 0.9)


def fit_subject_deltas(model: Any, batch: PromptBatch, subject: torch.Tensor, layer: int, *, margin: float = 3.0,
                       steps: int = 40, lr: float = SUBJECT_VALUE_LR, batch_size: int = 32, init: Optional[torch.Tensor] = None,
                       progress: bool = True, essence: Optional[torch.Tensor] = None,
                       essence_weight: float = 1.0) -> tuple[torch.Tensor, dict]:
    """One δ per subject (S, d), added after ``layer``'s MLP at the subject's last token of each of its rows, fit
    jointly over them: Adam on the summed target cross-entropy of the rows below ``margin`` until every row
    reaches it (or ``steps``). δ changes nothing before the subject's last token: one forward gives the residual
    after ``layer`` from there on and the keys and values before it (:func:`~factkernels.hf.capture.tail_start`),
    and each step runs only the later blocks on the positions from the subject's last token on.
    init: (S, d) the δ to start from (default zeros; its rows are measured before any runs with a graph); a
    subject without rows in ``batch`` keeps it.
    essence: (R,) bool, optional: rows whose targets are text the unedited model wrote after the subject
    (:func:`~factkernels.hf.essence.continuations`), not facts: they are not taught and have no margin; while
    their subject is fit, ``essence_weight`` times each row's mean KL(p ‖ p_δ) over its target positions (p the
    unedited model's, over its top :data:`~factkernels.hf.essence.ESSENCE_TOP` tokens and the rest) joins the loss, so δ leaves what the
    model says after the subject alone where no fact is asked (ROME's essence term, over whole continuations).
    Returns δ and {"value_steps", "value_min_margin" (the last step's, over the rows with a margin),
    "value_tokens_graph", "value_tokens_measured": the tokens run through the later blocks with a graph and without
    (the fit's work, whatever the machine's load), "value_subject_steps": (S,) the steps each subject's rows ran (0
    without rows; ``steps`` for one that never reached the margin)}."""
    device = model_device(model)
    n_subjects = int(subject.max()) + 1 if init is None else len(init)
    delta = (torch.zeros(n_subjects, model.config.hidden_size, device=device) if init is None
             else init.detach().to(device).clone()).requires_grad_(True)
    opt = torch.optim.Adam([delta], lr=lr, betas=ADAM_BETAS)
    batch = batch.scored_tokens()
    probe = batch.rows(slice(0, 2))
    start = batch.subject_last
    from_start = batch.attention_mask.sum(1) - start  # tokens each row runs through the later blocks
    overhead = piece_overhead(model)
    cached = (tail_start(model, batch, layer, start, batch_size=batch_size)
              if tail_matches(model, probe.input_ids, probe.attention_mask, layer) else None)

    def target_logits(chunk: torch.Tensor, sub: PromptBatch,
                      values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits (k, vocab) of the rows ``chunk`` at their target positions with their subjects' ``values`` (δ),
        the row (k,) and token (k,) of each. The model runs at most ``batch_size`` rows at a time and the unembedding
        once over all of them (its weight is read once for every :data:`UNEMBED_CHUNKS` chunks); ``chunk`` sorted by
        length from the subject on, cut by :func:`padding_pieces`."""
        t_rows, t_pos, t_tokens = sub.target_positions()
        step = values[subject[chunk].to(device)]
        hidden = []
        for piece in padding_pieces(from_start[chunk], batch_size, overhead):
            at = (t_rows >= piece[0]) & (t_rows <= piece[-1])  # target_positions lists rows in order
            rows, pos = t_rows[at] - piece[0], t_pos[at]
            if cached is None:  # a model whose tail differs: δ by a hook in a full forward
                part = sub.rows(piece)
                out = hidden_with_delta(model, layer, part, None, torch.arange(len(piece)), part.subject_last,
                                        step[piece.to(device)])
            else:
                rows_of = chunk[piece]
                out = tail_with_delta(model, layer, cached, rows_of, step[piece.to(device)])
                pos = pos - start[rows_of][rows]
            hidden.append(out[rows.to(out.device), pos.to(out.device)])
        return model.lm_head(torch.cat(hidden)).float(), t_rows, t_tokens

    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    history = []
    active = torch.arange(len(batch))
    # from zeros every row starts below the margin (a new fact) and runs with a graph at once; from ``init`` (a
    # repair round's refit) most rows start at it, so at the first step they are measured first like rows that
    # reached it, and only those below run again with the graph
    margins = torch.full((len(batch),), float("-inf") if init is None else float("inf"))
    essence = torch.zeros(len(batch), dtype=torch.bool) if essence is None else essence.cpu().bool()
    margins[essence] = float("inf")  # kept, not taught: never below the margin
    reference = essence_reference(essence, from_start, batch, batch_size,
                                  lambda chunk, sub: target_logits(chunk, sub, torch.zeros_like(delta)))

    tokens = {True: 0, False: 0}  # tokens run through the later blocks with a graph (True) and without
    ran = torch.zeros(n_subjects, dtype=torch.long)  # steps each subject's rows ran

    def run(rows: torch.Tensor, train: bool) -> torch.Tensor:
        """Margins of ``rows`` with the current δ (into ``margins``); with ``train``, the gradient of the summed
        target cross-entropy of those below the margin (and of the essence rows' KL) accumulated into δ.grad.
        Returns the rows below it."""
        below_rows = []
        tokens[train] += int(from_start[rows].sum())
        for part in length_sorted_chunks(from_start[rows], batch_size * UNEMBED_CHUNKS):
            chunk = rows[part]
            sub = batch.rows(chunk)
            with torch.set_grad_enabled(train):
                logits, t_rows, t_tokens = target_logits(chunk, sub, delta)
            t_tokens = t_tokens.to(logits.device)
            kept = essence[chunk].to(logits.device)
            own = logits.gather(1, t_tokens[:, None]).squeeze(1)
            other = logits.detach().scatter(1, t_tokens[:, None], float("-inf")).amax(1)
            row_margin = torch.full((len(chunk),), float("inf"), device=logits.device).scatter_reduce(
                0, t_rows.to(logits.device), (own.detach() - other), "amin").masked_fill(kept, float("inf"))
            margins[chunk] = row_margin.cpu()
            below_rows.append(chunk[margins[chunk] < margin])
            below = (row_margin < margin)[t_rows.to(logits.device)]
            if not train or not (bool(below.any()) or bool(kept.any())):
                continue
            loss = (F_nn.cross_entropy(logits, t_tokens, reduction="none") * below).sum()
            if bool(kept.any()) and essence_weight > 0:
                at = kept[t_rows.to(logits.device)]
                offset = (sub.target_positions()[1] - sub.prompt_last[t_rows])[at.cpu()]
                ids, logp = (r[chunk[t_rows[at.cpu()]], offset] for r in reference)
                kl = bucketed_kl(logp.to(logits.device), logits[at].log_softmax(-1).gather(1, ids.to(logits.device)))
                lengths = sub.target_len.to(logits.device).float()[t_rows.to(logits.device)[at]]
                loss = loss + essence_weight * (kl / lengths).sum()
            loss.backward()
        return torch.cat(below_rows) if below_rows else rows[:0]

    try:
        for step in progress_bar(range(steps), desc=f"subject values at layer {layer}", enabled=progress,
                                 leave=False):
            opt.zero_grad()
            # rows that were at the margin when last run go first without a graph: most stay there and add no gradient
            # (a backward costs about a forward); those that fell below run again with it, so the gradient is the
            # sum over the rows below the margin (up to float rounding: other batches). Rows at least
            # RECHECK_SLACK above it run only every RECHECK_STEPS steps (and on the last): they rarely fall in
            # between (:data:`RECHECK_STEPS`). Essence rows have no margin: while their subject is fit they
            # always run with the graph
            settled = (margins[active] >= margin) & ~essence[active]
            due = step % RECHECK_STEPS == 0 or step == steps - 1
            measured = settled & (due | (margins[active] < margin + RECHECK_SLACK))
            fell = run(active[measured], train=False)
            run(torch.cat([active[~settled], fell]), train=True)
            # a subject is done when all its rows reach the margin (its rows stop running and its δ stays): the rows
            # of a subject that looks done but were not measured at this δ are measured first
            unmeasured = active[settled & ~measured]
            subject_min = torch.full((n_subjects,), float("inf")).scatter_reduce(0, subject, margins, "amin")
            if len(unmeasured):
                fell = run(unmeasured[subject_min[subject[unmeasured]] >= margin], train=False)
                run(fell, train=True)
                subject_min = torch.full((n_subjects,), float("inf")).scatter_reduce(0, subject, margins, "amin")
            history.append(float(margins[~essence].min()))
            ran[torch.unique(subject[active])] += 1
            if bool((subject_min >= margin).all()):
                break
            active = (subject_min[subject] < margin).nonzero().flatten()
            with torch.no_grad():
                frozen = (subject_min >= margin).to(device)
                if delta.grad is not None:
                    delta.grad[frozen] = 0.0
            before = delta.detach().clone()
            opt.step()
            with torch.no_grad():
                delta[frozen] = before[frozen]
    finally:
        for p in params:
            p.requires_grad_(True)
    return delta.detach(), {"value_steps": len(history), "value_min_margin": history[-1] if history else None,
                            "value_tokens_graph": tokens[True], "value_tokens_measured": tokens[False],
                            "value_subject_steps": ran.tolist()}


__all__ = ["ADAM_BETAS", "RECHECK_SLACK", "RECHECK_STEPS", "SUBJECT_VALUE_LR", "UNEMBED_CHUNKS", "fit_subject_deltas"]
