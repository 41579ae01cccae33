"""Cost experiments and the capacity command: fits, JSON beside the seed's claims, plots with content."""

import json

import numpy as np
import pytest

from factkernels.capacity import sampled_storage_cost
from factkernels.capacity_experiments import EXPERIMENTS, SEED_CLAIMS, Grid, loglog_fit, run_experiment
from factkernels.cli import main
from factkernels.embeddings import family_fact_set

pytestmark = pytest.mark.usefixtures("one_thread")


def _image(path):
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    return pixels[..., :3]


def test_loglog_fit_recovers_a_power_law():
    rho = [0.1, 0.2, 0.4, 0.8]
    fit = loglog_fit(rho, [5.0 * r**-2 for r in rho])
    assert fit["slope"] == pytest.approx(-2.0) and np.exp(fit["intercept"]) == pytest.approx(5.0)
    assert fit["r2"] == pytest.approx(1.0) and fit["points"] == 4
    noisy = loglog_fit(rho, [5.0 * r**-2 * s for r, s in zip(rho, (1.3, 0.7, 1.2, 0.9))])
    assert 0.5 < noisy["r2"] < 1.0
    assert loglog_fit([1.0, 2.0], [1.0, 2.0]) is None


def test_rho_vs_cost_writes_costs_fit_and_seed_claim(tmp_path):
    grid = Grid(("ours",), (8,), facts_per_d2=(0.5,), seeds=1, families=("spherical", "anisotropic-16",
                                                                          "anisotropic-256"))
    payload = run_experiment("rho-vs-cost", tmp_path, grid=grid, quiet=True)
    saved = json.loads((tmp_path / "rho_vs_cost.json").read_text())
    assert saved["seed_claim"] == SEED_CLAIMS["rho-vs-cost"] and "environment" in saved
    cells = saved["measured"]["cells"]
    assert [c["family"] for c in cells] == ["spherical", "anisotropic-16", "anisotropic-256"]
    for cell in cells:  # each cost is the sampled search's, for the same fact sets
        sample = lambda seed, fam=cell["family"]: family_fact_set(fam, 32, 8, seed=seed)
        assert cell["parameters"] == sampled_storage_cost("ours", sample, seeds=1, progress=False).parameters
    assert cells[2]["rho"] < cells[0]["rho"] and cells[2]["parameters"] > cells[0]["parameters"]
    fit = saved["measured"]["fits"]["ours"]
    assert fit["slope"] < 0 and fit == pytest.approx(loglog_fit([c["rho"] for c in cells],
                                                                [c["parameters"] for c in cells]))
    pixels = _image(payload["files"]["png"])
    assert pixels.shape[0] > 200 and pixels.shape[1] > 300
    assert (pixels.std(axis=2) > 0.1).sum() > 100  # coloured points and the fitted line, not an empty axis


def test_whitening_and_hybrid_experiments_report_ratios(tmp_path):
    grid = Grid(("ours",), (8,), facts_per_d2=(0.5,), seeds=1, kappas=(256.0,), strengths=(0.0, 1.0))
    whitening = run_experiment("whitening", tmp_path, grid=grid, quiet=True)["measured"]
    costs = {c["options"]["whiten"]: c["parameters"] for c in whitening["cells"]}
    assert whitening["summary"]["max_gain"] == pytest.approx(costs[0.0] / costs[1.0]) and costs[0.0] > costs[1.0]
    grid = Grid(("ours", "naive"), (8,), facts_per_d2=(0.25,), seeds=1)
    hybrids = run_experiment("hybrids", tmp_path, grid=grid, quiet=True)["measured"]
    costs = {c["method"]: c["parameters"] for c in hybrids["cells"]}
    assert hybrids["summary"]["ours_over_naive"] == pytest.approx(costs["ours"] / costs["naive"])
    assert (tmp_path / "whitening.png").stat().st_size > 5000 and (tmp_path / "hybrids.png").stat().st_size > 5000


def test_scaling_marks_methods_that_store_nothing(tmp_path):
    grid = Grid(("ours", "ntk"), (4,), facts_per_d2=(1.0,), seeds=1, max_size=512)
    measured = run_experiment("scaling", tmp_path, grid=grid, quiet=True)["measured"]
    assert measured["summary"]["ntk_not_stored"] == [[4, 16]]  # NTK at d=4 needs more than 512 units
    assert measured["ratios"] == [{"d": 4, "facts": 16, "ntk_over_ours": None, "ours_over_gd": None}]


def test_capacity_command_writes_the_search(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert main(["capacity", "--method", "ours", "--d", "8", "--facts", "16", "--seeds", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["result"]
    expected = sampled_storage_cost("ours", lambda seed: family_fact_set("spherical", 16, 8, seed=seed), seeds=2,
                                    progress=False)
    assert result["size"] == expected.size and result["parameters"] == expected.parameters
    assert f"m={expected.size}" in capsys.readouterr().out
    assert main(["capacity", "--method", "ntk", "--d", "4", "--facts", "16", "--seeds", "1", "--max-size", "300"]) == 1


def test_experiment_command_parses_and_bad_requests_are_rejected(tmp_path):
    assert set(EXPERIMENTS) == {"rho-vs-cost", "whitening", "scaling", "hybrids"}
    with pytest.raises(ValueError, match="name must be one of"):
        run_experiment("fig2", tmp_path)
    with pytest.raises(ValueError, match="unknown methods"):
        run_experiment("hybrids", tmp_path, grid=Grid(("ours", "mlp"), (8,)))
    with pytest.raises(ValueError, match="kappa=3 has no family"):
        run_experiment("whitening", tmp_path, grid=Grid(("ours",), (8,), kappas=(3.0,)), quiet=True)
    with pytest.raises(SystemExit):
        main(["capacity", "--method", "transformer"])
    assert main(["experiment", "whitening", "--quick", "--out", str(tmp_path), "--seeds", "1", "--quiet",
                 "--methods", "ours"]) == 0
    saved = json.loads((tmp_path / "whitening.json").read_text())
    assert saved["config"]["quick"] and saved["config"]["seeds"] == 1 and len(saved["measured"]["cells"]) == 12
