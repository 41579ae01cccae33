"""The real-lm-editing experiment: its cells at tiny scale (a random 3-layer Llama; no packaged model needed),
its grids, its summary over draws and its command-line grid."""

import math

import pytest
import torch

pytest.importorskip("transformers")

from factkernels.experiments import engine, real_lm_editing as real_lm  # noqa: E402
from factkernels.experiments import real_lm_editing_report as report  # noqa: E402
from factkernels.hf.metrics import t_interval  # noqa: E402


def test_tiny_grid_runs_every_method_and_leaves_the_model_unedited(tiny_run, tmp_path):
    grid = real_lm._scale_grid("tiny")
    assert {c["method"] for c in grid} == set(real_lm.METHODS)
    res, folder = tiny_run(real_lm.NAME)
    assert res.missing == 0 and res.summary is not None
    assert {f for f in res.files if f.endswith(".png")} == {"real_lm_triangle.png", "real_lm_scaling.png",
                                                            "real_lm_seconds.png"}
    cells = engine.load_cells(folder.parent, real_lm.NAME)
    assert {k for k, c in cells.items() if real_lm.stale_reason(c)} == set()  # MODEL_SHAPES["tiny"] is the model's
    for c in cells.values():
        scores = c.result["scores"]
        for metric in ("efficacy_score", "paraphrase_score", "neighbourhood_score", "efficacy_exact"):
            assert 0.0 <= scores[metric] <= 1.0
        assert scores["num_cases"] == real_lm.TINY_CASES and c.result["requests"] == 5 * real_lm.TINY_CASES
        assert c.result["seconds"]["baseline"] > 0 and len(c.result["load_average"]) == 3
        if c.config["method"] != "unedited":  # scored against the unedited model of the same cases
            unedited = next(u.result["scores"] for u in cells.values() if u.config["method"] == "unedited")
            assert scores["unedited"]["efficacy_score"] == unedited["efficacy_score"]
            assert c.result["seconds"]["edit"] > 0 and c.result["seconds"]["edit_cpu"] >= 0
    # every cell undid its edit: a cell run again on the cached model leaves every weight as it was
    model, _ = real_lm.model_for("tiny")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for config in grid[1:]:
        if config["method"] in ("memit", "ours") or config["protocol"] == "single":
            engine.run(real_lm.NAME, tmp_path, grid=[config], quiet=True)
    after = model.state_dict()
    assert set(after) == set(state) and all(torch.equal(v, after[k]) for k, v in state.items())
    table = report.markdown_table(res.summary, model="tiny")
    assert len([line for line in table.splitlines() if line.startswith("|")]) == 2 + len(grid)  # a draw per row
    assert "| 4 | rome | single |" in table and "| 4 | rome | sequential |" in table


def test_finished_cells_are_kept_on_resume(tmp_path):
    config = real_lm.cell("unedited", n=2, draw=1, model="tiny")
    first = engine.run(real_lm.NAME, tmp_path, grid=[config], quiet=True, resume=True)
    again = engine.run(real_lm.NAME, tmp_path, grid=[config], quiet=True, resume=True)
    assert (first.ran, again.ran, again.kept) == (1, 0, 1)
    saved = engine.load_cells(tmp_path, real_lm.NAME)[engine.cell_key(config)]
    assert saved.result["scores"]["num_cases"] == 2 and saved.config == config


def test_ours_settings_name_insert_facts_defaults():
    """The experiment's settings for ours name the defaults that moved (so a cell says what it ran): they must be
    what insert_facts does when given none, or a default cell would run something its settings do not say."""
    import inspect

    from factkernels import hf
    from factkernels.hf import subject_keys, subject_values

    settings = real_lm.OURS_SETTINGS
    assert settings["partner_weight"] == subject_keys.PARTNER_WEIGHT > 0
    assert inspect.signature(hf.insert_facts).parameters["partner_weight"].default == subject_keys.PARTNER_WEIGHT
    assert settings["value_lr"] == subject_values.SUBJECT_VALUE_LR


