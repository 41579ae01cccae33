"""The editing benchmark for real models: relations, known facts, invented facts, and seeded draws of edit cases.

    rel = relations()["capital"]                   # Relation: edit templates, held-out paraphrase templates
    facts = known_facts()                          # the candidates SmolLM2-135M answers under its edit templates
    cases = known_draw("validation")               # counterfactual EditCases: target_new from the same relation
    cases = known_draw("test", 0)                  # three disjoint test draws (0, 1, 2), disjoint from validation
    cases = new_knowledge_draw("test", 0, n=10_000)  # invented subjects, one fact each
    cases = all_test_draws("known")                # every test case at once (neighbours: validation subjects)

Data (``factkernels/datasets``, see its README): ``relations.json`` (per relation: the subject kind, 5 edit
templates used for insertion, editing and tuning, 4 held-out paraphrase templates used only to evaluate;
edit and held-out context prefixes), ``known_fact_candidates.csv`` (facts written for this benchmark),
``known_facts.csv`` (those the packaged model answers, from ``benchmarks/make_known_facts.py``, with
which templates it answers them under) and ``invented_names.json`` (name parts of invented subjects).

Draws are partitions by subject: every fact of a subject sits in one draw, so a draw's neighbourhood prompts
(other subjects of the same relation, from outside the draw) are never edited with it.
"""

from __future__ import annotations

import csv
import importlib.resources
import json
import random
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Optional

SPLITS = ("validation", "test")
NUM_TEST_DRAWS = 3
KNOWN_VALIDATION_FRACTION = 0.2
NEW_VALIDATION_FACTS = 1_000
NEW_TEST_FACTS = 10_000
DRAW_SEED = 32
ALL_DRAWS = "all"
"""The draw index of every test draw at once (:func:`all_test_draws`)."""


@dataclass(frozen=True)
class Relation:
    """A relation: ``edit`` and ``held_out`` templates hold one '{}' for the subject; the object follows."""

    name: str
    subject_kind: str
    edit: tuple[str, ...]
    held_out: tuple[str, ...]


@dataclass(frozen=True)
class Fact:
    """(subject, relation, object); the object is written without its leading space."""

    relation: str
    subject: str
    object: str


@dataclass(frozen=True)
class KnownFact:
    """A fact and whether the unedited model completes it greedily under each edit / held-out template."""

    fact: Fact
    edit_correct: tuple[bool, ...]
    held_out_correct: tuple[bool, ...]


@dataclass(frozen=True)
class Neighbour:
    """Another subject's prompt whose answer must not move: ``prompt.format(subject)`` -> ``target``."""

    prompt: str
    subject: str
    target: str


@dataclass(frozen=True)
class EditCase:
    """One edit: ask ``target_new`` of ``subject`` under ``relation``.

    target_true: the unedited model's answer (known facts) or, for invented subjects, another object of the
    relation (what CounterFact-style scores compare against). edit_prompts / paraphrase_prompts: the relation's
    edit and held-out templates; neighbours: other subjects (of the relation when it has enough) with their true
    objects.
    """

    relation: str
    subject: str
    target_new: str
    target_true: str
    edit_prompts: tuple[str, ...]
    paraphrase_prompts: tuple[str, ...]
    neighbours: tuple[Neighbour, ...] = field(default_factory=tuple)
    known: bool = True


