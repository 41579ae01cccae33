"""One registry of editing methods, with a hyperparameter dataclass per method.

Every method that writes facts into a model, ours and the baselines, is a row of :data:`METHODS`:
its name, hyperparameter class, kind ("weights": rewrites a down projection; "side_memory": adds a
routed memory beside it; "construction": builds units by construction) and whether the toy LM
(:mod:`factkernels.transformer.editing`) or real models (:mod:`factkernels.hf`) run it.

Published settings are the dataclass defaults, as the authors' configuration files give them for their
reference model (ROME, MEMIT: GPT-J-6B, 28 layers, MLP width 16,384; AlphaEdit: Llama3-8B, 32 layers,
14,336; GRACE, WISE: EasyEdit's LLaMA-7B, 32 layers). :meth:`for_model` moves them to another model:
layers keep their relative depth, and MEMIT's λ (``mom2_weight``), which weighs C, a width-summed
quantity, against the edited keys, scales with the MLP width.

    hp = hparams("memit", num_layers=30, mlp_width=1536, steps=50)   # MEMIT's, rescaled, one override
    hp.mom2_weight                                                    # 1406.25 = 1.5e4 · 1536 / 16384
    hp = hparams("memit", num_layers=30, mlp_width=1536, preset="smollm2-135m")   # chosen for SmolLM2

A preset (:data:`TUNED`) holds the settings chosen for one model on the editing benchmark's validation draw
(layers by causal tracing, the rest by a sweep); the published settings stay the default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

# (length in tokens, count) of generated context prefixes, and the words they start from ("" = BOS)
Prefixes = tuple[tuple[int, int], ...]


def _rescale_layers(layers: tuple[int, ...], ref_layers: int, num_layers: int) -> tuple[int, ...]:
    """The published (contiguous) layers moved to the same relative depth of a ``num_layers``-layer
    model: the first at its relative depth, the count kept."""
    count = min(len(layers), num_layers)
    first = min(num_layers - count, round(layers[0] * num_layers / ref_layers))
    return tuple(range(first, first + count))


class _Published:
    """Published settings for a reference model of REF_LAYERS layers and MLP width REF_WIDTH."""

    REF_LAYERS: ClassVar[int] = 28
    REF_WIDTH: ClassVar[int] = 16384

    @classmethod
    def for_model(cls, num_layers: int, mlp_width: int, **overrides: Any) -> Any:
        """Published settings moved to a model of ``num_layers`` layers and MLP width ``mlp_width``
        (layers at the same relative depth, MEMIT's λ scaled by the width); ``overrides`` win, except a
        None for a moved field, which keeps the moved value."""
        base = cls()
        moved: dict[str, Any] = {}
        if hasattr(base, "layers"):
            moved["layers"] = _rescale_layers(base.layers, cls.REF_LAYERS, num_layers)
        if hasattr(base, "layer"):
            moved["layer"] = _rescale_layers((base.layer,), cls.REF_LAYERS, num_layers)[0]
        if hasattr(base, "mom2_weight"):
            moved["mom2_weight"] = base.mom2_weight * mlp_width / cls.REF_WIDTH
        given = {k: v for k, v in overrides.items() if not (v is None and k in moved)}
        return dataclasses.replace(base, **{**moved, **given})


@dataclass(frozen=True)
class ResidualStep(_Published):
    """The published residual step shared by ROME (``compute_v``), MEMIT and AlphaEdit (``compute_z``):
    δ added at the last edited layer at the subject's last token, trained with Adam (``steps``, ``lr``)
    on the target's NLL over every context prefix plus ``kl_factor`` · KL at the subject of "{} is a"
    and ``weight_decay`` · ||δ|| / ||h||²; ||δ|| <= ``clamp_norm`` · ||h|| (h: ROME the MLP output,
    MEMIT/AlphaEdit the layer output); stops when that loss < ``early_stop``."""

    steps: int = 25
    lr: float = 0.5
    weight_decay: float = 0.5
    clamp_norm: Optional[float] = 0.75
    kl_factor: float = 0.0625
    early_stop: Optional[float] = 5e-2
    prefixes: Prefixes = ((10, 5),)
    prefix_starts: tuple[str, ...] = ("The", "Therefore", "Because", "I", "You")

    def residual_settings(self) -> dict:
        """The fields δ depends on (two edits with equal ones can share δ)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(ResidualStep)}


@dataclass(frozen=True)
class KeyStatistics(ResidualStep):
    """Where ROME, MEMIT and AlphaEdit take C = E[k kᵀ] from on a real model
    (:func:`factkernels.hf.statistics.mom2_texts`): ``mom2_dataset`` "wikipedia" (the shipped English
    Wikipedia article leads, ~1.05M tokens; the references use Wikipedia too) or "smollm2_text" (22k tokens,
    quick runs), its first ``mom2_n_samples`` documents (None: all 10,033; the references take 100,000
    whole articles). The toy LM computes its own C."""

    mom2_dataset: str = "wikipedia"
    mom2_n_samples: Optional[int] = None


