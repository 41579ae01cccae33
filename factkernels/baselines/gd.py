"""Gradient-descent baselines (seed 000, A.1.3).

* :func:`gd_mlp` — a SwiGLU MLP trained with cross-entropy on the dot-product logits g(K) Vᵀ
  (full-batch Adam, cosine learning rate 1e-3 -> 1e-6, up to 20000 steps).
* :func:`gd_encoder` — a gated encoder R^d -> R^m trained with MSE to fixed codes, keys
  jittered by N(0, ε_key²), ε_key = 1e-7 (1000 Adam steps at 1e-2).
* :func:`gd_decoder` — learned codes C (|V|, m) and decoding matrix M (m, d) trained with
  cross-entropy on C M Vᵀ (1000 Adam steps, cosine 1 -> 0.01), rescaled after.
* :func:`encoder_decoder` — the hybrids Bin+JL (= :func:`factkernels.construct`), GD+JL,
  Bin+GD and GD+GD, assembled into one gated FactMLP g(x) = D · enc(x).

Every variant trains through the one loop :func:`fit`, which stops as soon as every fact
is stored (checked on the forward pass of each step, before the update, so the returned
weights are the ones that stored everything); only the decoder trains all its steps.
Tensors live on the device and in the dtype of the keys; initial weights are drawn on the
CPU from ``seed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F_nn

from .. import _ops, geometry
from ..construct import construct
from ..decoder import JLDecoder, jl_decoder
from ..encoder import assemble, build_shared_gate
from ..mlp import FactMLP
from ..progress import progress_bar
from ..solvers import pick_solver
from ..validation import check_positive_int as _check_count
from ..validation import validate_inputs

ENCODERS = ("bin", "gd")
DECODERS = ("jl", "gd")
KEY_NOISE = 1e-7  # ε_key of the GD encoder
BIN_WIDTH_MULTIPLIER = 1.5  # construct()'s default gadget width multiplier
GD_WIDTH_MULTIPLIER = 1.0  # the seed's default for h = ⌈m (F/d) · multiplier⌉


@dataclass
class FitResult:
    """How a :func:`fit` run ended: optimizer steps taken, whether every fact was stored, last loss."""

    steps: int
    solved: bool
    loss: float


def fit(
    parameters: Sequence[torch.Tensor],
    objective: Callable[[], tuple[torch.Tensor, bool]],
    *,
    steps: int,
    lr: float,
    final_lr: float,
    progress: bool = True,
    desc: str = "gd",
) -> FitResult:
    """Full-batch Adam with a cosine learning rate ``lr`` -> ``final_lr`` over ``steps`` steps.

    ``objective()`` returns (loss, solved) from one forward pass; training stops before the
    update of the first step whose forward pass stores every fact (``solved``).
    """
    optimizer = torch.optim.Adam(parameters, lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps, eta_min=final_lr)
    with progress_bar(total=steps, desc=desc, enabled=progress, leave=False) as bar:
        for step in range(steps + 1):
            optimizer.zero_grad(set_to_none=True)
            loss, solved = objective()
            if solved or step == steps:
                return FitResult(step, solved, float(loss.detach()))
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.update(1)
            if step % 100 == 0:
                bar.set_postfix(loss=f"{float(loss.detach()):.3g}")
    raise AssertionError("unreachable")  # pragma: no cover


# ----------------------------------------------------------------------------- the gated network


@dataclass
class _GatedNet:
    """Trainable SwiGLU weights: gate/up (h, d_in) with biases (h,), down (d_out, h), down bias (d_out,)."""

    gate: torch.Tensor
    gate_bias: torch.Tensor
    up: torch.Tensor
    up_bias: torch.Tensor
    down: torch.Tensor
    down_bias: torch.Tensor

    @classmethod
    def init(cls, d_in: int, hidden: int, d_out: int, generator: torch.Generator, like: torch.Tensor) -> "_GatedNet":
        """nn.Linear's default init, U(±1/√fan_in) for weights and biases, drawn on the CPU."""

        def uniform(*shape: int, fan_in: int) -> torch.Tensor:
            t = (torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1) / math.sqrt(fan_in)
            return t.to(like).requires_grad_(True)

        return cls(uniform(hidden, d_in, fan_in=d_in), uniform(hidden, fan_in=d_in), uniform(hidden, d_in, fan_in=d_in),
                   uniform(hidden, fan_in=d_in), uniform(d_out, hidden, fan_in=hidden), uniform(d_out, fan_in=hidden))

    def parameters(self) -> list[torch.Tensor]:
        return [self.gate, self.gate_bias, self.up, self.up_bias, self.down, self.down_bias]

    def __call__(self, x: torch.Tensor, activation: str) -> torch.Tensor:
        """x: (n, d_in) -> (n, d_out), differentiable (torch twin of the fused kernel)."""
        return _ops.gated_forward(x, self.gate, self.gate_bias, self.up, self.up_bias, self.down, self.down_bias,
                                  activation, backend="torch")