def test_cells_and_grids_are_validated():
    assert real_lm.cell("rome", n=10)["protocol"] == "sequential"
    assert real_lm.cell("memit", n="all")["protocol"] == "batch"
    assert real_lm.cell("ours", n=10)["settings"] == real_lm.cell("ours", n=10, kind="new")["settings"] \
        == real_lm.OURS_SETTINGS
    assert real_lm.cell("alphaedit", n=100, protocol="single")["protocol"] == "single"
    assert real_lm.cell("ours", n="all", draw="all")["draw"] == "all"
    for bad in ({"method": "nope"}, {"method": "memit", "protocol": "sequential"}, {"method": "rome", "n": 0},
                {"method": "rome", "n": "most"}, {"method": "unedited", "settings": {"a": 1}},
                {"method": "rome", "kind": "old"}, {"method": "ours", "draw": 3}, {"method": "ours", "draw": True},
                {"method": "ours", "split": "validation", "draw": "all"}, {"method": "ours", "split": "train"}):
        with pytest.raises(ValueError):
            real_lm.cell(**{"n": 10, **bad})
    cells = real_lm.grid(["unedited", "memit"], [10, "all"], draws=[0, 2],
                         settings={"memit": [{"mom2_weight": 150}, {"mom2_weight": 1500}]})
    assert len(cells) == 2 * (1 + 2) * 2
    assert {c["settings"].get("mom2_weight") for c in cells if c["method"] == "memit"} == {150, 1500}
    with pytest.raises(ValueError, match="not in the grid"):
        real_lm.grid(["ours"], [10], settings={"memit": {}})
    assert real_lm.parse_sizes("10, 100,all") == [10, 100, "all"]
    assert real_lm.parse_draws("0,2") == [0, 2] and real_lm.parse_draws("all") == ["all"]
    with pytest.raises(ValueError):
        real_lm.parse_sizes("10,lots")
    seed = real_lm._scale_grid("seed")  # the paper's grid holds every method at every test case at once
    assert {c["method"] for c in seed if c["draw"] == "all" and c["n"] == "all"} == set(real_lm.METHODS)


def _fake_cell(method, draw, scores, seconds):
    config = real_lm.cell(method, n=10, draw=draw)
    full = {"num_cases": 10, **scores, "kl_mean": 0.0, "perplexity_ratio": 1.0}
    wall = "baseline" if method == "unedited" else "edit"
    return engine.Cell(engine.cell_key(config), config,
                       {"scores": full, "seconds": {wall: seconds, f"{wall}_cpu": seconds / 2}}, seconds)


def test_summary_gives_t_intervals_over_draws_and_the_harmonic_mean():
    values = [(0.9, 0.5, 1.0), (1.0, 0.3, 0.8), (0.8, 0.4, 0.9)]
    cells = [_fake_cell("memit", d, dict(zip(("efficacy_score", "paraphrase_score", "neighbourhood_score"), v)),
                        10.0 * (d + 1)) for d, v in enumerate(values)]
    cells.append(_fake_cell("unedited", 0, {"efficacy_score": 0.0, "paraphrase_score": 0.1,
                                            "neighbourhood_score": 1.0, "paraphrase_true_exact": 0.3}, 5.0))
    cells[0].result["scores"]["by_relation"] = {"capital": {"num_cases": 3, "paraphrase_score": 1.0},
                                                "currency": {"num_cases": 7, "paraphrase_score": 0.0}}
    cells[1].result["scores"]["by_relation"] = {"capital": {"num_cases": 1, "paraphrase_score": 0.0}}
    summary = report.summarize(cells)
    unedited, memit = summary["rows"]  # registry order: unedited first
    assert unedited["method"] == "unedited" and memit["draws"] == [0, 1, 2]
    para = memit["metrics"]["paraphrase_score"]
    assert para == pytest.approx(t_interval([0.5, 0.3, 0.4]))
    assert para["mean"] == pytest.approx(0.4) and para["high"] - para["mean"] == pytest.approx(
        4.302652729911275 * 0.1 / math.sqrt(3))  # t(0.975, 2) · s / √3
    assert memit["hmean"] == pytest.approx(3 / (1 / 0.9 + 1 / 0.4 + 1 / 0.9))
    assert memit["seconds"]["mean"] == pytest.approx(20.0) and memit["cpu_seconds"]["mean"] == pytest.approx(10.0)
    table = report.markdown_table(summary)
    assert "| 10 | memit | batch | defaults | 3 | 0.900 ± 0.248 | 0.400 ± 0.248 |" in table
    assert "| 10 | unedited | none | defaults | 1 | 0.000 |" in table
    assert "cross-template consistency" in table and "10 cases 0.300." in table
    # per relation: cases of every draw weighted equally
    assert memit["by_relation"]["capital"] == {"num_cases": 4, "paraphrase_score": pytest.approx(0.75)}
    assert memit["by_relation"]["currency"]["paraphrase_score"] == 0.0
    assert summary["comparison"] == []  # ours did not run
    assert report.markdown_table(summary, kind="new") == "No new-fact cells on the test draws yet."


