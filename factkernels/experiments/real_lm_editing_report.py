"""Summaries, the docs table and the figures of the real-lm-editing cells (:mod:`.real_lm_editing`).

A row is one (model, kind, split, method, settings, protocol, n) over its draws (a cell of every test draw at once,
draw "all", is a row of its own: its ``draws`` are ["all"]): every numeric metric of
``hf.metrics.score_cases`` as its mean and 95 % Student-t interval over the draws (``metrics.over_draws``),
the harmonic mean of the three mean scores (efficacy, paraphrase, neighbourhood), and the edit's wall and
CPU seconds (an edit that restored its fitted targets from a checkpoint counts that fit's wall seconds, and its
CPU seconds where recorded (ours); an editor's CPU seconds are then unknown). A cell that ran other hyperparameters than its settings give now (a preset moved
since: ``real_lm_editing.hparams_drift``) is a row of its own, labelled by the values it ran (:func:`settings_label`).

Figures: ``real_lm_triangle`` — reliability (efficacy score), generalization (paraphrase score) and locality
(neighbourhood score) in three aligned panels (stacked, methods shared), one bar per method and number of
edits with its 95 % interval, the unedited model's value as a dashed line. Three panels rather than a ternary
or radar plot: the three scores do not sum to one (a ternary plot needs proportions), and a radar plot's area
depends on the order of its axes and hides the intervals; aligned 0..1 axes let each score be read against the
unedited model and the other methods. ``real_lm_scaling`` — the three scores, KL (on all held-out texts and on
those naming no edited subject) and perplexity ratio against the number of edits (log axis), a line per method. ``real_lm_seconds`` — CPU (bars) and wall (×) seconds per
edit call per method and size (log axis).
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

SCORES = (("efficacy_score", "reliability: efficacy score"), ("paraphrase_score", "generalization: paraphrase score"),
          ("neighbourhood_score", "locality: neighbourhood score"))
TABLE_METRICS = ("efficacy_score", "paraphrase_score", "neighbourhood_score", "efficacy_exact", "paraphrase_exact",
                 "neighbourhood_exact", "fluency", "consistency", "kl_mean", "kl_mean_unmentioned", "perplexity_ratio")


def _order() -> tuple[str, ...]:
    from .real_lm_editing import METHODS

    return METHODS


def row_size(row: dict) -> tuple[Any, bool]:
    """What a row's edits are: (n, whether every test draw was edited at once), the rows compared side by side."""
    from ..datasets.editing_benchmark import ALL_DRAWS

    return row["n"], row["draws"] == [ALL_DRAWS]


def _size_key(size: tuple[Any, bool]) -> tuple[float, bool]:
    n, at_once = size
    return math.inf if n == "all" else float(n), at_once


def _edit_cpu(seconds: dict, wall: str) -> float:
    """A cell's CPU seconds, or NaN when unknown: a cell that restored its fitted targets from a checkpoint
    ("targets_restored": that fit's wall seconds, added to its wall time) adds their CPU seconds
    ("targets_restored_cpu", ours) or, the editors' without them, has no CPU count of the fit."""
    if "targets_restored" in seconds and "targets_restored_cpu" not in seconds:
        return math.nan
    return seconds.get(f"{wall}_cpu", math.nan) + seconds.get("targets_restored_cpu", 0.0)


def settings_text(settings: dict) -> str:
    """A cell's settings as short text: "k=v, ..." (sorted), or "defaults"."""
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(settings.items())) or "defaults"


def settings_label(row: dict) -> str:
    """A row's settings as the table and figures name them: :func:`settings_text`, and for cells that ran before
    their preset moved, "(as of k=v, ...)": the values they ran where these differ from what the settings give now,
    and "before k, ...": fields added since, which they did not record."""
    drift = row.get("hparams_drift")
    if not drift:
        return settings_text(row["settings"])
    ran = {k: d["ran"] for k, d in drift.items() if "ran" in d}
    added = sorted(k for k, d in drift.items() if "ran" not in d)
    parts = ([f"as of {settings_text(ran)}"] if ran else []) + ([f"before {', '.join(added)}"] if added else [])
    return f"{settings_text(row['settings'])} ({'; '.join(parts)})"


def _all_or_none(values: list[float]) -> list[float]:
    """``values``, or [NaN] when one is unknown (a mean over the other draws would understate the cost)."""
    return [math.nan] if any(math.isnan(v) for v in values) else values


