"""Transformer building blocks, the SSFR task, the FactTransformer slot, fact-adaptive accuracy,
the W-vs-F search, usability/Lipschitz and the two experiment commands (tiny sizes)."""

import json

import pytest
import torch

from factkernels.experiments import engine
from factkernels.transformer import (CausalSelfAttention, FactTransformer, RMSNorm, RotaryEmbedding, SSFRTask,
                                     build_fact_mlp, build_model, capacity, fact_adaptive_accuracy, lipschitz,
                                     run_fact_adaptive, swap_mlp, train_ssfr, usable_size)
from factkernels.transformer.training import accuracy
from factkernels.transformer.usability import spearman

GEN = torch.Generator


# ----------------------------------------------------------------------------- layers


def test_rmsnorm_frozen_projects_to_unit_sphere_and_trainable_to_rms_one():
    x = torch.randn(3, 4, 8, generator=GEN().manual_seed(0)) * 5
    frozen = RMSNorm(8, frozen=True)
    assert list(frozen.parameters()) == []
    torch.testing.assert_close(frozen(x).norm(dim=-1), torch.ones(3, 4))
    trainable = RMSNorm(8)
    torch.testing.assert_close(trainable(x).pow(2).mean(-1), torch.ones(3, 4), rtol=1e-4, atol=1e-4)
    assert trainable.weight.requires_grad
    with pytest.raises(ValueError, match="last dimension 8"):
        frozen(torch.zeros(2, 7))


def test_rotary_scores_depend_only_on_relative_position_and_keep_norms():
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 8, generator=GEN().manual_seed(1)), torch.randn(1, 1, 8, generator=GEN().manual_seed(2))
    rq, rk = rope(q.expand(1, 10, 8))[0], rope(k.expand(1, 10, 8))[0]  # (10, 8): same vector at every position
    torch.testing.assert_close(rq[7] @ rk[4], rq[3] @ rk[0])
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(10))
    assert not torch.allclose(rq[7] @ rk[4], rq[4] @ rk[4])
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7)


def test_attention_identity_value_output_is_causal_convex_mix_and_respects_padding():
    attn = CausalSelfAttention(6, identity_value_output=True)
    assert attn.value is None and attn.output is None
    x = torch.randn(2, 5, 6, generator=GEN().manual_seed(3))
    mask = torch.tensor([[False, False, True, True, True], [True] * 5])
    out, weights = attn(x, mask, return_weights=True)
    torch.testing.assert_close(out, weights @ x)  # V = O = identity
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))
    assert torch.all(weights.triu(1) == 0)  # causal
    assert torch.all(weights[0, 2:, :2] == 0)  # padded keys get no attention
    y = x.clone()
    y[:, 3:] = 0.0  # the future does not change earlier outputs
    torch.testing.assert_close(attn(y, mask)[:, :3], out[:, :3])
    full = CausalSelfAttention(6, head_dim=4)
    assert full(x).shape == (2, 5, 6) and full.value is not None


# ----------------------------------------------------------------------------- SSFR task


def test_ssfr_task_follows_the_seed_format():
    task = SSFRTask(10, 8, seed=0)
    assert task.vocab_size == 10 + 10 + 16 and len(task.junk_pairs) == 16 + 4
    for prefix, suffix in task.junk_pairs:
        assert 8 <= len(prefix) <= 16 and 8 <= len(suffix) <= 16
        assert bool(((prefix >= 20) & (prefix < 36)).all()) and bool(((suffix >= 20) & (suffix < 36)).all())
    batch = task.sequences(split="train")
    assert len(batch) == 10 * 16
    for i in range(0, len(batch), 7):
        real = batch.tokens[i][batch.padding_mask[i]]
        prefix, suffix = task.junk_pairs[i % 16]
        expected = torch.cat([prefix, batch.keys[i].view(1), suffix])
        assert torch.equal(real, expected)
        assert bool(batch.padding_mask[i, -1])  # left padding: the prediction position is the last
    assert torch.equal(batch.targets, task.facts[batch.keys])
    test = task.sequences(split="test")
    assert len(test) == 10 * 4
    torch.testing.assert_close(task.mlp_keys.norm(dim=1), torch.ones(10))
    assert torch.equal(task.mlp_values, task.embeddings[10:20])
    assert torch.equal(SSFRTask(10, 8, seed=0).embeddings, task.embeddings)  # seeded
    assert not torch.equal(task.new_facts(1), task.facts)
    sample = task.sample(32, GEN().manual_seed(0))
    assert sample.tokens.shape == (32, task.max_length)


