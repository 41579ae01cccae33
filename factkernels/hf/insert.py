"""Inserting facts into a real causal LM by construction: new hidden units in one layer's MLP.

    ins = insert_facts(model, tok, requests)     # in place; ins.report; ins.remove() undoes it exactly

Design (argued from measurements in benchmarks/results/hf/, see the README):

* **Keys** are the MLP inputs (post-RMSNorm, what gate/up see) of layer L, captured with
  forward hooks at the positions that decide the target: with ``position="target"`` every
  position that predicts a target token (the prompt's last token, then each target token
  but the last, teacher-forced: greedy decoding reproduces exactly these states while it
  follows the target); with ``position="subject"`` the subject's last token (ROME's key).
* **Values** are residual-stream deltas δ added at that position after layer L's MLP,
  optimised by Adam on the target tokens' cross-entropy until every target token wins by
  ``margin`` logits. At the last layer with ``position="target"`` the rest of the model is
  only the final norm and the unembedding, so this costs no model forward at all; at any
  other layer or position the blocks after the layer run on its cached output plus δ
  (ROME/MEMIT's v*, without re-running the blocks before it).
* **Units**: ``gate="detector"`` (default): one unit per key whose gate is a whitened
  matched filter, silu(β(s_i(x) − τ)) with s_i(x) = w_iᵀ(x − μ), w_i = Σ⁻¹(k_i − μ)/‖k_i − μ‖²_Σ
  (μ, Σ from background text at the same layer), so s_i(k_i) = 1 while ordinary tokens sit
  near 0 and the unit is silent (silu(−βτ) ≈ 0); up is the constant 1 (a bias); the down
  columns solve Φ C = Δ (Φ_ji = gate_i(k_j)), so every key gets its δ exactly.
  ``gate="generic"``: the seed's construction, :func:`factkernels.encoder.build_shared_gate`
  with a random shared gate, δ expressed in an orthonormal basis of the deltas, and the
  background states as zero-output constraints in the same solve.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F_nn
from ..progress import progress_bar

from ..encoder import assemble, build_shared_gate
from ..mlp import FactMLP
from ..validation import check_positive_int
from .capture import (PromptBatch, block_outputs, capture, default_batch_size, encode_requests, encode_texts,
                      hidden_with_delta, length_sorted_chunks, logits_at, model_device, tail_matches)
from .checkpoint import WORKERS_AUTO, ChunkCheckpoint, check_workers, fingerprint
from .evaluate import batch_margins, fact_min, token_margin
from .layout import mlp_layers, mlp_module
from .requests import Request, parse_requests
from .subject_keys import (PARTNER_WEIGHT, WIKIPEDIA_NEGATIVES, check_subject_options, default_prefixes,
                           insert_subject_keyed)
from .subject_values import SUBJECT_VALUE_LR
from .units import Insertion, InsertionReport, append_units, removed_on_failure

GATES = ("detector", "generic")
KEYS = ("request", "subject")
KEY_POSITIONS = ("target", "subject")


@dataclass
class KeySet:
    """Where the keys of a batch of requests sit.

    row, position: (n_keys,) long indices into the PromptBatch; fact: (n_keys,) long request
    index; token: (n_keys,) long the target token the key's position predicts (-1 for subject keys).
    """

    row: torch.Tensor
    position: torch.Tensor
    fact: torch.Tensor
    token: torch.Tensor


def key_positions(batch: PromptBatch, position: str) -> KeySet:
    """Key positions: every target-predicting position ("target") or the subject's last token ("subject")."""
    if position not in KEY_POSITIONS:
        raise ValueError(f"position must be one of {KEY_POSITIONS}, got {position!r}")
    rows, positions, tokens = [], [], []
    for i in range(len(batch)):
        if position == "subject":
            rows.append(i), positions.append(int(batch.subject_last[i])), tokens.append(-1)
            continue
        start = int(batch.prompt_last[i])
        for t, token in enumerate(batch.target_ids(i)):
            rows.append(i), positions.append(start + t), tokens.append(token)
    row = torch.tensor(rows)
    return KeySet(row, torch.tensor(positions), row.clone(), torch.tensor(tokens))