def _interval(values: list[float]) -> dict:
    from ..hf.metrics import t_interval

    return t_interval(values)


def summarize(cells: list) -> dict:
    """{"rows": one row per (model, kind, split, method, settings, protocol, n, hyperparameters that differ from
    what the settings give now) over its draws, "claims": {}}; a row of cells whose hyperparameters differ holds
    them as "hparams_drift" (``real_lm_editing.hparams_drift``)."""
    from ..datasets.editing_benchmark import ALL_DRAWS
    from ..hf.metrics import KINDS, harmonic_mean, over_draws
    from .real_lm_editing import hparams_drift

    groups: dict[str, tuple[dict, list]] = {}
    for c in cells:
        cfg = c.config
        drift = hparams_drift(cfg, c.result)
        key = json.dumps([cfg["model"], cfg["kind"], cfg["split"], cfg["method"], cfg["settings"], cfg["protocol"],
                          cfg["n"], cfg["draw"] == ALL_DRAWS, drift], sort_keys=True)
        groups.setdefault(key, (drift, []))[1].append(c)
    order = _order()
    rows = []
    for drift, members in groups.values():
        members.sort(key=lambda c: c.config["draw"])
        cfg = members[0].config
        per_draw = [c.result["scores"] for c in members]
        stats = over_draws(per_draw)
        means = [stats[f"{k}_score"]["mean"] for k in KINDS]
        seconds = [c.result["seconds"] for c in members]
        wall = "baseline" if cfg["method"] == "unedited" else "edit"
        rows.append({**{k: cfg[k] for k in ("model", "kind", "split", "method", "settings", "protocol", "n")},
                     "draws": [c.config["draw"] for c in members], "metrics": stats,
                     "by_relation": _by_relation(per_draw),
                     "hmean": harmonic_mean(means),
                     "seconds": _interval([s[wall] + s.get("targets_restored", 0.0) for s in seconds]),
                     "cpu_seconds": _interval(_all_or_none([_edit_cpu(s, wall) for s in seconds])),
                     **({"hparams_drift": drift} if drift else {})})
    rows.sort(key=lambda r: (r["model"], r["kind"], r["split"], _size_key(row_size(r)),
                             order.index(r["method"]) if r["method"] in order else len(order),
                             r["protocol"], settings_label(r)))
    return {"rows": rows, "comparison": compare(rows), "claims": {}}


def compare(rows: list[dict]) -> list[dict]:
    """Per (model, kind, split, :func:`row_size`) where ours and another method ran: ours' best row (harmonic mean)
    against the other method with the best harmonic mean, and per score how far ours is below the best other
    method's (issue 32's target: the best harmonic mean, no score more than 0.05 below the best baseline's)."""
    from ..hf.metrics import KINDS

    def key_of(r: dict) -> tuple:
        return r["model"], r["kind"], r["split"], row_size(r)

    out = []
    for key in sorted({key_of(r) for r in rows}, key=lambda k: (*k[:3], _size_key(k[3]))):
        same = [r for r in rows if key_of(r) == key]
        ours = [r for r in same if r["method"] == "ours"]
        others = [r for r in same if r["method"] not in ("ours", "unedited")]
        if not ours or not others:
            continue
        mine, best = max(ours, key=lambda r: r["hmean"]), max(others, key=lambda r: r["hmean"])
        below = {k: max(r["metrics"][f"{k}_score"]["mean"] for r in others) - mine["metrics"][f"{k}_score"]["mean"]
                 for k in KINDS}
        out.append({"model": key[0], "kind": key[1], "split": key[2], "n": key[3][0], "all_draws_at_once": key[3][1],
                    "ours_settings": mine["settings"], "ours_hmean": mine["hmean"], "best_other": best["method"],
                    "best_other_protocol": best["protocol"], "best_other_settings": best["settings"],
                    "best_other_hmean": best["hmean"], "ours_below_best_other": below,
                    "best_hmean": mine["hmean"] >= best["hmean"], "within_0.05": max(below.values()) <= 0.05})
    return out


