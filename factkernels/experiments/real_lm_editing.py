"""Issue 32 part 5: the editing benchmark on a real LM — every method, one cell at a time.

A cell edits one draw of the editing benchmark (:mod:`factkernels.datasets.editing_benchmark`) with one
method and scores it with :mod:`factkernels.hf.metrics` against the unedited model on the same cases, then
restores the model. Its config (the cell's file name is a hash of it, so a resumed run redoes a finished cell
only when it is stale: it ran other hyperparameters than its settings give now, :func:`hparams_drift`):

    {"model": "smollm2-135m" | "tiny",
     "method": "unedited" | a real-model method of factkernels.editing.METHODS ("ours" is hf.insert_facts),
     "settings": {...},          # ours: hf.insert_facts keyword arguments; editors: hyperparameter overrides
     "kind": "known" | "new", "split": "validation" | "test",
     "draw": 0..2 (validation: 0) | "all",  # "all": every test draw at once, one cell (editing_benchmark.
                                            # all_test_draws; known cases' neighbours: the validation subjects)
     "n": 10 | 100 | "all",      # the first n cases of the draw, edited at once
     "protocol": ...}            # see PROTOCOLS

Protocols: "batch" edits every case's requests in one call (ours, MEMIT, GRACE, WISE); "sequential" is the
same call for the editors that edit in steps (ROME one request at a time on the model edited so far,
AlphaEdit batches of ``batch_size``); "single" edits each case alone, scores it and restores (ROME's
published single-edit protocol), the cell's scores the means over cases. Every method gets the same
requests: each case's new object under each of its relation's edit templates (``metrics.case_requests``).

Result: {"scores": score_cases' dict (every metric, its "unedited" values, by relation and template),
"seconds" ({"edit", "edit_cpu", "score", "baseline", "baseline_cpu"}: wall and process CPU seconds of the
edit, of scoring it and of the unedited model's scores when this process computed them; "targets_restored":
the wall seconds an earlier cell spent on the δ this edit read back, see below), "report" (what the
method reports: hparams, layers, units, NLLs), "requests", "generate", "load_average"}; the engine adds the
config, wall seconds, device and environment. The unedited model's scores of a draw are computed once per
process (``_baseline``); "unedited" cells write them, and a grid runs each draw's cells in a row. The
weight editors keep their δ in ``OUT/real-lm-editing/partial/shared-KEY/`` (``hf.edit(checkpoint=<folder>)``, a
file per δ batch named by everything δ depends on, the edited weights included): a cell stopped mid-δ resumes it,
on another machine too once the folder is committed (AlphaEdit's sequential batches from the last one finished),
and MEMIT's and AlphaEdit's cells of the same draw run in one command, whose δ settings agree (SmolLM2 preset; at
10 cases AlphaEdit's batch of 100 requests holds them all), train it once; WISE keeps its side memory there after
each edit and continues after the last one. The folder goes when the grid is done.
Ours keeps its values fit's chunks of subjects likewise (``checkpoint=<cache>/subject_values``; with the CPU
seconds they took: "targets_restored_cpu"). A "single" cell keeps each finished case (scores, report, seconds) in
its own partial file, ``OUT/real-lm-editing/partial/KEY.json``, and a resumed run continues after the last one.

    factkernels experiment real-lm-editing --out benchmarks/results/experiments --methods unedited,ours \
        --sizes 10 --kind known --split test --draws 0,1,2 --resume
    factkernels experiment real-lm-editing --methods memit --sizes 100 --split validation --draws 0 \
        --hparams '{"memit": [{"mom2_weight": 150}, {"mom2_weight": 1500}]}' --resume

    factkernels experiment real-lm-editing --methods unedited,ours --sizes all --draws all --device cuda --resume

Scales (``--scale``, when no grid options are given): tiny — a random 3-layer Llama with a word-level
tokenizer, 4 cases, every method (CI seconds; no numbers worth reading); quick — SmolLM2-135M, every method
at 10 known facts of each test draw; seed — every method at 10, 100 and all known facts of each test draw, and
at every test case at once (draw "all").
Summaries and figures: :mod:`.real_lm_editing_report`.
"""

from __future__ import annotations

import json
import os
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from ..datasets.editing_benchmark import ALL_DRAWS, NUM_TEST_DRAWS, SPLITS
from ..editing import method_names
from . import engine, real_lm_editing_report as report