def head_path(model: Any, layer: int, keys: KeySet) -> bool:
    """True when δ needs no model forward: target keys at the last layer (only norm and unembedding follow)."""
    return layer == len(mlp_layers(model)) - 1 and bool((keys.token >= 0).all())


def optimise_deltas(model: Any, batch: PromptBatch, layer: int, keys: KeySet, *, margin: float = 3.0,
                    steps: int = 60, lr: float = 0.5, batch_size: int = 32, residual: Optional[torch.Tensor] = None,
                    progress: bool = True, checkpoint: Union[str, Path, None] = None,
                    facts_per_chunk: int = 50) -> tuple[torch.Tensor, dict]:
    """Residual deltas δ (n_keys, d) added after layer ``layer``'s MLP at the key positions so that greedy
    decoding produces every target (each target token wins by ``margin`` logits), smallest-effort:
    Adam on the cross-entropy of the facts still below the margin, stopping when none is.

    Fast path (last layer, target keys): logits = lm_head(norm(r + δ)) with r the residual after the
    last layer, no model forward per step. Otherwise (ROME's v*) the residual after the layer is computed
    once and each step runs only the later blocks on it plus δ, on the prompts of the facts not yet at the
    margin only: a fact that reaches it keeps that δ.
    residual: (n_keys, d) the residual after ``layer`` at the key positions, when the caller captured it
    already (fast path only; otherwise it is captured here).
    checkpoint: a .safetensors file for the model path (hours at 1,000 facts on a CPU): the requests run in
        chunks of ``facts_per_chunk`` and each chunk's δ is written the moment it is done; run again with
        the same file, the chunks it holds are read instead of optimised. Facts are independent rows and Adam
        is elementwise, so chunks give the δ of one run over every fact (up to float rounding). The file
        records what it was made for and is refused for other requests, layer or settings.
    """
    if checkpoint is None or head_path(model, layer, keys):
        return _optimise(model, batch, layer, keys, margin=margin, steps=steps, lr=lr, batch_size=batch_size,
                         residual=residual, progress=progress)
    check_positive_int("facts_per_chunk", facts_per_chunk)
    saved = ChunkCheckpoint(checkpoint, fingerprint(
        model, layer, (batch.input_ids, batch.attention_mask, keys.row, keys.position, keys.token),
        {"margin": margin, "steps": steps, "lr": lr, "facts_per_chunk": facts_per_chunk}))
    delta = torch.zeros(len(keys.row), model.config.hidden_size, device=model_device(model))
    infos, restored = [], 0.0
    starts = range(0, len(batch), facts_per_chunk)
    for start in progress_bar(starts, desc=f"values at layer {layer} (chunks)", enabled=progress, leave=False):
        end = min(len(batch), start + facts_per_chunk)
        chosen = ((keys.fact >= start) & (keys.fact < end)).nonzero().flatten()
        if start in saved.chunks:
            restored += saved.chunks[start][1]["seconds"]
        else:
            chunk_start = time.perf_counter()
            sub = KeySet(keys.row[chosen] - start, keys.position[chosen], keys.fact[chosen] - start, keys.token[chosen])
            part, info = _optimise(model, batch.rows(slice(start, end)), layer, sub, margin=margin, steps=steps,
                                   lr=lr, batch_size=batch_size, residual=None, progress=progress)
            saved.put(start, {"delta": part}, {**info, "seconds": time.perf_counter() - chunk_start})
        part, info = saved.chunks[start]
        delta[chosen.to(delta.device)] = part["delta"].to(delta)
        infos.append(info)
    return delta, {"value_steps": max(i["value_steps"] for i in infos),
                   "value_min_margin": min(i["value_min_margin"] for i in infos), "value_path": "model",
                   "value_chunks": len(infos), "value_restored_seconds": restored}


