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


def _one_error_line(err: str, *names: str) -> str:
    """The single stderr line of a command-line error; it names each of ``names`` and holds no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(name in lines[0] for name in names), lines[0]
    return lines[0]


@pytest.mark.parametrize("text, entry", [
    ('[{"prompt": "The author of {} is", "subject": "Dune", "target_new": "Herbert"},\n'
     ' {"prompt": "The author of Emma is", "subject": "Dune", "target_new": "Austen"}]', "request 1: subject 'Dune'"),
    ('[{"prompt": "The author of {} is", "subject": "Dune", "target_new": "Herbert"},]', "not valid JSON"),
    ('{"requests": []}', "requests is empty"),
])
def test_insert_names_the_file_and_the_bad_request(tmp_path, capsys, text, entry):
    pytest.importorskip("transformers")
    path = tmp_path / "edits.json"
    path.write_text(text)
    assert main(["insert", "--requests", str(path), "--out", str(tmp_path / "out")]) == 2
    line = _one_error_line(capsys.readouterr().err, str(path), entry)
    assert line.startswith("factkernels insert: error: ")
    assert not (tmp_path / "out").exists()  # nothing loaded, nothing written


def test_malformed_json_exits_2_without_a_traceback(tmp_path):
    """As a user runs it: a separate process, exit status 2, one line on stderr naming the file and the entry."""
    import subprocess
    import sys

    bad = tmp_path / "results" / "scaling" / "summary.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"summary": {"claims": {}, }')
    done = subprocess.run([sys.executable, "-m", "factkernels", "experiment", "report", str(tmp_path / "results"),
                           "--out", str(tmp_path / "CLAIMS.md")], capture_output=True, text=True,
                          cwd=tmp_path)  # not the repository root, whose source folder has no compiled _C
    assert done.returncode == 2
    _one_error_line(done.stderr, str(bad), "not valid JSON", "line 1, column 28")


def test_result_files_without_their_entries_are_named(tmp_path, capsys):
    cell = tmp_path / "whitening" / "cells" / "abc.json"
    cell.parent.mkdir(parents=True)
    cell.write_text('{"key": "abc", "config": {}}')
    assert main(["experiment", "whitening", "--scale", "tiny", "--out", str(tmp_path), "--resume", "--quiet"]) == 2
    _one_error_line(capsys.readouterr().err, str(cell), "no 'result' entry")


@pytest.mark.parametrize("argv, entry", [
    (["rgr-search", "rgr-budget", "--out", "o", "--pairs", "64:16,128"], "m:d_model pairs"),
    (["rgr-search", "rgr-budget", "--out", "o", "--pairs", "64:16", "--seeds", "0,x"], "comma-separated integers"),
])
def test_option_values_are_checked_before_anything_runs(capsys, argv, entry):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and entry in capsys.readouterr().err


def test_experiment_options_name_the_bad_entry(tmp_path, capsys):
    assert main(["experiment", "whitening", "--scale", "tiny", "--out", str(tmp_path), "--shard", "3/2"]) == 2
    _one_error_line(capsys.readouterr().err, "shard i/N needs 1 <= i <= N, got '3/2'")
    assert not (tmp_path / "whitening").exists()


def test_rgr_train_names_the_option_that_does_not_fit(capsys):
    assert main(["rgr-train", "--m", "8", "--d-model", "4", "--heads", "2", "--d-k", "2", "--quiet"]) == 2
    _one_error_line(capsys.readouterr().err, "--context-length 16 exceeds --m 8")


def test_capacity_rejects_sizes_below_one(capsys):
    assert main(["capacity", "--d", "0"]) == 2
    _one_error_line(capsys.readouterr().err, "--d, --facts, --seeds and --max-size must be positive")