NAME = "real-lm-editing"
MODEL = "smollm2-135m"
METHODS = ("unedited", *method_names(real_lm=True))
EDITORS = tuple(m for m in METHODS if m not in ("unedited", "ours"))
KINDS = ("known", "new")
SIZES = (10, 100, "all")
DEFAULT_PROTOCOL = {"unedited": "none", "rome": "sequential", "alphaedit": "sequential"}
PROTOCOLS = ("none", "batch", "sequential", "single")
GENERATE = 50
"""Cases whose generations are scored for fluency and consistency (the first of each cell)."""
OURS_SETTINGS = {"keys": "subject", "layer": 10, "partner_weight": 0.01, "value_lr": 1.0}
"""Our insertion's settings when a grid names none: subject keys at layer 10 (validation draw, issue 32), with
insert_facts' defaults that moved named, so a cell's settings say what it ran: the values fit's lr 1.0 (session
30) and the pairwise partner filter (0.01: session 28 on the new-knowledge validation draw, on known facts since
session 32). Cells that name only keys and layer ran before those: lr 0.5, and no partner filter on known facts
(docs/results/real-models.md)."""
TINY_SETTINGS = {"ours": {**OURS_SETTINGS, "layer": 1, "value_steps": 10},
                 "rome": {"layers": [1], "steps": 10, "prefixes": [[4, 2]]},
                 "memit": {"layers": [1], "steps": 10, "prefixes": [[4, 2]]},
                 "alphaedit": {"layers": [1], "steps": 10, "prefixes": [[4, 2]], "batch_size": 10},
                 "grace": {"layer": 1, "steps": 10}, "wise": {"layer": 1, "steps": 10}}
"""The tiny model's settings (layers it has, few steps)."""
TINY_CASES = 4
MODEL_SHAPES = {MODEL: (30, 1536), "tiny": (3, 64)}
"""(layers, MLP width) of each cell model, which the editors' published layers and λ are moved to
(:func:`factkernels.editing.hparams`): a finished cell's hparams are checked against them without loading it."""


def default_protocol(method: str) -> str:
    return DEFAULT_PROTOCOL.get(method, "batch")


