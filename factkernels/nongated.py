"""Non-gated encoder gadgets by central finite differences (seed 000, Alg. 8 and B.4.3).

A gated gadget built with the derivative activation σ',

    enc'(x) = Σ_r σ'(g_r(x)) a_r(x) + b_E,   g_r = G_r·x + b_G,r,   a_r = A_r·x + b_A,r,

is approximated by a plain MLP with σ and twice the hidden units,

    enc(x) = Σ_r [σ(g_r + ε_r a_r) − σ(g_r − ε_r a_r)] / (2 ε_r) + b_E,

i.e. up-projection [G + diag(ε)A; G − diag(ε)A], biases [b_G + ε⊙b_A; b_G − ε⊙b_A] and output
row [1/(2ε), −1/(2ε)]. The error is O(ε²) (central difference) plus round-off O(u/ε), so ε is
halved from a coarse start until every key's code is within the tolerance (Alg. 8, lines 2–5).
As in the gated fast path, all m gadgets share one gate, so one solve serves every gadget.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import _ops
from .decoder import OUTPUTS, check_decodable, jl_decoder, output_embeddings
from .encoder import augment, build_shared_gate, gadget_width, sample_gate
from .mlp import DecodingMLP
from .validation import check_choice, check_positive_int, validate_inputs

FIRST_STEP = 0.1  # largest |ε_r a_r(k_i)| tried: a tenth of the gate pre-activations' scale
MAX_HALVINGS = 40


def activation_derivative(z: torch.Tensor, activation: str) -> torch.Tensor:
    """σ'(z) elementwise, by autograd through the activation: any shape."""
    with torch.enable_grad():
        z = z.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(_ops.activate(z, activation).sum(), z)
    return grad


class NonGatedMLP(DecodingMLP):
    """g(x) = W_down σ(W_up x + b_up) + b_down.

    up_weight: (h, d_in), up_bias: (h,), down_weight: (d_out, h), down_bias: (d_out,).
    ``approximation_error``: the largest |enc(k_i) − enc'(k_i)| of the codes, as built.
    """

    def __init__(self, up_weight: torch.Tensor, up_bias: torch.Tensor, down_weight: torch.Tensor,
                 down_bias: torch.Tensor, activation: str, approximation_error: float = 0.0) -> None:
        super().__init__()
        self.activation = _ops.check_activation(activation)
        self.up_weight = nn.Parameter(up_weight.detach().contiguous(), requires_grad=False)
        self.up_bias = nn.Parameter(up_bias.detach().contiguous(), requires_grad=False)
        self.down_weight = nn.Parameter(down_weight.detach().contiguous(), requires_grad=False)
        self.down_bias = nn.Parameter(down_bias.detach().contiguous(), requires_grad=False)
        self.approximation_error = approximation_error

    @property
    def hidden_size(self) -> int:
        return self.up_weight.shape[0]

    @property
    def num_parameters(self) -> int:
        """W_up, b_up, W_down, b_down: 2 h d + h + d for d_in = d_out = d."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_in) -> (..., d_out)."""
        hidden = _ops.activate(torch.nn.functional.linear(x, self.up_weight, self.up_bias), self.activation)
        return torch.nn.functional.linear(hidden, self.down_weight, self.down_bias)


