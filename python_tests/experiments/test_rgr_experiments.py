"""Seed 002 budget experiments on the engine: cells, summaries with claims, the bracketing search."""

import json

import pytest

from factkernels.attention.budget_fits import seed_law
from factkernels.attention.key_budget import rung_head_dim
from factkernels.experiments import engine, rgr_budget, rgr_cells, rgr_regular, rgr_search, rgr_softmax


def test_budget_experiment_runs_tiny_and_summarizes_claims(tiny_run):
    res, folder = tiny_run("rgr-budget")
    assert res.missing == 0 and res.ran == len(rgr_budget.grid("tiny"))
    summary = json.loads((folder / "summary.json").read_text())["summary"]
    (point,) = summary["points"]
    assert (point["m"], point["d_model"]) == (32, 16)
    assert {c["num_heads"] for c in point["configs"]} == {1, 2}
    assert all(len(c["test_f1"]) == 2 for c in point["configs"])  # seeds 0, 1 of each cell
    assert (folder / "rgr_budget.png").exists()


def test_seed_groups_of_one_configuration_merge_in_seed_order():
    cells = [engine.Cell("a", rgr_cells.cell_config(64, 16, 2, 5, [3, 4]), {"test_f1": [0.3, 0.4], "steps": [1, 1]}),
             engine.Cell("b", rgr_cells.cell_config(64, 16, 2, 5, [0, 1]), {"test_f1": [0.0, 0.1], "steps": [1, 1]})]
    (configs,) = rgr_cells.config_results(cells).values()
    assert configs[0].seeds == [0, 1, 3, 4] and configs[0].test_f1 == [0.0, 0.1, 0.3, 0.4]


def _threshold_model(thresholds):
    """Fake training: three seeds pass (F1 1) iff D_K >= thresholds[h], else fail clearly."""
    calls = []

    def evaluate(config):
        calls.append(config)
        ok = config["heads"] * config["head_dim"] >= thresholds[config["heads"]]
        return {"test_f1": [1.0, 1.0, 1.0] if ok else [0.5, 0.6, 0.55], "steps": [1, 1, 1]}
    return evaluate, calls


def test_bracketing_search_finds_the_threshold_and_skips_useless_cells():
    evaluate, calls = _threshold_model({1: 400, 2: 60, 4: 30, 8: 45})
    done = rgr_search.search_pair(64, 16, [1, 2, 4, 8], [0, 1, 2], evaluate)
    assert done == calls
    cells = [engine.Cell(str(i), c, evaluate(c)) for i, c in enumerate(done)]
    (configs,) = rgr_cells.config_results(cells).values()
    from factkernels.attention.key_budget import summarize_budget
    point = summarize_budget(64, 16, configs)
    assert point.best_heads == 4 and 30 <= point.key_budget < 30 * 1.25 + 4
    assert point.key_budget == point.key_budget_upper == point.key_budget_lower
    # h = 4 (= m / d_model) first; nothing above 1.1x the best passing D_K ever runs
    assert done[0]["heads"] == 4
    first_pass = min(c["heads"] * c["head_dim"] for c in done if c["heads"] == 4
                     and c["heads"] * c["head_dim"] >= 30)
    assert all(c["heads"] * c["head_dim"] <= 1.1 * first_pass for c in done if c["heads"] != 4)
    # h = 1 never passes below the cap: it gets failing cells only, at most one rung each
    assert len({c["head_dim"] for c in done if c["heads"] == 1}) == len([c for c in done if c["heads"] == 1])


def test_rungs_follow_the_seed_law():
    law = seed_law(128, 32)
    assert rgr_cells.law(128, 32, degree=4) == pytest.approx(4 * law)
    assert rung_head_dim(law, 4, 0) == round(law / 4)
    assert rung_head_dim(law, 64, -7) == 1
    with pytest.raises(ValueError):
        engine.run("rgr-budget", "/nonexistent", scale="huge")


def test_variant_configs_name_only_what_differs_from_the_base_model():
    base = rgr_cells.cell_config(64, 16, 2, 5, [0])
    assert set(base) == {"m", "d_model", "heads", "head_dim", "seeds", "max_steps"} and base["max_steps"] == 20_000
    soft = rgr_cells.cell_config(64, 16, 2, 5, [0], aggregation="softmax-sum")
    assert soft["aggregation"] == "softmax-sum" and soft["max_steps"] == 80_000
    assert rgr_cells.variant(rgr_cells.cell_config(64, 16, 2, 5, [0], degree=4)) == (64, 16, 4, "max")


@pytest.mark.parametrize("name", ["rgr-diagonal", "rgr-softmax", "rgr-regular"])
def test_variant_experiments_run_tiny_with_their_claims(name, tiny_run):
    res, folder = tiny_run(name)
    assert res.missing == 0
    payload = json.loads((folder / "summary.json").read_text())
    assert set(payload["summary"]["claims"]) <= {c.id for c in engine.get(name).claims}
    assert payload["figures"]


