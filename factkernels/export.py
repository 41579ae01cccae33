"""Export a FactMLP into the MLP slot of a Hugging Face-style SwiGLU decoder block.

Hugging Face Llama/Qwen2/Mistral blocks name their MLP ``mlp.gate_proj``, ``mlp.up_proj``,
``mlp.down_proj`` (weights (h, d), (h, d), (d, h)) and compute
``down_proj(silu(gate_proj(x)) * up_proj(x))``, which is FactMLP's layout. The transformers
package is not a dependency: :class:`SwiGLUMLP` and :class:`SwiGLUBlock` re-implement the layout
(parameter names, shapes and forward) so checkpoints written here load into either.

    sd = write_mlp(checkpoint, mlp, layer=3)       # replaces model.layers.3.mlp.* (shapes checked)
    save_checkpoint(sd, "model.safetensors")
    back = read_mlp(sd, layer=3)                   # a FactMLP again (gate expanded to h rows)
    block = SwiGLUBlock(d, mlp.hidden_size, mlp_bias=True); block.load_state_dict(block_state_dict(mlp, block))

Constructed MLPs have biases (gate, up and down), so the target must have them too
(``LlamaConfig(mlp_bias=True)``); a bias-free slot (Qwen2, Llama's default) raises, naming that.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn.functional as F_nn
from torch import nn

from . import _ops
from .mlp import FactMLP
from .transformer.layers import RMSNorm, RotaryEmbedding

MLP_NAMES = ("gate_proj", "up_proj", "down_proj")


def layer_prefix(layer: Optional[int], model_prefix: str = "model.layers") -> str:
    """State-dict prefix of a block's MLP: ``model.layers.{layer}.mlp.``, or ``mlp.`` for a bare block."""
    if layer is None:
        return "mlp."
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer must be an int >= 0 or None (a bare block), got {layer!r}")
    return f"{model_prefix}.{layer}.mlp."


class SwiGLUMLP(nn.Module):
    """Hugging Face LlamaMLP / Qwen2MLP: ``down_proj(act(gate_proj(x)) * up_proj(x))``.

    gate_proj, up_proj: Linear(hidden_size -> intermediate_size), down_proj: Linear(intermediate_size
    -> hidden_size), all with bias iff ``mlp_bias``. x: (..., hidden_size) -> (..., hidden_size).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, mlp_bias: bool = False,
                 hidden_act: str = "silu") -> None:
        super().__init__()
        self.hidden_act = _ops.check_activation(hidden_act)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=mlp_bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=mlp_bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(_ops.activate(self.gate_proj(x), self.hidden_act) * self.up_proj(x))


class SwiGLUAttention(nn.Module):
    """Causal multi-head attention under Hugging Face names (q_proj, k_proj, v_proj, o_proj) with RoPE."""

    def __init__(self, hidden_size: int, num_heads: int = 1) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide hidden_size={hidden_size}")
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden_size, hidden_size, bias=False)
                                                              for _ in range(4))
        self.rotary = RotaryEmbedding(self.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, d) -> (B, T, d)."""
        batch, time, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, time, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        q, k = self.rotary(q), self.rotary(k)
        out = F_nn.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(self.head_dim))
        return self.o_proj(out.transpose(1, 2).reshape(batch, time, -1))


