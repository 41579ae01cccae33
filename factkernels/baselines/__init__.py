"""Baselines the construction is compared against (seed 000, A.1.3 and B.3.1).

    baselines.ntk(K, V, f, hidden=4096)            # NTK MLP (Alg. 5), gated FactMLP
    baselines.naive(K, V, f)                       # one ReLU unit per key (B.3.1)
    baselines.hebbian(K, V, f, m=64, variant="ridge")   # bilinear Hebbian MLP (the authors' later work)
    baselines.gd_mlp(K, V, f, hidden=32)           # SwiGLU MLP trained with cross-entropy
    baselines.encoder_decoder(K, V, f, m=32, encoder="gd", decoder="jl")   # GD+JL, Bin+GD, GD+GD
    baselines.gd_mlp_batch([(K, V, f)] * 3, hiddens=32, seeds=[0, 1, 2])   # B models as one batch

Each returns a module with ``.predict(K, V)`` and ``.num_parameters``.

Modules: ``ntk``, ``naive``, ``hebbian``; ``gd_swiglu`` (the GD MLP), ``gd_hybrids`` (GD encoder, GD
decoder and the encoder/decoder hybrids), both trained through ``batched_adam`` (the batched Adam loop
``fit``) on ``stacked_swiglu`` models (B SwiGLU nets as one, the fused cross-entropy, the stop tests).
"""

from .batched_adam import FitResult, fit
from .gd_hybrids import (encoder_decoder, encoder_decoder_batch, gd_decoder, gd_decoder_batch, gd_encoder,
                         gd_encoder_batch)
from .gd_swiglu import gd_mlp, gd_mlp_batch
from .hebbian import HebbianMLP, hebbian
from .naive import NaiveMLP, naive
from .ntk import hermite_coefficient, normalized_hermite, ntk

__all__ = [
    "ntk",
    "naive",
    "hebbian",
    "HebbianMLP",
    "NaiveMLP",
    "gd_mlp",
    "gd_mlp_batch",
    "gd_encoder_batch",
    "gd_decoder_batch",
    "encoder_decoder_batch",
    "gd_encoder",
    "gd_decoder",
    "encoder_decoder",
    "fit",
    "FitResult",
    "hermite_coefficient",
    "normalized_hermite",
]