def cell(method: str, *, n: Union[int, str], kind: str = "known", split: str = "test", draw: Union[int, str] = 0,
         settings: Optional[dict] = None, protocol: Optional[str] = None, model: str = MODEL) -> dict:
    """One cell's config, validated (see the module docstring); settings None: the method's defaults (ours:
    :data:`OURS_SETTINGS`)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not (n == "all" or (isinstance(n, int) and not isinstance(n, bool) and n >= 1)):
        raise ValueError(f"n must be a positive int or 'all', got {n!r}")
    draws = (0,) if split == "validation" else (*range(NUM_TEST_DRAWS), ALL_DRAWS)
    if split not in SPLITS or draw not in draws or isinstance(draw, bool):
        raise ValueError(f"split must be one of {SPLITS} and its draw one of {draws}, got {split!r}, {draw!r}")
    protocol = default_protocol(method) if protocol is None else protocol
    allowed = ("none",) if method == "unedited" else (default_protocol(method), "single")
    if protocol not in allowed:
        raise ValueError(f"protocol of {method} must be one of {allowed}, got {protocol!r}")
    if settings is None:
        settings = dict(OURS_SETTINGS) if method == "ours" else {}
    if method == "unedited" and settings:
        raise ValueError(f"the unedited model takes no settings, got {settings}")
    return {"model": model, "method": method, "settings": settings, "kind": kind, "split": split, "draw": draw,
            "n": n, "protocol": protocol}


def grid(methods: Sequence[str], sizes: Sequence[Union[int, str]], *, kind: str = "known", split: str = "test",
         draws: Sequence[Union[int, str]] = (0, 1, 2), settings: Optional[dict] = None, protocols: Optional[dict] = None,
         model: str = MODEL) -> list[dict]:
    """Cells of every method × size × draw. settings: {method: settings dict or a list of them (a sweep)};
    protocols: {method: protocol or list of protocols} (default each method's own)."""
    settings, protocols = settings or {}, protocols or {}
    unknown = (set(settings) | set(protocols)) - set(methods)
    if unknown:
        raise ValueError(f"settings or protocols name methods not in the grid: {sorted(unknown)}")
    cells = []
    for n in sizes:
        for d in draws:  # a draw's cells in a row: its unedited scores are computed once
            for method in methods:
                points = settings.get(method, [None])
                ways = protocols.get(method, [None])
                for point in points if isinstance(points, list) else [points]:
                    for protocol in ways if isinstance(ways, list) else [ways]:
                        cells.append(cell(method, n=n, kind=kind, split=split, draw=d, settings=point,
                                          protocol=protocol, model=model))
    return cells


def _scale_grid(scale: str) -> list[dict]:
    if scale == "tiny":
        tiny = grid(METHODS, [TINY_CASES], draws=[0], settings=TINY_SETTINGS, model="tiny")
        return tiny + [cell("rome", n=TINY_CASES, protocol="single", settings=TINY_SETTINGS["rome"], model="tiny")]
    if scale == "quick":
        return grid(METHODS, [10])
    return grid(METHODS, SIZES) + grid(METHODS, ["all"], draws=[ALL_DRAWS])


def _draw(config: dict) -> list:
    from ..datasets.editing_benchmark import all_test_draws, known_draw, new_knowledge_draw

    n = None if config["n"] == "all" else config["n"]
    if config["draw"] == ALL_DRAWS:
        return all_test_draws(config["kind"], n=n)
    make = known_draw if config["kind"] == "known" else new_knowledge_draw
    return make(config["split"], config["draw"], n=n)


def _texts(split: str, tiny: bool) -> list[str]:
    """The shipped text of ``split``; at tiny scale four 40-word snippets of it."""
    from ..datasets import natural_text

    texts = natural_text(split)
    return [" ".join(t.split()[:40]) for t in texts[:4]] if tiny else texts


@lru_cache(maxsize=1)
def _tiny_words() -> tuple[str, ...]:
    """Every word the tiny model may meet: the benchmark's templates, prefixes, facts and the tiny texts."""
    from ..datasets.editing_benchmark import known_fact_candidates, prefixes, relations

    text = [t for r in relations().values() for t in r.edit + r.held_out]
    text += prefixes("edit") + prefixes("held_out") + _texts("eval", True) + _texts("stats", True)
    text += [f"{f.subject} {f.object}" for f in known_fact_candidates()]
    return tuple(sorted({w.lower() for t in text for w in t.replace("{}", " ").split()}))


def _tiny_model() -> tuple[Any, Any]:
    """A random 3-layer Llama (d=32, SwiGLU 64, initializer_range 0.2) with a word-level tokenizer."""
    import tokenizers
    import torch
    import transformers

    vocab = {w: i for i, w in enumerate(("[UNK]", "[PAD]", *_tiny_words()))}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = tokenizers.normalizers.Lowercase()
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    layers, width = MODEL_SHAPES["tiny"]
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=width, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      hidden_act="silu", pad_token_id=1, initializer_range=0.2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), tok


@lru_cache(maxsize=1)
def model_for(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) of a cell, loaded once per process and put on the run's device (cells always leave
    it unedited)."""
    from .. import hf

    model, tok = _tiny_model() if name == "tiny" else hf.load(name)
    return model.to(engine.cell_device()), tok


_BASELINES: dict[str, tuple[Any, dict]] = {}


def _baseline(config: dict, model: Any, tok: Any, cases: list, texts: list[str]) -> tuple[Any, dict]:
    """The unedited model's :class:`~factkernels.hf.metrics.Baseline` of the cell's cases and the seconds it
    took ({"baseline": wall, "baseline_cpu": process CPU}), computed once per process per (model, kind, split,
    draw, n)."""
    import torch

    from ..hf.metrics import record_baseline

    key = json.dumps([config[k] for k in ("model", "kind", "split", "draw", "n")])
    if key not in _BASELINES:  # a few MB each (the text reference's top-k), so every draw's is kept
        wall, cpu = time.perf_counter(), time.process_time()
        with torch.no_grad():
            base = record_baseline(model, tok, cases, texts=texts, generate=GENERATE)
        _BASELINES[key] = (base, {"baseline": time.perf_counter() - wall, "baseline_cpu": time.process_time() - cpu})
    return _BASELINES[key]


def _edit(config: dict, model: Any, tok: Any, requests: list, tiny: bool):
    """Apply the cell's method for ``requests``: (undo, report dict)."""
    from .. import hf

    method, settings = config["method"], dict(config["settings"])
    if method == "ours":
        if not tiny:  # the values fit's finished chunks, in a file named by what they depend on
            from ..hf.statistics import default_cache_dir

            settings["checkpoint"] = default_cache_dir() / "subject_values"
        applied = hf.insert_facts(model, tok, requests, progress=False, background=_texts("stats", tiny), **settings)
        return applied.remove, {k: v for k, v in applied.report.to_dict().items() if k != "margins"}
    stats = None
    if tiny and method in ("rome", "memit", "alphaedit"):  # tiny vocabulary: C from the tiny texts
        from ..hf.statistics import key_second_moments

        stats = key_second_moments(model, tok, settings["layers"], texts=_texts("eval", True), cache_dir=False)
    if not tiny and method in (*hf.editors.WEIGHT_EDITORS, "wise"):  # WISE: its memory after each edit
        settings["checkpoint"] = _targets_folder()
    applied = hf.edit(model, tok, requests, method=method, stats=stats, progress=False, **settings)
    return applied.restore, applied.report


