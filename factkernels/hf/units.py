"""Appending hidden units to one layer's SwiGLU MLP of a Hugging Face model, and taking them out again.

For a SwiGLU MLP, extra gate/up rows and down columns add their units' output:
``down([h_old; h_new]) = down_old h_old + down_new h_new``, so the layer computes exactly
old + new. Only that layer grows in memory: the model runs at its old cost plus the new units.

Llama's config has one ``intermediate_size`` for every layer, so a checkpoint needs every layer
at the widest one. ``config.intermediate_size`` becomes that width and a state-dict hook on each
narrower MLP pads its tensors with zero units (zero gate/up rows and down columns: output +0) and,
when the new units have biases (``config.mlp_bias = True``), zero biases. Then
``model.save_pretrained`` writes a stock checkpoint that plain transformers loads. A layer that
receives units while narrower than that width is first padded for real, so every saved layer keeps
its units at the same positions. :meth:`AppendedUnits.remove` puts the original Parameter objects,
config and hooks back: bit-for-bit the original.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from ..mlp import FactMLP
from .layout import mlp_layers, mlp_module

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_HOOKS = "_factkernels_padding_hooks"  # model attribute: {layer: hook handle} of the padded layers


@dataclass
class AppendedUnits:
    """Record of one :func:`append_units` call: enough to undo it exactly."""

    model: Any
    layer: int
    start: int  # the layer's width before (index of the first new unit)
    count: int  # units appended to ``layer``
    saved: dict = field(repr=False)  # projection -> (weight Parameter, bias Parameter or None) of ``layer``
    config: dict = field(repr=False)  # config fields before
    hooks_before: dict = field(repr=False)  # the model's padding hooks before
    removed: bool = False

    def remove(self) -> None:
        """Restore the original parameters, config and hooks (bit-for-bit). Last in, first out."""
        if self.removed:
            raise RuntimeError("these units were already removed")
        mlp = mlp_layers(self.model)[self.layer]
        width = self.config["intermediate_size"] + self.count
        if self.model.config.intermediate_size != width or mlp.up_proj.out_features != width:
            raise RuntimeError(f"layer {self.layer} or the config changed since these units were appended: "
                               "remove later insertions first (last in, first out)")
        for name, (weight, bias) in self.saved.items():
            linear = getattr(mlp, name)
            linear.weight, linear.bias = weight, bias
            linear.in_features, linear.out_features = weight.shape[1], weight.shape[0]
        mlp.intermediate_size = self.start
        for key, value in self.config.items():
            setattr(self.model.config, key, value)
        hooks = getattr(self.model, _HOOKS)
        for layer in set(hooks) - set(self.hooks_before):
            hooks.pop(layer).remove()
        if not hooks:
            delattr(self.model, _HOOKS)
        self.removed = True


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


def _pad_state(model: Any, mlp: nn.Module, state: dict, prefix: str, _metadata: Any) -> None:
    """State-dict hook of a narrower MLP: zero units up to ``config.intermediate_size`` (and zero biases
    when ``config.mlp_bias``), as a checkpoint of uniform width needs."""
    width, bias = model.config.intermediate_size, getattr(model.config, "mlp_bias", False)
    for name in PROJECTIONS:
        weight = state[f"{prefix}{name}.weight"]
        dim = 1 if name == "down_proj" else 0
        extra = width - weight.shape[dim]
        if extra > 0:
            shape = list(weight.shape)
            shape[dim] = extra
            state[f"{prefix}{name}.weight"] = torch.cat([weight, weight.new_zeros(shape)], dim=dim)
        if bias:
            size = state[f"{prefix}{name}.weight"].shape[0]
            old = state.get(f"{prefix}{name}.bias")
            if old is None:
                state[f"{prefix}{name}.bias"] = weight.new_zeros(size)
            elif old.shape[0] < size:
                state[f"{prefix}{name}.bias"] = torch.cat([old, old.new_zeros(size - old.shape[0])])


@torch.no_grad()
def append_units(model: Any, layer: int, weights: dict[str, torch.Tensor]) -> AppendedUnits:
    """Append hidden units to ``model.model.layers[layer].mlp`` (see the module docstring).

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
    width = model.config.intermediate_size
    if any(m.up_proj.out_features > width for m in mlps):
        raise ValueError("an MLP is wider than config.intermediate_size: the model was changed outside factkernels")
    ref = target.up_proj.weight
    has_bias = any(k.endswith(".bias") for k in weights) or target.up_proj.bias is not None
    saved = {name: (getattr(target, name).weight, getattr(target, name).bias) for name in PROJECTIONS}
    config = {"intermediate_size": width, "mlp_bias": getattr(model.config, "mlp_bias", False)}
    pad = width - start  # zero units first, so the new ones sit where a checkpoint of uniform width has them
    for name in PROJECTIONS:
        linear = getattr(target, name)
        dim = 1 if name == "down_proj" else 0
        zeros = ref.new_zeros((pad, d) if dim == 0 else (d, pad))
        linear.weight = _param(torch.cat([linear.weight, zeros, weights[f"{name}.weight"].to(ref)], dim=dim))
        if has_bias:
            old_b = linear.bias if linear.bias is not None else ref.new_zeros(d if dim else start)
            new_b = weights.get(f"{name}.bias")
            if name == "down_proj":  # the output bias adds
                linear.bias = _param(old_b + (new_b.to(ref) if new_b is not None else 0.0))
            else:
                linear.bias = _param(torch.cat([old_b, ref.new_zeros(pad),
                                                new_b.to(ref) if new_b is not None else ref.new_zeros(count)]))
        linear.in_features, linear.out_features = linear.weight.shape[1], linear.weight.shape[0]
    target.intermediate_size = width + count
    model.config.intermediate_size = width + count
    model.config.mlp_bias = has_bias
    hooks = getattr(model, _HOOKS, None)
    if hooks is None:
        hooks = {}
        setattr(model, _HOOKS, hooks)
    before = dict(hooks)
    for i, mlp in enumerate(mlps):
        if i != layer and i not in hooks:
            hooks[i] = mlp.register_state_dict_post_hook(
                lambda module, state, prefix, metadata: _pad_state(model, module, state, prefix, metadata))
    return AppendedUnits(model, layer, start, count, saved, config, before)


@dataclass
class InsertionReport:
    """What :func:`insert_facts` did and measured. Margins are logits (target − best other), min over
    each fact's target tokens; a fact is stored iff its margin is > 0 in the edited model."""

    layer: int
    gate: str
    position: str
    num_facts: int
    num_keys: int
    hidden_added: int
    params_added: int
    efficacy: float
    min_margin: float
    margins: list
    value_error: float  # max over keys of ‖mlp_new(k) − δ‖, over the mean ‖δ‖ (some keys need δ = 0)
    delta_norm_mean: float
    background_output_ratio: float  # mean ‖mlp_new(x)‖ / mean ‖mlp_old(x)‖ on the background text's tokens
    timings: dict
    peak_rss_mb: float
    construction: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@contextmanager
def removed_on_failure(units: AppendedUnits) -> Iterator[None]:
    """Units appended but not yet certified are taken out again if anything fails (an interrupt included): a
    failed insertion leaves the model as it was."""
    try:
        yield
    except BaseException:
        units.remove()
        raise


@dataclass
class Insertion:
    """Facts inserted by :func:`insert_facts`: ``.report``, ``.mlp`` (the constructed units), ``.remove()``."""

    report: InsertionReport
    mlp: FactMLP
    units: AppendedUnits

    def remove(self) -> None:
        """Delete exactly the appended units: the model is bit-for-bit the original again."""
        self.units.remove()