@dataclass(frozen=True)
class ROMEHparams(KeyStatistics):
    """ROME (Meng et al. 2022; kmeng01/rome hparams/ROME/gpt-j-6B.json): one layer, rank-one edits.
    ``ridge`` · mean(diag C) is added to C before it is inverted (C from a finite sample; ours)."""

    layers: tuple[int, ...] = (5,)
    steps: int = 20
    clamp_norm: Optional[float] = 4.0
    prefixes: Prefixes = ((5, 10), (10, 10))
    prefix_starts: tuple[str, ...] = ("",)
    ridge: float = 1e-4


@dataclass(frozen=True)
class MEMITHparams(KeyStatistics):
    """MEMIT (Meng et al. 2023; kmeng01/memit hparams/MEMIT/gpt-j-6B.json): z* spread over ``layers``
    by W + R Kᵀ (λ C + K Kᵀ)⁻¹; λ = ``mom2_weight`` (1.5e4 at GPT-J's width, rescaled by for_model)."""

    layers: tuple[int, ...] = (3, 4, 5, 6, 7, 8)
    mom2_weight: float = 1.5e4


@dataclass(frozen=True)
class AlphaEditHparams(KeyStatistics):
    """AlphaEdit (Fang et al. 2025; jianghoucheng/AlphaEdit hparams/AlphaEdit/Llama3-8B.json): MEMIT's
    spreading projected onto the null space of C (eigenvalues < ``nullspace_threshold``; when
    ``nullspace_relative`` is set the threshold is that fraction of C's mean eigenvalue instead, a
    width-free form), ``l2`` ridge, edits applied in sequential batches of ``batch_size`` with the
    earlier batches' keys kept in the system (the paper's protocol)."""

    layers: tuple[int, ...] = (4, 5, 6, 7, 8)
    lr: float = 0.1
    nullspace_threshold: float = 2e-2
    nullspace_relative: Optional[float] = None
    l2: float = 10.0
    batch_size: int = 100

    REF_LAYERS: ClassVar[int] = 32
    REF_WIDTH: ClassVar[int] = 14336


@dataclass(frozen=True)
class GRACEHparams(_Published):
    """GRACE (Hartvigsen et al. 2023; EasyEdit hparams/GRACE/llama-7b.yaml): a codebook at ``layer``'s
    down projection: keys (its input at the prompt's last token), values trained for ``steps`` Adam
    steps at ``lr`` from a cold (uniform random) start, deferral radius ``eps`` (Euclidean); a query within
    a key's radius has its output replaced by the value. A new key of the same target within reach
    expands the nearest radius (coverage); of another target, both radii are split."""

    layer: int = 27
    steps: int = 50
    lr: float = 1.0
    eps: float = 1.0

    REF_LAYERS: ClassVar[int] = 32
    REF_WIDTH: ClassVar[int] = 11008


@dataclass(frozen=True)
class WISEHparams(_Published):
    """WISE (Wang et al. 2024; EasyEdit hparams/WISE/llama-7b.yaml): a side copy of ``layer``'s down
    projection trained by SGD (``steps``, ``lr``) on a random ``mask_ratio`` of its entries, each within
    ``norm_constraint`` of the original, on the target's NLL under the bare prompt and generated context
    prefixes (``prefixes``, ``prefix_starts``: EasyEdit's ``get_context_templates``, lengths [[5, 5], [10, 5]]
    from "I", "You", "Because", "Yes", "Q: ") with the routing margins (alpha, beta, gamma) = ``act_margin``
    on the activation distance ||silu(W' k) − silu(W k)||; a sequence is routed to the side memory when
    its distance exceeds ``act_ratio`` × the smallest distance seen on an edit."""

    layer: int = 27
    steps: int = 70
    lr: float = 1.0
    mask_ratio: float = 0.2
    norm_constraint: float = 1.0
    act_margin: tuple[float, float, float] = (5.0, 20.0, 10.0)
    act_ratio: float = 0.88
    prefixes: Prefixes = ((5, 5), (10, 5))
    prefix_starts: tuple[str, ...] = ("I", "You", "Because", "Yes", "Q:")
    seed: int = 0

    REF_LAYERS: ClassVar[int] = 32
    REF_WIDTH: ClassVar[int] = 11008


@dataclass(frozen=True)
class MLPSwapHparams:
    """The seed's MLP swap (toy LM): a new fact MLP of the same size storing the whole edited fact set."""

    seed: int = 0


@dataclass(frozen=True)
class InsertionHparams:
    """Ours: constructed units appended to one layer's MLP (:func:`factkernels.hf.insert_facts`); None
    fields take insert_facts' defaults."""

    layer: Optional[int] = None
    position: str = "target"
    value_steps: int = 60
    seed: int = 0


