"""Authors/books language model with a swappable fact expert (seed 000 §5.4, App. A.3).

Task (App. A.3.1): facts f: book -> author from the Goodreads book graph (one book per
author, :mod:`factkernels.datasets.book_authors`), written as templated sentences
``prefix + book + suffix + author``, e.g. "The author of | 1984 | is | George Orwell". Every
book and every author is one token; template words are word tokens. The model predicts
every next token.

Model (App. A.2.2 + A.3.2): a 1-layer transformer with tied, uniformly sampled unit-sphere
token embeddings (book and author rows frozen, template words trained), single-head causal attention with RoPE, MLP-parametrized
queries and keys and value/output frozen to the identity, no residual connections, a
frozen pre-MLP RMSNorm (projection onto the unit sphere), and in place of the MLP a
mixture of two experts with an MLP router: the frozen fact-storing MLP and a trainable low-rank
linear language expert. The fact expert is, as in the seed's LM experiments (App. A.3.2), a
SwiGLU MLP trained by gradient descent with an MSE objective to output the author embedding on
each book embedding (``expert="gd"``: stopped once every fact decodes; ``"gd_converged"``: trained
through the authors' released schedule), or a FactMLP built by ``factkernels.construct``
(``expert="constructed"``); both are decoded against the book and author embeddings.

    task = AuthorsBooks.build(256)
    model, losses = trained_lm(task, LMTrainConfig(steps=1500), dim=64, expert="gd")   # own expert stores task.facts
    evaluate(model, task, task.facts)   # {"value_accuracy": ..., "ce_nonfact": ..., "router_fact_word": ..., ...}
    new_facts = random_facts(256, seed=1)
    model.swap_fact_expert(model.matching_fact_expert(task, new_facts, seed=1))
    evaluate(model, task, new_facts)    # new-fact accuracy, non-fact CE after the swap
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Sequence

import torch
import torch.nn.functional as F_nn
from torch import nn

from ..baselines import gd_mlp
from ..construct import construct
from ..datasets import BOOK_TEMPLATES, load_book_authors
from ..mlp import FactMLP
from ..progress import progress_bar
from .layers import CausalSelfAttention, RMSNorm

# How the fact expert is made: GD with MSE (the seed's LM), stopped once every fact decodes ("gd") or trained
# through the authors' released schedule (10,000 full-batch Adam steps, "gd_converged"), or construct().
EXPERTS = ("gd", "gd_converged", "constructed")
GD_EXPERTS = ("gd", "gd_converged")
CONVERGED_EXPERT_STEPS = 10000  # the authors' GDMLPConfig.num_epochs
# What the router and the language expert read: the frozen norm's unit-sphere output, as the fact expert
# does ("normed", the seed is silent), or the attention output before it ("attention", the authors'
# released fact-editing code: BinaryMoE(prev_x, new_x) routes on prev_x).
MIXER_INPUTS = ("normed", "attention")

# Kinds of next-token targets, for the per-kind cross-entropy of App. A.3.3.
PAD, WORD, KEY, VALUE = 0, 1, 2, 3


@dataclass
class Sentences:
    """Padded token sequences of templated fact sentences.

    tokens: (N, T) long (padding holds 0), mask: (N, T) bool real tokens,
    kinds: (N, T) long kind of the *next* token predicted at each position (PAD/WORD/KEY/VALUE),
    fact: (N,) long fact index, template: (N,) long template index,
    value_position: (N,) long position whose next token is the author.
    """

    tokens: torch.Tensor
    mask: torch.Tensor
    kinds: torch.Tensor
    fact: torch.Tensor
    template: torch.Tensor
    value_position: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def subset(self, index: torch.Tensor) -> "Sentences":
        return Sentences(*(getattr(self, f.name)[index] for f in fields(self)))

    def targets(self) -> torch.Tensor:
        """(N, T) next token at each position (0 where there is none)."""
        return torch.cat([self.tokens[:, 1:], torch.zeros_like(self.tokens[:, :1])], dim=1)


@dataclass
class AuthorsBooks:
    """The authors/books fact set and its vocabulary.

    Vocabulary ids: template words [0, W), books [W, W+F), authors [W+F, W+2F).
    facts: (F,) long, author index (into ``authors``) of book i; the Goodreads map is the identity.
    """

    words: list[str]
    books: list[str]
    authors: list[str]
    facts: torch.Tensor

    @classmethod
    def build(cls, num_facts: int) -> "AuthorsBooks":
        """First ``num_facts`` shipped pairs with the 16 templates' words."""
        pairs = load_book_authors(num_facts)
        words = sorted({w for prefix, suffix in BOOK_TEMPLATES for w in (prefix + " " + suffix).split()})
        return cls(words, [b for _, b in pairs], [a for a, _ in pairs], torch.arange(num_facts))

    @property
    def num_facts(self) -> int:
        return len(self.books)

    @property
    def vocab_size(self) -> int:
        return len(self.words) + 2 * self.num_facts

    def book_ids(self) -> torch.Tensor:
        """(F,) vocabulary ids of the books (the keys)."""
        return torch.arange(self.num_facts) + len(self.words)

    def author_ids(self) -> torch.Tensor:
        """(F,) vocabulary ids of the authors (the values)."""
        return torch.arange(self.num_facts) + len(self.words) + self.num_facts

    def token_strings(self) -> list[str]:
        return self.words + self.books + self.authors

    def sentences(self, facts: torch.Tensor, fact_ids: Optional[torch.Tensor] = None,
                  templates: Optional[list[int]] = None) -> Sentences:
        """Sentences prefix + book + suffix + author f(book) for every (fact, template) pair.

        facts: (F,) author index per book (the fact set to write down); fact_ids: which
        books (default all); templates: template indices (default all 16). Order: fact-major.
        """
        facts = self._check_facts(facts)
        fact_ids = torch.arange(self.num_facts) if fact_ids is None else torch.as_tensor(fact_ids, dtype=torch.long)
        templates = list(range(len(BOOK_TEMPLATES))) if templates is None else list(templates)
        if any(not 0 <= t < len(BOOK_TEMPLATES) for t in templates):
            raise ValueError(f"templates must lie in [0, {len(BOOK_TEMPLATES)}), got {templates}")
        word_id = {w: i for i, w in enumerate(self.words)}
        parts = [([word_id[w] for w in p.split()], [word_id[w] for w in s.split()]) for p, s in BOOK_TEMPLATES]
        length = max(len(parts[t][0]) + len(parts[t][1]) + 2 for t in templates)
        n = len(fact_ids) * len(templates)
        tokens = torch.zeros(n, length, dtype=torch.long)
        kinds = torch.zeros(n, length, dtype=torch.long)
        value_pos = torch.zeros(n, dtype=torch.long)
        book_ids, author_ids = self.book_ids(), self.author_ids()
        row = 0
        for i in fact_ids.tolist():
            for t in templates:
                prefix, suffix = parts[t]
                seq = prefix + [int(book_ids[i])] + suffix + [int(author_ids[facts[i]])]
                kind = [WORD] * (len(prefix) - 1) + [KEY] + [WORD] * len(suffix) + [VALUE]
                tokens[row, : len(seq)] = torch.tensor(seq)
                kinds[row, : len(kind)] = torch.tensor(kind)
                value_pos[row] = len(seq) - 2
                row += 1
        fact_col = fact_ids.repeat_interleave(len(templates))
        template_col = torch.tensor(templates).repeat(len(fact_ids))
        lengths = torch.tensor([len(parts[t][0]) + len(parts[t][1]) + 2 for t in template_col.tolist()])
        mask = torch.arange(length)[None, :] < lengths[:, None]
        return Sentences(tokens, mask, kinds, fact_col, template_col, value_pos)

    def _check_facts(self, facts: torch.Tensor) -> torch.Tensor:
        if not isinstance(facts, torch.Tensor) or facts.dtype.is_floating_point or facts.shape != (self.num_facts,):
            raise ValueError(f"facts must be an integer tensor of shape ({self.num_facts},) (author index per book)")
        if int(facts.min()) < 0 or int(facts.max()) >= self.num_facts:
            raise ValueError(f"facts must index authors in [0, {self.num_facts})")
        return facts.long()