def _by_relation(per_draw: list[dict]) -> dict:
    """{relation: {score: mean over the draws' cases of that relation}} (cases weighted equally; single-protocol
    cells keep no breakdown, so they give {})."""
    out: dict = {}
    for scores in per_draw:
        for relation, part in scores.get("by_relation", {}).items():
            mine = out.setdefault(relation, {"num_cases": 0})
            n = part["num_cases"]
            for k, v in part.items():
                if k != "num_cases" and v == v:  # NaN: no such prompt in this draw
                    total, count = mine.get(k, (0.0, 0))
                    mine[k] = (total + v * n, count + n)
            mine["num_cases"] += n
    return {rel: {k: (v if k == "num_cases" else v[0] / v[1]) for k, v in part.items()}
            for rel, part in sorted(out.items())}


def _pm(stat: Optional[dict], digits: int = 3, style: str = "f") -> str:
    """"mean ± half-width" of a t_interval (just the mean for one draw; "–" when missing)."""
    if not stat or stat["mean"] is None or stat["mean"] != stat["mean"]:
        return "–"
    text = f"{stat['mean']:.{digits}{style}}"
    if stat["n"] >= 2 and stat["high"] is not None and stat["high"] == stat["high"]:
        text += f" ± {(stat['high'] - stat['low']) / 2:.{digits}{style}}"
    return text


def _size_text(row: dict) -> str:
    cases = row["metrics"]["num_cases"]["mean"]
    return f"all ({cases:.0f})" if row["n"] == "all" else str(row["n"])


def draws_text(row: dict) -> str:
    """How many draws a row's numbers come from: "3", or "3 at once" for one cell of every test draw."""
    from ..datasets.editing_benchmark import NUM_TEST_DRAWS

    return f"{NUM_TEST_DRAWS} at once" if row_size(row)[1] else str(len(row["draws"]))


def markdown_table(summary: dict, *, kind: str = "known", split: str = "test", model: str = "smollm2-135m") -> str:
    """The test-draw table: per number of edits and method, every score as mean ± 95 % t half-width over draws,
    the harmonic mean of the three scores, KL, perplexity ratio and the edit's seconds (wall, CPU)."""
    head = ["edits", "method", "protocol", "settings", "draws", "efficacy", "paraphrase", "neighbourhood",
            "harmonic mean", "efficacy exact", "paraphrase exact", "neighbourhood exact", "fluency", "consistency",
            "KL", "KL, texts naming no edited subject", "ppl ratio", "seconds (CPU)"]
    mine = [r for r in summary["rows"] if (r["kind"], r["split"], r["model"]) == (kind, split, model)]
    if not mine:
        return f"No {kind}-fact cells on the {split} draws yet."
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in mine:
        m = r["metrics"]
        cells = [_size_text(r), r["method"], r["protocol"], settings_label(r), draws_text(r)]
        cells += [_pm(m.get(k)) for k in TABLE_METRICS[:3]] + [f"{r['hmean']:.3f}"]
        cells += [_pm(m.get(k)) for k in TABLE_METRICS[3:6]]
        cells += [_pm(m.get("fluency"), 2), _pm(m.get("consistency")), _pm(m.get("kl_mean"), 1, "e"),
                  _pm(m.get("kl_mean_unmentioned"), 1, "e"), _pm(m.get("perplexity_ratio"), 4)]
        cpu = r["cpu_seconds"]["mean"]
        cells.append(f"{r['seconds']['mean']:.0f}" + (f" ({cpu:.0f})" if cpu == cpu else ""))
        lines.append("| " + " | ".join(cells) + " |")
    if any("hparams_drift" in r for r in mine):
        lines.append("\nSettings marked \"(as of ...)\" are cells run before their preset moved: the values they ran "
                     "where these differ from the preset now (\"before\": settings added since, which they did not record).")
    ceiling = [r for r in summary["rows"] if (r["kind"], r["split"], r["model"], r["method"]) ==
               (kind, split, model, "unedited")]
    if ceiling and kind == "known":  # greedy true object under held-out templates: how far paraphrases can go
        # (invented subjects have no true object: their target_true is another object of the relation)
        lines.append("\nThe unedited model's own cross-template consistency (held-out templates, greedy true object; "
                     "the ceiling of paraphrase exact): "
                     + ", ".join(f"{_size_text(r)} cases {_pm(r['metrics'].get('paraphrase_true_exact'))}" for r in ceiling)
                     + ".")
    for c in summary.get("comparison", []):
        if (c["kind"], c["split"], c["model"]) == (kind, split, model):
            gaps = ", ".join(f"{k} {v:+.3f}" for k, v in c["ours_below_best_other"].items())
            at_once = " of every test draw at once" if c["all_draws_at_once"] else ""
            lines.append(f"\nAt {c['n']} edits{at_once}: ours' harmonic mean {c['ours_hmean']:.3f} against the best other "
                         f"method's, {c['best_other']} ({c['best_other_protocol']}) {c['best_other_hmean']:.3f}; the best "
                         f"other score minus ours: {gaps}.")
    return "\n".join(lines)


