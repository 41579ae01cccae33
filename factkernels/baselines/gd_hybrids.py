"""GD encoder, GD decoder and the encoder/decoder hybrids (seed 000, A.1.3): Bin+JL, GD+JL, Bin+GD, GD+GD.

* :func:`gd_encoder` — a gated encoder R^d -> R^m trained with MSE to fixed codes, keys
  jittered by N(0, ε_key²), ε_key = 1e-7 (1000 Adam steps at 1e-2).
* :func:`gd_decoder` — learned codes C (|V|, m) and decoding matrix M (m, d) trained with
  cross-entropy on C M Vᵀ (1000 Adam steps, cosine 1 -> 0.01), rescaled after.
* :func:`encoder_decoder` — the hybrids, assembled into one gated FactMLP g(x) = D · enc(x)
  (Bin+JL is :func:`factkernels.construct`).

Each has a ``*_batch`` twin that trains B independent models as one stacked model through
:func:`factkernels.baselines.batched_adam.fit`; the single-model functions are batches of one.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F_nn

from .. import _ops, ustar
from ..construct import construct
from ..decoder import JLDecoder, jl_decoder
from ..embeddings import FactSet
from ..encoder import assemble, build_shared_gate
from ..mlp import FactMLP
from ..solvers import pick_solver
from ..validation import check_positive_int as _check_count
from .batched_adam import (ActiveRows, FitResult, check_rates, fit, per_model_counts, per_model_seeds,
                           stack_fact_sets)
from .stacked_swiglu import (all_decoded, batched_cross_entropy, init_stacked_swiglu, stacked_swiglu_forward,
                             unstack_swiglu)


ENCODERS = ("bin", "gd")
DECODERS = ("jl", "gd")
KEY_NOISE = 1e-7  # ε_key of the GD encoder
BIN_WIDTH_MULTIPLIER = 1.5  # construct()'s default gadget width multiplier
GD_WIDTH_MULTIPLIER = 1.0  # the seed's default for h = ⌈m (F/d) · multiplier⌉


def gd_encoder_batch(
    keys: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    hiddens: Union[int, Sequence[int]],
    seeds: Sequence[int],
    *,
    stored: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
    steps: int = 1000,
    lr: float = 1e-2,
    key_noise: float = KEY_NOISE,
    activation: str = "silu",
    progress: bool = True,
) -> list[tuple[FactMLP, FitResult]]:
    """B gated encoders trained as one batch: model b maps keys[b] (F, d) to targets[b] (F, m_b).

    ``stored(outputs (b, F, m), active (b,)) -> (b,) bool`` stops model active[i] early.
    Model b's key jitter comes from Generator(seeds[b]) on the keys' device. Targets of several
    widths m_b are zero-padded to the widest (outputs (b, F, max m) then hold zeros past m_b).
    Otherwise as :func:`gd_encoder`, which is the batch of one.
    """
    if len(keys) == 0 or len(keys) != len(targets):
        raise ValueError(f"keys and targets must be non-empty and of one length, got {len(keys)} and {len(targets)}")
    for K, target in zip(keys, targets):
        if not isinstance(target, torch.Tensor) or target.dim() != 2 or target.shape[0] != K.shape[0]:
            raise ValueError(f"targets must be a ({K.shape[0]}, m) tensor (one code per key), got "
                             f"{tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__}")
    if len({K.shape for K in keys}) != 1:
        raise ValueError("keys must share one shape to train as a batch")
    count = len(keys)
    hiddens = per_model_counts("hidden", hiddens, count)
    seeds = per_model_seeds(seeds, count)
    _check_count("steps", steps)
    check_rates(lr, lr)
    if not (isinstance(key_noise, (int, float)) and key_noise >= 0):
        raise ValueError(f"key_noise must be a non-negative number, got {key_noise!r}")
    _ops.check_activation(activation)
    outs = [t.shape[1] for t in targets]
    K = torch.stack(list(keys))  # (B, F, d)
    codes = torch.stack([F_nn.pad(t, (0, max(outs) - t.shape[1])) for t in targets])  # (B, F, max m)
    noise = [torch.Generator(device=K.device).manual_seed(seed) for seed in seeds]
    # Each model draws the jitter of `chunk` steps in one call: one randn per model per step cost more
    # than the step itself in small batches. The stream is the per-step one whenever F·d is a multiple
    # of 16 (torch's CPU normal sampler works in blocks of 16), and the same alone as in a batch always.
    chunk = max(1, min(64, (1 << 18) // K[0].numel()))
    jitter = torch.empty(count, chunk, *K.shape[1:], device=K.device, dtype=K.dtype)
    training = ActiveRows(K, codes)
    step = 0

    def objective(params: list[torch.Tensor], active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal step  # fit calls this once per step, every model still training being at that step
        position, step = step % chunk, step + 1
        if position == 0:
            for b in active.tolist():
                jitter[b] = torch.randn(jitter.shape[1:], generator=noise[b], device=K.device, dtype=K.dtype)
        keys, wanted = training(active)
        rows = jitter[:, position] if keys is K else jitter[active, position]
        outputs = stacked_swiglu_forward(params, keys + rows * key_noise, activation)
        loss = (outputs - wanted).square().sum(2).mean(1)
        solved = (stored(outputs.detach(), active) if stored is not None
                  else torch.zeros(active.shape, dtype=torch.bool, device=K.device))
        return loss, solved

    params, results = fit(init_stacked_swiglu(K.shape[2], hiddens, outs, seeds, K), objective, steps=steps, lr=lr,
                          final_lr=lr, progress=progress, desc=f"gd encoder x{count} h<={max(hiddens)}")
    return [(unstack_swiglu(params, b, hidden, activation, out), result)
            for b, (hidden, out, result) in enumerate(zip(hiddens, outs, results))]


def gd_encoder(
    K: torch.Tensor,
    targets: torch.Tensor,
    hidden: int,
    *,
    stored: Optional[Callable[[torch.Tensor], bool]] = None,
    steps: int = 1000,
    lr: float = 1e-2,
    key_noise: float = KEY_NOISE,
    activation: str = "silu",
    seed: int = 0,
    progress: bool = True,
) -> tuple[FactMLP, FitResult]:
    """A gated encoder of width ``hidden`` fit to codes: keys K (F, d) -> targets (F, m).

    Minimizes mean_i ||enc(k_i + η_i) − targets_i||², η_i ~ N(0, key_noise² I), with Adam at a
    constant ``lr``. ``stored(outputs (F, m)) -> bool`` stops training early (e.g. when the
    decoded codes give every fact). Returns the encoder as a FactMLP (down = E (m, hidden)).
    """
    _check_count("hidden", hidden)
    batch_stored = None if stored is None else (
        lambda outputs, active: torch.tensor([bool(stored(outputs[0]))], device=outputs.device))
    return gd_encoder_batch([K], [targets], [hidden], [seed], stored=batch_stored, steps=steps, lr=lr,
                            key_noise=key_noise, activation=activation, progress=progress)[0]


def gd_decoder_batch(
    values: Sequence[torch.Tensor],
    used: Sequence[torch.Tensor],
    ms: Union[int, Sequence[int]],
    seeds: Sequence[int],
    *,
    steps: int = 1000,
    lr: float = 1.0,
    final_lr: float = 0.01,
    progress: bool = True,
) -> list[tuple[JLDecoder, FitResult]]:
    """B learned decoders trained as one batch: model b has codes (|V|, ms[b]) for values[b] and
    trains on used[b]. Codes and matrices are zero-padded to the largest m (padding gets zero
    gradient) and the cross-entropy of model b averages over its own used values. Otherwise
    as :func:`gd_decoder`, which is the batch of one.
    """
    count = len(values)
    if count == 0 or len(used) != count or len({V.shape for V in values}) != 1:
        raise ValueError("values must be a non-empty sequence of one shape, with one used tensor per model")
    for V, u in zip(values, used):
        if u.dim() != 1 or u.numel() == 0 or int(u.min()) < 0 or int(u.max()) >= V.shape[0]:
            raise ValueError(f"used must be a non-empty 1-D tensor of value indices in [0, {V.shape[0]})")
    ms = per_model_counts("m", ms, count)
    seeds = per_model_seeds(seeds, count)
    _check_count("steps", steps)
    check_rates(lr, final_lr)
    V = torch.stack(list(values))  # (B, |V|, d)
    num_values, dim, width = V.shape[1], V.shape[2], max(ms)
    longest = max(u.numel() for u in used)
    index = torch.zeros(count, longest, dtype=torch.int64, device=V.device)  # used values, padded with 0
    weight = torch.zeros(count, longest, dtype=V.dtype, device=V.device)  # 1/k_b on real entries, 0 on padding
    codes = torch.zeros(count, num_values, width, dtype=torch.float64)
    matrix = torch.zeros(count, width, dim, dtype=torch.float64)
    for b, (u, m, seed) in enumerate(zip(used, ms, seeds)):
        index[b, :u.numel()] = u
        weight[b, :u.numel()] = 1.0 / u.numel()
        generator = torch.Generator().manual_seed(seed)
        codes[b, :, :m] = torch.randn(num_values, m, generator=generator, dtype=torch.float64) / math.sqrt(m)
        matrix[b, :m] = torch.randn(m, dim, generator=generator, dtype=torch.float64) / math.sqrt(m)

    training = ActiveRows(index, V, weight)

    def objective(params: list[torch.Tensor], active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, values, weights = training(active)  # rows (b, k)
        chosen = torch.gather(params[0], 1, rows.unsqueeze(2).expand(-1, -1, width))  # (b, k, m)
        logits = torch.bmm(torch.bmm(chosen, params[1]), values.transpose(1, 2))  # (b, k, |V|)
        loss = (batched_cross_entropy(logits, rows)[0] * weights).sum(1)
        return loss, torch.zeros(active.shape, dtype=torch.bool, device=V.device)  # never early: see gd_decoder

    (codes, matrix), results = fit([codes.to(V), matrix.to(V)], objective, steps=steps, lr=lr, final_lr=final_lr,
                                   progress=progress, desc=f"gd decoder x{count} m<={width}")
    decoders = []
    for b, (m, result) in enumerate(zip(ms, results)):
        code, mat = codes[b, :, :m], matrix[b, :m]
        code = code / code.norm(dim=1, keepdim=True).clamp_min(1e-30)
        mat = mat / mat.norm(dim=1).square().mean().sqrt().clamp_min(1e-30)
        decoders.append((JLDecoder(mat.T.contiguous(), code.contiguous()), result))
    return decoders


def gd_decoder(
    V: torch.Tensor,
    used: torch.Tensor,
    m: int,
    *,
    steps: int = 1000,
    lr: float = 1.0,
    final_lr: float = 0.01,
    seed: int = 0,
    progress: bool = True,
) -> tuple[JLDecoder, FitResult]:
    """Learned decoder: codes C (|V|, m) and M (m, d) with CE(C[used] M Vᵀ, used).

    V: (|V|, d); used: (k,) indices of the values that facts map to. C and M start i.i.d.
    N(0, 1/m). After training, the rows of C are normalized (as in the seed) and M is divided
    by its RMS row norm: the seed also normalizes M's rows, but that changes which value a
    code decodes to (it broke 2 of 64 values in our tests), one scalar does not. Unlike the other
    variants it trains all ``steps``: stopping at the first step that decodes every value
    leaves near-zero margins, which the encoder's fitting error then flips. Returns the
    decoder as a :class:`JLDecoder` container with projection D = Mᵀ (d, m) and codes C.
    """
    _check_count("m", m)
    return gd_decoder_batch([V], [used], [m], [seed], steps=steps, lr=lr, final_lr=final_lr, progress=progress)[0]


# ----------------------------------------------------------------------------- hybrids


def encoder_decoder_batch(
    fact_sets: Sequence[FactSet],
    ms: Union[int, Sequence[int]],
    seeds: Sequence[int],
    *,
    encoder: str = "gd",
    decoder: str = "jl",
    width_multiplier: Optional[float] = None,
    encoder_hidden: Union[None, int, Sequence[int]] = None,
    encoder_steps: int = 1000,
    decoder_steps: int = 1000,
    outputs: Optional[Sequence[torch.Tensor]] = None,
    progress: bool = True,
) -> list[FactMLP]:
    """B hybrid fact MLPs (see :func:`encoder_decoder`, the batch of one): model b stores fact set b
    with code dimension ms[b] from seed seeds[b]. The GD decoders train as one batch, then the GD
    encoders (codes of several m zero-padded to the largest); closed-form parts are built per model.
    ``encoder_hidden``: one width or one per model (GD encoder only). ``outputs``: decoder "jl" only,
    U* (|V|, d_out) of each model's values, solved here (once per fact set) when not given.
    """
    K, V, facts = stack_fact_sets(fact_sets)
    count, num_facts, d_in = K.shape
    if encoder not in ENCODERS:
        raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    ms = per_model_counts("m", ms, count)
    seeds = per_model_seeds(seeds, count)
    if width_multiplier is not None and not (isinstance(width_multiplier, (int, float)) and width_multiplier > 0):
        raise ValueError(f"width_multiplier must be a positive number, got {width_multiplier!r}")
    if encoder_hidden is not None:
        if encoder != "gd":
            raise ValueError(f"encoder_hidden sets the GD encoder's width; it does not apply to encoder={encoder!r}")
        encoder_hidden = per_model_counts("encoder_hidden", encoder_hidden, count)
    if outputs is not None:
        if decoder != "jl":
            raise ValueError(f"outputs are U* for the JL decoder; they do not apply to decoder={decoder!r}")
        outputs = list(outputs)
        if len(outputs) != count or any(not isinstance(u, torch.Tensor) or u.shape != V.shape[1:] for u in outputs):
            raise ValueError(f"outputs must be one ({V.shape[1]}, {V.shape[2]}) tensor per model ({count})")
    elif decoder == "jl":
        solved: dict = {}  # U* once per fact set: a search's batch repeats each one for several m
        for b, (_, values, _) in enumerate(fact_sets):
            if id(values) not in solved:
                solved[id(values)] = ustar.margin_optimal_outputs(V[b])[0]
        outputs = [solved[id(values)] for _, values, _ in fact_sets]
    if encoder == "bin" and decoder == "jl":
        return [construct(K[b], V[b], facts[b], m=ms[b], outputs=outputs[b], seed=seeds[b], verify="report",
                          progress=progress, width_multiplier=width_multiplier or BIN_WIDTH_MULTIPLIER)
                for b in range(count)]

    fit_results: list[dict] = [{} for _ in range(count)]
    if decoder == "jl":
        decoders = [jl_decoder(outputs[b], ms[b], torch.Generator().manual_seed(seeds[b])) for b in range(count)]
    else:
        trained = gd_decoder_batch(list(V), [torch.unique(facts[b]) for b in range(count)], ms, seeds,
                                   steps=decoder_steps, progress=progress)
        decoders = [dec for dec, _ in trained]
        for results, (_, result) in zip(fit_results, trained):
            results["decoder"] = result

    if encoder == "bin":
        mlps = []
        for b, dec in enumerate(decoders):
            enc = build_shared_gate(K[b], dec.codes[facts[b]], width_multiplier=width_multiplier or BIN_WIDTH_MULTIPLIER,
                                    activation="silu", solver=pick_solver(num_facts, K.device, dtype=K.dtype),
                                    generator=torch.Generator().manual_seed(seeds[b]), progress=progress)
            mlps.append(assemble(enc, dec.projection, activation="silu"))
    else:
        hiddens = encoder_hidden or [math.ceil(m * num_facts / d_in * (width_multiplier or GD_WIDTH_MULTIPLIER))
                                     for m in ms]
        widest = max(ms)
        projections = torch.stack([F_nn.pad(dec.projection, (0, widest - dec.projection.shape[1]))
                                   for dec in decoders])  # (B, d_out, max m): zero columns past m_b

        decoding = ActiveRows(projections, V, facts)

        def stored(outputs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
            projection, values, rows = decoding(active)
            return all_decoded(torch.bmm(outputs, projection.transpose(1, 2)), values, rows)

        encoders = gd_encoder_batch(list(K), [dec.codes[facts[b]] for b, dec in enumerate(decoders)], hiddens, seeds,
                                    stored=stored, steps=encoder_steps, progress=progress)
        mlps = []
        for results, dec, (enc, result) in zip(fit_results, decoders, encoders):
            results["encoder"] = result
            mlps.append(FactMLP(enc.gate_weight, enc.gate_bias, enc.up_weight, enc.up_bias,
                                dec.projection @ enc.down_weight, dec.projection @ enc.down_bias))
    for mlp, results in zip(mlps, fit_results):
        mlp.fit_results = results
    return mlps


def encoder_decoder(
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    m: int,
    *,
    encoder: str = "gd",
    decoder: str = "jl",
    width_multiplier: Optional[float] = None,
    encoder_hidden: Optional[int] = None,
    encoder_steps: int = 1000,
    decoder_steps: int = 1000,
    outputs: Optional[torch.Tensor] = None,
    seed: int = 0,
    progress: bool = True,
) -> FactMLP:
    """A fact MLP g(x) = D · enc(x) from an encoder ("bin" | "gd") and a decoder ("jl" | "gd").

    K: (F, d_in), V: (|V|, d_out), f: (F,); m: code dimension.
    - decoder "jl": D ~ N(0, 1/m) (d_out, m), codes C = U* D (Alg. 4); "gd": :func:`gd_decoder`.
    - encoder "bin": the closed-form shared-gate gadgets (Alg. 2/3) with gadget width
      ⌈multiplier·F/(d_in+1)⌉ (multiplier default 1.5); "gd": :func:`gd_encoder` of width
      ``encoder_hidden`` or ⌈m (F/d_in) · multiplier⌉ (multiplier default 1).
    - encoder_steps / decoder_steps: Adam steps of the GD encoder / decoder.
    - outputs: decoder "jl" only, U* (|V|, d_out) of V when already solved (a search builds many
      sizes on one fact set); solved here otherwise.
    Bin+JL is exactly :func:`factkernels.construct` with margin-optimal outputs.

    Returns a gated FactMLP (SwiGLU layout); for the hybrids with a trained part,
    ``fit_results`` holds the :class:`FitResult` of each ({"decoder": ..., "encoder": ...}).
    """
    _check_count("m", m)
    if encoder_hidden is not None:
        _check_count("encoder_hidden", encoder_hidden)
    return encoder_decoder_batch([FactSet(K, V, f)], [m], [seed], encoder=encoder, decoder=decoder,
                                 width_multiplier=width_multiplier, encoder_hidden=encoder_hidden,
                                 encoder_steps=encoder_steps, decoder_steps=decoder_steps,
                                 outputs=None if outputs is None else [outputs], progress=progress)[0]
