"""The experiment engine: one JSON per cell, resume, shards, merge, summary with claims."""

import json
import re

import pytest
import torch

from factkernels.experiments import engine

CLAIM = engine.Claim("toy-sum", "000", "Fig. 0", "x + y is even for even x, y", "always")
calls = []
devices = []  # engine.cell_device() as each cell saw it


def _grid(scale):
    n = {"tiny": 2, "quick": 3, "seed": 4}[scale]
    return [{"x": 2 * i, "y": 2 * j} for i in range(n) for j in range(2)]


def _run_cell(config):
    calls.append(config)
    devices.append(engine.cell_device())
    return {"sum": config["x"] + config["y"]}


def _summarize(cells):
    even = all(c.result["sum"] % 2 == 0 for c in cells)
    return {"total": sum(c.result["sum"] for c in cells),
            "claims": {"toy-sum": engine.Finding(f"{len(cells)} cells even: {even}", "toy grid",
                                                 "reproduced" if even else "not reproduced")}}


def _plot(summary, cells):
    from factkernels.experiments.plotting import panels

    fig, (ax,) = panels(1)
    ax.plot([c.result["sum"] for c in cells])
    return {"toy": fig}


@pytest.fixture
def toy():
    calls.clear()
    exp = engine.register(engine.Experiment("toy", "toy experiment", (CLAIM,), _grid, _run_cell, _summarize, _plot))
    yield exp
    del engine.REGISTRY["toy"]


def test_run_writes_one_json_per_cell_and_summary(toy, tmp_path):
    res = engine.run("toy", tmp_path, scale="tiny", quiet=True)
    assert (res.total, res.ran, res.kept, res.missing) == (4, 4, 0, 0)
    files = sorted((tmp_path / "toy" / "cells").glob("*.json"))
    assert len(files) == 4
    cell = json.loads(files[0].read_text())
    fields = {"config", "result", "environment", "key", "seconds"}  # what every cell file records
    assert set(cell) >= fields
    summary = json.loads((tmp_path / "toy" / "summary.json").read_text())
    assert summary["summary"]["total"] == sum(c["x"] + c["y"] for c in _grid("tiny"))
    assert summary["summary"]["claims"]["toy-sum"]["verdict"] == "reproduced"
    assert (tmp_path / "toy" / "toy.png").exists()


def test_resume_keeps_finished_cells(toy, tmp_path):
    engine.run("toy", tmp_path, scale="tiny", quiet=True)
    calls.clear()
    res = engine.run("toy", tmp_path, scale="quick", resume=True, quiet=True)
    assert res.kept == 4 and res.ran == 2 and len(calls) == 2
    calls.clear()
    engine.run("toy", tmp_path, scale="quick", quiet=True)  # without resume every cell runs again
    assert len(calls) == 6


def test_shards_partition_the_grid_and_merge(toy, tmp_path):
    results = [engine.run("toy", tmp_path / f"s{i}", scale="seed", shard=(i, 3), quiet=True) for i in (1, 2, 3)]
    assert sum(r.ran for r in results) == 8 and all(r.summary is None for r in results)
    assert engine.merge([tmp_path / f"s{i}" for i in (1, 2, 3)], tmp_path / "all") == 8
    calls.clear()
    res = engine.run("toy", tmp_path / "all", scale="seed", resume=True, quiet=True)
    assert res.ran == 0 and res.summary is not None and not calls


def test_only_runs_a_sub_grid_and_summarizes_every_present_cell(toy, tmp_path):
    engine.run("toy", tmp_path, scale="seed", only={"y": 0, "x": 0}, quiet=True)
    assert calls == [{"x": 0, "y": 0}]
    res = engine.run("toy", tmp_path, scale="seed", only=engine.parse_fields(["y=2"]), resume=True, quiet=True)
    assert res.total == 4 and res.ran == 4 and res.summary is not None
    assert res.summary["total"] == sum(x + 2 for x in (0, 2, 4, 6))  # the sub-grid's 4 cells and the x=0, y=0 one
    assert engine.parse_fields(["method=memit", "hparams={\"a\": 1}"]) == {"method": "memit", "hparams": {"a": 1}}
    assert engine.matches({"x": 1}, {"y": None}) and not engine.matches({"x": 1}, {"x": None})
    with pytest.raises(ValueError, match="KEY=VALUE"):
        engine.parse_fields(["n_facts"])
    with pytest.raises(ValueError, match="no cell"):
        engine.run("toy", tmp_path, scale="seed", only={"x": 1}, quiet=True)