def headline_rows(summary: dict, model: str = "smollm2-135m") -> tuple[dict, Optional[dict], Optional[dict]]:
    """(ours at the most cases on the known-fact test draws (its best settings by harmonic mean), the other
    method with the best harmonic mean at that size, the unedited model at that size; None where not run)."""
    rows = [r for r in summary["rows"] if (r["model"], r["kind"], r["split"]) == (model, "known", "test")]
    ours = max((r for r in rows if r["method"] == "ours"), key=lambda r: (_size_key(row_size(r)), r["hmean"]))
    same = [r for r in rows if row_size(r) == row_size(ours)]
    others = [r for r in same if r["method"] not in ("ours", "unedited")]
    unedited = next((r for r in same if r["method"] == "unedited"), None)
    return ours, max(others, key=lambda r: r["hmean"]) if others else None, unedited


def _rows_for(summary: dict) -> list[dict]:
    """The rows the figures draw: the test split of the first model and kind present (known before new)."""
    rows = summary["rows"]
    if not rows:
        return []
    test = [r for r in rows if r["split"] == "test"] or rows
    kind = "known" if any(r["kind"] == "known" for r in test) else test[0]["kind"]
    model = next(r["model"] for r in test if r["kind"] == kind)
    return [r for r in test if r["kind"] == kind and r["model"] == model]


def _label(row: dict, methods_with_many: set) -> str:
    if row["method"] not in methods_with_many:
        return row["method"]
    return f"{row['method']} ({row['protocol']}, {settings_label(row)})"


