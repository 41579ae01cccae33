"""Cost experiments on the engine and the capacity command: fits, ratios, claims, plots with content."""

import json

import numpy as np
import pytest

from factkernels import ustar
from factkernels.capacity import sampled_storage_cost
from factkernels.cli import main
from factkernels.embeddings import family_fact_set
from factkernels.experiments import engine
import math

import torch

from factkernels.decoder import jl_bound
from factkernels.experiments.cost_cells import DEFAULT_MULTIPLIER, coherence, cost_cell, run_cost_cell
from factkernels.experiments.method_costs import run_two_hot_cell, two_hot_cell
from factkernels.experiments.summary_math import loglog_fit


def _image(path):
    import matplotlib.image

    return matplotlib.image.imread(path)[..., :3]


def test_loglog_fit_recovers_a_power_law():
    rho = [0.1, 0.2, 0.4, 0.8]
    fit = loglog_fit(rho, [5.0 * r**-2 for r in rho])
    assert fit["slope"] == pytest.approx(-2.0) and np.exp(fit["intercept"]) == pytest.approx(5.0)
    assert fit["r2"] == pytest.approx(1.0) and fit["points"] == 4
    noisy = loglog_fit(rho, [5.0 * r**-2 * s for r, s in zip(rho, (1.3, 0.7, 1.2, 0.9))])
    assert 0.5 < noisy["r2"] < 1.0
    assert loglog_fit([1.0, 2.0], [1.0, 2.0]) is None


def test_cost_cell_is_the_sampled_search_and_reports_every_multiplier():
    config = cost_cell("ours", "spherical", 32, 8, 2, multipliers=[1.25, DEFAULT_MULTIPLIER])
    result = run_cost_cell(config)
    sample = lambda seed: family_fact_set("spherical", 32, 8, seed=seed)
    expected = sampled_storage_cost("ours", sample, seeds=2, progress=False)
    assert result["size"] == expected.size and result["parameters"] == expected.parameters
    assert result["by_multiplier"]["1.5"] == {"m": expected.size, "parameters": expected.parameters}
    at_125 = sampled_storage_cost("ours", sample, seeds=2, progress=False, width_multiplier=1.25,
                                  start=expected.size)
    assert result["by_multiplier"]["1.25"]["parameters"] == at_125.parameters
    cheapest = min(p["parameters"] for p in result["by_multiplier"].values())
    assert result["cheapest_parameters"] == cheapest
    assert result["jl_compresses"] == (expected.size < 8)


def test_rho_vs_cost_fit_and_claims(tiny_run):
    res, folder = tiny_run("rho-vs-cost")
    rows = res.summary["rows"]
    assert [r["family"] for r in rows] == ["spherical", "anisotropic-16", "anisotropic-256"]
    assert rows[2]["rho"] < rows[0]["rho"] and rows[2]["parameters"] > rows[0]["parameters"]
    fit = res.summary["fits"]["ours"]
    assert fit["slope"] < 0 and fit == pytest.approx(loglog_fit([r["rho"] for r in rows],
                                                                [r["parameters"] for r in rows]))
    claims = res.summary["claims"]
    assert claims["000-fig2a-rho-gd"]["verdict"] == "not run"
    assert claims["000-fig2a-rho-ours"]["verdict"] in ("reproduced", "partly", "not reproduced")
    assert f"{fit['slope']:.2f}" in claims["000-fig2a-rho-ours"]["ours"]
    pixels = _image(folder / "rho_vs_cost.png")
    assert pixels.shape[0] > 200 and (pixels.std(axis=2) > 0.1).sum() > 100  # coloured points and the fit


@pytest.mark.parametrize("noise, verdict", [
    ((1.0, 1.0, 1.0, 1.0), "reproduced"),        # cost exactly a power of ρ: R² = 1
    ((1.0, 1.2, 0.85, 1.0), "partly"),           # R² 0.945: ρ predicts the cost, below the paper's 0.97
    ((1.0, 1.3, 0.8, 1.0), "not reproduced"),    # R² 0.89: it does not
    ((1.0, 3.0, 0.3, 1.0), "not reproduced"),    # R² 0.13
])
def test_rho_verdict_has_a_partly_tier_below_the_papers_r2(noise, verdict):
    from factkernels.experiments.rho_vs_cost import summarize as _summarize_rho

    rhos = (0.8, 0.6, 0.4, 0.2)
    cells = [engine.Cell(f"gd-{i}", {"method": "gd", "family": f"f{i}", "d": 32, "facts": 256, "seeds": 3},
                         {"parameters": 1000 * r ** -1.0 * n, "rho": r, "coherence": 0.1 * (i + 1), "size": 10}, 0.0)
             for i, (r, n) in enumerate(zip(rhos, noise))]
    fit = loglog_fit(rhos, [c.result["parameters"] for c in cells])
    claim = _summarize_rho(cells)["claims"]["000-fig2a-rho-gd"]
    assert claim.verdict == verdict and f"R² = {fit['r2']:.3f}" in claim.ours
    assert (fit["r2"] > 0.97) == (verdict == "reproduced") and (fit["r2"] >= 0.9) == (verdict != "not reproduced")


