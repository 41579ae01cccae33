"""The command line: demo/construct print a report and write JSON; info reports the build."""

import json

import pytest
import torch

from factkernels.cli import main
from factkernels.embeddings import random_fact_set


def test_construct_writes_report_json_and_model(tmp_path, capsys):
    out, model = tmp_path / "r.json", tmp_path / "m.safetensors"
    status = main(["construct", "--d", "16", "--facts", "64", "--outputs", "values", "--quiet",
                   "--json", str(out), "--save", str(model)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "accuracy" in printed and "100.00%" in printed
    payload = json.loads(out.read_text())
    assert payload["report"]["accuracy"] == 1.0 and payload["report"]["m_search"].startswith("auto")
    assert payload["config"]["facts"] == 64 and "torch" in payload["environment"]
    assert model.exists()


def test_failed_storage_exits_nonzero(capsys):
    assert main(["construct", "--d", "16", "--facts", "128", "--m", "1", "--outputs", "values", "--quiet"]) == 1
    assert "not stored" in capsys.readouterr().err


def test_info(capsys):
    assert main(["info"]) == 0
    assert json.loads(capsys.readouterr().out)["build"]["compiled"] is True


def test_random_fact_set_is_seeded_and_shaped():
    K, V, f = random_fact_set(50, 20, 8, seed=3)
    K2, V2, f2 = random_fact_set(50, 20, 8, seed=3)
    assert K.shape == (50, 8) and V.shape == (20, 8) and f.shape == (50,)
    assert torch.equal(K, K2) and torch.equal(f, f2)
    assert torch.allclose(V.norm(dim=1), torch.ones(20))
    tied = random_fact_set(20, 20, 8, seed=0, tied=True)
    assert torch.equal(tied[0], tied[1]) and torch.equal(torch.sort(tied[2]).values, torch.arange(20))
    with pytest.raises(ValueError, match="tied"):
        random_fact_set(30, 20, 8, seed=0, tied=True)