def random_facts(num_facts: int, *, seed: int) -> torch.Tensor:
    """A different book -> author map: a random permutation of the authors, (F,) long."""
    return torch.randperm(num_facts, generator=torch.Generator().manual_seed(seed))


def sphere_embeddings(num: int, dim: int, *, seed: int) -> torch.Tensor:
    """(num, dim) embeddings uniform on the unit sphere (normalized Gaussians)."""
    e = torch.randn(num, dim, generator=torch.Generator().manual_seed(seed))
    return e / e.norm(dim=1, keepdim=True)


def fact_expert(fact_embeddings: torch.Tensor, task: AuthorsBooks, facts: torch.Tensor, *, seed: int = 0,
                **construct_options) -> FactMLP:
    """A FactMLP storing book -> author ``facts`` under the model's tied, frozen embeddings.

    fact_embeddings: (2F, d) unit-norm embeddings of the books then the authors
    (``AuthorsLM.fact_embeddings``). Keys are the books (on the unit sphere already, as after
    the frozen pre-MLP norm); the decoding set is every book and author, so
    argmax_j <g(book_i), e_j> over them is the author of book i.
    """
    facts = task._check_facts(facts)
    num = task.num_facts
    if fact_embeddings.shape[0] != 2 * num:
        raise ValueError(f"fact_embeddings must have {2 * num} rows (books then authors), "
                         f"got {tuple(fact_embeddings.shape)}")
    options = {"verify": True, "progress": False, **construct_options}
    return construct(fact_embeddings[:num], fact_embeddings, facts + num, seed=seed, **options)


