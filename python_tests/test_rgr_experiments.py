"""Seed 002 budget experiments on the engine: cells, summaries with claims, the bracketing search."""

import json

import pytest

from factkernels.experiments import engine, rgr_budget


def test_budget_experiment_runs_tiny_and_summarizes_claims(tmp_path):
    res = engine.run("rgr-budget", tmp_path, scale="tiny", quiet=True)
    assert res.missing == 0 and res.ran == len(rgr_budget._grid("tiny"))
    summary = json.loads((tmp_path / "rgr-budget" / "summary.json").read_text())["summary"]
    (point,) = summary["points"]
    assert (point["m"], point["d_model"]) == (32, 16)
    assert {c["num_heads"] for c in point["configs"]} == {1, 2}
    assert all(len(c["test_f1"]) == 2 for c in point["configs"])  # seeds 0, 1 of each cell
    assert (tmp_path / "rgr-budget" / "rgr_budget.png").exists()


def test_seed_groups_of_one_configuration_merge_in_seed_order():
    cells = [engine.Cell("a", rgr_budget.cell_config(64, 16, 2, 5, [3, 4]), {"test_f1": [0.3, 0.4], "steps": [1, 1]}),
             engine.Cell("b", rgr_budget.cell_config(64, 16, 2, 5, [0, 1]), {"test_f1": [0.0, 0.1], "steps": [1, 1]})]
    (configs,) = rgr_budget.config_results(cells).values()
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
    done = rgr_budget.search_pair(64, 16, [1, 2, 4, 8], [0, 1, 2], evaluate)
    assert done == calls
    cells = [engine.Cell(str(i), c, evaluate(c)) for i, c in enumerate(done)]
    (configs,) = rgr_budget.config_results(cells).values()
    from factkernels.attention.training import summarize_budget
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
    law = rgr_budget.seed_law(128, 32)
    assert rgr_budget.rung_heads_dim(128, 32, 4, 0) == round(law / 4)
    assert rgr_budget.rung_heads_dim(128, 32, 64, -7) == 1
    with pytest.raises(ValueError):
        engine.run("rgr-budget", "/nonexistent", scale="huge")