def test_whitening_gain_and_ntk_that_stores_nothing(tiny_run):
    whitening = tiny_run("whitening")[0].summary
    costs = {r["whiten"]: r["parameters"] for r in whitening["rows"]}
    assert whitening["max_gain"] == pytest.approx(costs[0.0] / costs[1.0]) and costs[0.0] > costs[1.0]
    scaling = tiny_run("scaling")[0].summary
    (missing,) = scaling["ntk_not_stored"]  # NTK at d=4, F=16 needs more than 512 hidden units
    assert (missing["d"], missing["facts"], missing["max_size"]) == (4, 16, 512)
    assert 0 < missing["best_facts_stored"] < 16  # it comes close: the claim text says how close
    assert f"{missing['best_facts_stored']} of 16" in scaling["claims"]["000-fig2b-ntk-diverges"]["ours"]
    assert scaling["claims"]["000-fig2b-ntk-over-ours"]["verdict"] == "not run"


@pytest.mark.parametrize("ntk_params, verdict", [
    # d -> NTK parameters at F = d²/4, d²/2, d² (None: no width up to max_size stores every fact)
    ({16: (1e4, 4e4, None), 32: (1e5, 3e5, 9e5)}, "reproduced"),  # d=16 stores nothing at α=1, d=32 falls
    ({16: (1e4, 4e4, None), 32: (1e5, 1.5e5, 2e5)}, "partly"),    # d=32: facts/parameter rises with α
    ({16: (1e4, 1.5e4, 2e4), 32: (1e5, 1.5e5, 2e5)}, "not reproduced"),
])
def test_ntk_divergence_verdict_speaks_for_every_d(ntk_params, verdict):
    from factkernels.experiments.cost_scaling import summarize as _summarize_scaling

    cells = [engine.Cell(f"{d}-{i}", {"method": "ntk", "family": "spherical", "d": d, "facts": int(d * d * a),
                                      "seeds": 3, "max_size": 4096},
                         {"parameters": p, "size": None if p is None else 1,
                          "best_min_accuracy": 0.99 if p is None else 1.0}, 0.0)
             for d, params in ntk_params.items() for i, (a, p) in enumerate(zip((0.25, 0.5, 1.0), params))]
    claim = _summarize_scaling(cells)["claims"]["000-fig2b-ntk-diverges"]
    assert claim.verdict == verdict
    if verdict == "partly":
        assert "diverges at d ∈ [16]" in claim.reason and "at d = 32 facts/parameter does not fall" in claim.reason
    if verdict == "not reproduced":
        assert "no d where NTK diverges" in claim.reason


def test_hybrids_ratio(tiny_run):
    summary = tiny_run("hybrids")[0].summary
    costs = {r["method"]: r["parameters"] for r in summary["rows"]}
    (point,) = summary["points"]
    assert point["ours_over"]["naive"] == pytest.approx(costs["ours"] / costs["naive"])
    assert summary["claims"]["000-fig2c-gd-gd"]["verdict"] == "not run"


def test_hybrids_claims_speak_for_every_point():
    from factkernels.experiments.hybrid_costs import summarize as _summarize_hybrids

    # d=32: bin+gd 4x cheaper than ours (the paper's factor); d=64: 10x, and GD ran only at d=32
    costs = {(32, 256): {"ours": 40_000, "bin+gd": 10_000, "gd+gd": 4_000, "gd": 2_000},
             (64, 1024): {"ours": 200_000, "bin+gd": 20_000}}
    cells = [engine.Cell(f"{d}-{m}", {"method": m, "family": "spherical", "d": d, "facts": facts, "seeds": 3},
                         {"parameters": p, "size": 1, "jl_compresses": True}, 0.0)
             for (d, facts), row in costs.items() for m, p in row.items()]
    summary = _summarize_hybrids(cells)
    assert [(p["d"], p["facts"]) for p in summary["points"]] == [(32, 256), (64, 1024)]
    bin_gd = summary["claims"]["000-fig2c-bin-gd"]
    assert bin_gd.verdict == "partly"  # reproduced at d=32, a different factor at d=64
    assert "d=32 F=256: 4.00×" in bin_gd.ours and "d=64 F=1024: 10.00×" in bin_gd.ours
    gap = summary["claims"]["000-fig2c-gap-to-gd"]
    assert "d=32 F=256: 20.0× → 2.00×" in gap.ours and "d=64" not in gap.ours
    assert gap.verdict == "reproduced"
    assert summary["claims"]["000-fig2c-gd-jl"].verdict == "not run"