class SwiGLUBlock(nn.Module):
    """A pre-norm decoder block under Hugging Face LlamaDecoderLayer names:
    ``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj``.

    forward: h = x + self_attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h)).
    x: (B, T, hidden_size) -> (B, T, hidden_size).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, num_heads: int = 1, mlp_bias: bool = False,
                 hidden_act: str = "silu") -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size)
        self.self_attn = SwiGLUAttention(hidden_size, num_heads)
        self.post_attention_layernorm = RMSNorm(hidden_size)
        self.mlp = SwiGLUMLP(hidden_size, intermediate_size, mlp_bias, hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


def mlp_state_dict(mlp: FactMLP, prefix: str = "mlp.") -> dict[str, torch.Tensor]:
    """FactMLP weights under ``{prefix}gate_proj.weight`` etc. (gate expanded to (h, d_in))."""
    if not isinstance(mlp, FactMLP):
        raise TypeError(f"mlp must be a FactMLP, got {type(mlp).__name__}")
    return {prefix + name: tensor for name, tensor in mlp.swiglu_weights().items()}


def write_mlp(state_dict: dict[str, torch.Tensor], mlp: FactMLP, layer: Optional[int] = None,
              model_prefix: str = "model.layers") -> dict[str, torch.Tensor]:
    """A copy of ``state_dict`` (a block's or a whole model's) with the MLP of ``layer`` replaced by ``mlp``.

    The slot must exist with the same shapes (d_in, d_out and intermediate size must match) and
    hold the same bias entries; tensors keep the checkpoint's dtype and device.
    """
    prefix = layer_prefix(layer, model_prefix)
    new = mlp_state_dict(mlp, prefix)
    slot = {k for k in state_dict if k.startswith(prefix) and k[len(prefix):].split(".")[0] in MLP_NAMES}
    if not slot:
        raise ValueError(f"state_dict has no MLP slot under {prefix!r} (expected {prefix}gate_proj.weight, ...)")
    missing_bias = sorted(set(new) - slot)
    if missing_bias:
        raise ValueError(f"the slot under {prefix!r} has no {missing_bias}: constructed MLPs need biases; "
                         "use a target with mlp_bias=True (e.g. LlamaConfig(mlp_bias=True))")
    extra = sorted(slot - set(new))
    if extra:
        raise ValueError(f"the slot under {prefix!r} has {extra}, which this MLP does not have")
    for key, tensor in new.items():
        if state_dict[key].shape != tensor.shape:
            raise ValueError(f"{key} has shape {tuple(state_dict[key].shape)} in the checkpoint but "
                             f"{tuple(tensor.shape)} in the MLP; match intermediate_size={mlp.hidden_size} "
                             f"and hidden_size={mlp.in_features}")
    out = dict(state_dict)
    out.update({k: v.to(dtype=state_dict[k].dtype, device=state_dict[k].device) for k, v in new.items()})
    return out


def block_state_dict(mlp: FactMLP, block: SwiGLUBlock) -> dict[str, torch.Tensor]:
    """``block``'s state dict with its MLP replaced by ``mlp`` (for ``block.load_state_dict``)."""
    return write_mlp(block.state_dict(), mlp)


def read_mlp(state_dict: dict[str, torch.Tensor], layer: Optional[int] = None, activation: str = "silu",
             model_prefix: str = "model.layers") -> FactMLP:
    """The MLP in the slot of ``layer`` as a FactMLP (gate with h rows; biases as present)."""
    prefix = layer_prefix(layer, model_prefix)
    names = [f"{name}.{kind}" for name in MLP_NAMES for kind in ("weight", "bias")]
    missing = [prefix + n for n in names[::2] if prefix + n not in state_dict]
    if missing:
        raise ValueError(f"state_dict lacks {missing}")
    gate_w, gate_b, up_w, up_b, down_w, down_b = (state_dict.get(prefix + n) for n in names)
    return FactMLP(gate_w, gate_b, up_w, up_b, down_w, down_b, activation=activation)


def save_checkpoint(state_dict: dict[str, torch.Tensor], path: Union[str, Path]) -> Path:
    """Write a state dict as safetensors (contiguous CPU tensors), as Hugging Face checkpoints are stored."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in state_dict.items()}, str(path),
              metadata={"format": "pt"})
    return Path(path)


def load_checkpoint(path: Union[str, Path]) -> dict[str, torch.Tensor]:
    """Read a safetensors state dict."""
    from safetensors.torch import load_file

    return load_file(str(path))