def test_seconds_count_a_fit_restored_from_another_cell():
    scores = {"efficacy_score": 1.0, "paraphrase_score": 0.5, "neighbourhood_score": 1.0}
    cells = [_fake_cell("alphaedit", d, scores, 10.0) for d in range(2)]
    cells[1].result["seconds"]["targets_restored"] = 100.0  # the fit this cell read from MEMIT's checkpoint
    row, = report.summarize(cells)["rows"]
    assert row["seconds"]["mean"] == pytest.approx((10.0 + 110.0) / 2)
    assert math.isnan(row["cpu_seconds"]["mean"])  # that fit's CPU time was not recorded
    cells[1].result["seconds"]["targets_restored_cpu"] = 80.0  # ours' values chunks record theirs
    row, = report.summarize(cells)["rows"]
    assert row["cpu_seconds"]["mean"] == pytest.approx((5.0 + 85.0) / 2)


def test_comparison_puts_ours_against_the_best_other_method():
    scores = lambda e, p, n: {"efficacy_score": e, "paraphrase_score": p, "neighbourhood_score": n}  # noqa: E731
    cells = [_fake_cell("memit", 0, scores(1.0, 0.5, 0.8), 1.0), _fake_cell("rome", 0, scores(0.9, 0.6, 0.9), 1.0),
             _fake_cell("ours", 0, scores(1.0, 0.58, 1.0), 1.0)]
    (comparison,) = report.summarize(cells)["comparison"]
    assert comparison["best_other"] == "rome" and comparison["n"] == 10 and not comparison["all_draws_at_once"]
    assert comparison["ours_below_best_other"] == pytest.approx(
        {"efficacy": 0.0, "paraphrase": 0.02, "neighbourhood": -0.1})
    assert comparison["best_hmean"] and comparison["within_0.05"]
    assert comparison["ours_hmean"] == pytest.approx(3 / (1 + 1 / 0.58 + 1))
    ours, best, unedited = report.headline_rows(report.summarize(cells))
    assert (ours["method"], best["method"], unedited) == ("ours", "rome", None)
    # every test draw at once is compared apart: there only memit ran beside ours
    cells += [_fake_cell("memit", "all", scores(1.0, 0.2, 0.9), 1.0),
              _fake_cell("ours", "all", scores(1.0, 0.5, 1.0), 1.0)]
    per_draw, at_once = report.summarize(cells)["comparison"]
    assert per_draw["best_other"] == "rome" and not per_draw["all_draws_at_once"]
    assert at_once["best_other"] == "memit" and at_once["all_draws_at_once"] and at_once["n"] == 10
    ours, best, _ = report.headline_rows(report.summarize(cells))
    assert (ours["draws"], best["method"]) == (["all"], "memit")


def test_command_line_builds_the_grid(tmp_path):
    from factkernels.cli import _real_lm_grid, build_parser

    args = build_parser().parse_args(["experiment", "real-lm-editing", "--methods", "ours,rome", "--sizes", "10,all",
                                      "--draws", "0,1", "--hparams", '{"ours": {"layer": 5}}',
                                      "--protocols", '{"rome": ["sequential", "single"]}'])
    cells = _real_lm_grid(args)
    assert len(cells) == 2 * (1 + 2) * 2
    assert {c["settings"]["layer"] for c in cells if c["method"] == "ours"} == {5}
    union = build_parser().parse_args(["experiment", "real-lm-editing", "--methods", "unedited,ours", "--sizes", "all",
                                       "--draws", "all", "--device", "cuda"])
    assert [(c["method"], c["n"], c["draw"]) for c in _real_lm_grid(union)] == [("unedited", "all", "all"),
                                                                                ("ours", "all", "all")]
    assert union.device == "cuda"
    plain = build_parser().parse_args(["experiment", "real-lm-editing", "--quick"])
    assert _real_lm_grid(plain) is None
    bad = build_parser().parse_args(["experiment", "real-lm-editing", "--hparams", "{}"])
    with pytest.raises(ValueError, match="need --methods"):
        _real_lm_grid(bad)


