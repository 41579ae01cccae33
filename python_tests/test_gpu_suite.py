"""benchmarks/gpu_suite.py: without a CUDA device it says why and writes nothing."""

import importlib
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the suite would run")
def test_gpu_suite_exits_cleanly_without_cuda(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    suite = importlib.import_module("gpu_suite")
    assert suite.main(["--out", str(tmp_path)]) == suite.NO_DEVICE_STATUS
    assert "no CUDA device" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