def _optimise(model: Any, batch: PromptBatch, layer: int, keys: KeySet, *, margin: float, steps: int, lr: float,
              batch_size: int, residual: Optional[torch.Tensor], progress: bool) -> tuple[torch.Tensor, dict]:
    """:func:`optimise_deltas` over every request of ``batch`` at once."""
    device = model_device(model)
    head_only = head_path(model, layer, keys)
    delta = torch.zeros(len(keys.row), model.config.hidden_size, device=device, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=lr)
    norm, lm_head = model.model.norm, model.get_output_embeddings()
    if head_only:
        if residual is None:
            residual = capture_at_keys(model, batch, layer, keys, batch_size, site="block_out")
        residual = residual.to(device)
        tokens = keys.token.to(device)
    start_states = None
    if not head_only:
        # the blocks up to ``layer`` never see δ: their output is computed once, and each step runs only the
        # blocks after it (checked against the full forward on two rows; otherwise a hook adds δ in a full forward)
        probe = batch.rows(slice(0, 2))
        if tail_matches(model, probe.input_ids, probe.attention_mask, layer):
            start_states = block_outputs(model, batch.input_ids, batch.attention_mask, layer, batch_size=batch_size)
    history = []
    # full-model path: a fact is done once every target token wins by the margin; its δ is kept from then on
    # and its prompt no longer runs (facts are independent rows)
    done = torch.zeros(len(batch), dtype=torch.bool)
    done_margin = torch.full((len(batch),), float("inf"), device=device)
    kept = torch.zeros_like(delta)
    bar = progress_bar(range(steps), desc=f"values at layer {layer}", enabled=progress, leave=False)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        for _ in bar:
            opt.zero_grad()
            if head_only:
                with torch.no_grad():
                    per_key = token_margin(lm_head(norm(residual + delta)), tokens)
                fact_margin = fact_min(per_key, keys.fact.to(device), len(batch))
                # the gradient only through the keys still below the margin (most are done after a few steps)
                active = (per_key < margin).nonzero().flatten()
                logits = lm_head(norm(residual[active] + delta[active]))
                loss = F_nn.cross_entropy(logits, tokens[active], reduction="sum")
            else:
                active = (~done).nonzero().flatten()
                active_margin, _ = _full_model_step(model, layer, batch, keys, delta, margin, batch_size, active,
                                                    start_states=start_states)  # δ.grad accumulated batch by batch
                fact_margin = done_margin.clone()
                fact_margin[active.to(device)] = active_margin
                newly = active[(active_margin >= margin).cpu()]
                done[newly] = True
                done_margin[newly.to(device)] = active_margin[(active_margin >= margin)]
                with torch.no_grad():
                    finished = done[keys.fact].to(device)
                    kept[finished] = delta[finished]
            history.append(float(fact_margin.min()))
            bar.set_postfix(min_margin=f"{history[-1]:.2f}")
            if bool((fact_margin >= margin).all()):
                break
            if head_only:
                loss.backward()
            opt.step()
            if not head_only:
                with torch.no_grad():
                    delta[finished] = kept[finished]
    finally:
        for p in params:
            p.requires_grad_(True)
    info = {"value_steps": len(history), "value_min_margin": history[-1], "value_path": "head" if head_only else "model"}
    return delta.detach(), info


def _full_model_step(model: Any, layer: int, batch: PromptBatch, keys: KeySet, delta: torch.Tensor, margin: float,
                     batch_size: int, facts: torch.Tensor,
                     start_states: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, float]:
    """One loss evaluation of the requests ``facts`` (indices into ``batch``) with δ added after ``layer``'s MLP:
    to ``start_states`` (n, T, d), the residual after that layer, and only the later blocks run
    (:func:`~factkernels.hf.capture.hidden_with_delta`), or, without them, by a forward hook in a full forward. The loss is the summed
    target cross-entropy of the requests below ``margin``; its gradient is accumulated into ``delta.grad``
    batch by batch (when δ requires it), so memory holds one batch's graph, not every request's. Requests
    run in batches of similar length. Returns their margins (len(facts),) and the loss."""
    device = delta.device
    margins, total = torch.empty(len(facts), device=device), 0.0
    for part in length_sorted_chunks(batch.attention_mask.sum(1)[facts], batch_size):
        chunk = facts[part]
        sub = batch.rows(chunk)
        local = torch.full((len(batch),), -1, dtype=torch.long)
        local[chunk] = torch.arange(len(chunk))
        chosen = (local[keys.row] >= 0).nonzero().flatten()
        states = None if start_states is None else start_states[chunk.to(start_states.device)]
        hidden = hidden_with_delta(model, layer, sub, states, local[keys.row[chosen]], keys.position[chosen],
                                   delta[chosen.to(device)])
        t_rows, t_pos, t_tokens = sub.target_positions()
        t_rows, t_tokens = t_rows.to(device), t_tokens.to(device)
        logits = logits_at(model, hidden, t_rows, t_pos)
        m = fact_min(token_margin(logits.detach(), t_tokens), t_rows, len(sub))
        margins[part.to(device)] = m
        below = (m < margin)[t_rows]
        loss = (F_nn.cross_entropy(logits, t_tokens, reduction="none") * below).sum()
        if loss.requires_grad:
            loss.backward()
        total += float(loss.detach())
    return margins, total