def _targets_folder() -> Path:
    """Where the weight editors keep δ (files named by everything δ depends on, :func:`~factkernels.hf.editors.
    targets_file`): in a run, the experiment's shared partial folder ``OUT/NAME/partial/shared-KEY/`` (in the results
    tree, so a run stopped on one machine resumes on another from a commit; removed once the grid is complete), else
    the cache folder."""
    folder = engine.shared_partial_path({"residual_targets": "files_named_by_content"})
    if folder is None:
        from ..hf.statistics import default_cache_dir

        return default_cache_dir() / "residual_targets"
    return folder.with_suffix("")


def _timed_edit(config: dict, model: Any, tok: Any, requests: list, tiny: bool):
    """(undo, report, {"edit": wall s, "edit_cpu": process CPU s})."""
    wall, cpu = time.perf_counter(), time.process_time()
    undo, method_report = _edit(config, model, tok, requests, tiny)
    seconds = {"edit": time.perf_counter() - wall, "edit_cpu": time.process_time() - cpu}
    values = method_report.get("values") or {}
    if method_report.get("targets_restored_seconds"):
        seconds["targets_restored"] = method_report["targets_restored_seconds"]
    elif values.get("value_restored_seconds"):  # ours: δ chunks read back, with the CPU seconds they took
        seconds["targets_restored"] = values["value_restored_seconds"]
        seconds["targets_restored_cpu"] = values["value_restored_cpu"]
    return undo, method_report, seconds


def _single(config: dict, model: Any, tok: Any, cases: list, base: Any, texts: list[str], tiny: bool):
    """Each case edited alone, scored and restored: (mean scores over cases, seconds summed, reports). Finished
    cases are kept in the cell's partial file (:func:`~factkernels.experiments.engine.partial_path`): ROME one
    case at a time over every known fact takes hours, and a resumed run continues after the last one kept."""
    from dataclasses import replace

    from ..hf.metrics import KINDS, case_requests, harmonic_mean, score_cases

    partial = engine.partial_path()
    done = engine.read_json(partial, "cases")["cases"] if partial is not None and partial.exists() else []
    if len(done) > len(cases):
        raise engine.ResultFileError(f"{partial}: {len(done)} cases kept, but the cell has {len(cases)}")
    for i, case in enumerate(cases[len(done):], start=len(done)):
        undo, method_report, spent = _timed_edit(config, model, tok, case_requests([case]), tiny)
        try:
            own = replace(base, generate=1 if i < base.generate else 0)
            scores = score_cases(model, tok, [case], own, texts=texts)
        finally:
            undo()
        done.append(engine.clean_json({"scores": scores, "report": method_report, "seconds": spent}))
        if partial is not None:
            engine.write_json(partial, {"cases": done})
    per_case = [d["scores"] for d in done]
    seconds = {k: sum(d["seconds"][k] for d in done) for k in ("edit", "edit_cpu")}
    numeric = list(dict.fromkeys(k for s in per_case for k, v in s.items()
                                 if isinstance(v, (int, float)) and not isinstance(v, bool)))
    scores: dict = {}
    for k in numeric + ["fluency", "consistency"]:
        values = [s[k] for s in per_case if s.get(k) is not None]  # None (NaN): the case had no such prompt
        if values:
            scores[k] = sum(values) / len(values)
    scores["num_cases"] = len(cases)
    scores["score"] = harmonic_mean([scores[f"{k}_score"] for k in KINDS])
    scores["consistency_cases"] = sum(s.get("consistency_cases", 0) for s in per_case)
    scores["unedited"] = per_case[0]["unedited"]
    return scores, seconds, {"per_case": [d["report"] for d in done]}


