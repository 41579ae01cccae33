"""Fact-storage cost (seed 000, A.1.1–A.1.2): the fewest parameters that store every fact.

A method is a builder ``(K, V, f, size, seed) -> module`` (the module has ``.predict(K, V)``
and ``.num_parameters``) and one integer size. :func:`fact_storage_cost` searches that size:
it doubles from a start size until the MLP stores the facts, then bisects between the
largest size that failed and the smallest that stored. A size stores the facts when the
minimum accuracy over the seeds is at least 1 − eps_acc (eps_acc = 0 in the seed: every
fact of every seed). Bisection assumes storage is monotone in size, which holds in
expectation; for randomized methods the boundary is as noisy as the method.

Sizes, and how the parameters are counted (``module.num_parameters``), per method:

==========  ===============================  ===============================================
name        size                             parameters
==========  ===============================  ===============================================
ours        m, code dimension (Bin+JL:       FactMLP in SwiGLU layout, gate expanded to h
            construct, outputs U*)           rows: 2hd + dh + 2h + d with h = m·⌈1.5F/(d+1)⌉
                                             (gate, up, down and their biases)
ntk         hidden width h (Alg. 5, V)       3hd (gate, up, down; no biases)
ntk_u*      hidden width h (Alg. 5, U*)      3hd
gd          hidden width h                   3hd + 2h + d (SwiGLU with biases)
gd+jl       m (GD encoder of width ⌈mF/d⌉)   3hd + 2h + d, down = D·E folded into (d, h)
bin+gd      m (closed-form encoder)          as ours
gd+gd       m (GD encoder of width ⌈mF/d⌉)   as gd+jl
nongated    m (Alg. 8 gadgets + JL,          2hd + h + d (up, down and their biases) with
            outputs U*)                      h = 2m·⌈1.5F/(d+1)⌉
hebbian_*   m, bilinear features (raw,       2md + dm (A₀, A₁ and the readout W; no biases)
            ridge, data_dependent readout/
            features; baselines.hebbian)
naive       none (hidden = F, evaluated      2dF + F (in weights, thresholds, out weights)
            once)
==========  ===============================  ===============================================

d is the key/value dimension and F the number of facts. The seed's two-step search for the
GD-encoder hybrids (first m, then the encoder width at that m, up to multiplier 2) is
``fact_storage_cost(encoder_width_method("gd+jl", m), ..., max_size=...)`` after the search
over m; see :func:`encoder_width_method`.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

import torch
from torch import nn

from .baselines import encoder_decoder, encoder_decoder_batch, gd_mlp, gd_mlp_batch, naive, ntk
from .baselines.hebbian import hebbian
from .construct import construct
from .embeddings import FactSet
from .geometry import whiten
from .nongated import construct_nongated
from .progress import progress_bar
from .ustar import margin_optimal_outputs
from .validation import validate_inputs

Builder = Callable[..., nn.Module]


@dataclass(frozen=True)
class Method:
    """A named builder ``(K, V, f, size, seed, **options) -> module`` and what its size means.

    start: first size tried; fixed: the method has no size (built once at size = F);
    prepare: ``(K, V, f, options) -> extra options`` computed once per fact set and passed to
    every build (work that depends on neither the size nor the seed, e.g. the outputs U*).
    build_batch: ``(fact_sets, sizes, seeds, options) -> modules``, the same models as one
    build per (fact set, size, seed) but trained as one batch (the GD methods), ``options`` being
    each model's build options (its fact set's :meth:`prepared` options); the search
    uses it to build every seed of a size at once; lookahead: and the sizes it may ask for next.
    Lookahead pays where a round's time is its slowest model's and storing models stop early
    (the GD MLP). The hybrids turn it off: their decoders train every step, their GD encoders
    pad to the widest code and their closed-form parts build one model at a time, so a size
    trained ahead and never asked for costs in full (their searches ran slower with it).
    """

    name: str
    build: Builder
    size_name: str
    start: int
    fixed: bool = False
    prepare: Optional[Callable[[torch.Tensor, torch.Tensor, torch.Tensor, dict], dict]] = None
    build_batch: Optional[Callable[..., list[nn.Module]]] = None
    lookahead: bool = True

    def __call__(self, K: torch.Tensor, V: torch.Tensor, f: torch.Tensor, size: int, seed: int, **options) -> nn.Module:
        return self.build(K, V, f, size, seed, **options)

    def prepared(self, K: torch.Tensor, V: torch.Tensor, f: torch.Tensor, options: dict) -> dict:
        """``options`` plus what :attr:`prepare` computes for this fact set (given options win)."""
        return {**(self.prepare(K, V, f, options) if self.prepare else {}), **options}


def _margin_optimal(K, V, f, options: dict) -> dict:
    """U* of the values construct() sees: whitened with strength ``whiten`` when it is > 0."""
    if "outputs" in options:
        return {}
    alpha = options.get("whiten", 0.0)
    return {"outputs": margin_optimal_outputs(whiten(V, alpha)[0] if alpha > 0 else V)[0]}


def _ours(K, V, f, size, seed, **options) -> nn.Module:
    options = {"outputs": "margin_optimal", **options}
    return construct(K, V, f, m=size, seed=seed, verify="report", progress=False, **options)


def _ntk(K, V, f, size, seed, *, margin_optimal: bool, **options) -> nn.Module:
    return ntk(K, V, f, hidden=size, margin_optimal=margin_optimal, seed=seed, **options)


def _gd(K, V, f, size, seed, **options) -> nn.Module:
    return gd_mlp(K, V, f, hidden=size, seed=seed, progress=False, **options)


def _gd_batch(fact_sets, sizes, seeds, options: Sequence[dict]) -> list[nn.Module]:
    return gd_mlp_batch(fact_sets, sizes, seeds, progress=False, **options[0])  # no prepare: one options dict


def _hybrid_options(options: Sequence[dict]) -> dict:
    """The shared build options of a hybrid batch, with each model's U* (prepared for "+jl") as one list."""
    shared = {key: value for key, value in options[0].items() if key != "outputs"}
    return {**shared, "outputs": [o["outputs"] for o in options]} if "outputs" in options[0] else shared