def _check_rates(lr: float, final_lr: float) -> None:
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if not (isinstance(final_lr, (int, float)) and 0 <= final_lr <= lr):
        raise ValueError(f"final_lr must be in [0, lr={lr}], got {final_lr!r}")


def _all_decoded(outputs: torch.Tensor, values: torch.Tensor, targets: torch.Tensor) -> bool:
    """Whether argmax_j <outputs_i, v_j> = targets_i for every row: outputs (n, d), values (|V|, d)."""
    with torch.no_grad():
        return bool((_ops.decode(outputs, values, backend="torch")[0] == targets).all())


# ----------------------------------------------------------------------------- GD MLP


GD_LOSSES = ("ce", "mse")


def gd_mlp(
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    hidden: int,
    *,
    steps: int = 20000,
    lr: float = 1e-3,
    final_lr: float = 1e-6,
    activation: str = "silu",
    loss: str = "ce",
    seed: int = 0,
    progress: bool = True,
) -> FactMLP:
    """A SwiGLU MLP of width ``hidden`` trained to store f with full-batch Adam.

    loss "ce": CE(g(K) Vᵀ, f) (the capacity baseline); "mse": mean_i ||g(k_i) − v_f(i)||²
    (the fact experts of the seed's language model, App. A.3.2).
    K: (F, d_in), V: (|V|, d_out), f: (F,). Stops early once every fact is stored.
    Returns a FactMLP with biases (gate/up (hidden, d_in), down (d_out, hidden)); its
    ``fit_results`` attribute holds {"mlp": :class:`FitResult`}.
    """
    facts = validate_inputs(K, V, f)
    _check_count("hidden", hidden)
    _check_count("steps", steps)
    _check_rates(lr, final_lr)
    _ops.check_activation(activation)
    if loss not in GD_LOSSES:
        raise ValueError(f"loss must be one of {GD_LOSSES}, got {loss!r}")
    net = _GatedNet.init(K.shape[1], hidden, V.shape[1], torch.Generator().manual_seed(seed), K)

    def objective() -> tuple[torch.Tensor, bool]:
        outputs = net(K, activation)  # (F, d_out)
        logits = outputs @ V.T  # (F, |V|)
        if loss == "ce":
            value = F_nn.cross_entropy(logits, facts)
        else:
            value = (outputs - V[facts]).square().sum(dim=1).mean()
        return value, bool((logits.argmax(1) == facts).all())

    result = fit(net.parameters(), objective, steps=steps, lr=lr, final_lr=final_lr, progress=progress,
                 desc=f"gd mlp h={hidden}")
    mlp = FactMLP(*net.parameters(), activation=activation)
    mlp.fit_results = {"mlp": result}
    return mlp