def test_ssfr_task_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_keys"):
        SSFRTask(0, 8)
    with pytest.raises(ValueError, match="junk_length"):
        SSFRTask(4, 8, junk_length=(5, 3))
    with pytest.raises(ValueError, match="num_test_pairs > 0"):
        SSFRTask(4, 8, num_test_pairs=0).sequences(split="test")
    with pytest.raises(ValueError, match="split"):
        SSFRTask(4, 8).sequences(split="valid")


def test_ssfr_kappa_ill_conditions_embeddings():
    task = SSFRTask(32, 8, kappa=100.0, seed=0)
    s = torch.linalg.svdvals(task.embeddings[:32].double())
    assert float(s[0] / s[-1]) == pytest.approx(100.0, rel=1e-3)


# ----------------------------------------------------------------------------- model and training


@pytest.fixture(scope="module")
def tiny():
    task = SSFRTask(64, 32, seed=0)
    make = lambda f: build_fact_mlp("constructed", task.mlp_keys, task.mlp_values, f, 64)  # noqa: E731
    return task, make


def test_model_freezes_key_value_embeddings_and_mlp_and_swaps(tiny):
    task, make = tiny
    mlp = make(task.facts)
    model = build_model(task, mlp, seed=0)
    assert isinstance(model, FactTransformer)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"trainable_embeddings", "attention_norm.weight", "attention.query.weight",
                         "attention.key.weight"}
    assert model.trainable_embeddings.shape == (16, 32)  # only the junk tokens train
    batch = task.sample(8, GEN().manual_seed(0))
    logits = model(batch.tokens, batch.padding_mask)
    assert logits.shape == (8, task.max_length, 64)
    torch.testing.assert_close(model(batch.tokens, batch.padding_mask, last_only=True), logits[:, -1])
    # with attention that only sees the key, the block recalls exactly what the MLP stores
    recalled = model.mlp(model.mlp_norm(task.embeddings[:64])) @ model.output_embeddings.T
    torch.testing.assert_close(recalled, mlp(task.mlp_keys) @ task.mlp_values.T, rtol=1e-3, atol=1e-3)
    assert torch.equal(recalled.argmax(1), task.facts)
    other = make(task.new_facts(1))
    assert swap_mlp(model, other) is mlp and model.mlp is other
    assert not torch.allclose(model(batch.tokens, batch.padding_mask, last_only=True), logits[:, -1])
    with pytest.raises(ValueError, match=r"\(n, 32\)"):
        model.swap_mlp(torch.nn.Linear(32, 3))


def test_vanilla_switches_give_a_standard_block(tiny):
    task, make = tiny
    model = build_model(task, make(task.facts), seed=0, tie_embeddings=False, residual=True, freeze_mlp_norm=False,
                        identity_value_output=False)
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    assert {"output_weight", "mlp_norm.weight", "attention.value.weight", "attention.output.weight"} <= names


def test_output_norm_rescales_the_block_output_before_the_output_layer(tiny):
    task, make = tiny
    mlp = make(task.facts)
    plain = build_model(task, mlp, seed=0)
    normed = build_model(task, mlp, seed=0, output_norm=True)
    assert plain.output_norm is None and normed.output_norm.weight.requires_grad
    x = torch.randn(5, task.embeddings.shape[1])
    assert torch.allclose(normed.output_norm(x).pow(2).mean(-1), torch.ones(5), atol=1e-4)  # unit RMS at init
    with torch.no_grad():
        normed.output_norm.weight.mul_(2.0)
    data = torch.randint(0, task.embeddings.shape[0], (3, 6))
    out_plain, out_normed = plain.hidden(data), normed.hidden(data)
    assert torch.allclose(out_normed, 2.0 * out_plain * torch.rsqrt(out_plain.pow(2).mean(-1, keepdim=True) + 1e-6),
                          atol=1e-5)