def _hybrid(K, V, f, size, seed, *, encoder: str, decoder: str, **options) -> nn.Module:
    return encoder_decoder(K, V, f, m=size, encoder=encoder, decoder=decoder, seed=seed, progress=False, **options)


def _hybrid_batch(fact_sets, sizes, seeds, options: Sequence[dict], *, encoder: str, decoder: str) -> list[nn.Module]:
    return encoder_decoder_batch(fact_sets, sizes, seeds, encoder=encoder, decoder=decoder, progress=False,
                                 **_hybrid_options(options))


def _hybrid_method(encoder: str, decoder: str) -> Method:
    # "+jl": U* once per fact set, not once per size and seed (it was a sixth of a small search's time)
    return Method(f"{encoder}+{decoder}", functools.partial(_hybrid, encoder=encoder, decoder=decoder), "m", start=8,
                  prepare=_margin_optimal if decoder == "jl" else None,
                  build_batch=functools.partial(_hybrid_batch, encoder=encoder, decoder=decoder), lookahead=False)


def _nongated(K, V, f, size, seed, **options) -> nn.Module:
    return construct_nongated(K, V, f, m=size, seed=seed, **options)


def _hebbian(K, V, f, size, seed, *, variant: str, **options) -> nn.Module:
    return hebbian(K, V, f, m=size, variant=variant, seed=seed, **options)


def _naive(K, V, f, size, seed, **options) -> nn.Module:
    return naive(K, V, f, **options)  # deterministic: no size, no seed