def test_overrides_run_the_grid_at_another_setting(toy, tmp_path):
    res = engine.run("toy", tmp_path, scale="tiny", overrides={"y": 10}, quiet=True)
    # the tiny grid's pairs of y collapse to one cell per x, each with y = 10
    assert sorted(map(tuple, (sorted(c.items()) for c in calls))) == [(("x", 0), ("y", 10)), (("x", 2), ("y", 10))]
    assert res.summary["total"] == (0 + 10) + (2 + 10)
    assert engine.with_overrides([{"a": 1}, {"b": 2}], {"a": 5}) == [{"a": 5}, {"b": 2}]
    with pytest.raises(ValueError, match="field 'z'"):
        engine.run("toy", tmp_path, scale="tiny", overrides={"z": 1}, quiet=True)
    with pytest.raises(ValueError, match="--set takes"):
        engine.parse_fields(["y"], "--set")


def test_bad_arguments(toy, tmp_path):
    with pytest.raises(ValueError, match="shard"):
        engine.parse_shard("4/3")
    with pytest.raises(ValueError, match="shard"):
        engine.parse_shard("two")
    with pytest.raises(ValueError, match="scale"):
        engine.run("toy", tmp_path, scale="huge")
    with pytest.raises(ValueError, match="unknown experiment"):
        engine.run("nope", tmp_path)
    with pytest.raises(ValueError, match="verdict"):
        engine.Finding("1", "x", "maybe")


def test_cells_run_on_the_device_asked_for_and_record_it(toy, tmp_path):
    devices.clear()
    engine.run("toy", tmp_path, scale="tiny", quiet=True, device="cpu")
    assert devices == [torch.device("cpu")] * 4 and engine.cell_device() == torch.device("cpu")  # reset after
    assert {json.loads(p.read_text())["device"] for p in (tmp_path / "toy" / "cells").glob("*.json")} == {"cpu"}
    with pytest.raises(ValueError, match=r"runs its cells on \['cpu'\], not cuda"):
        engine.run("toy", tmp_path, scale="tiny", quiet=True, device="cuda")
    gpu_toy = engine.register(engine.Experiment("toy-gpu", "toy on any device", (CLAIM,), _grid, _run_cell, _summarize,
                                                devices=("cpu", "cuda")))
    try:
        if not torch.cuda.is_available():
            with pytest.raises(ValueError, match="torch sees no CUDA device"):
                engine.run("toy-gpu", tmp_path, scale="tiny", quiet=True, device="cuda")
        with pytest.raises(RuntimeError):
            engine.run("toy-gpu", tmp_path, scale="tiny", quiet=True, device="gpu")  # not a torch device
    finally:
        del engine.REGISTRY[gpu_toy.name]
    assert not (tmp_path / "toy-gpu").exists()


def test_cell_keys_are_stable_and_distinct():
    a, b = engine.cell_key({"x": 1, "y": 2}), engine.cell_key({"y": 2, "x": 1})
    assert a == b and a != engine.cell_key({"x": 1, "y": 3})


