"""Where the MLPs are: Llama-style SwiGLU layout ``model.model.layers[i].mlp.{gate,up,down}_proj``.

Llama, Mistral, Qwen2 and SmolLM share it: ``mlp(x) = down_proj(act(gate_proj(x)) * up_proj(x))``
with ``act = silu``. Anything else gets a ValueError naming what is missing.
"""

from __future__ import annotations

from typing import Any

from torch import nn

SUPPORTED_ACTIVATIONS = ("silu", "swish")


def mlp_layers(model: Any) -> list[nn.Module]:
    """The decoder layers' SwiGLU MLP modules, one per layer (``model.model.layers[i].mlp``)."""
    name = type(model).__name__
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, (nn.ModuleList, list)) or len(layers) == 0:
        raise ValueError(f"unsupported model layout: {name} has no model.model.layers (a list of decoder layers); "
                         "factkernels.hf supports Llama-style causal LMs (Llama, Mistral, Qwen2, SmolLM)")
    act = getattr(getattr(model, "config", None), "hidden_act", None)
    if act not in SUPPORTED_ACTIVATIONS:
        raise ValueError(f"unsupported MLP activation in {name}: config.hidden_act={act!r}; "
                         f"factkernels.hf supports SwiGLU MLPs with hidden_act in {SUPPORTED_ACTIVATIONS}")
    mlps = []
    for i, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        missing = [p for p in ("gate_proj", "up_proj", "down_proj") if not isinstance(getattr(mlp, p, None), nn.Linear)]
        if mlp is None or missing:
            found = "no mlp" if mlp is None else f"mlp {type(mlp).__name__} without nn.Linear {', '.join(missing)}"
            raise ValueError(f"unsupported model layout: {name}.model.layers[{i}] has {found}; factkernels.hf needs "
                             "mlp.gate_proj, mlp.up_proj and mlp.down_proj (Llama-style SwiGLU)")
        mlps.append(mlp)
    return mlps


def mlp_module(model: Any, layer: int) -> nn.Module:
    """``model.model.layers[layer].mlp`` after checking the layout and that ``layer`` is in range."""
    mlps = mlp_layers(model)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(mlps):
        raise ValueError(f"layer must be an int in [0, {len(mlps)}) for this {len(mlps)}-layer model, got {layer!r}")
    return mlps[layer]