def run_cell(config: dict) -> dict:
    import torch

    from ..hf.metrics import case_requests, score_cases

    tiny = config["model"] == "tiny"
    cell(config["method"], n=config["n"], kind=config["kind"], split=config["split"], draw=config["draw"],
         settings=config["settings"], protocol=config["protocol"], model=config["model"])  # validates
    model, tok = model_for(config["model"])
    cases = _draw(config)
    texts = _texts("eval", tiny)
    base, base_seconds = _baseline(config, model, tok, cases, texts)
    requests = case_requests(cases)
    out: dict = {"requests": len(requests), "generate": min(GENERATE, len(cases))}
    if config["method"] == "unedited":
        return {**out, "scores": base.scores, "seconds": base_seconds, "report": {},
                "load_average": list(os.getloadavg())}
    if config["protocol"] == "single":
        scores, seconds, method_report = _single(config, model, tok, cases, base, texts, tiny)
    else:
        with torch.enable_grad():
            undo, method_report, seconds = _timed_edit(config, model, tok, requests, tiny)
        try:
            start = time.perf_counter()
            scores = score_cases(model, tok, cases, base, texts=texts)
            seconds["score"] = time.perf_counter() - start
        finally:
            undo()
    return {**out, "scores": scores, "seconds": {**seconds, **base_seconds},
            "report": engine.clean_json(method_report), "load_average": list(os.getloadavg())}


def hparams_drift(config: dict, result: dict) -> dict:
    """{field: {"ran": the value a finished editor cell recorded, "now": what its settings resolve to now}} for
    every field of the method's hyperparameter dataclass where they differ: its settings name a preset of
    :data:`factkernels.editing.TUNED` that has moved since, or the published defaults moved (lists and tuples
    compare equal). "ran" is absent for a field the cell did not record (it predates the field). {} for ours and
    the unedited model (no preset) and for a result without recorded hparams (test doubles)."""
    if config["method"] not in EDITORS:
        return {}
    method_report = result.get("report") or {}
    cases = method_report.get("per_case")  # the single protocol: every case ran the cell's settings
    recorded = cases[0].get("hparams") if cases else method_report.get("hparams")
    if recorded is None:
        return {}
    if config["model"] not in MODEL_SHAPES:
        raise ValueError(f"no (layers, MLP width) for model {config['model']!r}: add it to MODEL_SHAPES")
    from ..editing.methods import as_dict, json_ready
    from ..hf.editors import hparams_for_shape

    settings = dict(config["settings"])
    now = as_dict(hparams_for_shape(config["method"], *MODEL_SHAPES[config["model"]], settings.pop("layers", None),
                                    settings))
    drift = {}
    for k, v in now.items():
        if k not in recorded:
            drift[k] = {"now": v}
        elif json_ready(recorded[k]) != v:
            drift[k] = {"ran": recorded[k], "now": v}
    return drift


def stale_reason(finished: engine.Cell) -> Optional[str]:
    """Why a finished cell no longer runs what its config runs now (:func:`hparams_drift`), or None."""
    drift = hparams_drift(finished.config, finished.result)
    if not drift:
        return None
    return "its hparams differ from what its settings give now: " + "; ".join(
        f"{k} {'ran ' + json.dumps(d['ran']) if 'ran' in d else 'not recorded'}, now {json.dumps(d['now'])}"
        for k, d in sorted(drift.items()))


def parse_sizes(text: str, what: str = "sizes") -> list[Union[int, str]]:
    """"10,100,all" -> [10, 100, "all"] (also the draws, "0,1,2" or "all"; ``what`` names them in errors)."""
    sizes: list[Union[int, str]] = []
    for part in text.split(","):
        part = part.strip()
        if part != "all" and not part.isdigit():
            raise ValueError(f"{what} are ints or 'all', comma-separated, got {part!r}")
        sizes.append(part if part == "all" else int(part))
    return sizes


def parse_draws(text: str) -> list[Union[int, str]]:
    """"0,1,2" -> [0, 1, 2]; "all" -> ["all"] (every test draw at once)."""
    return parse_sizes(text, "draws")


EXPERIMENT = engine.register(engine.Experiment(
    name=NAME,
    help="issue 32: the editing benchmark on SmolLM2-135M — ours vs ROME, MEMIT, AlphaEdit, GRACE, WISE",
    claims=(),
    grid=_scale_grid,
    run_cell=run_cell,
    summarize=report.summarize,
    plot=report.plot,
    tags=("hf",),
    devices=engine.CPU_OR_CUDA,
    stale=stale_reason,
))