methods: dict[str, Method] = {method.name: method for method in (
    Method("ours", _ours, "m", start=8, prepare=_margin_optimal),
    Method("ntk", functools.partial(_ntk, margin_optimal=False), "hidden", start=256),
    Method("ntk_u*", functools.partial(_ntk, margin_optimal=True), "hidden", start=256),
    Method("gd", _gd, "hidden", start=8, build_batch=_gd_batch),
    _hybrid_method("gd", "jl"),
    _hybrid_method("bin", "gd"),
    _hybrid_method("gd", "gd"),
    Method("nongated", _nongated, "m", start=8),
    *(Method(f"hebbian_{variant}", functools.partial(_hebbian, variant=variant), "m", start=8)
      for variant in ("raw", "ridge", "data_dependent")),
    Method("naive", _naive, "hidden", start=1, fixed=True),
)}


def encoder_width_method(name: str, m: int) -> Method:
    """The second step of the seed's search for "gd+jl" / "gd+gd": m fixed, size = GD encoder width.

    The default width is ⌈m F/d⌉ (multiplier 1) and the seed caps the multiplier at 2: pass
    ``start=math.ceil(m * F / d), max_size=math.ceil(2 * m * F / d)`` to :func:`fact_storage_cost`.
    """
    if name not in ("gd+jl", "gd+gd"):
        raise ValueError(f"name must be 'gd+jl' or 'gd+gd' (the hybrids with a GD encoder), got {name!r}")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be a positive int, got {m!r}")

    encoder, decoder = name.split("+")

    def build(K, V, f, size, seed, **options) -> nn.Module:
        return methods[name](K, V, f, m, seed, encoder_hidden=size, **options)

    def build_batch(fact_sets, sizes, seeds, options: Sequence[dict]) -> list[nn.Module]:
        return encoder_decoder_batch(fact_sets, m, seeds, encoder=encoder, decoder=decoder, encoder_hidden=sizes,
                                     progress=False, **_hybrid_options(options))

    return Method(f"{name} encoder width at m={m}", build, "encoder hidden", start=1,
                  prepare=_margin_optimal if decoder == "jl" else None, build_batch=build_batch)


@dataclass
class Trial:
    """One size tried: accuracy per seed (in seed order; built one at a time, it stops at the first seed
    that fails; built as a batch, every seed is evaluated)."""

    size: int
    accuracies: list[float]
    parameters: int
    stored: bool


@dataclass
class StorageCost:
    """Result of :func:`fact_storage_cost`.

    size / parameters: the smallest size that stores every fact for every seed and its
    parameter count (None when no size up to ``max_size`` did); accuracies: per seed at that
    size; trace: every size tried, in order.
    """

    method: str
    size_name: str
    size: Optional[int]
    parameters: Optional[int]
    accuracies: list[float]
    seeds: list[int]
    eps_acc: float
    trace: list[Trial] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class TrialLog:
    """Finished trials of cost searches in a JSON file, so that a stopped search resumes where it was.

    A search run with ``checkpoint=path`` writes every trial the moment it is known (atomically) and,
    started again with the same path, takes the sizes the file has instead of training them: a
    seed-scale GD search that takes hours can span sessions. Trials are grouped by a search key
    (method, size name, seeds, facts, eps_acc and the builder options), so one file can serve every
    search of one experiment cell; it must not be shared between different fact sets.
    File: {search key: {size: Trial as a dict}}.
    """

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self._data: dict = json.loads(self.path.read_text()) if self.path.exists() else {}

    def get(self, search: str, size: int) -> Optional[Trial]:
        found = self._data.get(search, {}).get(str(size))
        return None if found is None else Trial(**found)

    def put(self, search: str, trial: Trial) -> None:
        self._data.setdefault(search, {})[str(trial.size)] = asdict(trial)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")  # never half a file
        tmp.write_text(json.dumps(self._data, indent=1))
        tmp.replace(self.path)


def _search_key(spec: "Method", seed_list: list[int], num_facts: int, eps_acc: float, options: dict) -> str:
    """What identifies a search's trials within one checkpoint: the start size and max_size do not change
    a trial's outcome, the method, seeds and builder options do (options as JSON, others by repr)."""
    return json.dumps({"method": spec.name, "size": spec.size_name, "seeds": seed_list, "facts": num_facts,
                       "eps_acc": float(eps_acc), "options": options}, sort_keys=True, default=repr)


