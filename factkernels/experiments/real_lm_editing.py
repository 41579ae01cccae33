"""Issue 12 part 6: facts into a real pretrained LM — insertion by construction vs ROME, MEMIT, AlphaEdit.

One cell = (method, n_facts, layer, seed) on one model: ``hf.book_requests(n_facts, seed)``
(counterfactual authors for shipped book titles) are written into the model by ``method``, scored by
the one ``hf.evaluate`` (efficacy, paraphrase, neighborhood, their harmonic mean "score", perplexity
ratio and mean KL against the unedited model on the held-out ``natural_text("eval")``), and undone
(``Insertion.remove`` / ``EditResult.restore``) before the next cell. ``layer`` is the insertion
layer for "ours" (a sweep) and the published default layers for the editors (layer = -1).

Editors run a grid (``EDITOR_GRIDS``, cut from the seed's App. A.3.4 grids for CPU time): their
update-rule setting in full (MEMIT's λ, AlphaEdit's null-space tolerance) at the published
residual step and at a stronger one (100 Adam steps at lr 0.5). Cells of one residual step share
δ (``hf.edit(targets=...)`` within a process; its chunks in ``OUT/NAME/partial/shared-*.safetensors``
across processes, until the grid is complete), so a grid costs one δ per residual step, and MEMIT and
AlphaEdit share theirs (same last layer and clamp); ``edit_seconds`` always counts that δ, as a
standalone edit would. The comparison takes each
method's best grid point by score, as the seed's editing protocol does.

Scales: tiny — a 3-layer random Llama built from a LlamaConfig with a word-level tokenizer over the
requests' and texts' words (CI seconds; no numbers worth reading); quick — SmolLM2-135M, 10 facts,
every method, ours with target-position keys at three layers and subject keys at layers 5 and 10;
seed — SmolLM2-135M, 10/100/1,000 facts, ours at six layers (target keys) and two (subject keys).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

from ..editing import hparams as _hparams, method_names
from . import engine

NAME = "real-lm-editing"
METHODS = ("ours", *method_names(real_lm=True, kind="weights"))
EDITOR_LAYERS = -1  # "the editor's published default layers"
METRICS = ("efficacy", "paraphrase", "neighborhood", "score", "perplexity_ratio", "kl_mean", "edit_seconds")
# Residual steps: the published one ({}) and a stronger one; per method, the update-rule grid (the seed's
# App. A.3.4 values, MEMIT's published λ rescaled to SmolLM2's MLP width first; AlphaEdit's published threshold
# 2e-2 in place of the seed grid's 1e-2).
STRONG_STEP = {"steps": 100, "lr": 0.5}
MEMIT_LAMBDA = _hparams("memit", num_layers=30, mlp_width=1536).mom2_weight  # 1.5e4 · 1536 / 16384
EDITOR_GRIDS: dict[str, list[dict]] = {
    "rome": [{}, STRONG_STEP],
    "memit": [{**step, "mom2_weight": lam} for step in ({}, STRONG_STEP) for lam in (MEMIT_LAMBDA, 1.5e4, 1.5e2, 1.0)],
    "alphaedit": [{**step, "nullspace_threshold": tol} for step in ({}, STRONG_STEP) for tol in (2e-2, 1.0, 10.0)],
}


def _grid(scale: str) -> list[dict]:
    if scale == "tiny":
        model, sizes, our_layers, subject_layers = "tiny", (4,), (2, 1), (1,)
    elif scale == "quick":
        model, sizes, our_layers, subject_layers = "smollm2-135m", (10,), (29, 20, 10), (5, 10)
    else:
        model, sizes, our_layers, subject_layers = "smollm2-135m", (10, 100, 1000), (29, 25, 20, 15, 10, 5), (5, 10)
    cells = []
    for n in sizes:
        ours = [{"model": model, "method": "ours", "n_facts": n, "layer": layer, "seed": 0} for layer in our_layers]
        # keys at the subject's last token (ROME's key), values through the model: the way to paraphrases
        ours += [{"model": model, "method": "ours", "n_facts": n, "layer": layer, "seed": 0, "position": "subject"}
                 for layer in subject_layers]
        grids = {m: g[:2] for m, g in EDITOR_GRIDS.items()} if scale == "tiny" else EDITOR_GRIDS  # CI: reuse once
        editors = [_editor_cell(model, m, n, hp) for m in METHODS[1:] for hp in grids[m]]
        cells += ours[:1] + editors + ours[1:]  # the comparison first, the rest of the sweep after
    return cells


def _editor_cell(model: str, method: str, n: int, hparams: dict) -> dict:
    """An editor's cell; the published setting (the first grid point) carries no "hparams" key."""
    defaults = _published(method)
    published = {k: v for k, v in hparams.items() if v != defaults.get(k)}
    cell = {"model": model, "method": method, "n_facts": n, "layer": EDITOR_LAYERS, "seed": 0}
    return cell | ({"hparams": published} if published else {})


