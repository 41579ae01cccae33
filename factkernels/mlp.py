"""FactMLP: a gated MLP that stores facts, in SwiGLU layout.

    g(x) = W_down (σ(W_gate x + b_gate) ⊙ (W_up x + b_up)) + b_down

When the gadgets share one gate, W_gate is kept compact (h_g rows, hidden unit
r uses row r mod h_g) and expanded only on export, which saves memory and a
factor m of the gate's work in the forward pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

import torch
from torch import nn

from . import _ops
from .report import ConstructionReport


class DecodingMLP(nn.Module):
    """Base of every fact MLP here (constructed, baselines): decoding against a value table.

    Subclasses define ``forward`` (..., d_in) -> (..., d_out); ``backend`` picks the fused
    decode kernel or its torch twin.
    """

    backend: str = "auto"

    @torch.no_grad()
    def predict(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """argmax_j <g(k_i), v_j>: keys (n, d_in), values (|V|, d_out) -> (n,) long."""
        return _ops.decode(self(keys), values, backend=self.backend)[0]

    @torch.no_grad()
    def margins(self, keys: torch.Tensor, values: torch.Tensor, facts: torch.Tensor) -> torch.Tensor:
        """<g(k_i), v_f(i)> − max_{j≠f(i)} <g(k_i), v_j>: (n,); fact i is stored iff > 0."""
        return _ops.decode(self(keys), values, facts, backend=self.backend)[1]


class FactMLP(DecodingMLP):
    """A constructed fact-storing gated MLP.

    gate_weight: (h_g, d_in) with h_g dividing h; gate_bias: (h_g,)
    up_weight: (h, d_in); up_bias: (h,)
    down_weight: (d_out, h); down_bias: (d_out,)
    ``report`` holds the :class:`ConstructionReport` when built by :func:`factkernels.construct`.
    """

    def __init__(
        self,
        gate_weight: torch.Tensor,
        gate_bias: Optional[torch.Tensor],
        up_weight: torch.Tensor,
        up_bias: Optional[torch.Tensor],
        down_weight: torch.Tensor,
        down_bias: Optional[torch.Tensor],
        activation: str = "silu",
        report: Optional[ConstructionReport] = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.activation = _ops.check_activation(activation)
        if up_weight.shape[0] % gate_weight.shape[0]:
            raise ValueError(
                f"gate_weight rows ({gate_weight.shape[0]}) must divide up_weight rows ({up_weight.shape[0]})"
            )
        if down_weight.shape[1] != up_weight.shape[0]:
            raise ValueError(f"down_weight must have {up_weight.shape[0]} columns, got {tuple(down_weight.shape)}")

        def param(t: Optional[torch.Tensor]) -> Optional[nn.Parameter]:
            return None if t is None else nn.Parameter(t.detach().contiguous(), requires_grad=False)

        self.gate_weight = param(gate_weight)
        self.gate_bias = param(gate_bias)
        self.up_weight = param(up_weight)
        self.up_bias = param(up_bias)
        self.down_weight = param(down_weight)
        self.down_bias = param(down_bias)
        self.report = report
        self.backend = backend

    # ------------------------------------------------------------------ shapes
    @property
    def in_features(self) -> int:
        return self.up_weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.down_weight.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.up_weight.shape[0]

    @property
    def num_parameters(self) -> int:
        """Parameters in SwiGLU layout (gate expanded to h rows), biases included."""
        h, d_in, d_out = self.hidden_size, self.in_features, self.out_features
        biases = sum(b is not None for b in (self.gate_bias, self.up_bias)) * h + (self.down_bias is not None) * d_out
        return 2 * h * d_in + d_out * h + biases

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, hidden={self.hidden_size}, out={self.out_features}, "
                f"gate_rows={self.gate_weight.shape[0]}, activation={self.activation}")

    # ----------------------------------------------------------------- compute
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_in) -> (..., d_out)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have last dimension {self.in_features}, got shape {tuple(x.shape)}")
        flat = x.reshape(-1, self.in_features)
        out = _ops.gated_forward(flat, self.gate_weight, self.gate_bias, self.up_weight, self.up_bias,
                                 self.down_weight, self.down_bias, self.activation, backend=self.backend)
        return out.reshape(*x.shape[:-1], self.out_features)

    # ------------------------------------------------------------------ export
    def swiglu_weights(self) -> dict[str, torch.Tensor]:
        """Weights under Hugging Face SwiGLU names with the gate expanded to (h, d_in).

        {"gate_proj.weight": (h, d_in), "gate_proj.bias": (h,), "up_proj.weight": (h, d_in),
         "up_proj.bias": (h,), "down_proj.weight": (d_out, h), "down_proj.bias": (d_out,)}
        (bias entries only when present).
        """
        repeat = self.hidden_size // self.gate_weight.shape[0]
        tensors = {
            "gate_proj.weight": self.gate_weight.repeat(repeat, 1),
            "gate_proj.bias": None if self.gate_bias is None else self.gate_bias.repeat(repeat),
            "up_proj.weight": self.up_weight,
            "up_proj.bias": self.up_bias,
            "down_proj.weight": self.down_weight,
            "down_proj.bias": self.down_bias,
        }
        return {k: v.detach().clone() for k, v in tensors.items() if v is not None}

    def save(self, path: Union[str, Path]) -> None:
        """Write weights (compact gate) and metadata to a safetensors file."""
        from safetensors.torch import save_file

        tensors = {name: p.detach().contiguous().cpu() for name, p in self.named_parameters()}
        metadata = {"format": "factkernels.FactMLP/1", "activation": self.activation,
                    "report": json.dumps(None if self.report is None else self.report.to_dict())}
        save_file(tensors, str(path), metadata=metadata)

    @classmethod
    def load(cls, path: Union[str, Path], device: Union[str, torch.device] = "cpu") -> "FactMLP":
        """Read a FactMLP written by :meth:`save`."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device=str(device)) as fh:
            metadata = fh.metadata() or {}
            if metadata.get("format") != "factkernels.FactMLP/1":
                raise ValueError(f"{path} is not a factkernels FactMLP file (metadata: {metadata})")
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        report = json.loads(metadata.get("report", "null"))
        return cls(
            tensors["gate_weight"], tensors.get("gate_bias"), tensors["up_weight"], tensors.get("up_bias"),
            tensors["down_weight"], tensors.get("down_bias"), activation=metadata["activation"],
            report=None if report is None else ConstructionReport.from_dict(report),
        )