def nongated_encoder(
    keys: torch.Tensor,
    targets: torch.Tensor,
    *,
    width_multiplier: float = 1.5,
    activation: str = "silu",
    tol: float = 1e-3,
    generator: torch.Generator,
) -> NonGatedMLP:
    """m non-gated gadgets (Alg. 8): keys (F, d) -> an encoder with enc(k_i) ≈ targets_i (m,).

    Solves the shared-gate gated gadgets with σ' (gadget width h̃ = ⌈multiplier·F/(d+1)⌉), then
    halves the finite-difference step until max_i,j |enc(k_i)_j − enc'(k_i)_j| is at most
    ``tol`` · RMS(targets), with ε_{j,r} = step / max_i |a_{j,r}(k_i)|. Hidden size 2·m·h̃;
    output (m, 2·m·h̃) with block rows [1/(2ε), −1/(2ε)].
    """
    num_facts, d = keys.shape
    m = targets.shape[1]
    width = gadget_width(num_facts, d, width_multiplier)
    gate, gate_bias = sample_gate(keys, width, generator)  # (h̃, d), (h̃,)
    features = activation_derivative(keys @ gate.T + gate_bias, activation)  # σ'(G K + b_G): (F, h̃)
    solved = build_shared_gate(keys, targets, width_multiplier=width_multiplier, activation=activation,
                               solver="cholesky", generator=generator, gate=(gate, gate_bias), features=features,
                               progress=False)
    coef, out_bias = solved.coefficients, solved.output_bias  # (m, h̃, d+1), (m,)
    gated = _ops.gadget_matvec(features, augment(keys), coef) + out_bias  # enc'(k_i): (F, m)

    slopes = torch.einsum("ic,jrc->ijr", augment(keys), coef)  # a_{j,r}(k_i): (F, m, h̃)
    scale = slopes.abs().amax(dim=0).clamp_min(1e-30)  # (m, h̃)
    threshold = tol * float(targets.square().mean().sqrt())
    blocks = torch.block_diag(*torch.ones(m, 1, width, dtype=keys.dtype, device=keys.device))  # (m, m·h̃)
    base = torch.cat([gate, gate_bias[:, None]], dim=1).repeat(m, 1)  # [G | b_G] per gadget: (m·h̃, d+1)
    step = FIRST_STEP
    for _ in range(MAX_HALVINGS):
        eps = (step / scale).reshape(m * width, 1)  # ε_{j,r}
        shift = coef.reshape(m * width, d + 1) * eps  # ε ⊙ [A | b_A]
        up = torch.cat([base + shift, base - shift])  # (2·m·h̃, d+1)
        half = blocks / (2 * eps.T)  # (m, m·h̃)
        encoder = NonGatedMLP(up[:, :d], up[:, d], torch.cat([half, -half], dim=1), out_bias, activation)
        error = float((encoder(keys) - gated).abs().max())
        if error <= threshold:
            encoder.approximation_error = error
            return encoder
        step /= 2
    raise RuntimeError(
        f"no finite-difference step reaches tol={tol:g} (last error {error:.2e}); round-off dominates: "
        "use float64 keys and values or raise tol"
    )


def construct_nongated(
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    m: int,
    *,
    outputs: str = "margin_optimal",
    activation: str = "silu",
    width_multiplier: float = 1.5,
    tol: float = 1e-3,
    seed: int = 0,
) -> NonGatedMLP:
    """A non-gated fact MLP g(x) = D · enc(x): JL decoder (Alg. 4) on non-gated gadgets (Alg. 8).

    Args:
        K: (F, d_in) keys, V: (|V|, d_out) values, f: (F,) value indices; m: code dimension.
        outputs: "margin_optimal" (U*) or "values", the embeddings the codes compress.
        activation: σ of the MLP (analytic, non-polynomial; the gadgets are solved with σ').
        width_multiplier: gated gadget width h̃ = ⌈multiplier·F/(d_in+1)⌉; hidden size 2·m·h̃.
        tol: allowed finite-difference error, relative to the RMS of the codes. float64 inputs
            reach small tolerances; float32 round-off limits it to about 1e-3.
        seed: seeds the gate and the JL projection.

    Returns:
        NonGatedMLP with up (2mh̃, d_in), down (d_out, 2mh̃) and their biases.
    """
    facts = validate_inputs(K, V, f)
    check_positive_int("m", m)
    check_choice("outputs", outputs, OUTPUTS)
    _ops.check_activation(activation)
    if not (isinstance(width_multiplier, (int, float)) and width_multiplier >= 1.0):
        raise ValueError(f"width_multiplier must be >= 1 (each gadget needs h~(d+1) >= F), got {width_multiplier!r}")
    if not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    generator = torch.Generator().manual_seed(seed)
    out_embed, rho = output_embeddings(V, outputs)
    check_decodable(float(rho), outputs)
    decoder = jl_decoder(out_embed, m, generator)
    encoder = nongated_encoder(K, decoder.codes[facts], width_multiplier=width_multiplier, activation=activation,
                               tol=tol, generator=generator)
    return NonGatedMLP(encoder.up_weight, encoder.up_bias, decoder.projection @ encoder.down_weight,
                       decoder.projection @ encoder.down_bias, activation, encoder.approximation_error)