# ----------------------------------------------------------------------------- GD encoder / decoder


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
    if not isinstance(targets, torch.Tensor) or targets.dim() != 2 or targets.shape[0] != K.shape[0]:
        raise ValueError(f"targets must be a ({K.shape[0]}, m) tensor (one code per key), got "
                         f"{tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__}")
    _check_count("hidden", hidden)
    _check_count("steps", steps)
    _check_rates(lr, lr)
    if not (isinstance(key_noise, (int, float)) and key_noise >= 0):
        raise ValueError(f"key_noise must be a non-negative number, got {key_noise!r}")
    _ops.check_activation(activation)
    net = _GatedNet.init(K.shape[1], hidden, targets.shape[1], torch.Generator().manual_seed(seed), K)
    noise = torch.Generator(device=K.device).manual_seed(seed)

    def objective() -> tuple[torch.Tensor, bool]:
        jitter = torch.randn(K.shape, generator=noise, device=K.device, dtype=K.dtype) * key_noise
        outputs = net(K + jitter, activation)
        loss = (outputs - targets).square().sum(1).mean()
        return loss, stored is not None and stored(outputs.detach())

    result = fit(net.parameters(), objective, steps=steps, lr=lr, final_lr=lr, progress=progress,
                 desc=f"gd encoder h={hidden}")
    return FactMLP(*net.parameters(), activation=activation), result


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
    if used.dim() != 1 or used.numel() == 0 or int(used.min()) < 0 or int(used.max()) >= V.shape[0]:
        raise ValueError(f"used must be a non-empty 1-D tensor of value indices in [0, {V.shape[0]})")
    _check_count("m", m)
    _check_count("steps", steps)
    _check_rates(lr, final_lr)
    generator = torch.Generator().manual_seed(seed)
    codes = (torch.randn(V.shape[0], m, generator=generator, dtype=torch.float64) / math.sqrt(m)).to(V)
    matrix = (torch.randn(m, V.shape[1], generator=generator, dtype=torch.float64) / math.sqrt(m)).to(V)
    codes.requires_grad_(True)
    matrix.requires_grad_(True)

    def objective() -> tuple[torch.Tensor, bool]:  # never stops early: see the docstring
        return F_nn.cross_entropy(codes[used] @ matrix @ V.T, used), False

    result = fit([codes, matrix], objective, steps=steps, lr=lr, final_lr=final_lr, progress=progress,
                 desc=f"gd decoder m={m}")
    codes, matrix = codes.detach(), matrix.detach()
    codes = codes / codes.norm(dim=1, keepdim=True).clamp_min(1e-30)
    matrix = matrix / matrix.norm(dim=1).square().mean().sqrt().clamp_min(1e-30)
    return JLDecoder(matrix.T.contiguous(), codes), result


# ----------------------------------------------------------------------------- hybrids


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
    Bin+JL is exactly :func:`factkernels.construct` with margin-optimal outputs.

    Returns a gated FactMLP (SwiGLU layout); for the hybrids with a trained part,
    ``fit_results`` holds the :class:`FitResult` of each ({"decoder": ..., "encoder": ...}).
    """
    facts = validate_inputs(K, V, f)
    if encoder not in ENCODERS:
        raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    _check_count("m", m)
    if width_multiplier is not None and not (isinstance(width_multiplier, (int, float)) and width_multiplier > 0):
        raise ValueError(f"width_multiplier must be a positive number, got {width_multiplier!r}")
    if encoder_hidden is not None:
        if encoder != "gd":
            raise ValueError(f"encoder_hidden sets the GD encoder's width; it does not apply to encoder={encoder!r}")
        _check_count("encoder_hidden", encoder_hidden)
    if encoder == "bin" and decoder == "jl":
        return construct(K, V, facts, m=m, outputs="margin_optimal", seed=seed, verify="report", progress=progress,
                         width_multiplier=width_multiplier or BIN_WIDTH_MULTIPLIER)

    fit_results: dict = {}
    used = torch.unique(facts)
    if decoder == "jl":
        dec = jl_decoder(geometry.margin_optimal_outputs(V)[0], m, torch.Generator().manual_seed(seed))
    else:
        dec, fit_results["decoder"] = gd_decoder(V, used, m, steps=decoder_steps, seed=seed,
                                                    progress=progress)
    targets = dec.codes[facts]  # (F, m)
    num_facts, d_in = K.shape

    if encoder == "bin":
        enc = build_shared_gate(K, targets, width_multiplier=width_multiplier or BIN_WIDTH_MULTIPLIER,
                                activation="silu", solver=pick_solver(num_facts, K.device),
                                generator=torch.Generator().manual_seed(seed), progress=progress)
        mlp = assemble(enc, dec.projection, activation="silu")
    else:
        hidden = encoder_hidden or math.ceil(m * num_facts / d_in * (width_multiplier or GD_WIDTH_MULTIPLIER))
        enc, fit_results["encoder"] = gd_encoder(
            K, targets, hidden, stored=lambda out: _all_decoded(out @ dec.projection.T, V, facts),
            steps=encoder_steps, seed=seed, progress=progress)
        mlp = FactMLP(enc.gate_weight, enc.gate_bias, enc.up_weight, enc.up_bias,
                      dec.projection @ enc.down_weight, dec.projection @ enc.down_bias)
    mlp.fit_results = fit_results
    return mlp