def test_training_learns_to_use_the_mlp_and_swapping_recalls_new_facts(tiny):
    task, make = tiny
    new_facts = task.new_facts(1)
    mlp_a, mlp_b = make(task.facts), make(new_facts)
    assert capacity(mlp_a, task.mlp_keys, task.mlp_values, task.facts) == 1.0
    model = build_model(task, mlp_a, seed=0)
    before = accuracy(model, task.sequences(split="train"))
    result = train_ssfr(model, task, steps=400, batch_size=64, lr=1e-2, eval_every=100, progress=False)
    assert before < 0.1 and result.final_accuracy > 0.6  # chance is 1/64
    faa = fact_adaptive_accuracy(model, task, mlp_b, new_facts)
    # the transformer recalls facts it never saw through the swapped MLP about as well as its own
    assert faa > 0.6 and faa > result.final_accuracy - 0.15
    assert model.mlp is mlp_a  # swapped back
    # a mismatched MLP (facts B, evaluated on A's sequences) gets A's facts wrong
    assert fact_adaptive_accuracy(model, task, mlp_b, task.facts) < 0.1


def test_accuracy_can_stop_at_the_first_chunk_with_a_wrong_sequence(tiny):
    from dataclasses import replace

    task, make = tiny
    model = build_model(task, make(task.facts), seed=0)
    batch = task.sequences(task.facts, split="train")  # 64 keys x 16 junk tuples
    full = accuracy(model, batch, chunk=256)
    assert full < 1 and accuracy(model, batch, chunk=256, stop_at_miss=True) is None
    with torch.no_grad():  # targets set to the model's own answers: every sequence right, every chunk scored
        own = model(batch.tokens, batch.padding_mask, last_only=True).argmax(-1)
    assert accuracy(model, replace(batch, targets=own), chunk=256, stop_at_miss=True) == 1.0
    result = train_ssfr(model, task, steps=30, eval_every=10, progress=False)
    assert [step for step, _ in result.accuracies] == [10, 20, 30]
    assert result.accuracies[0][1] is None and result.accuracies[-1][1] == result.final_accuracy  # the last: full


def test_run_fact_adaptive_skips_training_when_capacity_is_too_low(tiny):
    task, _ = tiny
    result = run_fact_adaptive(task, lambda f: build_fact_mlp("constructed", task.mlp_keys, task.mlp_values, f, 1),
                               new_facts=task.new_facts(1), min_capacity=0.99, progress=False)
    assert result.fact_adaptive_accuracy is None and result.runs == [] and result.capacity_new < 0.99
    assert result.usability is None


def test_usable_size_search_records_every_size_and_gives_up_at_max(tiny):
    task, _ = tiny
    point = usable_size(task, "constructed", start=32, max_size=64, steps=2, eval_every=1, progress=False)
    assert point.size is None and [t["size"] for t in point.trace] == [32, 64]
    assert all(not t["usable"] for t in point.trace)
    with pytest.raises(ValueError, match="resolution"):
        usable_size(task, resolution=1.0)
    # finished sizes are replayed, not trained again: a replayed usable start sends the search down
    reported = []
    replayed = usable_size(task, "constructed", start=32, max_size=64, steps=2, eval_every=1, progress=False,
                           done=[{**point.trace[0], "usable": True}], on_trial=reported.append)
    assert replayed.size == 32 and [t["size"] for t in replayed.trace] == [32, 24, 28]
    assert [t["size"] for t in reported] == [24, 28]
    reported = []
    resumed = usable_size(task, "constructed", start=32, max_size=64, steps=2, eval_every=1, progress=False,
                          done=point.trace[:1], on_trial=reported.append)
    assert [t["size"] for t in resumed.trace] == [32, 64] and [t["size"] for t in reported] == [64]