def _read(name: str) -> str:
    return importlib.resources.files("factkernels").joinpath("datasets", name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def _relations_file() -> dict:
    return json.loads(_read("relations.json"))


def relations() -> dict[str, Relation]:
    """Every relation of the benchmark by name, in file order."""
    return {name: Relation(name, r["subject_kind"], tuple(r["edit"]), tuple(r["held_out"]))
            for name, r in _relations_file()["relations"].items()}


def prefixes(split: str) -> list[str]:
    """Neutral context sentences put before a template: "edit" (insertion contexts) or "held_out" (evaluation)."""
    table = _relations_file()["prefixes"]
    if split not in table:
        raise ValueError(f"split must be one of {sorted(table)}, got {split!r}")
    return list(table[split])


@lru_cache(maxsize=None)
def known_fact_candidates() -> tuple[Fact, ...]:
    """Every written fact (subject, relation, object), in file order."""
    return tuple(Fact(r["relation"], r["subject"], r["object"]) for r in csv.DictReader(_read("known_fact_candidates.csv").splitlines()))


def _flags(text: str) -> tuple[bool, ...]:
    return tuple(c == "1" for c in text)


@lru_cache(maxsize=None)
def known_facts() -> tuple[KnownFact, ...]:
    """The candidates the packaged model answers greedily under an edit template (``known_facts.csv``; see
    :func:`is_known`)."""
    rows = csv.DictReader(_read("known_facts.csv").splitlines())
    return tuple(KnownFact(Fact(r["relation"], r["subject"], r["object"]), _flags(r["edit_correct"]),
                           _flags(r["held_out_correct"])) for r in rows)


def is_known(edit_correct: tuple[bool, ...]) -> bool:
    """The filter of ``known_facts.csv``: right under at least one of the relation's edit templates."""
    return any(edit_correct)


@lru_cache(maxsize=None)
def object_pool(relation: str) -> tuple[str, ...]:
    """The distinct objects of a relation's candidates, sorted: where counterfactual targets come from."""
    return tuple(sorted({f.object for f in known_fact_candidates() if f.relation == relation}))


def _other_object(rng: random.Random, relation: str, avoid: str) -> str:
    pool = [o for o in object_pool(relation) if o != avoid]
    return rng.choice(pool)


def _subject_partition(facts: list[KnownFact]) -> list[list[KnownFact]]:
    """Validation then NUM_TEST_DRAWS test draws: disjoint, whole subjects each, seeded by DRAW_SEED."""
    subjects = sorted({k.fact.subject for k in facts})
    random.Random(DRAW_SEED).shuffle(subjects)
    cut = round(KNOWN_VALIDATION_FRACTION * len(subjects))
    val = set(subjects[:cut])
    rest = subjects[cut:]
    where = {s: 0 for s in val}
    where.update({s: 1 + i % NUM_TEST_DRAWS for i, s in enumerate(rest)})
    parts: list[list[KnownFact]] = [[] for _ in range(1 + NUM_TEST_DRAWS)]
    for k in facts:
        parts[where[k.fact.subject]].append(k)
    return parts


def _draw_index(split: str, index: int) -> int:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "validation":
        if index != 0:
            raise ValueError(f"there is one validation draw (index 0), got index {index}")
        return 0
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < NUM_TEST_DRAWS:
        raise ValueError(f"test draw index must be an int in [0, {NUM_TEST_DRAWS}), got {index!r}")
    return 1 + index


def _neighbours(rng: random.Random, fact: Fact, target_new: str, pool: list[KnownFact], count: int) -> tuple:
    """Up to ``count`` other subjects from ``pool`` (not edited with this case): of the same relation, those sharing
    the true object first (CounterFact's choice), then of other relations when the relation has too few; never one
    whose answer is ``target_new``; each under a template the unedited model answers it with."""
    rels = relations()
    others = [k for k in pool if k.fact.object != target_new and k.fact.subject != fact.subject]
    rng.shuffle(others)
    others.sort(key=lambda k: (k.fact.relation != fact.relation, k.fact.object != fact.object))  # stable
    out = []
    for k in others[:count]:
        rel = rels[k.fact.relation]
        templates = [t for t, ok in zip(rel.edit + rel.held_out, k.edit_correct + k.held_out_correct) if ok]
        out.append(Neighbour(rng.choice(templates), k.fact.subject, k.fact.object))
    return tuple(out)


def known_draw(split: str, index: int = 0, *, n: Optional[int] = None, neighbours: int = 5) -> list[EditCase]:
    """Counterfactual edit cases of one draw of the known facts (seeded, the same on every call).

    split: "validation" (a fifth of the subjects) or "test" (index 0..2: the other subjects in three parts).
    n: the first n cases of the draw (its order is seeded), all when None. target_new is another object of the
    same relation; neighbours come from the other draws.
    """
    part = _draw_index(split, index)
    parts = _subject_partition(list(known_facts()))
    chosen = list(parts[part])
    outside = [k for i, p in enumerate(parts) if i != part for k in p]
    rng = random.Random(DRAW_SEED * 1000 + part)
    rng.shuffle(chosen)
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(chosen):
            raise ValueError(f"n must be an int in [1, {len(chosen)}] for this draw, got {n!r}")
        chosen = chosen[:n]
    rels = relations()
    cases = []
    for k in chosen:
        f, rel = k.fact, rels[k.fact.relation]
        new = _other_object(rng, f.relation, f.object)
        cases.append(EditCase(f.relation, f.subject, new, f.object, rel.edit, rel.held_out,
                              _neighbours(rng, f, new, outside, neighbours)))
    return cases


@lru_cache(maxsize=None)
def _names() -> dict:
    return json.loads(_read("invented_names.json"))


def invented_name(rng: random.Random, kind: str) -> str:
    """One invented name of a subject kind: a seeded choice from each part list of the kind's pattern."""
    names = _names()
    spec = names["kinds"].get(kind)
    if spec is None:
        raise ValueError(f"unknown subject kind {kind!r}; known: {sorted(names['kinds'])}")
    parts = []
    for part in spec["pattern"]:
        options = spec.get(part) or names["syllables"].get(part) or names[part]
        parts.append(rng.choice(options))
    if kind in ("athlete", "person", "musician"):  # "Anna" + "Kal" "a" "ski" -> "Anna Kalaski"
        return f"{parts[0]} {''.join(parts[1:])}"
    return "".join(parts)


@lru_cache(maxsize=4)
def invented_facts(n: int, seed: int = DRAW_SEED) -> tuple[Fact, ...]:
    """The first ``n`` facts of the seeded stream of invented facts: relations in turn, a fresh invented subject
    each (never a known-fact subject, never repeated), an object drawn from the relation's pool."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    rng = random.Random(seed)
    rels = list(relations().values())
    taken = {f.subject.lower() for f in known_fact_candidates()}
    out = []
    for i in range(n):
        rel = rels[i % len(rels)]
        name = invented_name(rng, rel.subject_kind)
        while name.lower() in taken:
            name = invented_name(rng, rel.subject_kind)
        taken.add(name.lower())
        out.append(Fact(rel.name, name, rng.choice(object_pool(rel.name))))
    return tuple(out)


def new_knowledge_draw(split: str, index: int = 0, *, n: Optional[int] = None, neighbours: int = 1) -> list[EditCase]:
    """Edit cases about invented subjects: "validation" (1,000 facts) or "test" draws 0..2 (10,000 each), slices
    of one stream (:func:`invented_facts`), so disjoint. target_true is another object of the relation (the
    comparison of CounterFact-style scores); neighbours are known facts of the same relation."""
    part = _draw_index(split, index)
    size = NEW_VALIDATION_FACTS if part == 0 else NEW_TEST_FACTS
    start = 0 if part == 0 else NEW_VALIDATION_FACTS + (part - 1) * NEW_TEST_FACTS
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= size:
            raise ValueError(f"n must be an int in [1, {size}] for this draw, got {n!r}")
        size = n
    facts = invented_facts(NEW_VALIDATION_FACTS + NUM_TEST_DRAWS * NEW_TEST_FACTS)[start:start + size]
    rng = random.Random(DRAW_SEED * 2000 + part)
    pool = list(known_facts())
    rels = relations()
    cases = []
    for f in facts:
        rel = rels[f.relation]
        cases.append(EditCase(f.relation, f.subject, f.object, _other_object(rng, f.relation, f.object), rel.edit,
                              rel.held_out, _neighbours(rng, f, f.object, pool, neighbours), known=False))
    return cases


def all_test_draws(kind: str = "known", *, n: Optional[int] = None) -> list[EditCase]:
    """Every test draw's cases edited at once (draw index :data:`ALL_DRAWS`): case i of each draw in turn, so the
    first ``n`` (all when None) hold about n / 3 of each draw. kind: "known" (:func:`known_draw`: ~745 cases) or
    "new" (:func:`new_knowledge_draw`: 30,000). Cases, targets and invented neighbours are the draws' own; a known
    case's neighbours are drawn again (seeded) from the validation subjects, since the other test draws, where
    its own neighbours came from, are edited with it."""
    if kind not in ("known", "new"):
        raise ValueError(f"kind must be 'known' or 'new', got {kind!r}")
    if kind == "known":
        draws = [known_draw("test", i) for i in range(NUM_TEST_DRAWS)]
    else:  # only the first ceil(n / 3) of each draw can be among the first n
        each = NEW_TEST_FACTS if n is None else min(NEW_TEST_FACTS, max(1, -(-n // NUM_TEST_DRAWS)))
        draws = [new_knowledge_draw("test", i, n=each) for i in range(NUM_TEST_DRAWS)]
    cases = [d[k] for k in range(max(map(len, draws))) for d in draws if k < len(d)]
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(cases):
            raise ValueError(f"n must be an int in [1, {len(cases)}] for every test draw at once, got {n!r}")
        cases = cases[:n]
    if kind == "known":
        rng = random.Random(DRAW_SEED * 3000)
        validation = _subject_partition(list(known_facts()))[0]
        cases = [replace(c, neighbours=_neighbours(rng, Fact(c.relation, c.subject, c.target_true), c.target_new,
                                                   validation, len(c.neighbours))) for c in cases]
    return cases
