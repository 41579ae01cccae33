"""A 1-layer GPT-2-style transformer with a slot for a frozen fact-storing MLP (seed 000 §5.1).

    x = E[tokens]                                    (B, T, d), key/value rows of E frozen
    a = attention(RMSNorm(x))                        single head, RoPE, causal
    h = mlp(unit(a))                                 frozen FactMLP behind the frozen pre-MLP norm
    logits = h @ E[output_tokens]ᵀ                   (tied output embeddings)

Each of the seed's four modifications is a switch (all on by default, as in the seed):
``tie_embeddings`` (the output embeddings are the frozen input embeddings, so the MLP's value
embeddings are the transformer's), ``residual=False`` (no residual connections),
``freeze_mlp_norm`` (the pre-MLP RMSNorm has no weight and projects onto the unit sphere, where
the MLP's keys live) and ``identity_value_output`` (attention V and O frozen to the identity).

    model = FactTransformer(task.embeddings, mlp, frozen_tokens=..., output_tokens=task.value_tokens)
    logits = model(tokens, padding_mask, last_only=True)   # (B, |out|)
    old = model.swap_mlp(factkernels.construct(K, V, f_new))  # new facts, no retraining
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .layers import CausalSelfAttention, RMSNorm


def _token_ids(name: str, ids: Optional[torch.Tensor], vocab: int) -> torch.Tensor:
    if ids is None:
        return torch.arange(vocab)
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() != 1:
        raise TypeError(f"{name} must be a 1-D long tensor of token ids, got {ids!r}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"{name} must hold token ids in [0, {vocab}), got range [{int(ids.min())}, {int(ids.max())}]")
    if ids.unique().numel() != ids.numel():
        raise ValueError(f"{name} has repeated token ids")
    return ids.clone()


class FactTransformer(nn.Module):
    """One transformer block whose MLP is a frozen, swappable fact-storing MLP.

    Args:
        embeddings: (vocab, d) token embeddings (copied).
        mlp: module (..., d) -> (..., d), e.g. a :class:`~factkernels.FactMLP`; frozen.
        frozen_tokens: (n,) long ids whose embeddings stay fixed (default: all); the other
            rows train. The seed freezes the key and value embeddings.
        output_tokens: (n_out,) long ids scored by the output layer (default: all tokens).
        tie_embeddings: output layer = frozen embeddings of ``output_tokens``; False gives a
            trainable output matrix initialised from them.
        residual: add residual connections around attention and MLP (vanilla GPT-2).
        freeze_mlp_norm: pre-MLP norm projects onto the unit sphere (no weight); False gives a
            trainable RMSNorm.
        identity_value_output: attention V and O frozen to the identity.
        rope: rotary position embeddings on queries and keys. head_dim: query/key width (default d).
        output_norm: a trainable RMSNorm before the output layer (GPT-2's final norm, which the
            authors' released code keeps); off by default, as in the runs committed so far.
    """

    def __init__(self, embeddings: torch.Tensor, mlp: nn.Module, *, frozen_tokens: Optional[torch.Tensor] = None,
                 output_tokens: Optional[torch.Tensor] = None, tie_embeddings: bool = True, residual: bool = False,
                 freeze_mlp_norm: bool = True, identity_value_output: bool = True, rope: bool = True,
                 head_dim: Optional[int] = None, output_norm: bool = False) -> None:
        super().__init__()
        if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 2 or not embeddings.is_floating_point():
            raise TypeError("embeddings must be a floating (vocab, d) tensor")
        vocab, dim = embeddings.shape
        frozen = _token_ids("frozen_tokens", frozen_tokens, vocab)
        trainable = torch.ones(vocab, dtype=torch.bool)
        trainable[frozen] = False
        self.dim, self.vocab_size = dim, vocab
        self.register_buffer("embedding_table", embeddings.detach().clone())
        self.register_buffer("trainable_tokens", torch.nonzero(trainable).flatten())
        self.trainable_embeddings = nn.Parameter(embeddings.detach()[trainable].clone())
        self.register_buffer("output_tokens", _token_ids("output_tokens", output_tokens, vocab))
        self.tie_embeddings, self.residual = bool(tie_embeddings), bool(residual)
        self.output_weight = None if tie_embeddings else nn.Parameter(embeddings.detach()[self.output_tokens].clone())
        self.attention_norm = RMSNorm(dim)
        self.attention = CausalSelfAttention(dim, head_dim, identity_value_output=identity_value_output, rope=rope)
        self.mlp_norm = RMSNorm(dim, frozen=freeze_mlp_norm)
        self.output_norm = RMSNorm(dim) if output_norm else None
        self.mlp = self._frozen(mlp)

    def _frozen(self, mlp: nn.Module) -> nn.Module:
        if not isinstance(mlp, nn.Module):
            raise TypeError(f"mlp must be a torch.nn.Module mapping (..., {self.dim}) -> (..., {self.dim}), "
                            f"got {type(mlp).__name__}")
        probe = mlp(torch.zeros(1, self.dim, dtype=self.embedding_table.dtype, device=self.embedding_table.device))
        if probe.shape != (1, self.dim):
            raise ValueError(f"mlp must map (n, {self.dim}) -> (n, {self.dim}), got output shape {tuple(probe.shape)}")
        return mlp.requires_grad_(False)

    def swap_mlp(self, mlp: nn.Module) -> nn.Module:
        """Put ``mlp`` (frozen, moved to this model's device and dtype) into the slot; return the old one."""
        old = self.mlp
        self.mlp = self._frozen(mlp.to(device=self.embedding_table.device, dtype=self.embedding_table.dtype))
        return old

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) long -> (B, T, d); trainable rows come from ``trainable_embeddings``."""
        table = self.embedding_table.index_copy(0, self.trainable_tokens, self.trainable_embeddings)
        return table[tokens]

    @property
    def output_embeddings(self) -> torch.Tensor:
        """(n_out, d) rows the logits are taken against."""
        if self.output_weight is not None:
            return self.output_weight
        return self.embedding_table[self.output_tokens]

    def hidden(self, tokens: torch.Tensor, padding_mask: Optional[torch.Tensor] = None,
               last_only: bool = False) -> torch.Tensor:
        """Block output (after the output norm, if any) before the output layer: (B, T, d), or (B, d) at the
        last position."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a (batch, time) long tensor, got {tokens.dtype} {tuple(tokens.shape)}")
        x = self.embed(tokens)
        mixed = self.attention(self.attention_norm(x), padding_mask)
        if last_only:  # only the last position is scored: skip the MLP elsewhere
            x, mixed = x[:, -1], mixed[:, -1]
        if self.residual:
            mixed = x + mixed
        out = self.mlp(self.mlp_norm(mixed))
        out = mixed + out if self.residual else out
        return out if self.output_norm is None else self.output_norm(out)

    def forward(self, tokens: torch.Tensor, padding_mask: Optional[torch.Tensor] = None,
                last_only: bool = False) -> torch.Tensor:
        """tokens (B, T) long, padding_mask (B, T) bool -> logits (B, T, n_out), or (B, n_out) if last_only."""
        return self.hidden(tokens, padding_mask, last_only) @ self.output_embeddings.T


def swap_mlp(model: FactTransformer, mlp: nn.Module) -> nn.Module:
    """Put ``mlp`` into ``model``'s MLP slot (same as ``model.swap_mlp(mlp)``); return the old MLP."""
    return model.swap_mlp(mlp)