def test_a_trial_rescored_on_the_other_split_is_the_trial_measured_there(tiny):
    from factkernels.transformer import rescored_trial

    task, _ = tiny
    # one size (a usable start of ratio 2 to its floor stops the search), one seed, short training
    search = dict(start=64, max_size=64, resolution=2.0, target=0.05, seeds=[0, 1], lrs=[1e-2], steps=60,
                  eval_every=30, progress=False)
    (on_j,) = usable_size(task, split="train", **search).trace
    (on_all,) = usable_size(task, split="all", **search).trace
    j_runs = [r["fact_adaptive_accuracy"] for r in on_j["runs"]]
    all_runs = [r["fact_adaptive_accuracy"] for r in on_all["runs"]]
    assert j_runs != all_runs  # the splits score differently ...
    assert [r["fact_adaptive_test_accuracy"] for r in on_j["runs"]] == \
        [r["fact_adaptive_test_accuracy"] for r in on_all["runs"]]  # ... the same transformers
    for measured, other, source in ((on_j, on_all, "all"), (on_all, on_j, "train")):
        split = "train" if source == "all" else "all"
        rescored = rescored_trial(other, task, source, split, target=0.05)
        assert rescored["rescored_from"] == source and rescored["usable"] == measured["usable"]
        assert [r["fact_adaptive_accuracy"] for r in rescored["runs"]] == \
            pytest.approx([r["fact_adaptive_accuracy"] for r in measured["runs"]], abs=1e-12)
        assert rescored["fact_adaptive_accuracy"] == pytest.approx(measured["fact_adaptive_accuracy"], abs=1e-12)
    assert rescored_trial(on_j, task, "train", "train") is on_j
    unstored = {"size": 1, "usable": False, "fact_adaptive_accuracy": None, "capacity": 0.2, "runs": []}
    # no transformer ran: nothing to rescore
    assert rescored_trial(unstored, task, "all", "train") == {**unstored, "rescored_from": "all"}
    with pytest.raises(ValueError, match="'train' or 'all'"):
        rescored_trial(on_j, task, "test", "train")
    held_out_missing = {**on_j, "runs": [{**on_j["runs"][0], "fact_adaptive_test_accuracy": None}]}
    with pytest.raises(ValueError, match="held-out"):
        rescored_trial(held_out_missing, task, "train", "all")


# ----------------------------------------------------------------------------- usability


def test_gd_mlp_with_whitening_folded_still_reads_unwhitened_keys():
    task = SSFRTask(16, 16, kappa=50.0, seed=0)
    mlp = build_fact_mlp("gd", task.mlp_keys, task.mlp_values, task.facts, 32, whiten=1.0, gd_steps=3000)
    assert capacity(mlp, task.mlp_keys, task.mlp_values, task.facts) == 1.0
    with pytest.raises(ValueError, match="kind"):
        build_fact_mlp("ntk", task.mlp_keys, task.mlp_values, task.facts, 8)


def test_lipschitz_is_max_spectral_norm_of_the_jacobian(tiny):
    task, make = tiny
    mlp = make(task.facts)
    keys, values = task.embeddings[:64], task.mlp_values

    def exact(x):
        jac = torch.autograd.functional.jacobian(lambda z: values @ mlp(z / z.norm()), x)  # (|V|, d)
        return float(torch.linalg.svdvals(jac)[0])

    assert lipschitz(mlp, keys, values, num_samples=100, chunk=5) == pytest.approx(max(exact(k) for k in keys), rel=1e-4)
    assert lipschitz(mlp, keys, values, num_samples=3) <= lipschitz(mlp, keys, values, num_samples=64) + 1e-6
    with pytest.raises(ValueError, match="num_samples"):
        lipschitz(mlp, keys, values, num_samples=0)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 1, 1], [1, 2, 3]) != spearman([1, 1, 1], [1, 2, 3])  # NaN: a constant has no ranking
    with pytest.raises(ValueError, match="same length"):
        spearman([1, 2], [1, 2, 3])


# ----------------------------------------------------------------------------- commands