def _series(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows by curve (a method, or a method's protocol and settings when it has several), sizes ascending."""
    variants: dict[str, set] = {}
    for r in rows:
        variants.setdefault(r["method"], set()).add((r["protocol"], settings_label(r)))
    many = {m for m, v in variants.items() if len(v) > 1}
    out: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: _size_key(row_size(r))):
        out.setdefault(_label(r, many), []).append(r)
    return out


def _legend(rows: list[dict], size: tuple[Any, bool]) -> str:
    """A size's legend entry: "10 edits", "all (248) edits", "all (745) edits, 3 draws at once"."""
    row = next(r for r in rows if row_size(r) == size)
    return f"{_size_text(row)} edits" + (f", {draws_text(row)}" if size[1] else "")


def _error(stat: dict) -> tuple[float, float]:
    if stat["n"] < 2 or stat["high"] is None or stat["high"] != stat["high"]:
        return 0.0, 0.0
    return stat["mean"] - stat["low"], stat["high"] - stat["mean"]


def plot(summary: dict, cells: list) -> dict:
    rows = _rows_for(summary)
    if not rows:
        return {}
    return {"real_lm_triangle": _triangle(rows), "real_lm_scaling": _scaling(rows), "real_lm_seconds": _seconds(rows)}


def _triangle(rows: list[dict]):
    from .plotting import panels

    series = {k: v for k, v in _series(rows).items() if v[0]["method"] != "unedited"}
    unedited = {row_size(r): r for r in rows if r["method"] == "unedited"}
    sizes = sorted({row_size(r) for members in series.values() for r in members}, key=_size_key)  # with a bar
    fig, axes = panels(1, nrows=3, width=max(6.0, 0.3 * len(series) * len(sizes) + 2), height=2.6)
    width = 0.8 / max(1, len(sizes))
    for ax, (metric, title) in zip(axes, SCORES):
        for j, n in enumerate(sizes):
            xs, ys, errs = [], [], [[], []]
            for i, members in enumerate(series.values()):
                row = next((r for r in members if row_size(r) == n), None)
                if row is None:
                    continue
                stat = row["metrics"][metric]
                xs.append(i + (j - (len(sizes) - 1) / 2) * width)
                ys.append(stat["mean"])
                lo, hi = _error(stat)
                errs[0].append(lo), errs[1].append(hi)
            ax.bar(xs, ys, width=width, yerr=errs, capsize=2, color=f"C{j}", label=_legend(rows, n))
            base = unedited.get(n)
            if base is not None:
                ax.axhline(base["metrics"][metric]["mean"], color=f"C{j}", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(series)), list(series) if ax is axes[-1] else [], rotation=30, ha="right", fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(title, fontsize=8)
    if sizes:  # a grid of the unedited model alone has no bars
        axes[0].legend(fontsize=7, title="dashed: unedited", title_fontsize=7, loc="upper left",
                       bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def _styles(series: dict[str, list[dict]]) -> dict[str, dict]:
    """Line styles by curve: one colour per method (the unedited model grey), a marker and dash per variant of it,
    so a method's settings stay together and a dozen curves stay apart (the default cycle repeats after ten)."""
    methods = list(dict.fromkeys(members[0]["method"] for members in series.values()))
    variants: dict[str, int] = {}
    styles = {}
    for label, members in series.items():
        method = members[0]["method"]
        k = variants[method] = variants.get(method, -1) + 1
        styles[label] = {"color": "0.5" if method == "unedited" else f"C{methods.index(method) % 10}",
                         "marker": "osD^v"[k % 5], "linestyle": ("-", "--", ":", "-.")[k % 4]}
    return styles


def _scaling(rows: list[dict]):
    from .plotting import panels

    metrics = SCORES + (("kl_mean", "KL on held-out text"),
                       ("kl_mean_unmentioned", "KL, texts naming no edited subject"),
                       ("perplexity_ratio", "perplexity ratio on held-out text"))
    series = _series(rows)
    styles = _styles(series)
    fig, axes = panels(3, nrows=2, width=3.6, height=3.0)
    for label, members in series.items():
        xs = [r["metrics"]["num_cases"]["mean"] for r in members]
        for ax, (metric, _) in zip(axes, metrics):
            stats = [r["metrics"].get(metric) for r in members]
            if any(s is None for s in stats):
                continue
            means = [s["mean"] for s in stats]
            # KL >= 0 and the ratio > 0: a t-interval over 3 draws reaching below is the interval's, not the data's
            floor = 0.0 if metric.startswith("kl") else 0.5 if metric == "perplexity_ratio" else None
            errs = [(mean - max(mean - lo, floor) if floor is not None else lo, hi)
                    for mean, (lo, hi) in zip(means, (_error(s) for s in stats))]
            ax.errorbar(xs, means, yerr=list(zip(*errs)), capsize=2, markersize=4, label=label, **styles[label])
    for ax, (metric, title) in zip(axes, metrics):
        ax.set_xscale("log")
        ax.set_xlabel("edits at once", fontsize=8)
        ax.set_title(title, fontsize=9)
    for ax in axes[:3]:
        ax.set_ylim(0, 1.05)
    for ax in axes[3:5]:
        ax.set_yscale("symlog", linthresh=1e-6)
        ax.set_ylim(bottom=0)
    axes[5].set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.07 + 0.018 * ((len(labels) + 1) // 2), 1, 1))
    return fig


def _seconds(rows: list[dict]):
    from .plotting import panels

    series = {k: v for k, v in _series(rows).items() if v[0]["method"] != "unedited"}
    sizes = sorted({row_size(r) for r in rows}, key=_size_key)
    fig, axes = panels(1, width=max(5.0, 0.8 * len(series) * len(sizes)))
    ax = axes[0]
    width = 0.8 / max(1, len(sizes))
    for j, n in enumerate(sizes):
        xs, cpu, wall = [], [], []
        for i, members in enumerate(series.values()):
            row = next((r for r in members if row_size(r) == n), None)
            if row is not None:
                xs.append(i + (j - (len(sizes) - 1) / 2) * width)
                cpu.append(row["cpu_seconds"]["mean"])
                wall.append(row["seconds"]["mean"])
        ax.bar(xs, cpu, width=width, color=f"C{j}", label=_legend(rows, n))
        ax.plot(xs, wall, "kx", markersize=5, label="wall" if j == 0 else None)
    ax.set_xticks(range(len(series)), list(series), rotation=30, ha="right", fontsize=7)
    ax.set_yscale("log")
    # the machine is shared: wall seconds grow with its load, the process's CPU seconds much less
    ax.set_ylabel("seconds per edit call\n(bars: CPU, ×: wall; mean over draws)", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
