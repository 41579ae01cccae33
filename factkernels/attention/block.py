"""A full pre-LN Transformer block on frozen real token embeddings (seed 002, Sec. 7.3).

Task (permutation -> matching retrieval, induction / IOI-style indirection): a fixed random
permutation pi of m items; an example draws a query q with s = pi(q) != q and 2 ell - 1 more
distinct items (not q, not s), groups s and those items into ell pairs (s with the first),
and asks for y = the partner of s. Each pair (a, b) is one superposed slot E[a] + E[b]; the
sequence is [slot_1 .. slot_ell, E[NULL], E[q]] with no positional embeddings (slots are
exchangeable, so their order carries nothing), read out at the last position through the
tied unembedding: logits = LN(h_last) E^T over the m + 1 rows of E.

Model: one GPT-style pre-LN block, x + MHA(LN x), then + MLP(LN .), with an explicit key
budget D_K = h d_k (W_Q, W_K: d_model x D_K), d_v = d_model / h, no biases in attention, a
2-layer GELU MLP of width d_ff (16), softmax attention with 1/sqrt(d_k). Only the block
trains (AdamW, weight decay 0.01, constant lr); E is frozen. The reported number is test
accuracy at the best validation accuracy (checked every ``check_every`` steps).

Embeddings: the seed uses GPT-2-small (d = 768), the m most frequent WikiText-103 tokens and
NULL = EOS. Here E is the first m + 1 whole-word tokens of all-MiniLM-L6-v2 (d = 384, shipped
with the package, ``factkernels.datasets.token_embeddings``), the last of them serving as
NULL; no frequency ranking is available offline.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..datasets import token_embeddings
from ..progress import progress_bar
from .train_heads import torch_threads

_INIT_SEED_OFFSET = 1_000_003  # block parameters draw from their own stream, data from the run seed


@dataclass(frozen=True)
class BlockConfig:
    """Sec. 7.3's protocol; the seed's run is m = 6144, ell = 16, up to 100,000 steps, 7 seeds."""

    context_pairs: int = 16  # ell slots, 2 ell items
    mlp_width: int = 16  # d_ff
    lr: float = 1e-3
    weight_decay: float = 0.01
    batch_size: int = 64
    max_steps: int = 100_000
    check_every: int = 500
    val_examples: int = 1000
    test_examples: int = 2000
    threads: Optional[int] = 1

    def __post_init__(self) -> None:
        for name in ("context_pairs", "mlp_width", "batch_size", "max_steps", "check_every", "val_examples",
                     "test_examples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not self.lr > 0 or not self.weight_decay >= 0:
            raise ValueError(f"lr must be positive and weight_decay non-negative, got {self.lr}, {self.weight_decay}")


@dataclass(frozen=True)
class RetrievalBatch:
    """Examples of the task: pairs (N, ell, 2), query (N,), label (N,) item indices; NULL is item m."""

    pairs: torch.Tensor
    query: torch.Tensor
    label: torch.Tensor


def sample_retrieval(permutation: torch.Tensor, num: int, context_pairs: int, generator: torch.Generator
                     ) -> RetrievalBatch:
    """``num`` examples for the permutation pi (m,) with ``context_pairs`` = ell pairs each (needs m >= 2 ell + 1)."""
    m = permutation.shape[0]
    if m < 2 * context_pairs + 1:
        raise ValueError(f"need m >= 2 ell + 1 = {2 * context_pairs + 1} items, got m = {m}")
    movers = torch.nonzero(permutation != torch.arange(m)).flatten()  # q with pi(q) != q
    if movers.numel() == 0:
        raise ValueError("the permutation is the identity: no query has a successor s != q")
    query = movers[torch.randint(0, movers.numel(), (num,), generator=generator)]
    succ = permutation[query]
    weights = torch.ones(num, m)
    rows = torch.arange(num)
    weights[rows, query] = 0
    weights[rows, succ] = 0
    others = torch.multinomial(weights, 2 * context_pairs - 1, replacement=False, generator=generator)
    pairs = torch.cat([succ[:, None], others], dim=1).view(num, context_pairs, 2)
    return RetrievalBatch(pairs, query, others[:, 0])


class PreLNBlock(nn.Module):
    """One pre-LN block (MHA + MLP + residuals) over a frozen table E (m + 1, d_model), last row NULL."""

    def __init__(self, table: torch.Tensor, num_heads: int, key_budget: int, mlp_width: int = 16, seed: int = 0):
        super().__init__()
        d_model = table.shape[1]
        if key_budget % num_heads or d_model % num_heads:
            raise ValueError(f"h = {num_heads} must divide D_K = {key_budget} and d_model = {d_model}")
        self.register_buffer("table", table, persistent=False)
        self.num_heads, self.head_dim = num_heads, key_budget // num_heads
        self.ln_attn, self.ln_mlp, self.ln_out = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.query = nn.Linear(d_model, key_budget, bias=False)
        self.key = nn.Linear(d_model, key_budget, bias=False)
        self.value = nn.Linear(d_model, d_model, bias=False)  # h heads of d_v = d_model / h
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_width), nn.GELU(), nn.Linear(mlp_width, d_model))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() == 2:  # PyTorch's default Linear bound 1/sqrt(fan_in), drawn from the seeded stream
                    bound = 1 / math.sqrt(p.shape[1])
                    p.copy_(torch.rand(p.shape, generator=generator) * 2 * bound - bound)
            for module in self.mlp:
                if isinstance(module, nn.Linear):
                    module.bias.zero_()

    def encode(self, batch: RetrievalBatch) -> torch.Tensor:
        """Input sequences (N, ell + 2, d_model): superposed pair slots, NULL, query."""
        slots = self.table[batch.pairs].sum(dim=2)
        null = self.table[-1].expand(slots.shape[0], 1, -1)
        return torch.cat([slots, null, self.table[batch.query][:, None]], dim=1)

    def forward(self, batch: RetrievalBatch) -> torch.Tensor:
        """Logits (N, m + 1) at the last (query) position."""
        x = self.encode(batch)
        n, length, d = x.shape
        h = self.ln_attn(x)
        q = self.query(h[:, -1]).view(n, self.num_heads, 1, -1)  # only the last position is read out
        k = self.key(h).view(n, length, self.num_heads, -1).transpose(1, 2)  # (n, h, length, d_k)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)  # (n, h, 1, length)
        # sum_j a_j (W_V LN x_j) = W_V (sum_j a_j LN x_j): mix first, then one d_v slice of W_V per head
        mixed = (weights @ h[:, None]).squeeze(2)  # (n, h, d_model)
        w_v = self.value.weight.view(self.num_heads, -1, d)  # (h, d_v, d_model)
        attended = torch.einsum("nhd,hvd->nhv", mixed, w_v).reshape(n, 1, d)
        last = x[:, -1:] + self.out(attended)
        last = last + self.mlp(self.ln_mlp(last))
        return self.ln_out(last[:, 0]) @ self.table.T


@dataclass
class BlockRun:
    """One trained block: test accuracy at the best validation accuracy."""

    seed: int
    num_heads: int
    key_budget: int
    test_accuracy: float
    val_accuracy: float
    best_step: int
    steps: int

    def to_dict(self) -> dict:
        return asdict(self) | {"head_dim": self.key_budget // self.num_heads}


def _accuracy(model: PreLNBlock, batch: RetrievalBatch) -> float:
    with torch.no_grad():
        return float((model(batch).argmax(dim=1) == batch.label).float().mean())


def train_block(m: int, num_heads: int, key_budget: int, seed: int, config: BlockConfig = BlockConfig(), *,
                table: Optional[torch.Tensor] = None, quiet: bool = False) -> BlockRun:
    """Train one pre-LN block on the retrieval task for permutation seed ``seed`` (module docstring).

    table: the frozen E (m + 1, d_model); default the first m + 1 MiniLM whole-word tokens.
    """
    if isinstance(m, bool) or not isinstance(m, int) or m < 3:
        raise ValueError(f"m must be an int >= 3, got {m!r}")
    if table is None:
        table = token_embeddings(m + 1)[0]
    if table.dim() != 2 or table.shape[0] != m + 1:
        raise ValueError(f"table must have shape (m + 1 = {m + 1}, d_model), got {tuple(table.shape)}")
    with torch_threads(config.threads):
        gen = torch.Generator().manual_seed(seed)
        permutation = torch.randperm(m, generator=gen)
        val = sample_retrieval(permutation, config.val_examples, config.context_pairs, gen)
        test = sample_retrieval(permutation, config.test_examples, config.context_pairs, gen)
        model = PreLNBlock(table, num_heads, key_budget, config.mlp_width, seed + _INIT_SEED_OFFSET)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        best = (-1.0, 0.0, 0)  # (val accuracy, test accuracy, step)
        bar = progress_bar(range(1, config.max_steps + 1), desc=f"block h={num_heads} D_K={key_budget}", leave=False,
                   enabled=not quiet)
        for step in bar:
            batch = sample_retrieval(permutation, config.batch_size, config.context_pairs, gen)
            loss = F.cross_entropy(model(batch), batch.label)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % config.check_every == 0 or step == config.max_steps:
                val_acc = _accuracy(model, val)
                if val_acc > best[0]:
                    best = (val_acc, _accuracy(model, test), step)
                bar.set_postfix(val=f"{val_acc:.3f}", best=f"{best[0]:.3f}")
        bar.close()
    return BlockRun(seed, num_heads, key_budget, best[1], best[0], best[2], config.max_steps)