def test_experiment_ssfr_cells_and_claims(tiny_run):
    res, folder = tiny_run("ssfr")
    assert set(res.summary["headline"]) == {"seed_modifications", "vanilla"}
    acc = res.summary["headline"]["seed_modifications"]["fact_adaptive_accuracy"]
    assert 0.0 <= acc <= 1.0 and f"{acc:.3f}" in res.summary["claims"]["000-sec5.1-fact-adaptive"]["ours"]
    runs = res.summary["headline"]["seed_modifications"]["runs"]
    assert acc == max(r["fact_adaptive_accuracy"] for r in runs)  # scored on the seed's J (training junk)
    assert all(0.0 <= r["fact_adaptive_test_accuracy"] <= 1.0 for r in runs)  # held-out junk, reported beside
    assert res.summary["scaling"][0]["num_facts"] == 8 and res.summary["scaling"][0]["trace"]
    assert res.summary["claims"]["000-fig3a-w-vs-f"]["verdict"] == "not run"  # one F gives no slope
    assert (folder / "ssfr_scaling.png").stat().st_size > 0
    # the tiny grid runs the seed's GPT-2 block (final norm); a cell of the earlier block is cited beside it
    from factkernels.experiments import ssfr_swap as texp

    cells = list(engine.load_cells(folder.parent, "ssfr").values())
    assert res.summary["output_norm"] and all(c.config["output_norm"] for c in cells)
    old = next(c for c in cells if c.config.get("variant") == "seed_modifications")
    earlier = engine.Cell("earlier", {k: v for k, v in old.config.items() if k != "output_norm"},
                          {**old.result, "fact_adaptive_accuracy": 0.123}, 0.0)
    both = texp.summarize(cells + [earlier])
    assert both["headline"]["seed_modifications"] == old.result
    assert "without the final RMSNorm (our earlier block) 0.123" in both["claims"]["000-sec5.1-fact-adaptive"].reason
    alone = texp.summarize([earlier])  # only the earlier block: it speaks, and says so
    assert not alone["output_norm"] and "without GPT-2's final RMSNorm" in alone["claims"]["000-sec5.1-fact-adaptive"].setting


@pytest.mark.cuda
def test_ssfr_and_usability_cells_train_on_the_gpu(tmp_path):
    """--device cuda: the SSFR transformers train there, the cells say where they ran, and the accuracies
    match the CPU's up to float rounding in 20 steps of training."""
    accuracies = {}
    for device in ("cpu", "cuda"):
        for name in ("ssfr", "usability"):
            engine.run(name, tmp_path / device, scale="tiny", quiet=True, device=device)
            cells = list((tmp_path / device / name / "cells").glob("*.json"))
            assert cells and all(json.loads(p.read_text())["device"].startswith(device) for p in cells)
        headline = engine.load_cells(tmp_path / device, "ssfr").values()
        accuracies[device] = {c.config["variant"]: c.result["fact_adaptive_accuracy"] for c in headline
                              if c.config["part"] == "headline"}
    for variant, accuracy in accuracies["cpu"].items():
        assert abs(accuracies["cuda"][variant] - accuracy) <= 0.1


def test_ssfr_w_vs_f_speaks_from_the_seeds_j_and_cites_the_stricter_search():
    from factkernels.experiments import ssfr_swap as texp

    base = {"dim": 8, "seeds": [0], "steps": 20, "batch_size": 16, "lrs": [0.01], "target": 0.99, "resolution": 2.0,
            "max_size": 40, "mlp": "constructed", "output_norm": True, "part": "scaling"}

    def search(facts, parameters, split=None):
        config = {**base, "facts": facts, **({} if split is None else {"split": split})}
        trace = [{"size": 10, "capacity": 1.0}, {"size": 5, "capacity": 0.5}]
        result = {"num_facts": facts, "size": 10, "parameters": parameters, "trace": trace}
        return engine.Cell(f"{facts}-{split}", config, result, 0.0)
    on_j = [search(64, 1000, "train"), search(128, 2000, "train")]
    stricter = [search(64, 4000), search(128, 5000)]
    both = texp.summarize(on_j + stricter)
    claim = both["claims"]["000-fig3a-w-vs-f"]
    assert both["scaling_split"] == "train" and [p["parameters"] for p in both["scaling"]] == [1000, 2000]
    assert claim.ours == "F=64: W=1,000, F=128: W=2,000; slope 1.00" and "the seed's J" in claim.setting
    assert "held-out junk tuples (stricter than the seed's J) W is 4,000 at F=64, 5,000 at F=128 (slope 0.32)" \
        in claim.reason
    alone = texp.summarize(stricter)  # no J search: the stricter one speaks, and says how it scored
    assert alone["scaling_split"] == "all" and alone["scaling_all_tuples"] == []
    assert "training + held-out junk tuples" in alone["claims"]["000-fig3a-w-vs-f"].setting