def _published(method: str) -> dict:
    """The method's published settings moved to SmolLM2-135M (30 layers, MLP width 1,536)."""
    from ..editing import as_dict, hparams

    return as_dict(hparams(method, num_layers=30, mlp_width=1536))


def _tiny_model(words: tuple[str, ...]) -> tuple[Any, Any]:
    """A random 3-layer Llama (d=32, SwiGLU 64, initializer_range 0.2) with a word-level tokenizer over ``words``."""
    import tokenizers
    import torch
    import transformers

    vocab = {w: i for i, w in enumerate(("[UNK]", "[PAD]", *words))}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = tokenizers.normalizers.Lowercase()
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      hidden_act="silu", pad_token_id=1, initializer_range=0.2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), tok


@lru_cache(maxsize=1)
def _model(name: str, words: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """The cell's model, loaded once per process (cells always leave it unedited)."""
    from .. import hf

    return _tiny_model(words) if name == "tiny" else hf.load(name)


def _texts(split: str, tiny: bool) -> list[str]:
    """The shipped text of ``split``; at tiny scale four 40-word snippets of it."""
    from ..datasets import natural_text

    texts = natural_text(split)
    return [" ".join(t.split()[:40]) for t in texts[:4]] if tiny else texts


def _setup(config: dict) -> tuple[Any, list[str], Any, Any]:
    """(request set, held-out texts, model, tokenizer) of a cell; the model is shared by every cell."""
    from .. import hf

    tiny = config["model"] == "tiny"
    facts = hf.book_requests(config["n_facts"], seed=config["seed"], paraphrases_per_fact=1 if tiny else 2)
    texts = _texts("eval", tiny)
    words: tuple[str, ...] = ()
    if tiny:
        everything = [r.text + r.target_new for r in facts.requests + facts.paraphrases] + list(facts.neighborhood)
        words = tuple(sorted({w.lower() for t in everything + texts + _texts("stats", True) for w in t.split()}))
    model, tok = _model(config["model"], words)
    return facts, texts, model, tok


# δ of the last residual step run in this process: (ResidualTargets, seconds it took).
_SHARED_TARGETS: dict[tuple, tuple[Any, float]] = {}


def residual_step_key(config: dict, model: Any, hparams: dict) -> tuple:
    """What δ depends on: model, facts, the layer it is trained at (the method's last edited layer), what its
    norm is clamped against (ROME: the MLP output; MEMIT, AlphaEdit: the layer output) and the residual-step
    settings; not the method, so MEMIT and AlphaEdit cells with one last layer and step share one δ.
    Public: ``benchmarks/memit_null_directions.py`` shares δ across methods by the same key."""
    from ..hf.editors import resolve_hparams

    hp = resolve_hparams(model, config["method"], None, hparams)
    return (config["model"], config["n_facts"], config["seed"], int(hp.layers[-1]),
            "mlp" if config["method"] == "rome" else "layer", repr(sorted(hp.residual_settings().items())))


def run_cell(config: dict) -> dict:
    import time

    from .. import hf
    from ..hf.evaluate import evaluate, record_reference

    tiny = config["model"] == "tiny"
    facts, texts, model, tok = _setup(config)
    reference = record_reference(model, tok, neighborhood=facts.neighborhood, texts=texts)
    start = time.perf_counter()
    if config["method"] not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {config['method']!r}")
    if config["method"] == "ours":
        partial = engine.partial_path()  # δ through the model takes hours at 1,000 facts: finished chunks are kept
        kwargs: dict = {"background": _texts("stats", tiny), "position": config.get("position", "target"),
                        "checkpoint": None if partial is None else partial.with_suffix(".safetensors")}
        if tiny:
            kwargs.update(value_steps=10)
        applied = hf.insert_facts(model, tok, facts.requests, layer=config["layer"], progress=False, **kwargs)
        undo, report = applied.remove, {"hidden_added": applied.report.hidden_added,
                                        "insert_efficacy": applied.report.efficacy}
        start -= applied.report.values.get("value_restored_seconds", 0.0)  # chunks done by an earlier run
    else:
        hparams = {"layers": [1], "steps": 10, "prefixes": [[4, 2]]} if tiny else {}
        hparams.update(config.get("hparams", {}))
        stats = None
        if tiny:  # tiny vocabulary: the shipped text is mostly unknown words; use the tiny texts
            from ..hf.statistics import key_second_moments

            stats = key_second_moments(model, tok, hparams["layers"], texts=texts, cache_dir=False)
        step_key = residual_step_key(config, model, hparams)
        shared = _SHARED_TARGETS.get(step_key)
        # the residual step's chunks go to a file of the step, not of the cell: every cell of that step (in
        # any process or session) reads them back instead of training δ again
        step_file = engine.shared_partial_path({"residual_step": list(step_key)})
        applied = hf.edit(model, tok, facts.requests, method=config["method"], stats=stats, progress=False,
                          targets=shared[0] if shared else None,
                          checkpoint=None if step_file is None else step_file.with_suffix(".safetensors"), **hparams)
        step_seconds = shared[1] if shared else applied.report["targets_seconds"]
        if shared is None and applied.targets is not None:  # sequential edits train δ on the edited model
            _SHARED_TARGETS.clear()  # one residual step is kept: the grid's cells of one step run in a row
            _SHARED_TARGETS[step_key] = (applied.targets, step_seconds)
        undo, report = applied.restore, {"nll_before": applied.report["nll_before"],
                                         "nll_target": applied.report["nll_target"],
                                         "targets_reused": applied.report["targets_reused"],
                                         "targets_seconds": step_seconds,
                                         "targets_restored_seconds": 0.0 if shared or applied.targets is None
                                         else applied.targets.restored_seconds}
        # a standalone edit trains its δ; chunks of it read from a checkpoint count the time they took then
        start -= shared[1] if shared else report["targets_restored_seconds"]
    edit_seconds = time.perf_counter() - start
    try:
        scores = evaluate(model, tok, facts.requests, paraphrases=facts.paraphrases, neighborhood=facts.neighborhood,
                          texts=texts, reference=reference)
    finally:
        undo()
    return {**{k: v for k, v in scores.items() if isinstance(v, (int, float))}, **report, "edit_seconds": edit_seconds}


def _setting_text(hparams: dict) -> str:
    """Grid point as text: "published", or its departures from the published settings."""
    names = {"mom2_weight": "λ", "nullspace_tol": "tol"}
    return ", ".join(f"{names.get(k, k)}={v:g}" for k, v in sorted(hparams.items())) or "published"


def _rows(cells: list[engine.Cell]) -> list[dict]:
    rows = []
    order = sorted(cells, key=lambda c: (c.config["n_facts"], METHODS.index(c.config["method"]), c.config["layer"],
                                         _setting_text(c.config.get("hparams", {}))))
    for c in order:
        rows.append({"method": c.config["method"], "n_facts": c.config["n_facts"], "layer": c.config["layer"],
                     "setting": (_setting_text(c.config.get("hparams", {})) if c.config["method"] != "ours"
                                 else f"keys at {c.config.get('position', 'target')}"),
                     "seed": c.config["seed"], **{m: c.result.get(m) for m in METRICS}})
        rows[-1]["kl_mean"] = max(rows[-1]["kl_mean"], 0.0)  # >= 0; below is float32 rounding (see hf.evaluate)
    return rows


def _best(rows: list[dict], method: str, n: int) -> Optional[dict]:
    """A method's best row at n facts: highest score, then lowest KL."""
    mine = [r for r in rows if r["method"] == method and r["n_facts"] == n]
    return max(mine, key=lambda r: (r["score"], -r["kl_mean"])) if mine else None


def summarize(cells: list[engine.Cell]) -> dict:
    """Every cell as a table row, and per fact count: each method's best grid point (ours: its best
    layer), and ours against the best editor (score) and the least-KL editor point."""
    rows = _rows(cells)
    comparison = {}
    for n in sorted({r["n_facts"] for r in rows}):
        best = {m: b for m in METHODS if (b := _best(rows, m, n)) is not None}
        editors = [r for r in rows if r["n_facts"] == n and r["method"] != "ours"]
        if "ours" not in best or not editors:
            continue
        best_ours = best["ours"]
        best_editor = max((best[m] for m in METHODS[1:] if m in best), key=lambda r: (r["score"], -r["kl_mean"]))
        least_kl = min(r["kl_mean"] for r in editors)
        comparison[str(n)] = {"best": {m: {k: r[k] for k in ("layer", "setting", "score", "efficacy", "kl_mean")}
                                       for m, r in best.items()},
                              "ours_layer": best_ours["layer"], "ours_score": best_ours["score"],
                              "ours_kl_mean": best_ours["kl_mean"], "best_editor": best_editor["method"],
                              "best_editor_setting": best_editor["setting"],
                              "best_editor_score": best_editor["score"], "least_editor_kl_mean": least_kl,
                              "score_at_least_as_good": best_ours["score"] >= best_editor["score"],
                              "kl_at_least_as_good": best_ours["kl_mean"] <= least_kl}
    return {"rows": rows, "comparison": comparison, "claims": {}}


def markdown_table(summary: dict, best_only: bool = False) -> str:
    """The README table of a summary: one line per cell, or (best_only) each method's best point per fact count."""
    head = "| facts | method | layer | setting | efficacy | paraphrase | neighborhood | score | ppl ratio | KL | seconds |"
    lines = [head, "|" + "---|" * 11]
    rows = summary["rows"]
    if best_only:
        rows = [b for n in sorted({r["n_facts"] for r in rows}) for m in METHODS if (b := _best(rows, m, n))]
    for r in rows:
        layer = "default" if r["layer"] == EDITOR_LAYERS else str(r["layer"])
        # a ratio that overflowed is stored as null (JSON has no inf); its log sits in log_perplexity_ratio
        ppl = "inf" if r["perplexity_ratio"] is None else f"{r['perplexity_ratio']:.4f}"
        lines.append(f"| {r['n_facts']} | {r['method']} | {layer} | {r.get('setting', '')} | {r['efficacy']:.3f} | "
                     f"{r['paraphrase']:.3f} | "
                     f"{r['neighborhood']:.3f} | {r['score']:.3f} | {ppl} | "
                     f"{r['kl_mean']:.2e} | {r['edit_seconds']:.0f} |")
    return "\n".join(lines)


def plot(summary: dict, cells: list[engine.Cell]) -> dict:
    from .plotting import panels

    rows = summary["rows"]
    sizes = sorted({r["n_facts"] for r in rows})
    fig, axes = panels(2)
    for ax, metric, label in ((axes[0], "score", "harmonic-mean score"), (axes[1], "kl_mean", "mean KL on held-out text")):
        for i, method in enumerate(METHODS):
            values = []
            for n in sizes:  # each method's best point (ours: best layer; editors: best grid point)
                best = _best(rows, method, n)
                values.append(best[metric] if best else float("nan"))
            ax.bar([j + 0.2 * i for j in range(len(sizes))], values, width=0.2, label=method)
        ax.set_xticks([j + 0.3 for j in range(len(sizes))], [f"{n} facts" for n in sizes])
        ax.set_ylabel(label)
    axes[1].set_yscale("log")
    for j, n in enumerate(sizes):  # a KL of 0 (float32 precision) has no bar on the log axis: say so
        best = _best(rows, "ours", n)
        if best and best["kl_mean"] == 0.0:
            axes[1].annotate("ours: 0", (j, 0), xycoords=("data", "axes fraction"), xytext=(0, 4),
                             textcoords="offset points", ha="center", fontsize=8)
    axes[0].legend()
    figures = {"real_lm_editing": fig}
    if any(r["method"] == "ours" for r in rows):  # a grid of editors only has no layer sweep
        figures["real_lm_layers"] = _plot_layers(rows, sizes)
    return figures


def _plot_layers(rows: list[dict], sizes: list[int]):
    """Ours across insertion layers: neighbourhood, paraphrase and perplexity ratio per fact count; target keys
    as lines, subject keys as open markers."""
    from .plotting import panels

    fig, axes = panels(3, width=4.4)
    metrics = (("neighborhood", "neighbourhood kept"), ("paraphrase", "paraphrase accuracy"),
               ("perplexity_ratio", "perplexity ratio (held-out text)"))
    for i, n in enumerate(sizes):
        color = f"C{i}"
        for position, style in (("target", {"marker": "o", "linestyle": "-"}),
                                ("subject", {"marker": "s", "linestyle": "none", "fillstyle": "none"})):
            mine = sorted((r for r in rows if r["method"] == "ours" and r["n_facts"] == n
                           and r["setting"] == f"keys at {position}"), key=lambda r: r["layer"])
            if not mine:
                continue
            for ax, (metric, _) in zip(axes, metrics):
                ax.plot([r["layer"] for r in mine], [r[metric] for r in mine], color=color,
                        label=f"{n} facts, {position} keys", **style)
    for ax, (_, label) in zip(axes, metrics):
        ax.set_xlabel("insertion layer")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


EXPERIMENT = engine.register(engine.Experiment(
    name=NAME,
    help="issue 12: facts into SmolLM2-135M — construction (layer sweep) vs ROME, MEMIT, AlphaEdit",
    claims=(),
    grid=_grid,
    run_cell=run_cell,
    summarize=summarize,
    plot=plot,
    tags=("hf",),
))