def _resolve(method: Union[str, Method, Builder], options: dict) -> Method:
    if isinstance(method, str):
        if method not in methods:
            raise ValueError(f"method must be one of {sorted(methods)} or a builder callable, got {method!r}")
        return methods[method]
    if isinstance(method, Method):
        return method
    if callable(method):
        if options:
            raise TypeError(f"options {sorted(options)} can only be passed with a named method or a Method")
        return Method(getattr(method, "__name__", "builder"), method, "size", start=1)
    raise TypeError(f"method must be a name, a Method or a callable (K, V, f, size, seed), got {type(method).__name__}")


def _seed_list(seeds: Union[int, Sequence[int]]) -> list[int]:
    if isinstance(seeds, bool):
        raise TypeError("seeds must be a positive int or a sequence of ints, got a bool")
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {seeds}")
        return list(range(seeds))
    seed_list = list(seeds)
    if not seed_list or not all(isinstance(s, int) and not isinstance(s, bool) for s in seed_list):
        raise ValueError(f"seeds must be a positive int or a non-empty sequence of ints, got {seeds!r}")
    return seed_list


def _check_search(start: int, max_size: int, eps_acc: float) -> None:
    for arg, value in (("start", start), ("max_size", max_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg} must be a positive int, got {value!r}")
    if start > max_size:
        raise ValueError(f"start={start} is above max_size={max_size}")
    if not (isinstance(eps_acc, (int, float)) and 0.0 <= eps_acc < 1.0):
        raise ValueError(f"eps_acc must be in [0, 1), got {eps_acc!r}")


# batch="auto" trains one model at a time on the CPU from this many logits per model (F · |V|) up. A batch
# amortizes the per-step overhead of small models; from here a model's own arithmetic fills the step: one
# Adam step of 3 GD MLPs as a batch cost 2.0x one model's at F = |V| = 256, 2.5x at 1,024 and 4.8x at 2,048
# (the logits outgrow the cache; benchmarks/results/gd_batch.json, step_cost_by_size), so a batch saves
# little or nothing, and the serial search's stop at the first failing seed and its lack of lookahead save
# whole 20,000-step trainings.
SERIAL_LOGITS = 1 << 19


def _batches(batch: Union[bool, str], K: torch.Tensor, V: torch.Tensor) -> bool:
    """Whether a search trains its models as batches: ``batch`` itself, or for "auto" unless they train on the
    CPU with at least SERIAL_LOGITS logits each (K (F, d) and V (|V|, d) of one fact set)."""
    if batch == "auto":
        return K.device.type != "cpu" or K.shape[0] * V.shape[0] < SERIAL_LOGITS
    if not isinstance(batch, bool):
        raise ValueError(f"batch must be True, False or 'auto', got {batch!r}")
    return batch


# A batched search trains the sizes a few search steps ahead in the same batch: every size left
# between the bracketing sizes when at most this many remain, else the next two bisection levels.
LOOKAHEAD_SIZES = 8


def _lookahead(size: int, bracket: Optional[tuple[int, int]], max_size: int) -> list[int]:
    """Sizes to train with ``size``: while doubling, the next two doublings; while bisecting the
    open bracket (failing, storing), all of it when small, else the next two bisection levels."""
    if bracket is None:
        return sorted({min(size * 2 ** k, max_size) for k in range(3)})
    failing, storing = bracket
    if storing - failing - 1 <= LOOKAHEAD_SIZES:
        return list(range(failing + 1, storing))
    return sorted({size, (failing + size) // 2, (size + storing) // 2} - {failing, storing})


def _search(spec: Method, cases: Callable[[], Iterator[tuple[FactSet, int, dict]]], seed_list: list[int],
            num_facts: int, start: Optional[int], max_size: int, eps_acc: float, progress: bool,
            batch: bool, log: Optional[TrialLog] = None, search_key: str = "") -> StorageCost:
    """Doubling then bisection over the size; ``cases()`` yields (fact set, seed, build options) per seed.

    batch: when the method can build batches, every seed of a size, and (``spec.lookahead``) the sizes
    the search may ask for next (:func:`_lookahead`), train as one batch; the search then reads their results as
    it asks, so it visits the same sizes as one at a time (models in a batch are independent), in
    fewer rounds. One at a time, the seeds after the first that fails are skipped.
    log: trials already known (under ``search_key``) are read from it, new ones written to it."""
    start = spec.start if start is None else start
    _check_search(start, max_size, eps_acc)
    allowed_failures = math.floor(eps_acc * num_facts)
    trace: list[Trial] = []
    ahead: dict[int, Trial] = {}  # batched trials the search has not asked for yet

    def known(size: int) -> Optional[Trial]:
        return None if log is None else log.get(search_key, size)

    def record(found: Trial) -> Trial:
        if log is not None:
            log.put(search_key, found)
        return found
    bar = progress_bar(desc=f"cost {spec.name}", unit="size", enabled=progress, leave=False)

    def trial(size: int, failures: list[int], parameters: int) -> Trial:
        stored = len(failures) == len(seed_list) and max(failures) <= allowed_failures
        return Trial(size, [1.0 - x / num_facts for x in failures], parameters, stored)

    def train_batch(sizes: list[int]) -> None:
        for size in sizes:
            if (found := known(size)) is not None:
                ahead[size] = found
        sizes = [size for size in sizes if size not in ahead]
        listed = list(cases())
        modules = spec.build_batch([fact_set for fact_set, _, _ in listed for _ in sizes],
                                   [size for _ in listed for size in sizes],
                                   [seed for _, seed, _ in listed for _ in sizes],
                                   [options for _, _, options in listed for _ in sizes])
        for i, size in enumerate(sizes):
            failures, parameters = [], 0
            for j, ((K, V, f), _, _) in enumerate(listed):
                module = modules[j * len(sizes) + i]
                parameters = module.num_parameters
                failures.append(int((module.predict(K, V) != f).sum()))
            ahead[size] = record(trial(size, failures, parameters))

    def stores(size: int, bracket: Optional[tuple[int, int]] = None) -> bool:
        if (found := known(size)) is not None:
            trace.append(found)
        elif batch and spec.build_batch is not None:
            if size not in ahead:
                train_batch(_lookahead(size, bracket, max_size) if spec.lookahead else [size])
            trace.append(ahead.pop(size))
        else:
            failures, parameters = [], 0
            for (K, V, f), seed, options in cases():
                module = spec(K, V, f, size, seed, **options)
                parameters = module.num_parameters
                failures.append(int((module.predict(K, V) != f).sum()))
                if failures[-1] > allowed_failures:
                    break
            trace.append(record(trial(size, failures, parameters)))
        bar.update(1)
        bar.set_postfix({spec.size_name: size, "stored": trace[-1].stored})
        return trace[-1].stored

    def result(trial: Optional[Trial]) -> StorageCost:
        bar.close()
        return StorageCost(spec.name, spec.size_name, None if trial is None else trial.size,
                           None if trial is None else trial.parameters, [] if trial is None else trial.accuracies,
                           seed_list, float(eps_acc), trace)

    if spec.fixed:
        return result(trace[-1] if stores(num_facts) else None)
    failing, size = 0, start  # size 0 (no MLP) stores nothing
    while not stores(size):
        if size >= max_size:
            return result(None)
        failing, size = size, min(2 * size, max_size)
    storing = size
    while storing - failing > 1:
        middle = (failing + storing) // 2
        if stores(middle, (failing, storing)):
            storing = middle
        else:
            failing = middle
    return result(next(t for t in trace if t.size == storing))


def fact_storage_cost(
    method: Union[str, Method, Builder],
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    *,
    seeds: Union[int, Sequence[int]] = 3,
    start: Optional[int] = None,
    max_size: int = 1 << 20,
    eps_acc: float = 0.0,
    progress: bool = True,
    batch: Union[bool, str] = "auto",
    checkpoint: Union[str, Path, None] = None,
    **options,
) -> StorageCost:
    """Smallest size (and its parameter count) at which ``method`` stores f for every seed.

    Args:
        method: a name in :data:`methods`, a :class:`Method`, or a callable
            ``(K, V, f, size, seed) -> module`` with ``.predict`` and ``.num_parameters``.
        K: (F, d_in) keys, V: (|V|, d_out) values, f: (F,) value indices.
        seeds: number of seeds (0..n−1) or the seeds themselves; they seed the method's own
            randomness (gates, projections, initializations) for the fixed K, V, f.
            :func:`sampled_storage_cost` also draws a new fact set per seed (the seed's protocol).
        start: first size tried (default: the method's); max_size: the search gives up above it.
        eps_acc: a size stores the facts when at most ⌊eps_acc·F⌋ facts fail for every seed.
        batch: train every seed of a size as one batched model when the method has
            ``build_batch`` (the GD methods); False builds them one at a time; "auto" batches except on
            the CPU at F · |V| ≥ SERIAL_LOGITS, where a model's arithmetic outweighs what a batch saves.
            Both visit the same sizes and find the same cost.
        checkpoint: a JSON file (:class:`TrialLog`) where every finished trial is written at once; a
            search started again with it reuses those trials (for one fact set: K, V and f are not keyed).
        options: passed to the method's builder (e.g. ``degree=4`` for "ntk", ``steps=5000`` for "gd").

    Returns:
        :class:`StorageCost` with the size, parameters, accuracy per seed and the search trace.
    """
    facts = validate_inputs(K, V, f)
    spec = _resolve(method, options)
    seed_list = _seed_list(seeds)
    _check_search(spec.start if start is None else start, max_size, eps_acc)
    prepared = spec.prepared(K, V, facts, options)

    def cases() -> Iterator[tuple[FactSet, int, dict]]:
        return ((FactSet(K, V, facts), seed, prepared) for seed in seed_list)

    log = None if checkpoint is None else TrialLog(checkpoint)
    return _search(spec, cases, seed_list, facts.shape[0], start, max_size, eps_acc, progress, _batches(batch, K, V),
                   log, _search_key(spec, seed_list, facts.shape[0], eps_acc, options))


def sampled_storage_cost(
    method: Union[str, Method, Builder],
    sample: Callable[[int], FactSet],
    *,
    seeds: Union[int, Sequence[int]] = 3,
    start: Optional[int] = None,
    max_size: int = 1 << 20,
    eps_acc: float = 0.0,
    progress: bool = True,
    batch: Union[bool, str] = "auto",
    checkpoint: Union[str, Path, None] = None,
    **options,
) -> StorageCost:
    """Fact-storage cost over sampled fact sets (seed 000, A.1.2): seed s draws ``sample(s)``
    (embeddings and map) and seeds the method; a size stores when the minimum accuracy over
    the seeds is at least 1 − eps_acc. Arguments as in :func:`fact_storage_cost`;
    ``sample(seed) -> FactSet`` must return fact sets of one size F, e.g.
    ``functools.partial(embeddings.family_fact_set, "spherical", 256, 32)`` (keyword ``seed``).
    """
    if not callable(sample):
        raise TypeError(f"sample must be a callable seed -> FactSet, got {type(sample).__name__}")
    spec = _resolve(method, options)
    seed_list = _seed_list(seeds)
    _check_search(spec.start if start is None else start, max_size, eps_acc)
    fact_sets = []
    for seed in seed_list:
        K, V, f = sample(seed=seed)
        facts = validate_inputs(K, V, f)
        fact_sets.append((FactSet(K, V, facts), seed, spec.prepared(K, V, facts, options)))
    sizes = {fs.K.shape[0] for fs, _, _ in fact_sets}
    if len(sizes) != 1:
        raise ValueError(f"sample must return fact sets of one size F, got sizes {sorted(sizes)}")
    num_facts = sizes.pop()
    log = None if checkpoint is None else TrialLog(checkpoint)
    first = fact_sets[0][0]
    return _search(spec, lambda: iter(fact_sets), seed_list, num_facts, start, max_size, eps_acc, progress,
                   _batches(batch, first.K, first.V), log, _search_key(spec, seed_list, num_facts, eps_acc, options))