@pytest.mark.parametrize("steps, train_accuracy, length, blames_training", [
    (18_750, 0.51, "at the paper's training length", True),
    (6_000, 1.0, "with a fraction of the paper's training sequences", False)])
def test_ssfr_fact_adaptive_shortfall_says_how_long_it_trained_and_whether_training_fit(
        steps, train_accuracy, length, blames_training):
    from factkernels.experiments import ssfr_swap as texp

    config = {"dim": 128, "seeds": [0, 1], "steps": steps, "batch_size": 256 if steps == 18_750 else 64,
              "lrs": [2e-4], "facts": 256, "target": 0.99, "resolution": 1.25, "max_size": 4096,
              "mlp": "constructed", "output_norm": True, "part": "headline", "variant": "seed_modifications",
              "split": "train"}
    runs = [{"seed": s, "lr": 2e-4, "train_accuracy": train_accuracy, "fact_adaptive_accuracy": 0.5,
             "fact_adaptive_test_accuracy": 0.1} for s in (0, 1)]
    cell = engine.Cell("head", config, {"fact_adaptive_accuracy": 0.5, "runs": runs}, 0.0)
    claim = texp.summarize([cell])["claims"]["000-sec5.1-fact-adaptive"]
    assert claim.verdict == "not reproduced" and length in claim.reason
    assert ("training, not the swap, is what falls short" in claim.reason) == blames_training


def test_experiment_ssfr_search_resumes_from_its_finished_sizes(tiny_run, tmp_path, monkeypatch):
    import json

    from factkernels.transformer import scaling

    grid = [c for c in engine.get("ssfr").grid("tiny") if c["part"] == "scaling"]
    (fresh_cell,) = [c for c in engine.load_cells(tiny_run("ssfr")[1].parent, "ssfr").values()
                     if c.config["part"] == "scaling"]
    sizes = [t["size"] for t in fresh_cell.result["trace"]]
    assert len(sizes) >= 2
    real = scaling.run_fact_adaptive
    calls = []

    def train_then_stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run is killed while it trains the second size
        return real(*args, **kwargs)

    monkeypatch.setattr(scaling, "run_fact_adaptive", train_then_stop)
    with pytest.raises(KeyboardInterrupt):
        engine.run("ssfr", tmp_path / "run", scale="tiny", grid=grid, resume=True, quiet=True)
    (partial,) = (tmp_path / "run" / "ssfr" / "partial").iterdir()
    assert [t["size"] for t in json.loads(partial.read_text())["trials"]] == sizes[:1]
    calls.clear()
    monkeypatch.setattr(scaling, "run_fact_adaptive", lambda *a, **k: calls.append(1) or real(*a, **k))
    engine.run("ssfr", tmp_path / "run", scale="tiny", grid=grid, resume=True, quiet=True)
    (resumed,) = engine.load_cells(tmp_path / "run", "ssfr").values()
    assert len(calls) == len(sizes) - 1  # the first size is replayed from the partial file
    assert resumed.result == fresh_cell.result
    assert not partial.exists()  # removed once the cell is written


def test_experiment_ssfr_headline_resumes_from_its_finished_runs(tmp_path, monkeypatch):
    import json

    from factkernels.transformer import training

    (cell,) = [c for c in engine.get("ssfr").grid("tiny") if c["part"] == "headline"][:1]
    grid = [{**cell, "seeds": [0, 1, 2]}]
    fresh = engine.run("ssfr", tmp_path / "fresh", scale="tiny", grid=grid, quiet=True)
    (fresh_cell,) = engine.load_cells(tmp_path / "fresh", "ssfr").values()
    assert [r["seed"] for r in fresh_cell.result["runs"]] == [0, 1, 2]
    real = training.train_ssfr
    seeds_trained = []

    def train_then_stop(model, task, **kwargs):
        seeds_trained.append(kwargs["seed"])
        if len(seeds_trained) == 3:
            raise KeyboardInterrupt  # the run is killed while it trains the third transformer
        return real(model, task, **kwargs)

    monkeypatch.setattr(training, "train_ssfr", train_then_stop)
    with pytest.raises(KeyboardInterrupt):
        engine.run("ssfr", tmp_path / "run", scale="tiny", grid=grid, resume=True, quiet=True)
    (partial,) = (tmp_path / "run" / "ssfr" / "partial").iterdir()
    assert [r["seed"] for r in json.loads(partial.read_text())["runs"]] == [0, 1]
    seeds_trained.clear()
    monkeypatch.setattr(training, "train_ssfr", lambda model, task, **k: seeds_trained.append(k["seed"]) or
                        real(model, task, **k))
    engine.run("ssfr", tmp_path / "run", scale="tiny", grid=grid, resume=True, quiet=True)
    (resumed,) = engine.load_cells(tmp_path / "run", "ssfr").values()
    assert seeds_trained == [2]  # seeds 0 and 1 are read back from the partial file
    assert resumed.result == fresh_cell.result
    assert not partial.exists()