def test_every_test_draw_at_once_is_one_cell_and_a_row_of_its_own(tmp_path):
    """Draw "all": the test draws' cases in turn, edited at once, summarized apart from the per-draw rows."""
    import matplotlib

    matplotlib.use("Agg")
    from factkernels.datasets.editing_benchmark import known_draw

    ours = {"settings": real_lm.TINY_SETTINGS["ours"], "model": "tiny"}
    grid = [real_lm.cell("unedited", n=6, draw="all", model="tiny"), real_lm.cell("ours", n=6, draw="all", **ours),
            real_lm.cell("unedited", n=6, draw=0, model="tiny"), real_lm.cell("ours", n=6, draw=0, **ours)]
    res = engine.run(real_lm.NAME, tmp_path, grid=grid, quiet=True)
    assert res.missing == 0 and len(res.files) == 4  # summary.json and the three figures
    union = engine.load_cells(tmp_path, real_lm.NAME)[engine.cell_key(grid[1])].result
    assert union["scores"]["num_cases"] == 6 and union["requests"] == 30
    edited = {c.subject for c in real_lm._draw(grid[1])}
    assert edited == {c.subject for i in range(3) for c in known_draw("test", i, n=2)}  # two of each draw
    assert not edited & {nb.subject for c in real_lm._draw(grid[1]) for nb in c.neighbours}
    rows = res.summary["rows"]
    assert [(r["method"], r["draws"]) for r in rows] == [("unedited", [0]), ("ours", [0]), ("unedited", ["all"]),
                                                         ("ours", ["all"])]
    table = report.markdown_table(res.summary, model="tiny")
    label = report.settings_text(real_lm.TINY_SETTINGS["ours"])
    assert 'keys="subject", layer=1' in label
    assert f"| 6 | ours | batch | {label} | 3 at once |" in table and f"| 6 | ours | batch | {label} | 1 |" in table
    ours_row, _, unedited = report.headline_rows(res.summary, model="tiny")
    assert ours_row["draws"] == ["all"] and unedited["draws"] == ["all"]  # the most cases: the union
    fig = report._triangle(rows)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["6 edits", "6 edits, 3 at once"]


def test_new_knowledge_cells_and_the_single_protocol(tmp_path):
    """Invented subjects (kind "new"), ours one case at a time: the cell's scores are the means over its cases."""
    grid = [real_lm.cell("unedited", n=2, kind="new", model="tiny"),
            real_lm.cell("ours", n=2, kind="new", protocol="single", settings=real_lm.TINY_SETTINGS["ours"],
                         model="tiny")]
    res = engine.run(real_lm.NAME, tmp_path, grid=grid, quiet=True)
    cells = engine.load_cells(tmp_path, real_lm.NAME)
    single = cells[engine.cell_key(grid[1])].result
    assert single["scores"]["num_cases"] == 2 and len(single["report"]["per_case"]) == 2
    assert single["report"]["per_case"][0]["num_facts"] == 5  # one case: its five edit templates
    assert 0.0 <= single["scores"]["paraphrase_score"] <= 1.0
    table = report.markdown_table(res.summary, kind="new", model="tiny")
    assert "| 2 | ours | single |" in table and "cross-template" not in table  # no true object to be consistent on


