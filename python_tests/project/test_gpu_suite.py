"""benchmarks/: gpu_suite.py without a CUDA device says why and writes nothing; the CPU races of gd_batch.py and gd_stop.py run."""

import importlib
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the suite would run")
def test_gpu_suite_exits_cleanly_without_cuda(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    suite = importlib.import_module("gpu_suite")
    assert suite.main(["--out", str(tmp_path)]) == suite.NO_DEVICE_STATUS
    assert "no CUDA device" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_gd_batch_race_finds_one_size_both_ways_and_measures_step_costs(monkeypatch):
    # the race gpu_suite runs on a GPU, here on the CPU at a tiny setting (its timings belong to the benchmark)
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    gd_batch = importlib.import_module("gd_batch")
    report = gd_batch.race(["gd"], d=8, facts=8, seeds=2, gd_steps=1000, repeats=1)
    (row,) = report["rows"]
    assert row["method"] == "gd" and row["same_size"] and row["batched"]["size"] is not None
    assert row["batched"]["sizes_tried"] == row["one_at_a_time"]["sizes_tried"]
    costs = gd_batch.step_costs(d=8, facts=32, steps=20, repeats=1)  # width 2 stores none of 32 facts
    assert [c["models"] for c in costs] == list(gd_batch.STEP_COST_BATCHES) and costs[0]["cost_vs_one"] == 1.0
    monkeypatch.setattr(gd_batch, "STEP_COST_SIZES", ((32, 8, 10), (64, 8, 10), (64, 16, 5)))
    loss = gd_batch.loss_kernel_race(repeats=1)
    assert [(r["facts"], r["models"]) for r in loss] == [(32, 3), (64, 3), (64, 1)]
    assert all({"kernels", "torch", "speedup"} <= set(r) for r in loss)  # both modes raced (timings: benchmark)


def test_gd_stop_race_agrees_and_covers_far_to_near(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    gd_stop = importlib.import_module("gd_stop")
    report = gd_stop.race(facts=128, d=16, repeats=1)  # raises if the two stop tests disagree anywhere
    rows = report["rows"]
    assert [r["noise"] for r in rows] == list(gd_stop.NOISE) and report["median_radius"] > 0
    assert not rows[0]["all_decoded"] and rows[-1]["all_decoded"] and rows[-1]["rows_inside_radius"] == 1.0


def test_ustar_section_runs_on_the_cpu(tmp_path, monkeypatch):
    """The suite's U* section (the GPU run counts launches and syncs there) in its CPU smoke run."""
    import json

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    suite = importlib.import_module("gpu_suite")
    out = tmp_path / "suite.json"
    assert suite.main(["--out", str(out), "--device", "cpu", "--quick", "--skip-tests", "--only", "ustar"]) == 0
    rows = json.loads(out.read_text())["ustar"]["rows"]
    assert [(r["n"], r["d"], r["method"], r["backend"]) for r in rows] == [
        (512, 32, "auto", "auto"), (1024, 64, "auto", "auto"), (1024, 64, "active_set", "kernels")]
    assert rows[2]["passes"] > 0 and rows[2]["pass_seconds"] > 0
    assert 0 < rows[2]["seconds_in_passes_measured"] < rows[2]["seconds"]
    for row in rows:
        assert row["rho"] > 0 and row["work_ops"] > 0 and row["host_syncs"] > 0
        assert 0 < row["sync_free_path"]["host_syncs"] and row["sync_free_path"]["work_ops"] > 0


def test_device_time_table_ranks_device_kernels_by_total_time(monkeypatch):
    """The GPU breakdown of a profile: device events only, grouped by name, the longest total first."""
    from types import SimpleNamespace

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    launches = importlib.import_module("ustar_launches")
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, device_type, micros):
        return SimpleNamespace(name=name, device_type=device_type,
                               time_range=SimpleNamespace(elapsed_us=lambda: micros))

    events = [event("gemm", cuda, 300.0), event("cudaLaunchKernel", cpu, 5.0), event("topk", cuda, 50.0),
              event("gemm", cuda, 200.0), event("Memcpy DtoH", cuda, 10.0), event("topk", cuda, 500.0)]
    table = launches.device_time_table(events, top=2)
    assert table["device_events"] == 5 and table["device_busy_ms"] == 1.06
    assert table["top_device_kernels"] == [{"name": "topk", "calls": 2, "total_ms": 0.55},
                                           {"name": "gemm", "calls": 2, "total_ms": 0.5}]


def test_construct_section_profiles_both_builds_on_the_cpu(tmp_path, monkeypatch):
    """The suite's construct section in its CPU smoke run: the values and default builds, each timed, with
    its phases and one profiled call's counts (the GPU run adds launches, syncs and device kernels)."""
    import json

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    suite = importlib.import_module("gpu_suite")
    out = tmp_path / "suite.json"
    assert suite.main(["--out", str(out), "--device", "cpu", "--quick", "--skip-tests", "--only", "construct"]) == 0
    section = json.loads(out.read_text())["construct"]
    assert section["values"]["outputs"] == "values" and section["default"]["outputs"] == "margin_optimal"
    for build in (section["values"], section["default"]):
        assert build["accuracy"] == 1.0 and build["seconds"] > 0 and build["limit_s"] > 0
        assert build["profile"]["aten_ops"] > 0 and "total" in build["profile"]["phases_ms"]
    # U* (the default build's outputs) runs ops the values build does not
    assert section["default"]["profile"]["aten_ops"] > section["values"]["profile"]["aten_ops"]


def test_star_topk_race_times_both_and_checks_they_agree(monkeypatch):
    """The kernels section's star_topk rows (U*'s pass widths on a GPU), here tiny on the CPU: both timed
    beside the GEMM-rate limit, and the kernel's and the twin's lists compared."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    suite = importlib.import_module("gpu_suite")
    rows = suite.bench_star_topk(torch.device("cpu"), ((300, 16, 20, 300), (400, 8, 40, 50)), rate=1e10)
    assert [(r["nv"], r["k"], r["rows"]) for r in rows] == [(300, 20, 300), (400, 40, 50)]
    for row in rows:
        assert row["kernel_ms"] > 0 and row["torch_ms"] > 0 and row["limit_ms"] == pytest.approx(4 * row["rows"] * row["nv"] * row["d"] / 1e7)
        assert row["index_agreement"] > 0.99 and row["max_score_difference"] < 1e-4
        assert row["twin_profile"]["aten_ops"] > 0
    assert set(rows[1]["twin_ms_by_budget_mib"]) == {1024, 4096, 16384} and "twin_ms_by_budget_mib" not in rows[0]