def test_experiment_ssfr_search_replays_the_sizes_the_other_split_measured(tmp_path, monkeypatch):
    from factkernels.transformer import scaling

    (on_j,) = [c for c in engine.get("ssfr").grid("tiny") if c["part"] == "scaling"]
    stricter = {k: v for k, v in on_j.items() if k != "split"}
    engine.run("ssfr", tmp_path, scale="tiny", grid=[on_j], quiet=True)
    j_sizes = {t["size"] for t in engine.load_cells(tmp_path, "ssfr")[engine.cell_key(on_j)].result["trace"]}
    real, trained = scaling.run_fact_adaptive, []
    monkeypatch.setattr(scaling, "run_fact_adaptive", lambda *a, **k: trained.append(1) or real(*a, **k))
    engine.run("ssfr", tmp_path, scale="tiny", grid=[on_j, stricter], resume=True, quiet=True)
    trace = engine.load_cells(tmp_path, "ssfr")[engine.cell_key(stricter)].result["trace"]
    replayed = [t for t in trace if t["size"] in j_sizes]
    assert replayed and all(t.get("rescored_from") == "train" for t in replayed)
    assert len(trained) == len({t["size"] for t in trace} - j_sizes)  # only the sizes J did not measure train


def test_w_vs_f_names_what_set_each_width():
    from factkernels.experiments.ssfr_swap import _width_limit

    def point(size, *tried):
        return {"size": size, "trace": [{"size": s, "capacity": c} for s, c in tried]}

    assert _width_limit(point(40, (80, 1.0), (40, 1.0), (20, 0.5), (30, 0.98)), 0.99) == "storage"  # 30 is the nearest
    assert _width_limit(point(40, (80, 1.0), (40, 1.0), (30, 1.0), (20, 0.5)), 0.99) == "usability"
    assert _width_limit(point(40, (40, 1.0), (60, 1.0)), 0.99) == "floor"


def test_experiment_usability_rows_and_correlations(tmp_path):
    res = engine.run("usability", tmp_path, scale="tiny", quiet=True)
    rows = res.summary["rows"]
    assert [(r["kappa"], r["alpha"]) for r in rows] == [(1.1, 0.0), (1.1, 1.0)]
    for row in rows:
        assert 0 < row["capacity"] <= 1 and row["lipschitz"] > 0 and row["runs"]
    usable = [r for r in rows if r["usability"] is not None]
    if len(usable) == 2:
        expected = spearman([r["lipschitz"] for r in usable], [r["usability"] for r in usable])
        assert res.summary["spearman_usability_vs_lipschitz"] == pytest.approx(expected, nan_ok=True)
    assert (tmp_path / "usability" / "usability.png").stat().st_size > 0
    # tiny runs the seed's block; cells of the earlier block (no output_norm field) do not mix into its rows
    from factkernels.experiments import usability_tradeoff as texp

    cells = list(engine.load_cells(tmp_path, "usability").values())
    assert res.summary["output_norm"] and all(c.config["output_norm"] for c in cells)
    earlier = [engine.Cell(c.key + "-earlier", {k: v for k, v in c.config.items() if k != "output_norm"},
                           {**c.result, "capacity": 0.5}, 0.0) for c in cells]
    assert texp.summarize(cells + earlier)["rows"] == rows
    alone = texp.summarize(earlier)
    assert not alone["output_norm"] and all(r["capacity"] == 0.5 for r in alone["rows"])