def test_clean_json_is_strict_and_figures_are_png(tmp_path):
    import math

    import numpy as np
    import torch

    from factkernels.experiments.plotting import panels, save_figure

    data = engine.clean_json({"x": torch.tensor([1.0, 2.0]), "nan": math.nan, "n": np.int64(3), "pair": (1, 2),
                              "path": tmp_path})
    assert data == {"x": [1.0, 2.0], "nan": None, "n": 3, "pair": [1, 2], "path": str(tmp_path)}
    json.dumps(data, allow_nan=False)
    fig, (ax,) = panels(1)
    ax.plot([0, 1], [1, 0])
    assert save_figure(fig, tmp_path, "line").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_and_list_show_every_claim(toy, tmp_path, capsys):
    from factkernels.cli import main

    engine.run("toy", tmp_path / "runs", scale="tiny", quiet=True)
    out = tmp_path / "docs" / "CLAIMS.md"
    assert main(["experiment", "report", str(tmp_path / "runs"), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    toy_row = next(line for line in lines if "**toy-sum**" in line)
    assert "| reproduced |" in toy_row and "4 cells even: True" in toy_row
    assert "[toy](../runs/toy/toy.png)" in toy_row  # PNG links relative to the table
    others = [c.id for name, e in engine.REGISTRY.items() if name != "toy" for c in e.claims]
    for claim in others:  # registered claims without a summary: "not run" with the command that runs them
        row = next(line for line in lines if f"**{claim}**" in line)
        assert "| not run |" in row and "factkernels experiment" in row
    assert main(["experiment", "list", "--results", str(tmp_path / "runs")]) == 0
    printed = capsys.readouterr().out
    assert all(claim in printed for claim in ["toy-sum", *others]) and "reproduced" in printed


def test_report_shows_one_row_per_folder_that_ran_a_claim(toy, tmp_path):
    from factkernels.experiments import claims as report

    engine.run("toy", tmp_path / "quick", scale="tiny", quiet=True)
    engine.run("toy", tmp_path / "seed", scale="seed", quiet=True)
    rows = [r for r in report.claim_rows([tmp_path / "quick", tmp_path / "seed", tmp_path / "empty"])
            if r["claim"] == "toy-sum"]
    assert [(r["results"], r["ours"]) for r in rows] == [(str(tmp_path / "quick"), "4 cells even: True"),
                                                          (str(tmp_path / "seed"), "8 cells even: True")]
    table = report.write_claims_table([tmp_path / "quick", tmp_path / "seed"], tmp_path / "CLAIMS.md").read_text()
    assert "**toy-sum** (quick)" in table and "**toy-sum** (seed)" in table
    # each claim counted once, by its last (largest) run; rows counted apart
    (latest,) = [r for r in report.latest_rows(report.claim_rows([tmp_path / "quick", tmp_path / "seed"]))
                 if r["claim"] == "toy-sum"]
    assert latest["results"] == str(tmp_path / "seed")
    (latest,) = [r for r in report.latest_rows(report.claim_rows([tmp_path / "seed", tmp_path / "empty"]))
                 if r["claim"] == "toy-sum"]
    assert latest["results"] == str(tmp_path / "seed")  # a folder without the claim does not replace its finding
    claims = len(report.latest_rows(report.claim_rows([tmp_path / "quick", tmp_path / "seed"])))
    assert f"Verdicts of the {claims} claims" in table


def test_a_run_logged_to_a_file_says_when_each_cell_starts_and_is_written(tmp_path, capsys):
    # stderr is captured (no terminal, as under nohup): no bar, a timestamped line per cell and per note
    def run_cell(config):
        engine.note(f"half of {config['x']}")
        return {"sum": config["x"] + config["y"]}

    engine.register(engine.Experiment("toy-log", "toy", (CLAIM,), _grid, run_cell, _summarize))
    try:
        engine.run("toy-log", tmp_path, scale="tiny", only={"y": 0})
        lines = capsys.readouterr().err.splitlines()
        key = engine.cell_key({"x": 2, "y": 0})
        said = [line[11:] for line in lines if "cell 2/2" in line]
        assert said[:2] == [f"toy-log cell 2/2 {key}: started on cpu", "toy-log cell 2/2: half of 2"]
        assert re.fullmatch(r"toy-log cell 2/2: written after \d+ s", said[2]) and len(said) == 3
        assert all(line[0] == "[" and line[9] == "]" for line in lines) and len(lines) == 6
        engine.run("toy-log", tmp_path, scale="tiny", quiet=True)
        assert capsys.readouterr().err == ""  # quiet: nothing; a note outside a run says nothing either
        engine.note("outside")
        assert capsys.readouterr().err == ""
    finally:
        del engine.REGISTRY["toy-log"]


def test_a_cell_keeps_partial_progress_until_it_is_written(toy, tmp_path):
    # The running cell sees OUT/NAME/partial/KEY.json; a resumed run sees what the stopped one left there,
    # a fresh run starts clean, and the file is gone once the cell is written.
    seen = []

    def run_cell(config):
        path = engine.partial_path()
        seen.append((path, path.read_text() if path.exists() else None))
        if config["x"] == 0 and config["y"] == 0 and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("half")
            raise KeyboardInterrupt
        return {"sum": config["x"] + config["y"]}

    exp = engine.Experiment("toy-partial", "toy", (CLAIM,), _grid, run_cell, _summarize)
    engine.register(exp)
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.run("toy-partial", tmp_path, scale="tiny", quiet=True)
        key = engine.cell_key({"x": 0, "y": 0})
        assert seen[0] == (tmp_path / "toy-partial" / "partial" / f"{key}.json", None)
        assert engine.partial_path() is None  # reset outside the cell
        seen.clear()
        res = engine.run("toy-partial", tmp_path, scale="tiny", resume=True, quiet=True)
        assert res.ran == 4 and seen[0][1] == "half"
        assert not list((tmp_path / "toy-partial" / "partial").glob("*"))
        (tmp_path / "toy-partial" / "partial" / f"{key}.json").write_text("stale")
        seen.clear()
        with pytest.raises(KeyboardInterrupt):  # without resume the stale progress is dropped first
            engine.run("toy-partial", tmp_path, scale="tiny", quiet=True)
        assert seen[0][1] is None
    finally:
        del engine.REGISTRY["toy-partial"]


def test_work_shared_by_cells_is_kept_until_the_grid_is_complete(toy, tmp_path):
    # Cells with the same tag see one OUT/NAME/partial/shared-KEY.json: the first writes it, the rest read it
    # (also in a later run); it outlives a partial run and is removed once every cell is present.
    seen = []

    def run_cell(config):
        path = engine.shared_partial_path({"x": config["x"]})
        seen.append(path.read_text() if path.exists() else None)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"x={config['x']}")
        return {"sum": config["x"] + config["y"]}

    engine.register(engine.Experiment("toy-shared", "toy", (CLAIM,), _grid, run_cell, _summarize))
    try:
        assert engine.shared_partial_path({"x": 0}) is None  # outside a run
        engine.run("toy-shared", tmp_path, scale="tiny", quiet=True, only={"y": 0})
        shared = sorted((tmp_path / "toy-shared" / "partial").glob("shared-*"))
        assert len(shared) == 2 and seen == [None, None]  # x = 0 and x = 2, one file each, kept: cells missing
        seen.clear()
        res = engine.run("toy-shared", tmp_path, scale="tiny", resume=True, quiet=True)
        assert res.ran == 2 and seen == ["x=0", "x=2"] and res.summary is not None
        assert not list((tmp_path / "toy-shared" / "partial").glob("*"))
    finally:
        del engine.REGISTRY["toy-shared"]


def test_resume_runs_a_stale_cell_again_and_keeps_its_file_until_rewritten(tmp_path, capsys):
    # The hook compares the rule a finished cell recorded with the rule now; a fresh cell is kept.
    rule = {"now": 1, "interrupt": False}

    def run_cell(config):
        calls.append(config)
        if rule["interrupt"]:
            raise KeyboardInterrupt
        return {"sum": config["x"] + config["y"], "rule": rule["now"]}

    def stale(cell):
        return None if cell.result["rule"] == rule["now"] else f"rule ran {cell.result['rule']}, now {rule['now']}"

    engine.register(engine.Experiment("toy-stale", "toy", (CLAIM,), _grid, run_cell, _summarize, stale=stale))
    try:
        engine.run("toy-stale", tmp_path, scale="tiny", quiet=True)
        key = engine.cell_key({"x": 2, "y": 0})
        path = tmp_path / "toy-stale" / "cells" / f"{key}.json"
        old = json.loads(path.read_text())
        old["result"]["rule"] = 0  # this cell ran an earlier rule
        path.write_text(json.dumps(old))
        calls.clear()
        capsys.readouterr()
        rule["interrupt"] = True
        with pytest.raises(KeyboardInterrupt):  # an interrupted rerun loses nothing
            engine.run("toy-stale", tmp_path, scale="tiny", resume=True, quiet=True)
        assert calls == [{"x": 2, "y": 0}] and json.loads(path.read_text()) == old
        rule["interrupt"] = False
        calls.clear()
        capsys.readouterr()
        res = engine.run("toy-stale", tmp_path, scale="tiny", resume=True, quiet=True)
        assert calls == [{"x": 2, "y": 0}] and (res.ran, res.kept) == (1, 3)
        assert res.stale == {key: "rule ran 0, now 1"} and json.loads(path.read_text())["result"]["rule"] == 1
        lines = capsys.readouterr().err.splitlines()  # even when quiet: one line naming the cell and why
        assert [line[11:] for line in lines] == [f"toy-stale cell {key} is stale, running it again: rule ran 0, now 1"]
        calls.clear()
        res = engine.run("toy-stale", tmp_path, scale="tiny", resume=True, quiet=True)
        assert not calls and (res.ran, res.kept, res.stale) == (0, 4, {})
        rule["now"] = 2  # every cell stale, but a run on a part of the grid reruns only that part
        res = engine.run("toy-stale", tmp_path, scale="tiny", resume=True, quiet=True, only={"y": 2})
        assert calls == [{"x": 0, "y": 2}, {"x": 2, "y": 2}] and len(res.stale) == 2
    finally:
        del engine.REGISTRY["toy-stale"]