# background states by (tokenizer, layer, max_length, texts): (weight versions, tokenizer, weights, states); a few kept
_BACKGROUND: dict = {}
_BACKGROUND_KEEP = 4


def _weights_before_mlp(model: Any, layer: int) -> list:
    """The parameters the MLP input of ``layer`` depends on: the embeddings, the blocks before it, and the
    block's own attention and norms."""
    inner = model.model
    params = list(inner.embed_tokens.parameters())
    for i, block in enumerate(inner.layers[:layer + 1]):
        params += [p for name, p in block.named_parameters() if i < layer or not name.startswith("mlp.")]
    return params


def background_states(model: Any, tok: Any, texts: Sequence[str], layer: int, *, max_length: int = 128,
                      batch_size: int = 16) -> torch.Tensor:
    """MLP inputs of ``layer`` at every real token of ``texts`` (ordinary text): (N, d). Kept for the next
    call with the same model, tokenizer, layer and texts while the weights they depend on are the same
    tensors, unchanged in place (units appended at ``layer`` or later do not change them)."""
    weights = _weights_before_mlp(model, layer)
    key = (id(tok), layer, max_length, tuple(texts))
    versions = [(id(p), p._version, p.device) for p in weights]
    hit = _BACKGROUND.get(key)
    if hit is not None and hit[0] == versions and hit[1] is tok:
        return hit[3]
    ids, mask = encode_texts(tok, texts, max_length=max_length)
    states = capture(model, ids, mask, layer, site="mlp_in", batch_size=batch_size)
    _BACKGROUND.pop(key, None)
    while len(_BACKGROUND) >= _BACKGROUND_KEEP:
        _BACKGROUND.pop(next(iter(_BACKGROUND)))
    _BACKGROUND[key] = (versions, tok, weights, states)  # the tokenizer and weights are held: their ids stay theirs
    return states


def contrast_states(model: Any, tok: Any, requests: Sequence[Request], layer: int, position: str, *, rounds: int,
                    seed: int = 0, batch_size: int = 32) -> torch.Tensor:
    """MLP inputs of ``layer`` at the key positions of each request re-asked about another request's subject
    (a seeded derangement per round): (≈ rounds·n_keys, d). Needs at least two requests."""
    gen = torch.Generator().manual_seed(seed)
    n, out = len(requests), []
    for _ in range(rounds):
        order = torch.randperm(n, generator=gen)
        other = torch.empty(n, dtype=torch.long)
        other[order] = order.roll(1)  # a derangement: nobody keeps its own subject
        swapped = [Request(r.prompt, requests[int(j)].subject, r.target_new) for r, j in zip(requests, other)]
        swapped = [r for r, orig in zip(swapped, requests) if r.subject != orig.subject]
        batch = encode_requests(tok, swapped, with_target=True)
        out.append(capture_at_keys(model, batch, layer, key_positions(batch, position), batch_size))
    return torch.cat(out)


# Highest per-unit threshold of the adaptive gate: its key still scores 1 > τ, so it fires (silu(β(1 − τ))).
MAX_THRESHOLD = 0.98