TUNED: dict[str, dict[str, dict[str, Any]]] = {
    "smollm2-135m": {
        "rome": {"layers": (5,)},
        "memit": {"layers": (0, 1, 2, 3, 4, 5), "mom2_weight": 140.625},
        "alphaedit": {"layers": (1, 2, 3, 4, 5), "lr": 0.5, "nullspace_threshold": 0.1},
        "grace": {"eps": 20.0},
        "wise": {"act_ratio": 0.7},
    },
}
"""{model: {method: overrides of the published settings moved to the model}}. SmolLM2-135M: layers by causal
tracing (benchmarks/causal_trace_layers.py: the MLP effect at the subject's last token peaks at layer 5); the
rest by the validation-draw sweep (benchmarks/editor_validation_sweep.py, 10 known facts, harmonic mean of
efficacy, paraphrase and neighbourhood scores, C from 1.05M Wikipedia tokens): GRACE's ε 20 (0.57; published
1.0: 0.20); MEMIT's λ 140.6, a tenth of the width-rescaled 1,406 (0.983; 1,406: 0.978; published 1.5e4: 0.87);
AlphaEdit's null-space threshold 0.1 (0.985, a null space of 1,510-1,527 of 1,536 dimensions per layer;
published 2e-2: 0.97, 1,106-1,440). λ and the threshold were best at the grid's edge. AlphaEdit's δ learning
rate from the sanity gate (its published 0.1 reaches single-edit efficacy 0.47 on this model, MEMIT's 0.5
1.00: editor_sanity_gate*.json). WISE (trained over 10 generated context prefixes, as EasyEdit): act_ratio 0.7
(0.618; published LLaMA-2 settings, ratio 0.88: 0.611; 0.5: 0.618, the same memory routed; EasyEdit's Llama-3
settings, layer 27, lr 0.9, 30 steps, margins (2, 20, 10), ratio 0.5 or 0.88: 0.602). Efficacy stays 0.60-0.64
although every edit prompt routes to the memory (ratio <= 0.7; 0.88: 88 %): the side memory's values, not its
routing, limit it. The ratios within a point are a tie in all but one neighbour and one paraphrase.
python_tests/editing check these against the JSON."""


@dataclass(frozen=True)
class Method:
    """A registry row: name, hyperparameter class, kind, and where it runs."""

    name: str
    hparams: type
    kind: str
    toy_lm: bool
    real_lm: bool
    reference: str


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("rome", ROMEHparams, "weights", True, True, "kmeng01/rome"),
    Method("memit", MEMITHparams, "weights", True, True, "kmeng01/memit"),
    Method("alphaedit", AlphaEditHparams, "weights", True, True, "jianghoucheng/AlphaEdit"),
    Method("grace", GRACEHparams, "side_memory", False, True, "thartvigsen/grace, zjunlp/EasyEdit"),
    Method("wise", WISEHparams, "side_memory", False, True, "zjunlp/EasyEdit"),
    Method("mlp_swap", MLPSwapHparams, "construction", True, False, "seed 000 §5.4"),
    Method("ours", InsertionHparams, "construction", False, True, "factkernels.hf.insert_facts"),
)}


def method_names(*, toy_lm: Optional[bool] = None, real_lm: Optional[bool] = None,
                 kind: Optional[str] = None) -> tuple[str, ...]:
    """Registered method names, in registry order, filtered by where they run and kind."""
    return tuple(m.name for m in METHODS.values() if (toy_lm is None or m.toy_lm == toy_lm)
                 and (real_lm is None or m.real_lm == real_lm) and (kind is None or m.kind == kind))


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {name!r}")
    return METHODS[name]


def hparams(name: str, *, num_layers: Optional[int] = None, mlp_width: Optional[int] = None,
            preset: Optional[str] = None, **overrides: Any) -> Any:
    """The hyperparameters of method ``name``: published defaults, moved to a model of ``num_layers``
    layers and MLP width ``mlp_width`` when given (see the module docstring), then the ``preset``'s
    (:data:`TUNED`, e.g. "smollm2-135m") and ``overrides``; an unknown preset or override raises ValueError
    naming the known ones."""
    cls = get_method(name).hparams
    if preset is not None:
        if preset not in TUNED:
            raise ValueError(f"preset must be one of {sorted(TUNED)}, got {preset!r}")
        overrides = {**TUNED[preset].get(name, {}), **overrides}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"unknown hyperparameters for {name}: {sorted(unknown)}; known: {sorted(known)}")
    for key in ("layers", "prefixes", "prefix_starts", "act_margin"):
        if key in overrides and overrides[key] is not None and not isinstance(overrides[key], str):
            value = overrides[key]
            overrides[key] = tuple(tuple(v) if isinstance(v, list) else v for v in
                                   ([value] if isinstance(value, int) else value))
    if num_layers is not None and hasattr(cls, "for_model"):
        return cls.for_model(num_layers, mlp_width or cls.REF_WIDTH, **overrides)
    return cls(**overrides)


def as_dict(hp: Any) -> dict:
    """A hyperparameter dataclass as a JSON-able dict (tuples as lists)."""
    return json_ready(dataclasses.asdict(hp))


def json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [json_ready(v) for v in value]
    return value


__all__ = ["METHODS", "TUNED", "Method", "method_names", "get_method", "hparams", "as_dict", "ResidualStep",
           "KeyStatistics", "ROMEHparams", "MEMITHparams", "AlphaEditHparams", "GRACEHparams", "WISEHparams", "MLPSwapHparams",
           "InsertionHparams"]