def test_capacity_command_writes_the_search(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert main(["capacity", "--method", "ours", "--d", "8", "--facts", "16", "--seeds", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["result"]
    expected = sampled_storage_cost("ours", lambda seed: family_fact_set("spherical", 16, 8, seed=seed), seeds=2,
                                    progress=False)
    assert result["size"] == expected.size and result["parameters"] == expected.parameters
    assert f"m={expected.size}" in capsys.readouterr().out
    assert main(["capacity", "--method", "ntk", "--d", "4", "--facts", "16", "--seeds", "1", "--max-size", "300"]) == 1


def test_bad_requests_are_rejected():
    with pytest.raises(ValueError, match="method must be one of"):
        cost_cell("mlp", "spherical", 16, 8, 1)
    with pytest.raises(ValueError, match="family must be one of"):
        cost_cell("ours", "gaussian", 16, 8, 1)
    with pytest.raises(SystemExit):
        main(["capacity", "--method", "transformer"])


def test_coherence_is_the_largest_off_diagonal_cosine():
    assert coherence(torch.eye(3)) == 0.0
    assert coherence(torch.tensor([[2.0, 0.0], [1.0, 1.0], [0.0, -3.0]])) == pytest.approx(1 / math.sqrt(2))


def test_cost_cells_report_coherence_and_the_jl_bound_above_the_searched_m():
    result = run_cost_cell(cost_cell("ours", "anisotropic-16", 16, 8, 2, multipliers=[DEFAULT_MULTIPLIER]))
    values = [family_fact_set("anisotropic-16", 16, 8, seed=s).V for s in range(2)]
    assert result["coherence"] == pytest.approx(np.mean([coherence(V) for V in values]))
    assert result["size"] < result["jl_bound"] == jl_bound(min(ustar.decodability(V) for V in values), 16)


def test_two_hot_cell_stores_and_counts_bits():
    result = run_two_hot_cell(two_hot_cell(4, 2))
    assert all(p["stored"] for p in result["per_seed"]) and result["parameters"] > 0
    assert result["bits"] == pytest.approx(math.log2(math.factorial(12)))
    assert result["parameters_per_bit"] == pytest.approx(result["parameters"] / result["bits"])


def test_encoder_width_search_runs_at_the_found_m():
    config = cost_cell("gd+jl", "spherical", 16, 8, 1, encoder_width_search=True)
    result = run_cost_cell(config)
    search = result["width_search"]
    assert search["m"] == result["size"] and search["default_width"] == math.ceil(result["size"] * 16 / 8)
    assert search["width"] is not None and search["width"] <= 2 * search["default_width"]
    assert search["parameters"] == 3 * search["width"] * 8 + 2 * search["width"] + 8


@pytest.mark.parametrize("costs, verdict", [
    ({"spherical": (600, 200), "anisotropic-16": (None, None)}, "reproduced"),       # 3x cheaper with U*
    ({"spherical": (600, 800), "anisotropic-16": (None, None)}, "partly"),           # only the breakdown holds
    ({"spherical": (600, 800), "anisotropic-16": (None, 900)}, "partly"),            # U* stores where V does not
    ({"spherical": (600, 800)}, "not reproduced"),                                   # U* costs more, nothing else
])
def test_ntk_ustar_verdict_weighs_both_halves_of_the_claim(costs, verdict):
    from factkernels.experiments.ntk_ustar import summarize as _summarize_ntk_ustar

    cells = [engine.Cell(f"{fam}-{m}", {"method": m, "family": fam, "d": 32, "facts": 256, "seeds": 3},
                         {"parameters": p, "rho": 0.5, "best_min_accuracy": 1.0 if p else 0.5}, 0.0)
             for fam, pair in costs.items() for m, p in zip(("ntk", "ntk_u*"), pair)]
    assert _summarize_ntk_ustar(cells)["claims"]["000-fig5-ntk-ustar"].verdict == verdict


@pytest.mark.cuda
def test_gd_cost_cells_run_on_the_gpu(tmp_path):
    """GD cells of the cost experiments on cuda: the fact sets and models live there, the searches find what
    the CPU finds (up to one size: the trajectories differ by float rounding), the cells say where they ran."""
    grid = [cost_cell("gd", "spherical", 16, 8, 2, gd_steps=1000),
            cost_cell("gd+jl", "spherical", 16, 8, 1, encoder_width_search=True)]
    found = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        engine.run("hybrids", out, grid=grid, quiet=True, device=device)
        cells = [json.loads(p.read_text()) for p in (out / "hybrids" / "cells").glob("*.json")]
        assert len(cells) == 2 and all(c["device"].startswith(device) for c in cells)
        found[device] = {c["config"]["method"]: c["result"]["size"] for c in cells}
    for method, size in found["cpu"].items():
        assert size is not None and abs(found["cuda"][method] - size) <= 1