def detector_mlp(keys: torch.Tensor, deltas: torch.Tensor, background: torch.Tensor, *, sharpness: float = 100.0,
                 threshold: float = 0.92, adaptive_threshold: bool = False,
                 ridge: float = 1e-2) -> tuple[FactMLP, dict]:
    """One hidden unit per key with a whitened matched-filter gate (see the module docstring).

    keys (n, d), deltas (n, d), background (N, d) -> FactMLP with hidden n, in float32, and stats.
    adaptive_threshold: raise unit i's τ_i above ``threshold`` to halfway between the highest score of a
        background state b_i and its key's score 1 (capped at :data:`MAX_THRESHOLD`), the largest margin
        along its filter, so background states that come close to a key stay silent.
    ridge: Σ + ridge·mean(diag Σ)·I keeps the whitening well posed with few background tokens.
    """
    work = torch.float64
    k, x = keys.to(work), background.to(work)
    mu = x.mean(0)
    centred = x - mu
    sigma = centred.T @ centred / max(1, x.shape[0] - 1)
    sigma += ridge * sigma.diagonal().mean() * torch.eye(sigma.shape[0], dtype=work, device=sigma.device)
    chol = torch.linalg.cholesky(sigma)
    diff = k - mu  # (n, d)
    w = torch.cholesky_solve(diff.T, chol).T  # Σ⁻¹(k − μ): (n, d)
    w = w / (w * diff).sum(1, keepdim=True)  # s_i(k_i) = 1
    scores = centred @ w.T  # background scores s_i(x): (N, n)
    tau = torch.full((w.shape[0],), float(threshold), dtype=work, device=w.device)
    if adaptive_threshold:
        tau = torch.maximum(tau, (1.0 + scores.amax(0)) / 2).clamp(max=max(MAX_THRESHOLD, threshold))
    gate_w = sharpness * w
    gate_b = -sharpness * (w @ mu + tau)
    phi = F_nn.silu(k @ gate_w.T + gate_b)  # (n keys, n units): phi[j, i] = unit i at key j
    down = torch.linalg.solve(phi, deltas.to(work))  # (n units, d): phi @ down = deltas
    n, d = keys.shape
    mlp = FactMLP(gate_w.float(), gate_b.float(), torch.zeros(n, d), torch.ones(n), down.T.float().contiguous(), None)
    stats = {"key_condition": float(torch.linalg.cond(phi)),
             "background_score_mean": float(scores.mean()), "background_score_std": float(scores.std()),
             "background_score_max": float(scores.max()),
             "background_tokens_firing": float((scores > tau).any(1).double().mean()),
             "threshold_mean": float(tau.mean()), "units_threshold_raised": int((tau > threshold).sum())}
    return mlp.to(keys.device), stats


def generic_mlp(keys: torch.Tensor, deltas: torch.Tensor, background: torch.Tensor, *, seed: int = 0,
                width_multiplier: float = 1.5) -> tuple[FactMLP, dict]:
    """The seed's gadget construction with a random shared gate: keys and background states (zero targets)
    in one solve, outputs in an orthonormal basis B of the deltas (projection D = B). Hidden r·h̃."""
    work = torch.float64
    background, tol = background.to(work), 1e-4 * keys.norm(dim=1).max().to(work)
    # repeated states (same prefix; equal up to batching noise) and states equal to a key (which cannot
    # also output zero) would make the Gram singular: keep the first of each near-duplicate
    close = torch.cdist(background, background) <= tol
    repeated = torch.triu(close, diagonal=1).any(0)
    near_key = torch.cdist(background, keys.to(work)).amin(1) <= tol
    background = background[~(repeated | near_key)]
    basis, _ = torch.linalg.qr(deltas.to(work).T)  # (d, r)
    coords = deltas.to(work) @ basis  # (n, r)
    inputs = torch.cat([keys.to(work), background.to(work)])
    targets = torch.cat([coords, torch.zeros(background.shape[0], coords.shape[1], dtype=work)])
    encoder = build_shared_gate(inputs, targets, width_multiplier=width_multiplier, activation="silu",
                                solver="cholesky", generator=torch.Generator().manual_seed(seed), backend="torch",
                                progress=False)
    mlp = assemble(encoder, basis, activation="silu", backend="torch")
    mlp = FactMLP(*(None if t is None else t.float() for t in (mlp.gate_weight, mlp.gate_bias, mlp.up_weight,
                                                              mlp.up_bias, mlp.down_weight, mlp.down_bias)),
                  backend="torch")
    return mlp, {"solve_residual": encoder.solve.residual}


