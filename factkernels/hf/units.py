"""Appending hidden units to one layer's SwiGLU MLP of a Hugging Face model, and taking them out again.

For a SwiGLU MLP, extra gate/up rows and down columns add their units' output:
``down([h_old; h_new]) = down_old h_old + down_new h_new``, so the layer computes exactly
old + new. Llama's config has one ``intermediate_size`` for every layer, so the other layers
get the same number of zero units (zero gate/up rows and down columns: output +0), and when
the new units have biases every layer gets zero biases (``config.mlp_bias = True``). Then
``model.save_pretrained`` writes a stock checkpoint that plain transformers loads.
:meth:`AppendedUnits.remove` puts the original Parameter objects back: bit-for-bit the original.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .layout import mlp_layers, mlp_module

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


@dataclass
class AppendedUnits:
    """Record of one :func:`append_units` call: enough to undo it exactly."""

    model: Any
    layer: int
    start: int  # intermediate size before (index of the first new unit)
    count: int  # units appended to every layer (non-zero only in ``layer``)
    saved: dict = field(repr=False)  # (layer, projection) -> (weight Parameter, bias Parameter or None)
    config: dict = field(repr=False)  # config fields before
    removed: bool = False

    def remove(self) -> None:
        """Restore the original parameters and config (bit-for-bit). Only the latest append can be removed."""
        if self.removed:
            raise RuntimeError("these units were already removed")
        mlps = mlp_layers(self.model)
        width = mlps[self.layer].up_proj.out_features
        if width != self.start + self.count:
            raise RuntimeError(f"layer {self.layer} has {width} hidden units, expected {self.start + self.count}: "
                               "remove later insertions first (last in, first out)")
        for (i, name), (weight, bias) in self.saved.items():
            linear = getattr(mlps[i], name)
            linear.weight, linear.bias = weight, bias
            linear.in_features, linear.out_features = weight.shape[1], weight.shape[0]
        for mlp in mlps:
            mlp.intermediate_size = self.start
        for key, value in self.config.items():
            setattr(self.model.config, key, value)
        self.removed = True


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


@torch.no_grad()
def append_units(model: Any, layer: int, weights: dict[str, torch.Tensor]) -> AppendedUnits:
    """Append hidden units to ``model.model.layers[layer].mlp``; every other layer gets as many zero units.

    weights: SwiGLU tensors as :meth:`factkernels.FactMLP.swiglu_weights` returns them:
    "gate_proj.weight" (n, d), "up_proj.weight" (n, d), "down_proj.weight" (d, n), and
    optionally "gate_proj.bias" (n,), "up_proj.bias" (n,), "down_proj.bias" (d,).
    """
    target = mlp_module(model, layer)
    mlps = mlp_layers(model)
    d, start = target.up_proj.in_features, target.up_proj.out_features
    count = weights["up_proj.weight"].shape[0]
    expected = {"gate_proj.weight": (count, d), "up_proj.weight": (count, d), "down_proj.weight": (d, count),
                "gate_proj.bias": (count,), "up_proj.bias": (count,), "down_proj.bias": (d,)}
    for key, t in weights.items():
        if key not in expected or tuple(t.shape) != expected[key]:
            raise ValueError(f"weights[{key!r}] must have shape {expected.get(key, 'a known SwiGLU name')}, "
                             f"got {tuple(t.shape)}")
    if any(m.up_proj.out_features != start for m in mlps):
        raise ValueError("every layer's MLP must have the same intermediate size (config.intermediate_size)")
    ref = target.up_proj.weight
    has_bias = any(k.endswith(".bias") for k in weights) or target.up_proj.bias is not None
    saved = {(i, name): (getattr(m, name).weight, getattr(m, name).bias) for i, m in enumerate(mlps) for name in PROJECTIONS}
    config = {"intermediate_size": model.config.intermediate_size, "mlp_bias": getattr(model.config, "mlp_bias", False)}
    for i, mlp in enumerate(mlps):
        mine = i == layer
        for name in PROJECTIONS:
            linear = getattr(mlp, name)
            new_w = weights[f"{name}.weight"].to(ref) if mine else torch.zeros(expected[f"{name}.weight"]).to(ref)
            dim = 1 if name == "down_proj" else 0
            linear.weight = _param(torch.cat([linear.weight, new_w], dim=dim))
            if has_bias:
                old_b = linear.bias if linear.bias is not None else torch.zeros(linear.weight.shape[0] - (0 if dim else count)).to(ref)
                new_b = weights.get(f"{name}.bias") if mine else None
                if name == "down_proj":  # the output bias adds
                    linear.bias = _param(old_b + (new_b.to(ref) if new_b is not None else 0.0))
                else:
                    linear.bias = _param(torch.cat([old_b, new_b.to(ref) if new_b is not None else torch.zeros(count).to(ref)]))
            linear.in_features, linear.out_features = linear.weight.shape[1], linear.weight.shape[0]
        mlp.intermediate_size = start + count
    model.config.intermediate_size = start + count
    model.config.mlp_bias = has_bias
    return AppendedUnits(model, layer, start, count, saved, config)