def test_a_single_protocol_cell_stopped_mid_way_resumes_after_its_last_kept_case(tmp_path, monkeypatch):
    """One case at a time keeps every finished case in the cell's partial file: stopped in its second case, a
    resumed run edits only that one and writes the cell an uninterrupted run writes."""
    from factkernels.hf import metrics

    grid = [real_lm.cell("ours", n=2, kind="new", protocol="single", settings=real_lm.TINY_SETTINGS["ours"],
                         model="tiny")]
    key = engine.cell_key(grid[0])
    whole = engine.run(real_lm.NAME, tmp_path / "whole", grid=grid, quiet=True)
    assert whole.ran == 1
    real_score, real_edit, calls = metrics.score_cases, real_lm._timed_edit, []

    def stopped_in_the_second(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_score(*args, **kwargs)

    def counted(*args, **kwargs):
        calls.append(1)
        return real_edit(*args, **kwargs)

    monkeypatch.setattr(real_lm, "_timed_edit", counted)
    monkeypatch.setattr(metrics, "score_cases", stopped_in_the_second)
    with pytest.raises(KeyboardInterrupt):
        engine.run(real_lm.NAME, tmp_path / "stopped", grid=grid, quiet=True, resume=True)
    kept = engine.read_json(tmp_path / "stopped" / real_lm.NAME / "partial" / f"{key}.json", "cases")["cases"]
    assert len(kept) == 1 and not engine.load_cells(tmp_path / "stopped", real_lm.NAME)
    monkeypatch.setattr(metrics, "score_cases", real_score)
    engine.run(real_lm.NAME, tmp_path / "stopped", grid=grid, quiet=True, resume=True)
    assert len(calls) == 3  # the resumed run edited the second case only
    resumed = engine.load_cells(tmp_path / "stopped", real_lm.NAME)[key].result
    first = engine.load_cells(tmp_path / "whole", real_lm.NAME)[key].result
    assert resumed["scores"] == first["scores"] and len(resumed["report"]["per_case"]) == 2
    assert not (tmp_path / "stopped" / real_lm.NAME / "partial" / f"{key}.json").exists()


def test_triangle_legend_names_only_sizes_with_bars():
    import matplotlib

    matplotlib.use("Agg")
    scores = {"efficacy_score": 1.0, "paraphrase_score": 0.5, "neighbourhood_score": 1.0}
    cells = [_fake_cell("memit", 0, scores, 10.0), _fake_cell("unedited", 0, scores, 5.0)]
    more = real_lm.cell("unedited", n=100, draw=0)  # the unedited model scored at a size no method ran
    cells.append(engine.Cell(engine.cell_key(more), more, {"scores": {"num_cases": 100, **scores},
                                                           "seconds": {"baseline": 1.0}}, 1.0))
    fig = report._triangle(report.summarize(cells)["rows"])
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["10 edits"]


WISE_NOW = {"layer": 25, "steps": 70, "lr": 1.0, "mask_ratio": 0.2, "norm_constraint": 1.0, "act_margin": [5.0, 20.0, 10.0],
            "act_ratio": 0.7, "prefixes": [[5, 5], [10, 5]], "prefix_starts": ["I", "You", "Because", "Yes", "Q:"],
            "seed": 0}
"""WISE's SmolLM2 preset as a cell records it: published layer 27 of 32 moved to 25 of 30, act_ratio 0.7."""


def _ran(method, draw, hparams, settings=None, protocol=None):
    """A finished SmolLM2 cell of ``method`` (preset settings by default) that recorded ``hparams``."""
    config = real_lm.cell(method, n=10, draw=draw, settings=settings or {"preset": "smollm2-135m"}, protocol=protocol)
    scores = {"num_cases": 10, "efficacy_score": 0.5, "paraphrase_score": 0.5, "neighbourhood_score": 0.5}
    report_ = {"per_case": [{"hparams": hparams}] * 10} if protocol == "single" else {"hparams": hparams}
    return engine.Cell(engine.cell_key(config), config,
                       {"scores": scores, "seconds": {"edit": 1.0, "edit_cpu": 1.0}, "report": report_}, 1.0)


def test_a_cell_that_ran_other_hparams_than_its_preset_gives_now_is_stale():
    assert real_lm.EXPERIMENT.stale is real_lm.stale_reason
    assert real_lm.stale_reason(_ran("wise", 0, WISE_NOW)) is None
    tuples = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
              for k, v in WISE_NOW.items()}
    assert real_lm.hparams_drift(_ran("wise", 0, tuples).config, _ran("wise", 0, tuples).result) == {}
    old = {k: v for k, v in WISE_NOW.items() if k not in ("prefixes", "prefix_starts")} | {"act_ratio": 0.88}
    stale = _ran("wise", 0, old)  # ran before the preset moved to 0.7 and before the context prefixes
    assert real_lm.hparams_drift(stale.config, stale.result) == {
        "act_ratio": {"ran": 0.88, "now": 0.7}, "prefixes": {"now": [[5, 5], [10, 5]]},
        "prefix_starts": {"now": ["I", "You", "Because", "Yes", "Q:"]}}
    assert real_lm.stale_reason(stale) == (
        'its hparams differ from what its settings give now: act_ratio ran 0.88, now 0.7; prefix_starts not '
        'recorded, now ["I", "You", "Because", "Yes", "Q:"]; prefixes not recorded, now [[5, 5], [10, 5]]')
    # explicit settings win over the preset; ROME's single protocol records its hparams per case
    assert real_lm.stale_reason(_ran("wise", 0, old | {"prefixes": [[5, 5], [10, 5]], "prefix_starts": WISE_NOW[
        "prefix_starts"]}, settings={"preset": "smollm2-135m", "act_ratio": 0.88})) is None
    rome = {"layers": [5], "steps": 20, "lr": 0.5, "weight_decay": 0.5, "clamp_norm": 4.0, "kl_factor": 0.0625,
            "early_stop": 5e-2, "prefixes": [[5, 10], [10, 10]], "prefix_starts": [""], "mom2_dataset": "wikipedia",
            "mom2_n_samples": None, "ridge": 1e-4}
    assert real_lm.stale_reason(_ran("rome", 0, rome, protocol="single")) is None
    assert "layers ran [4], now [5]" in real_lm.stale_reason(_ran("rome", 0, rome | {"layers": [4]}, protocol="single"))
    ours = real_lm.cell("ours", n=10)  # no preset: never stale by this rule, whatever it reports
    assert real_lm.stale_reason(engine.Cell("k", ours, {"report": {"hparams": {"layer": 3}}})) is None