def default_layer(model: Any, position: str = "target") -> int:
    """The insertion layer :func:`insert_facts` uses by default: two thirds of the depth for target keys, a
    third for subject keys (ROME's depth)."""
    num_layers = len(mlp_layers(model))
    return (2 * num_layers) // 3 if position == "target" else num_layers // 3


def insert_facts(model: Any, tok: Any, requests: Union[str, Sequence[Union[Request, dict]]], *,
                 layer: Optional[int] = None, position: str = "target", gate: str = "detector",
                 background: Optional[Sequence[str]] = None, margin: float = 3.0, value_steps: int = 60,
                 value_lr: Optional[float] = None, contrast: int = 2, sharpness: float = 100.0, threshold: float = 0.92,
                 adaptive_threshold: bool = False, seed: int = 0, batch_size: Optional[int] = None,
                 progress: bool = True, checkpoint: Union[str, Path, None] = None, keys: str = "request",
                 prefixes: Optional[Sequence[str]] = None, value_prefixes: Optional[int] = None, within: float = 1.0,
                 subject_threshold: float = 0.5, ramp: float = 12.0, repair_rounds: int = 3, lookalikes: int = 6,
                 lookalike_weight: float = 0.03, partner_weight: float = PARTNER_WEIGHT, essence: int = 0,
                 essence_weight: float = 1.0, wikipedia_negatives: int = WIKIPEDIA_NEGATIVES, workers: Union[int, str] = WORKERS_AUTO,
                 device: Union[str, torch.device, None] = None) -> Insertion:
    """Insert facts by appending constructed hidden units to one layer's MLP (in place).

    requests: dicts/Requests or a .json/.csv path (see :func:`factkernels.hf.parse_requests`).
    layer: default two thirds of the depth (``position="target"``; layer 20 of SmolLM2-135M's 30) or a third
        ("subject"). Measured at 1,000 facts (README): layer 20 keeps neighbourhood 0.99 in 9.5 min on one
        CPU thread; the last layer is faster (no model forward for the values, 5.9 min) but its prompt-end
        states are template-dominated (neighbourhood 0.88).
    background: ordinary text (list of strings) whose hidden states set the detector's whitening
        and the generic construction's zero-output constraints; default
        :func:`factkernels.datasets.natural_text` ("stats").
    contrast: rounds of contrast states — each request's prompt (and target) with another request's
        subject, at the key positions — added to the background: same template, other subject, so the
        detectors learn what distinguishes the subject rather than the template (0 turns it off).
    sharpness, threshold, adaptive_threshold: the detector gate's (see :func:`detector_mlp`).
    checkpoint: a .safetensors file keeping the values (δ) of finished chunks of requests when they need the
        model (any layer but the last, or subject keys), so a long insertion can be stopped and run again
        (see :func:`optimise_deltas`; subject keys: chunks of subjects,
        :func:`~factkernels.hf.checkpoint.resumable_subject_fit`, which also takes a folder).
    keys: "request" (one unit per request's key, above) or "subject" (:mod:`factkernels.hf.subject_keys`: per
        subject an LDA detector on its last token under every request prompt × ``prefixes`` (default: the
        editing benchmark's edit prefixes) and one δ fit over the prompts bare and under the first
        ``value_prefixes`` prefixes (default 1; 0 left 58 of 550 validation contexts unanswered, 1 left 2);
        ``within`` weighs the within-subject spread in the whitening, ``subject_threshold`` places τ between the
        contrast and own scores, ``ramp`` is the units' saturation; ``position``, ``gate``, ``threshold``,
        ``contrast`` do not apply). The report's margins are then every context's (request ×
        prefix) in the edited model; up to ``repair_rounds`` times, the subjects of those <= 0 get δ refit and all
        are certified again; what stays unanswered is in ``report.construction["uncertified"]`` as [request,
        context] (context 0 the bare prompt, c the c-th prefix). ``lookalikes`` tokens that extend each subject's
        last token and as many nearest in embedding (" India": " Indian", ...) are put in its place in its
        contexts and kept below its detector's threshold (0 turns it off; ``lookalike_weight`` 0.03: with
        detectors for every validation fact no held-out text token off a mention gets δ, 3 without, 1-5 at
        0.1-0.3: benchmarks/results/hf/text_locality_detectors_validation0_nall.json). ``partner_weight`` > 0: a
        detector that passes its δ at another subject's key is kept off that subject's keys (a pairwise LDA
        penalty, :func:`~factkernels.hf.subject_keys.lda_detectors`; default
        :data:`~factkernels.hf.subject_keys.PARTNER_WEIGHT`, 0 leaves it out). ``essence`` > 0: the model's
        own 16-token continuations after each subject under the last ``essence`` prefixes join the δ fit, kept
        with ``essence_weight`` times their KL to the unedited model (text that names a subject but asks no fact;
        :func:`~factkernels.hf.subject_values.fit_subject_deltas`; 0, the default, leaves it out).
        ``wikipedia_negatives``: the first that many shipped Wikipedia leads (:func:`factkernels.datasets.wikipedia_leads`)
        join ``background`` as the detectors' negatives (0: ``background`` alone; see
        :data:`~factkernels.hf.subject_keys.WIKIPEDIA_NEGATIVES`). ``workers``: chunks of subjects whose values
        are fit at once, each on one intra-op thread (:func:`~factkernels.hf.checkpoint.resumable_subject_fit`);
        "auto": torch's intra-op thread count on a CPU, 1 on a GPU (:func:`~factkernels.hf.checkpoint.value_workers`).
        ``value_lr``: default :data:`~factkernels.hf.subject_values.SUBJECT_VALUE_LR` (1.0).
    value_lr: Adam's learning rate for δ; default 0.5 (``keys="subject"``: above).
    device: where the model runs ("cpu", "cuda", ...): it is moved there in place (``model.to(device)``) and
        stays; default: where it is. Every step runs on the model's device.
    batch_size: rows a forward runs at once; default 32 on a CPU, more on a GPU
        (:func:`~factkernels.hf.capture.default_batch_size`).
    Returns an :class:`Insertion`; raises ValueError for bad requests, layer or options.
    """
    start_time, start_cpu = time.perf_counter(), time.process_time()
    timings: dict = {}
    parsed = list(dict.fromkeys(parse_requests(requests)))  # repeated requests: one key each
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    if keys not in KEYS:
        raise ValueError(f"keys must be one of {KEYS}, got {keys!r}")
    if keys == "subject":
        position = "subject"
    if layer is None:
        layer = default_layer(model, position)
    mlp_module(model, layer)  # validates layout and range
    if position not in KEY_POSITIONS:
        raise ValueError(f"position must be one of {KEY_POSITIONS}, got {position!r}")
    if keys == "subject":
        prefixes = default_prefixes() if prefixes is None else list(prefixes)
        value_prefixes = min(1, len(prefixes)) if value_prefixes is None else value_prefixes
        check_subject_options(value_prefixes, prefixes, subject_threshold, ramp, within, repair_rounds, lookalikes,
                              lookalike_weight, essence, essence_weight, wikipedia_negatives, partner_weight)
    check_workers(workers)
    if value_lr is None:
        value_lr = SUBJECT_VALUE_LR if keys == "subject" else 0.5
    if device is not None:  # after every check: a refused request leaves the model where it was
        model.to(device)
    if batch_size is None:
        batch_size = default_batch_size(model)
    if background is None:
        from ..datasets import natural_text

        background = natural_text("stats")
    torch.manual_seed(seed)
    if keys == "subject":
        t, c = time.perf_counter(), time.process_time()
        if wikipedia_negatives:
            from ..datasets import wikipedia_leads

            background = list(background) + wikipedia_leads(wikipedia_negatives)
        states = background_states(model, tok, background, layer)
        return insert_subject_keyed(model, tok, parsed, layer=layer, background=states, background_texts=background,
                                  background_seconds=(time.perf_counter() - t, time.process_time() - c),
                                  start_cpu=start_cpu,
                                  prefixes=prefixes, value_prefixes=value_prefixes, within=within,
                                  threshold=subject_threshold, ramp=ramp, margin=margin, value_steps=value_steps,
                                  value_lr=value_lr, batch_size=batch_size, progress=progress, start_time=start_time,
                                  repair_rounds=repair_rounds, lookalikes=lookalikes, lookalike_weight=lookalike_weight,
                                  partner_weight=partner_weight, essence=essence, essence_weight=essence_weight,
                                  checkpoint=checkpoint,
                                  workers=workers)

    t = time.perf_counter()
    batch = encode_requests(tok, parsed, with_target=True)
    keys_at = key_positions(batch, position)
    if head_path(model, layer, keys_at):  # the residual after the layer comes from the same forwards
        keys, residual = capture_at_keys(model, batch, layer, keys_at, batch_size, site=("mlp_in", "block_out"))
    else:
        keys, residual = capture_at_keys(model, batch, layer, keys_at, batch_size), None
    text_states = bg = background_states(model, tok, background, layer)
    if contrast and len(parsed) > 1:
        bg = torch.cat([text_states, contrast_states(model, tok, parsed, layer, position, rounds=contrast, seed=seed,
                                            batch_size=batch_size)])
    timings["capture"] = time.perf_counter() - t

    t = time.perf_counter()
    deltas, value_info = optimise_deltas(model, batch, layer, keys_at, margin=margin, steps=value_steps, lr=value_lr,
                                         batch_size=batch_size, residual=residual, progress=progress,
                                         checkpoint=checkpoint)
    # chunks read from a checkpoint count the time they took then, so the timings are those of one run
    restored = value_info.get("value_restored_seconds", 0.0)
    timings["values"] = time.perf_counter() - t + restored

    t = time.perf_counter()
    if gate == "detector":
        fact_mlp, construction = detector_mlp(keys, deltas, bg, sharpness=sharpness, threshold=threshold,
                                              adaptive_threshold=adaptive_threshold)
    else:
        fact_mlp, construction = generic_mlp(keys, deltas, bg, seed=seed)
    with torch.no_grad():
        # relative to the mean ‖δ‖: keys whose target already wins by the margin keep δ = 0
        value_error = float((fact_mlp(keys) - deltas).norm(dim=1).max() / deltas.norm(dim=1).mean().clamp_min(1e-12))
        old = mlp_module(model, layer)
        background_ratio = float(fact_mlp(text_states).norm(dim=1).mean() / old(text_states).norm(dim=1).mean())
    timings["construct"] = time.perf_counter() - t

    units = append_units(model, layer, fact_mlp.swiglu_weights())
    t = time.perf_counter()
    with removed_on_failure(units), torch.no_grad():
        margins = batch_margins(model, batch, batch_size)
    timings["verify"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - start_time + restored
    report = InsertionReport(
        layer=layer, gate=gate, position=position, num_facts=len(parsed), num_keys=len(keys_at.row),
        hidden_added=fact_mlp.hidden_size, params_added=fact_mlp.num_parameters,
        efficacy=float((margins > 0).double().mean()), min_margin=float(margins.min()),
        margins=[round(float(m), 4) for m in margins], value_error=value_error,
        delta_norm_mean=float(deltas.norm(dim=1).mean()), background_output_ratio=background_ratio,
        timings=timings, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        construction=construction, values=value_info)
    fact_mlp.report = None
    return Insertion(report, fact_mlp, units)


@torch.no_grad()
def capture_at_keys(model: Any, batch: PromptBatch, layer: int, keys: KeySet, batch_size: int,
                    site: Union[str, tuple[str, ...]] = "mlp_in") -> Union[torch.Tensor, tuple[torch.Tensor, ...]]:
    """States at ``site`` of ``layer`` (see :func:`capture`) at the key positions ``keys`` of ``batch``
    (:func:`key_positions`): a (n_keys, d) tensor for one site, a tuple of them for a tuple of sites."""
    out = capture(model, batch.input_ids, batch.attention_mask, layer, site=site, batch_size=batch_size)
    lengths = batch.attention_mask.sum(1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    index = offsets[keys.row] + keys.position
    return out[index] if isinstance(site, str) else tuple(o[index] for o in out)
