"""The command line: demo/construct print a report and write JSON; info reports the build."""

import json

import numpy as np
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


@pytest.mark.parametrize("matrix_format", [".safetensors", ".npy", ".pt"])
@pytest.mark.parametrize("facts_format", [".npy", ".csv"])
def test_construct_reads_your_embeddings(tmp_path, capsys, matrix_format, facts_format):
    from safetensors.torch import save_file

    from factkernels.mlp import FactMLP

    keys, values, facts = random_fact_set(40, 30, 12, seed=5, fact_map="random")
    paths = {name: tmp_path / f"{name}{matrix_format}" for name in ("keys", "values")}
    for (name, path), tensor in zip(paths.items(), (keys, values)):
        if matrix_format == ".safetensors":
            save_file({name: tensor}, str(path))
        elif matrix_format == ".npy":
            np.save(path, tensor.numpy())
        else:
            torch.save(tensor, path)
    facts_path = tmp_path / f"f{facts_format}"
    if facts_format == ".npy":
        np.save(facts_path, facts.numpy())
    else:
        facts_path.write_text("\n".join(str(int(i)) for i in facts))
    model = tmp_path / "mlp.safetensors"
    assert main(["construct", "--keys", str(paths["keys"]), "--values", str(paths["values"]), "--facts",
                 str(facts_path), "--outputs", "values", "--quiet", "--save", str(model)]) == 0
    assert "100.00%" in capsys.readouterr().out
    assert torch.equal(FactMLP.load(model).predict(keys, values), facts)


def test_construct_rejects_bad_files(tmp_path, capsys):
    keys, values, facts = random_fact_set(10, 10, 4, seed=0)
    np.save(tmp_path / "k.npy", keys.numpy())
    np.save(tmp_path / "v.npy", values.numpy())
    (tmp_path / "f.csv").write_text("0,1,2,3,4,5,6,7,8,10")  # 10 is past the last value
    np.save(tmp_path / "short.npy", facts[:5].numpy())
    k, v = str(tmp_path / "k.npy"), str(tmp_path / "v.npy")
    for argv, message in (
        (["--keys", k, "--values", v, "--facts", str(tmp_path / "f.csv")], "must lie in [0, 10)"),
        (["--keys", k, "--values", v, "--facts", str(tmp_path / "short.npy")], "5 entries but keys has 10"),
        (["--keys", k, "--values", "10", "--facts", str(tmp_path / "short.npy")], "needs --values and --facts"),
        (["--keys", str(tmp_path / "missing.npy"), "--values", v, "--facts", str(tmp_path / "f.csv")], "not exist"),
        (["--keys", str(tmp_path / "f.csv"), "--values", v, "--facts", str(tmp_path / "f.csv")], "must end in"),
    ):
        assert main(["construct", "--quiet", *argv]) == 2
        assert message in capsys.readouterr().err