def test_committed_cells_of_published_settings_match_the_model_shapes():
    # SmolLM2's (layers, width) move MEMIT's and AlphaEdit's published layers and λ: cells run on the model agree
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "experiments"
    published = [c for c in engine.load_cells(folder, real_lm.NAME).values()
                 if c.config["method"] in real_lm.EDITORS and c.config["settings"] == {}]
    assert {c.config["method"] for c in published} >= {"memit", "alphaedit"}
    assert all(real_lm.hparams_drift(c.config, c.result) == {} for c in published)


def test_summary_labels_stale_cells_by_what_they_ran():
    old = WISE_NOW | {"act_ratio": 0.88}
    cells = [_ran("wise", 0, old), _ran("wise", 1, WISE_NOW), _ran("wise", 2, WISE_NOW)]
    summary = report.summarize(cells)
    now, then = summary["rows"]  # not averaged together: the stale draw is a row of its own
    assert (now["draws"], then["draws"]) == ([1, 2], [0]) and "hparams_drift" not in now
    assert then["hparams_drift"] == {"act_ratio": {"ran": 0.88, "now": 0.7}}
    table = report.markdown_table(summary)
    assert '| 10 | wise | batch | preset="smollm2-135m" | 2 |' in table
    assert '| 10 | wise | batch | preset="smollm2-135m" (as of act_ratio=0.88) | 1 |' in table
    assert "cells run before their preset moved" in table
    assert list(report._series(summary["rows"])) == ['wise (batch, preset="smollm2-135m")',
                                                     'wise (batch, preset="smollm2-135m" (as of act_ratio=0.88))']
    fresh = report.markdown_table(report.summarize(cells[1:]))
    assert "(as of" not in fresh and "before their preset moved" not in fresh


def test_weight_editors_keep_delta_in_the_runs_shared_partial_folder_until_the_grid_is_done(tmp_path, monkeypatch):
    # In a run the δ folder is OUT/NAME/partial/shared-KEY/ (a commit carries it to another machine); the engine
    # removes it with the other shared work once every cell is present. Outside a run: the cache folder.
    monkeypatch.setenv("FACTKERNELS_CACHE", str(tmp_path / "cache"))
    assert real_lm._targets_folder() == tmp_path / "cache" / "residual_targets"
    claim = engine.Claim("toy-delta", "000", "Fig. 0", "a folder per run", "always")
    folders = []

    def run_cell(config):
        folder = real_lm._targets_folder()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"targets_{config['x']}.safetensors").write_bytes(b"x")
        folders.append(folder)
        if config["x"] == 1:
            assert sorted(p.name for p in folder.iterdir()) == ["targets_0.safetensors", "targets_1.safetensors"]
        return {"x": config["x"]}

    engine.register(engine.Experiment("toy-delta", "toy", (claim,), lambda scale: [{"x": 0}, {"x": 1}], run_cell,
                                      lambda cells: {"claims": {}}))
    try:
        engine.run("toy-delta", tmp_path, scale="tiny", quiet=True, only={"x": 0})
        assert folders[0].is_dir() and folders[0].parent == tmp_path / "toy-delta" / "partial"
        assert folders[0].name.startswith("shared-") and not folders[0].suffix
        engine.run("toy-delta", tmp_path, scale="tiny", resume=True, quiet=True)
        assert folders[1] == folders[0] and not folders[0].exists()
    finally:
        del engine.REGISTRY["toy-delta"]
