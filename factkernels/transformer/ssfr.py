"""Synthetic Sequential Factual Recall (SSFR, seed 000 §5.1 and App. A.2.1).

A sequence is ``junk prefix, key, junk suffix`` and the model must predict ``f(key)`` as the
next (final) token:

    * % & # $   A   & % * $ #   ->   B
    junk prefix key junk suffix      value

The seed's settings (defaults here): junk prefix and suffix lengths between 8 and 16, |J| = 16
(prefix, suffix) tuples, 16 reserved junk tokens; transformer embeddings of the key, value and
junk tokens drawn from a standard normal (optionally ill-conditioned to condition number kappa,
as in App. A.1.1). The MLP key embeddings are the key embeddings projected onto the unit sphere
(the frozen pre-MLP RMSNorm does exactly that); the MLP value embeddings are the value embeddings.

Token layout: keys ``[0, F)``, values ``[F, F + |V|)``, junk ``[F + |V|, F + |V| + n_junk)``.

    task = SSFRTask(num_keys=64, dim=32, seed=0)
    mlp = factkernels.construct(task.mlp_keys, task.mlp_values, task.facts)
    batch = task.sample(128, generator=torch.Generator().manual_seed(0))   # training batch
    test = task.sequences(task.facts, split="test")                        # every (key, test junk pair)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..embeddings import anisotropic

JUNK_LENGTH = (8, 16)  # inclusive range of junk prefix / suffix lengths (App. A.2.1)
NUM_JUNK_PAIRS = 16  # |J|
NUM_TEST_PAIRS = 4  # held-out junk tuples (ours; the seed scores on J only)
NUM_JUNK_TOKENS = 16  # reserved junk tokens
SPLITS = ("train", "test", "all")


@dataclass
class SSFRBatch:
    """Left-padded SSFR inputs without their final value token.

    tokens: (N, T) long, padding_mask: (N, T) bool (True = real token), targets: (N,) long value
    index in [0, |V|) (the token id is ``num_keys + target``), keys: (N,) key index per sequence.
    """

    tokens: torch.Tensor
    padding_mask: torch.Tensor
    targets: torch.Tensor
    keys: torch.Tensor

    def to(self, device: torch.device) -> "SSFRBatch":
        return SSFRBatch(*(t.to(device) for t in (self.tokens, self.padding_mask, self.targets, self.keys)))

    def __len__(self) -> int:
        return self.tokens.shape[0]


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class SSFRTask:
    """One SSFR instance: embeddings, a fact set f: keys -> values and the junk (prefix, suffix) tuples.

    Args:
        num_keys: F. num_values: |V| (default F). dim: embedding dimension d.
        num_junk_tokens, num_junk_pairs, junk_length: the seed's 16, 16 and (8, 16).
        num_test_pairs: extra junk tuples held out from training; ``split="test"`` sequences use them.
        kappa: condition number of the key and value embedding matrices (1 = as drawn, no change).
        seed: seeds embeddings, the fact set and the junk tuples (same seed, same task).

    Attributes: embeddings (vocab, d) float32; facts (F,) long; junk_pairs: list of
    (prefix (Lp,), suffix (Ls,)) long tensors of junk token ids, the first ``num_junk_pairs`` for
    training and the last ``num_test_pairs`` held out.
    """

    def __init__(self, num_keys: int, dim: int, *, num_values: Optional[int] = None,
                 num_junk_tokens: int = NUM_JUNK_TOKENS, num_junk_pairs: int = NUM_JUNK_PAIRS,
                 junk_length: tuple[int, int] = JUNK_LENGTH, num_test_pairs: int = NUM_TEST_PAIRS, kappa: float = 1.0,
                 seed: int = 0) -> None:
        num_values = num_keys if num_values is None else num_values
        for name, value in (("num_keys", num_keys), ("num_values", num_values), ("dim", dim),
                            ("num_junk_tokens", num_junk_tokens), ("num_junk_pairs", num_junk_pairs)):
            _positive_int(name, value)
        if isinstance(num_test_pairs, bool) or not isinstance(num_test_pairs, int) or num_test_pairs < 0:
            raise ValueError(f"num_test_pairs must be an int >= 0, got {num_test_pairs!r}")
        low, high = junk_length
        if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high):
            raise ValueError(f"junk_length must be (low, high) ints with 0 <= low <= high, got {junk_length!r}")
        if num_values < 2:
            raise ValueError(f"num_values must be >= 2 (one value makes recall trivial), got {num_values}")
        self.num_keys, self.num_values, self.dim = num_keys, num_values, dim
        self.num_junk_tokens, self.num_junk_pairs, self.num_test_pairs = num_junk_tokens, num_junk_pairs, num_test_pairs
        self.junk_length, self.kappa, self.seed = (low, high), float(kappa), seed
        gen = torch.Generator().manual_seed(seed)
        keys = torch.randn(num_keys, dim, generator=gen)
        values = torch.randn(num_values, dim, generator=gen)
        if kappa != 1.0:
            keys, values = anisotropic(keys, kappa), anisotropic(values, kappa)
        junk = torch.randn(num_junk_tokens, dim, generator=gen)
        self.embeddings = torch.cat([keys, values, junk])  # (vocab, d)
        self.facts = self.random_facts(gen)
        junk_ids = torch.arange(num_junk_tokens) + num_keys + num_values

        def junk_run() -> torch.Tensor:
            length = int(torch.randint(low, high + 1, (1,), generator=gen))
            return junk_ids[torch.randint(num_junk_tokens, (length,), generator=gen)]

        self.junk_pairs = [(junk_run(), junk_run()) for _ in range(num_junk_pairs + num_test_pairs)]
        # One left-padded template per pair with a slot for the key: sequences are then a gather.
        rows = [torch.cat([prefix, torch.zeros(1, dtype=torch.long), suffix]) for prefix, suffix in self.junk_pairs]
        self.max_length = max(len(r) for r in rows)
        self._templates = torch.zeros(len(rows), self.max_length, dtype=torch.long)  # (P, T)
        self._template_mask = torch.zeros(len(rows), self.max_length, dtype=torch.bool)  # (P, T)
        self._key_slot = torch.zeros(len(rows), dtype=torch.long)  # (P,)
        for p, (row, (prefix, _)) in enumerate(zip(rows, self.junk_pairs)):
            self._templates[p, self.max_length - len(row):] = row
            self._template_mask[p, self.max_length - len(row):] = True
            self._key_slot[p] = self.max_length - len(row) + len(prefix)

    # ------------------------------------------------------------------ token ids and embeddings
    @property
    def vocab_size(self) -> int:
        return self.num_keys + self.num_values + self.num_junk_tokens

    @property
    def key_tokens(self) -> torch.Tensor:
        """(F,) token ids of the keys."""
        return torch.arange(self.num_keys)

    @property
    def value_tokens(self) -> torch.Tensor:
        """(|V|,) token ids of the values (the output vocabulary)."""
        return torch.arange(self.num_values) + self.num_keys

    @property
    def mlp_keys(self) -> torch.Tensor:
        """(F, d) MLP key embeddings: key embeddings projected onto the unit sphere."""
        keys = self.embeddings[: self.num_keys]
        return keys / keys.norm(dim=1, keepdim=True)

    @property
    def mlp_values(self) -> torch.Tensor:
        """(|V|, d) MLP value embeddings: the transformer value embeddings, unchanged."""
        return self.embeddings[self.value_tokens]

    def random_facts(self, generator: torch.Generator) -> torch.Tensor:
        """A fact set f (F,) long: a random permutation when F = |V|, else uniform values."""
        if self.num_keys == self.num_values:
            return torch.randperm(self.num_values, generator=generator)
        return torch.randint(self.num_values, (self.num_keys,), generator=generator)

    def new_facts(self, seed: int) -> torch.Tensor:
        """Another fact set (F,) on the same keys and values, for fact-adaptive accuracy."""
        return self.random_facts(torch.Generator().manual_seed(seed))

    # ------------------------------------------------------------------ sequences
    def _pair_ids(self, split: str) -> torch.Tensor:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if split == "test" and self.num_test_pairs == 0:
            raise ValueError("this task has no held-out junk pairs; build it with num_test_pairs > 0")
        start = self.num_junk_pairs if split == "test" else 0
        stop = self.num_junk_pairs if split == "train" else self.num_junk_pairs + self.num_test_pairs
        return torch.arange(start, stop)

    def build(self, facts: torch.Tensor, keys: torch.Tensor, pairs: torch.Tensor) -> SSFRBatch:
        """Sequences for key indices (N,) and junk pair indices (N,) under fact set ``facts`` (F,).

        Every sequence is left-padded to ``max_length`` (the prediction position is always the last).
        """
        if facts.shape != (self.num_keys,):
            raise ValueError(f"facts must have shape ({self.num_keys},), got {tuple(facts.shape)}")
        tokens = self._templates[pairs].clone()
        tokens[torch.arange(len(pairs)), self._key_slot[pairs]] = keys
        return SSFRBatch(tokens, self._template_mask[pairs].clone(), facts[keys], keys.clone())

    def sequences(self, facts: Optional[torch.Tensor] = None, split: str = "all") -> SSFRBatch:
        """Every (key, junk pair) of a split under ``facts`` (default: the task's fact set)."""
        facts = self.facts if facts is None else facts
        pairs = self._pair_ids(split)
        keys = torch.arange(self.num_keys).repeat_interleave(len(pairs))
        return self.build(facts, keys, pairs.repeat(self.num_keys))

    def sample(self, batch_size: int, generator: torch.Generator, facts: Optional[torch.Tensor] = None,
               split: str = "train") -> SSFRBatch:
        """``batch_size`` sequences drawn uniformly (with replacement) from a split."""
        _positive_int("batch_size", batch_size)
        facts = self.facts if facts is None else facts
        pairs = self._pair_ids(split)
        keys = torch.randint(self.num_keys, (batch_size,), generator=generator)
        return self.build(facts, keys, pairs[torch.randint(len(pairs), (batch_size,), generator=generator)])