def gd_fact_expert(fact_embeddings: torch.Tensor, task: AuthorsBooks, facts: torch.Tensor, hidden: int, *,
                   seed: int = 0, steps: int = 20000, lr: float = 1e-3, final_lr: float = 1e-6,
                   until: str = "stored") -> FactMLP:
    """A SwiGLU MLP of width ``hidden`` trained as in App. A.3.2: full-batch Adam on the MSE
    sum_i ||g(book_i) - author_f(i)||^2, stopping once argmax decoding over the books and
    authors stores every fact (``until="converged"``: after all ``steps``, see :func:`gd_mlp`).
    fact_embeddings: (2F, d) books then authors. Its ``fit_results["mlp"]`` says whether it stored
    every fact."""
    facts = task._check_facts(facts)
    num = task.num_facts
    if fact_embeddings.shape[0] != 2 * num:
        raise ValueError(f"fact_embeddings must have {2 * num} rows (books then authors), "
                         f"got {tuple(fact_embeddings.shape)}")
    return gd_mlp(fact_embeddings[:num], fact_embeddings, facts + num, hidden, loss="mse", seed=seed, steps=steps,
                  lr=lr, final_lr=final_lr, until=until, progress=False)


def _mlp(dim: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, out))


class ScaledMLP(nn.Module):
    """MLP-parametrized query or key projection with a trainable output scale (init ``scale``),
    so attention can become sharp (one token) in few steps. x: (..., d) -> (..., out)."""

    def __init__(self, dim: int, hidden: int, out: int, scale: float) -> None:
        super().__init__()
        self.net = _mlp(dim, hidden, out)
        self.log_scale = nn.Parameter(torch.tensor(float(scale)).log())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_scale.exp() * self.net(x)


