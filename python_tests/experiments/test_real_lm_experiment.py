"""The real-lm-editing experiment at tiny scale (a random 3-layer Llama; no packaged model needed)."""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("factkernels.hf.evaluate")  # hf.evaluate / hf.insert_facts (issue 12 part 3, 5)

from factkernels.experiments import engine, real_lm_editing as real_lm  # noqa: E402


def test_tiny_grid_runs_every_method_and_leaves_the_model_unedited(tiny_run):
    grid = real_lm._grid("tiny")
    assert {c["method"] for c in grid} == set(real_lm.METHODS)
    res, folder = tiny_run(real_lm.NAME)
    assert res.missing == 0 and res.summary is not None
    pngs = {f: folder / f for f in res.files if f.endswith(".png")}  # figures by name, beside summary.json
    assert set(pngs) == {"real_lm_editing.png", "real_lm_layers.png"}
    import matplotlib.image

    layers = matplotlib.image.imread(pngs["real_lm_layers.png"])[..., :3]
    colored = (layers.max(axis=2) - layers.min(axis=2)) > 0.3  # C0 blue lines and markers, not grey axes
    assert int(colored.sum()) > 100
    rows = res.summary["rows"]
    assert len(rows) == len(grid)
    for row in rows:
        for metric in ("efficacy", "paraphrase", "neighborhood"):
            assert 0.0 <= row[metric] <= 1.0
        assert row["perplexity_ratio"] > 0 and row["kl_mean"] >= 0
    # every cell undid its edit: the cached model still scores the unedited reference exactly
    _, _, model, _ = real_lm._setup(grid[1])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    real_lm.run_cell(dict(grid[1]))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    table = real_lm.markdown_table(res.summary)
    assert len(table.splitlines()) == 2 + len(grid)
    assert len(real_lm.markdown_table(res.summary, best_only=True).splitlines()) == 2 + len(real_lm.METHODS)
    overflowed = {**res.summary, "rows": [{**res.summary["rows"][0], "perplexity_ratio": None}]}
    assert "| inf |" in real_lm.markdown_table(overflowed)  # JSON stores an overflowed ratio as null
    assert set(res.summary["comparison"]["4"]) >= {"ours_score", "best_editor_score", "least_editor_kl_mean"}
    assert set(res.summary["comparison"]["4"]["best"]) == set(real_lm.METHODS)


def test_editor_grid_shares_one_residual_step(tmp_path):
    """The second MEMIT / AlphaEdit grid point reuses the first's δ and carries its recorded cost over."""
    grid = [c for c in real_lm._grid("tiny") if c["method"] in ("memit", "alphaedit")]
    assert [("hparams" in c) for c in grid] == [False, True, False, True]  # published first, one update setting after
    res = engine.run(real_lm.NAME, tmp_path, scale="tiny", quiet=True, grid=grid)
    keys = [engine.cell_key(c) for c in grid]
    loaded = engine.load_cells(tmp_path, real_lm.NAME)
    assert [loaded[k].result["targets_reused"] for k in keys] == [False, True, False, True]
    first_memit, reused_memit = (loaded[k].result for k in keys[:2])
    assert reused_memit["targets_seconds"] == first_memit["targets_seconds"]  # the shared δ's cost is carried over
    assert res.summary["rows"][1]["setting"] != "published"


def test_memit_and_alphaedit_share_a_residual_step_across_processes(tmp_path, monkeypatch):
    """An AlphaEdit cell whose residual step is MEMIT's (same last layer, clamp and settings) reads MEMIT's δ from
    the step's shared file when the process holds none (a later process or session), and counts its cost; the
    file is gone once the grid is complete."""

    class Forgetful(dict):  # every cell as if in a new process
        def __setitem__(self, key, value):
            pass

    monkeypatch.setattr(real_lm, "_SHARED_TARGETS", Forgetful())
    memit = next(c for c in real_lm._grid("tiny") if c["method"] == "memit" and "hparams" not in c)
    alpha = real_lm._editor_cell("tiny", "alphaedit", memit["n_facts"], {"lr": 0.5})
    _, _, model, _ = real_lm._setup(memit)
    assert real_lm.residual_step_key(memit, model, {"layers": [1], "steps": 10}) == \
        real_lm.residual_step_key(alpha, model, {"layers": [1], "steps": 10, "lr": 0.5})
    seen = []
    real_edit = real_lm.engine.shared_partial_path

    def spy(tag):
        path = real_edit(tag)
        seen.append(path.with_suffix(".safetensors").exists())
        return path

    monkeypatch.setattr(real_lm.engine, "shared_partial_path", spy)
    engine.run(real_lm.NAME, tmp_path, scale="tiny", quiet=True, grid=[memit, alpha])
    assert seen == [False, True]  # MEMIT trained δ into the step's file, AlphaEdit found it there
    cells = engine.load_cells(tmp_path, real_lm.NAME)
    first, second = (cells[engine.cell_key(c)].result for c in (memit, alpha))
    assert second["targets_restored_seconds"] > 0 and first["targets_restored_seconds"] == 0
    assert second["nll_target"] == first["nll_target"]  # the same δ
    assert not list((tmp_path / real_lm.NAME / "partial").glob("shared-*"))