def test_softmax_summary_compares_one_head_with_several_and_with_the_max_model():
    def cell(h, d_k, f1, aggregation):
        config = rgr_cells.cell_config(64, 16, h, d_k, [0, 1, 2], 10, aggregation=aggregation)
        return engine.Cell(engine.cell_key(config), config, {"test_f1": [f1] * 3, "steps": [10] * 3})
    cells = [cell(1, 32, 0.5, "softmax-sum"), cell(4, 8, 1.0, "softmax-sum"), cell(4, 4, 0.6, "softmax-sum"),
             cell(4, 4, 1.0, "max"), cell(1, 16, 0.4, "max")]
    claims = rgr_softmax.summarize(cells)["claims"]
    assert claims["002-softmax-multihead"].verdict == "reproduced"  # h=1 never passes, h=4 at D_K 32
    assert claims["002-softmax-shift"].verdict == "reproduced"  # softmax 32 > max 16


def test_regular_summary_fits_through_the_origin_in_edges():
    def cell(r, h, d_k, f1):
        config = rgr_cells.cell_config(64, 16, h, d_k, [0, 1, 2], 10, degree=r)
        return engine.Cell(engine.cell_key(config), config, {"test_f1": [f1] * 3, "steps": [10] * 3})
    cells = [cell(1, 4, 6, 1.0), cell(1, 4, 5, 0.5), cell(2, 8, 6, 1.0), cell(2, 8, 5, 0.5)]
    summary = rgr_regular.summarize(cells)
    x1 = 64 * 6 / 16
    assert [p["key_budget"] for p in summary["points"]] == [24, 48]
    assert summary["fit"]["slope"] == pytest.approx((24 * x1 + 48 * 2 * x1) / (x1 ** 2 + (2 * x1) ** 2))
    assert summary["claims"]["002-a3-regular-hstar"].ours == "h* = 4 (r=1), 8 (r=2)"


@pytest.mark.parametrize("halves_ran", [False, True])
def test_regular_hstar_is_an_upper_bound_where_half_as_many_heads_never_ran(halves_ran):
    def cell(r, h, d_k, f1):
        config = rgr_cells.cell_config(64, 16, h, d_k, [0, 1, 2], 10, degree=r)
        return engine.Cell(engine.cell_key(config), config, {"test_f1": [f1] * 3, "steps": [10] * 3})
    cells = [cell(1, 4, 6, 1.0), cell(2, 8, 6, 1.0)]
    if halves_ran:  # h*/2 ran and needs more D_K: h* is measured, not a bound of the head grid
        cells += [cell(1, 2, 12, 0.5), cell(2, 4, 12, 0.5)]
    claim = rgr_regular.summarize(cells)["claims"]["002-a3-regular-hstar"]
    assert claim.ours == "h* = 4 (r=1), 8 (r=2)"
    assert claim.verdict == ("reproduced" if halves_ran else "partly")
    assert ("upper bound" in claim.reason) != halves_ran


def test_densify_adds_seeds_only_near_the_estimates(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(rgr_search, "run_cell", lambda c: ran.append(c) or {"test_f1": [1.0] * len(c["seeds"]),
                                                                               "steps": [1] * len(c["seeds"])})
    for h, d_k, f1 in [(4, 2, 0.5), (4, 4, 0.5), (4, 6, 1.0), (4, 8, 1.0), (4, 20, 1.0), (2, 12, 1.0)]:
        config = rgr_cells.cell_config(64, 16, h, d_k, [0, 1, 2], 100)
        engine._write_cell(tmp_path, "rgr-budget", engine.cell_key(config), config,
                           {"test_f1": [f1] * 3, "steps": [1] * 3}, 0.0)
    added = rgr_search.densify(str(tmp_path), "rgr-budget", [(64, 16)], [3, 4], log=lambda s: None)
    # estimates: D_K* = 24 (h=4 d_k=6, also h=2 d_k=12); the band is 0.8 * 24 .. 1.1 * 24
    assert sorted((c["heads"], c["head_dim"]) for c in added) == [(2, 12), (4, 6)]
    assert all(c["seeds"] == [3, 4] and c["max_steps"] == 100 for c in ran) and len(ran) == 2
    assert rgr_search.densify(str(tmp_path), "rgr-budget", [(64, 16)], [3, 4], log=lambda s: None) == []


def test_search_starts_from_the_conservative_budget_of_earlier_cells():
    evaluate, calls = _threshold_model({1: 400, 4: 30})
    rgr_search.search_pair(64, 16, [1], [0, 1, 2], evaluate, known_upper=30)
    assert calls and all(c["head_dim"] <= 33 for c in calls)  # h = 1 never climbs past 1.1 x 30


def test_rgr_search_command_writes_cells_and_a_summary_of_what_ran(tmp_path, capsys):
    from factkernels.cli import main

    assert main(["rgr-search", "rgr-budget", "--out", str(tmp_path), "--pairs", "16:16", "--heads", "1",
                 "--max-steps", "100", "--seeds", "0,1"]) == 0
    cells = engine.load_cells(tmp_path, "rgr-budget")
    assert cells and all(c.config["max_steps"] == 100 and c.config["seeds"] == [0, 1] for c in cells.values())
    summary = json.loads((tmp_path / "rgr-budget" / "summary.json").read_text())
    assert summary["cells"] == len(cells) and "summary.json" in capsys.readouterr().out