class LowRankLinear(nn.Module):
    """The language expert: x -> up(down(x)) + b with rank ``rank``. x: (..., d) -> (..., d)."""

    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(dim, rank, bias=False)
        self.up = nn.Linear(rank, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


class FactMoE(nn.Module):
    """Two experts mixed by an MLP router: ``p_fact(r) g(z) + p_lang(r) L(r)``.

    Input x: (..., d), the attention output; z = x projected onto the unit sphere (the frozen
    pre-MLP norm) is the fact expert's input, and r (see :data:`MIXER_INPUTS`) is z or x. The
    fact expert g is a frozen FactMLP (swap it with :meth:`AuthorsLM.swap_fact_expert`).
    x: (..., d) -> (..., d).
    """

    def __init__(self, fact: FactMLP, dim: int, rank: int, router_hidden: int, fact_prior: float = 0.5,
                 mixer_input: str = "normed") -> None:
        super().__init__()
        if mixer_input not in MIXER_INPUTS:
            raise ValueError(f"mixer_input must be one of {MIXER_INPUTS}, got {mixer_input!r}")
        self.fact = fact
        self.norm = RMSNorm(dim, frozen=True)
        self.mixer_input = mixer_input
        self.language = LowRankLinear(dim, rank)
        self.router = _mlp(dim, router_hidden, 2)
        with torch.no_grad():  # initial routing weight of the fact expert is about fact_prior
            self.router[-1].bias.copy_(torch.tensor([fact_prior, 1.0 - fact_prior]).log())

    def inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, r): the fact expert's unit-sphere input and the router's and language expert's input."""
        z = self.norm(x)
        return z, (x if self.mixer_input == "attention" else z)

    def route(self, x: torch.Tensor) -> torch.Tensor:
        """Routing weights (..., 2): fact expert, language expert."""
        return self.router(self.inputs(x)[1]).softmax(dim=-1)

    def parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The weighted fact and language outputs (..., d) and the routing weights (..., 2)."""
        z, r = self.inputs(x)
        weights = self.router(r).softmax(dim=-1)
        return weights[..., :1] * self.fact(z), weights[..., 1:] * self.language(r), weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fact, language, _ = self.parts(x)
        return fact + language


class AuthorsLM(nn.Module):
    """1-layer transformer of App. A.3.2 over the task's vocabulary.

    forward(tokens (B, T) long, mask (B, T) bool) -> logits (B, T, vocab).
    Embeddings start uniform on the unit sphere and are tied with the output layer; book
    and author embeddings (the fact expert's keys and values) are frozen, template-word
    embeddings train (as the seed's junk tokens do). A trainable scalar temperature scales
    the logits. ``expert`` (one of :data:`EXPERTS`) says how fact experts are made, here and by
    :meth:`matching_fact_expert`; ``expert_hidden`` is the GD expert's width (default: F);
    ``mixer_input`` (one of :data:`MIXER_INPUTS`) what the router and language expert read.
    """

    def __init__(self, task: AuthorsBooks, fact: Optional[FactMLP] = None, *, expert: str = "constructed",
                 expert_hidden: Optional[int] = None, dim: int = 64, qk_hidden: int = 128, rank: int = 32,
                 router_hidden: int = 64, qk_scale: float = 4.0, fact_prior: float = 0.5, seed: int = 0,
                 mixer_input: str = "normed") -> None:
        super().__init__()
        if expert not in EXPERTS:
            raise ValueError(f"expert must be one of {EXPERTS}, got {expert!r}")
        self.expert = expert
        self.expert_hidden = task.num_facts if expert_hidden is None else expert_hidden
        torch.manual_seed(seed)  # parameter initialization (nn.Linear has no generator argument)
        table = sphere_embeddings(task.vocab_size, dim, seed=seed)
        num_words = len(task.words)
        self.word_embeddings = nn.Parameter(table[:num_words].clone())
        self.register_buffer("fact_embeddings", table[num_words:].clone())
        self.attention = CausalSelfAttention(dim, identity_value_output=True, query=ScaledMLP(dim, qk_hidden, dim, qk_scale),
                                             key=ScaledMLP(dim, qk_hidden, dim, qk_scale))
        if fact is None:
            fact = self._make_fact_expert(task, task.facts, seed=seed)
        self.moe = FactMoE(fact, dim, rank, router_hidden, fact_prior, mixer_input)
        self.log_scale = nn.Parameter(torch.tensor(2.0))

    def swap_fact_expert(self, fact: FactMLP) -> FactMLP:
        """Replace the fact expert (same in/out width); returns the old one."""
        if (fact.in_features, fact.out_features) != (self.moe.fact.in_features, self.moe.fact.out_features):
            raise ValueError(f"fact expert must map {self.moe.fact.in_features} -> {self.moe.fact.out_features}, "
                             f"got {fact.in_features} -> {fact.out_features}")
        old, self.moe.fact = self.moe.fact, fact
        return old

    def _make_fact_expert(self, task: AuthorsBooks, facts: torch.Tensor, *, seed: int, **construct_options) -> FactMLP:
        if self.expert == "gd":
            return gd_fact_expert(self.fact_embeddings, task, facts, self.expert_hidden, seed=seed)
        if self.expert == "gd_converged":
            return gd_fact_expert(self.fact_embeddings, task, facts, self.expert_hidden, seed=seed,
                                  steps=CONVERGED_EXPERT_STEPS, until="converged")
        return fact_expert(self.fact_embeddings, task, facts, seed=seed, **construct_options)

    def matching_fact_expert(self, task: AuthorsBooks, facts: torch.Tensor, *, seed: int) -> FactMLP:
        """A fact expert for ``facts`` (F,) made the same way and of the same size as the current
        one (GD: same width; constructed: same code dimension m), ready for :meth:`swap_fact_expert`."""
        report = self.moe.fact.report
        options = {} if self.expert in GD_EXPERTS or report is None else {"m": report.m}
        return self._make_fact_expert(task, facts, seed=seed, **options)

    @property
    def embeddings(self) -> torch.Tensor:
        """(vocab, d) token embeddings: words, books, authors."""
        return torch.cat([self.word_embeddings, self.fact_embeddings])

    def mixer_input(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Input of the MoE at every position, the attention output: (B, T, d) (the MoE projects it
        onto the unit sphere for the fact expert: :meth:`FactMoE.inputs`)."""
        return self.attention(self.embeddings[tokens], mask)

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """MoE output (..., d) -> logits (..., vocab) through the tied embeddings."""
        return self.log_scale.exp() * state @ self.embeddings.T

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.logits(self.moe(self.mixer_input(tokens, mask)))


@dataclass
class LMTrainConfig:
    """AdamW training on sampled sentences (App. A.2.2 uses lr 2e-4 for 4.8M sequences;
    the shorter CPU runs here use a larger rate)."""

    steps: int = 1500
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.0
    seed: int = 0


def _token_losses(model: AuthorsLM, batch: Sentences) -> torch.Tensor:
    """(B, T) cross-entropy of each next-token prediction (0 where there is no target)."""
    logits = model(batch.tokens, batch.mask)
    losses = F_nn.cross_entropy(logits.flatten(0, 1), batch.targets().flatten(), reduction="none")
    return losses.view(batch.tokens.shape) * (batch.kinds != PAD)


def train_lm(model: AuthorsLM, task: AuthorsBooks, config: LMTrainConfig, *,
             extra_experts: Sequence[tuple[FactMLP, torch.Tensor]] = (), quiet: bool = False) -> list[float]:
    """Train the non-frozen parameters on next-token prediction over all 16 templates.

    Without ``extra_experts`` this is the seed's protocol: one frozen fact expert storing
    ``task.facts``. ``extra_experts`` holds (FactMLP, facts (F,)) pairs for other fact sets:
    each step then swaps in one expert of the pool (the model's own or an extra one, drawn
    uniformly) and trains on sentences of its facts, so nothing but factual recall can be
    learned from the expert's outputs. The model's own expert is in place afterwards.
    Returns the loss per step.
    """
    pool = [(model.moe.fact, task.facts), *extra_experts]
    data = [task.sentences(facts) for _, facts in pool]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.steps)
    gen = torch.Generator().manual_seed(config.seed)
    history = []
    model.train()
    try:
        for _ in progress_bar(range(config.steps), desc="train LM", enabled=not quiet):
            pick = int(torch.randint(len(pool), (1,), generator=gen)) if len(pool) > 1 else 0
            model.moe.fact = pool[pick][0]
            batch = data[pick].subset(torch.randint(len(data[pick]), (config.batch_size,), generator=gen))
            losses = _token_losses(model, batch)
            loss = losses.sum() / (batch.kinds != PAD).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            history.append(loss.item())
    finally:
        model.moe.fact = pool[0][0]
        model.eval()
    return history


def trained_lm(task: AuthorsBooks, config: LMTrainConfig, *, dim: int = 64, pool: int = 0, fact_prior: float = 0.5,
               expert: str = "constructed", expert_hidden: Optional[int] = None, mixer_input: str = "normed",
               quiet: bool = False) -> tuple[AuthorsLM, list[float]]:
    """An :class:`AuthorsLM` (seeded by ``config.seed``, fact experts made by ``expert`` of
    width ``expert_hidden``, router input ``mixer_input``, see :class:`AuthorsLM`) trained on ``task``; ``pool`` > 0 adds
    that many fact experts for random fact sets (seeds 1000 + seed*100 + j) to the training pool
    (see :func:`train_lm`); ``fact_prior`` is the router's initial weight on the fact expert.
    Returns the model (with its own expert) and the loss per step."""
    if isinstance(pool, bool) or not isinstance(pool, int) or pool < 0:
        raise ValueError(f"pool must be an int >= 0 (extra fact experts while training), got {pool!r}")
    if not 0.0 < fact_prior < 1.0:
        raise ValueError(f"fact_prior must be in (0, 1), got {fact_prior!r}")
    model = AuthorsLM(task, expert=expert, expert_hidden=expert_hidden, dim=dim, fact_prior=fact_prior,
                      seed=config.seed, mixer_input=mixer_input)
    extra = []
    for j in range(pool):
        facts = random_facts(task.num_facts, seed=1000 + 100 * config.seed + j)
        extra.append((model.matching_fact_expert(task, facts, seed=1000 + j), facts))
    return model, train_lm(model, task, config, extra_experts=extra, quiet=quiet)


@torch.no_grad()
def evaluate(model: AuthorsLM, task: AuthorsBooks, facts: torch.Tensor, *, batch_size: int = 1024,
             fact_ids: Optional[torch.Tensor] = None, templates: Optional[list[int]] = None) -> dict:
    """Accuracy and cross-entropy of ``model`` on the sentences of ``facts``.

    Returns value_accuracy (argmax over the whole vocabulary is the author, at the value
    position), ce_value, ce_nonfact (template-word targets: "The", "author", "of", ...),
    ce_key (the book after the prefix: unpredictable, about ln F at best), ce_nonvalue (every
    target but the author: words and the book, the authors' released code's non-fact tokens,
    where the ~ln F book term dominates), the counts, and how
    the MoE mixes at template-word and value positions: router_fact_word / router_fact_value
    (mean routing weight of the fact expert) and fact_norm_word / language_norm_word (mean
    norm of each expert's weighted output at template-word positions).
    """
    data = task.sentences(facts, fact_ids, templates)
    kinds = {WORD: "word", KEY: "key", VALUE: "value"}
    sums = {name: 0.0 for name in ("ce_word", "ce_key", "ce_value", "router_word", "router_value", "fact_word",
                                   "language_word")}
    counts = {kind: 0 for kind in kinds}
    correct = 0
    for lo in range(0, len(data), batch_size):
        batch = data.subset(torch.arange(lo, min(lo + batch_size, len(data))))
        fact_part, language_part, weights = model.moe.parts(model.mixer_input(batch.tokens, batch.mask))
        logits = model.logits(fact_part + language_part)
        losses = F_nn.cross_entropy(logits.flatten(0, 1), batch.targets().flatten(), reduction="none")
        losses = losses.view(batch.tokens.shape)
        word, value = batch.kinds == WORD, batch.kinds == VALUE
        for kind, name in kinds.items():
            sums[f"ce_{name}"] += float(losses[batch.kinds == kind].sum())
            counts[kind] += int((batch.kinds == kind).sum())
        sums["router_word"] += float(weights[..., 0][word].sum())
        sums["router_value"] += float(weights[..., 0][value].sum())
        sums["fact_word"] += float(fact_part[word].norm(dim=-1).sum())
        sums["language_word"] += float(language_part[word].norm(dim=-1).sum())
        rows = torch.arange(len(batch))
        predicted = logits[rows, batch.value_position].argmax(dim=-1)
        correct += int((predicted == batch.targets()[rows, batch.value_position]).sum())
    return {"value_accuracy": correct / len(data), "ce_value": sums["ce_value"] / counts[VALUE],
            "ce_nonfact": sums["ce_word"] / counts[WORD], "ce_key": sums["ce_key"] / counts[KEY],
            "ce_nonvalue": (sums["ce_word"] + sums["ce_key"]) / (counts[WORD] + counts[KEY]),
            "router_fact_word": sums["router_word"] / counts[WORD],
            "router_fact_value": sums["router_value"] / counts[VALUE],
            "fact_norm_word": sums["fact_word"] / counts[WORD],
            "language_norm_word": sums["language_word"] / counts[WORD],
            "sentences": len(data), "nonfact_tokens": counts[WORD]}


def swap_report(model: AuthorsLM, task: AuthorsBooks, new_facts: torch.Tensor, *, seed: int) -> tuple[dict, FactMLP]:
    """Fig. 9's swap on a trained LM: its fact expert is replaced by one storing ``new_facts`` (F,) (made the same
    way and size, from ``seed``), then zeroed; the model keeps its own expert afterwards.

    Returns (numbers, the new expert). numbers: train_facts / swapped (:func:`evaluate` on the own facts with the
    own expert, on the new facts with the new one), new_fact_accuracy, old_fact_accuracy_after_swap,
    nonfact_ce_rise (template words, swapped / own − 1), nonvalue_ce_rise and nonvalue_log_ppl_ratio (words and
    book; the log of the perplexity ratio, swapped − own CE in nats: a broken swap's CE can rise by hundreds of
    nats, past what a float's exp holds), ce_nonfact_fact_expert_zeroed (template words with the expert's output
    zeroed, router untouched).
    """
    before = evaluate(model, task, task.facts)
    new_expert = model.matching_fact_expert(task, new_facts, seed=seed)
    own = model.swap_fact_expert(new_expert)
    try:
        after = evaluate(model, task, new_facts)
        old_after = evaluate(model, task, task.facts)["value_accuracy"]
        model.swap_fact_expert(_silenced(own))
        zeroed = evaluate(model, task, task.facts)["ce_nonfact"]
    finally:
        model.swap_fact_expert(own)
    return {"train_facts": before, "swapped": after, "new_fact_accuracy": after["value_accuracy"],
            "old_fact_accuracy_after_swap": old_after,
            "nonfact_ce_rise": after["ce_nonfact"] / before["ce_nonfact"] - 1,
            "nonvalue_ce_rise": after["ce_nonvalue"] / before["ce_nonvalue"] - 1,
            "nonvalue_log_ppl_ratio": after["ce_nonvalue"] - before["ce_nonvalue"],
            "ce_nonfact_fact_expert_zeroed": zeroed}, new_expert


def _silenced(mlp: FactMLP) -> FactMLP:
    """``mlp`` with its down projection zeroed: the fact expert removed, the router untouched."""
    down = torch.zeros_like(mlp.down_weight)
    bias = None if mlp.down_bias is None else torch.zeros_like(mlp.down_bias)
    return FactMLP(mlp.gate_weight, mlp.gate_bias, mlp.up_weight, mlp.up_bias, down, bias, activation=mlp.activation)