def test_usability_is_scored_on_the_seeds_j_and_cites_all_junk_tuples():
    from factkernels.experiments import usability_tradeoff as texp

    def cell(alpha, capacity, lipschitz, runs):
        config = {"dim": 8, "facts": 8, "seeds": [0, 1], "steps": 20, "batch_size": 16, "lrs": [0.01],
                  "lipschitz_samples": 4, "output_norm": True, "mlp": "gd", "size": 4, "gd_steps": 2000,
                  "kappa": 10.0, "alpha": alpha}
        runs = [{"fact_adaptive_accuracy": a, "fact_adaptive_test_accuracy": t} for a, t in runs]
        best = max((r["fact_adaptive_accuracy"] for r in runs), default=None)
        result = {"kappa": 10.0, "alpha": alpha, "capacity": capacity, "lipschitz": lipschitz, "runs": runs,
                  "fact_adaptive_accuracy": best, "usability": None if best is None else best / capacity}
        return engine.Cell(f"a{alpha}", config, result, 0.0)
    # all = (16 J + 4 held-out) / 20: J 1.0 and held-out 0.5 give 0.9 on all junk tuples
    cells = [cell(0.0, 1.0, 10.0, [(0.9, 0.5), (0.8, 1.0)]), cell(0.5, 1.0, 20.0, [(0.8, 0.5)]),
             cell(1.0, 0.5, 30.0, [])]  # no run: its MLP stored too few facts
    summary = texp.summarize(cells)
    assert summary["usability_split"] == "train" and summary["rows_all_tuples"] == [c.result for c in cells]
    assert [r["fact_adaptive_accuracy"] for r in summary["rows"]][:2] == pytest.approx([1.0, 0.875])
    assert summary["rows"][2]["fact_adaptive_accuracy"] is None
    assert summary["rows"][0]["runs"][1]["fact_adaptive_accuracy"] == pytest.approx(0.75)
    claim = summary["claims"]["000-fig3c-lipschitz"]
    assert "the seed's J" in claim.setting and "Spearman(usability, Lipschitz) = -1.00" in claim.reason
    # a run without its held-out accuracy (older cells): every row stays on all junk tuples, and says so
    cells[1].result["runs"][0]["fact_adaptive_test_accuracy"] = None
    older = texp.summarize(cells)
    assert older["usability_split"] == "all" and older["rows"] == [c.result for c in cells]
    assert "training + held-out junk tuples" in older["claims"]["000-fig3c-lipschitz"].setting


@pytest.mark.parametrize("usability_at_alpha_1, traded", [(0.5, True), (0.97, False)])
def test_tradeoff_needs_usability_to_fall_by_more_than_noise(usability_at_alpha_1, traded):
    from factkernels.experiments import usability_tradeoff as texp

    def cell(kappa, alpha, capacity, accuracy):
        config = {"dim": 8, "facts": 8, "seeds": [0], "steps": 20, "batch_size": 16, "lrs": [0.01],
                  "lipschitz_samples": 4, "output_norm": True, "mlp": "gd", "size": 4, "gd_steps": 2000,
                  "kappa": kappa, "alpha": alpha}
        result = {"kappa": kappa, "alpha": alpha, "capacity": capacity, "lipschitz": 10.0 + alpha,
                  "runs": [{"fact_adaptive_accuracy": accuracy}], "fact_adaptive_accuracy": accuracy,
                  "usability": accuracy / capacity}
        return engine.Cell(f"{kappa}-{alpha}", config, result, 0.0)
    # whitening raises capacity 0.5 -> 1.0 at kappa = 1000; usability falls from 1.0 to the parameter
    cells = [cell(1000.0, 0.0, 0.5, 0.5), cell(1000.0, 1.0, 1.0, usability_at_alpha_1)]
    claim = texp.summarize(cells)["claims"]["000-fig3b-tradeoff"]
    assert f"more than {texp.USABILITY_DROP}" in claim.reason
    assert ("at κ ∈ [1000.0]" in claim.reason) == traded
    assert ("never trades" in claim.reason) != traded
    # one kappa is too thin to call it reproduced; the pooled rank correlation (-1 on two points) keeps "partly"
    assert claim.verdict == "partly"
