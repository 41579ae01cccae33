"""factkernels.hf.insert_facts / evaluate on a tiny random Llama (exact mechanics) and on the packaged model."""

import copy
import dataclasses
import math

import pytest
import torch

from factkernels import datasets, hf

REQUESTS = [
    {"prompt": "the book {} was written by", "subject": "the hobbit", "target_new": "jane austen"},
    {"prompt": "who wrote {} ? it was", "subject": "war and peace", "target_new": "george orwell"},
    {"prompt": "the novel {} is by", "subject": "dune", "target_new": "mary shelley"},
    {"prompt": "the author of {} is", "subject": "emma", "target_new": "frank herbert"},
]
TEXTS = ["the old house by the river", "music and rain in the city on a new day", "people know the time of year",
         "the sun and the stone . the tree and the light", "water in the morning , music in the house",
         "a reader knows that the city is old", "the year of the rain and the sun"] * 4
PROBE = ["the old house in the rain", "who wrote the hobbit ? it was", "the novel dune is by"]


def _logits(model, tok, texts):
    ids, mask = hf.encode_texts(tok, texts)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


@pytest.fixture
def fresh_tiny(tiny_llama):
    model, tok = tiny_llama
    return copy.deepcopy(model), tok


@pytest.mark.parametrize("gate", ["detector", "generic"])
def test_insertion_is_old_plus_new_and_removal_is_exact(fresh_tiny, gate):
    model, tok = fresh_tiny
    before = copy.deepcopy(model.state_dict())
    logits_before = _logits(model, tok, PROBE)
    layer = 2
    x = hf.capture(model, *hf.encode_texts(tok, PROBE), layer)
    old_out = model.model.layers[layer].mlp(x).detach()
    ins = hf.insert_facts(model, tok, REQUESTS, layer=layer, gate=gate, background=TEXTS, progress=False)
    mlp = model.model.layers[layer].mlp
    assert mlp.up_proj.out_features == 64 + ins.report.hidden_added == model.config.intermediate_size
    # only this layer grows in memory; the state dict (what save_pretrained writes) has every layer at the new width
    assert all(m.mlp.down_proj.in_features == 64 for i, m in enumerate(model.model.layers) if i != layer)
    state = model.state_dict()
    assert all(state[f"model.layers.{i}.mlp.down_proj.weight"].shape[1] == model.config.intermediate_size
               and state[f"model.layers.{i}.mlp.gate_proj.weight"].shape[0] == model.config.intermediate_size
               for i in range(3))
    assert not state["model.layers.0.mlp.gate_proj.weight"][64:].any()  # zero units
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), old_out + ins.mlp(x), rtol=1e-5, atol=1e-5)
        # the other layers got zero units only: their outputs are unchanged
        x0 = hf.capture(model, *hf.encode_texts(tok, PROBE), 0)
        torch.testing.assert_close(model.model.layers[0].mlp(x0), before_mlp0(before, x0), rtol=1e-6, atol=1e-6)
    assert ins.report.efficacy == 1.0 and ins.report.min_margin > 0
    assert ins.report.value_error < 1e-3
    ins.remove()
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert torch.equal(_logits(model, tok, PROBE), logits_before)
    assert model.config.intermediate_size == 64 and model.config.mlp_bias is False
    with pytest.raises(RuntimeError, match="already removed"):
        ins.remove()


def before_mlp0(state, x):
    w = {k.split("mlp.")[1]: v for k, v in state.items() if k.startswith("model.layers.0.mlp.")}
    return (torch.nn.functional.silu(x @ w["gate_proj.weight"].T) * (x @ w["up_proj.weight"].T)) @ w["down_proj.weight"].T


def test_saved_model_loads_in_plain_transformers(fresh_tiny, tmp_path):
    transformers = pytest.importorskip("transformers")
    model, tok = fresh_tiny
    ins = hf.insert_facts(model, tok, REQUESTS, background=TEXTS, progress=False)
    model.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is transformers.LlamaForCausalLM
    assert loaded.config.intermediate_size == model.config.intermediate_size and loaded.config.mlp_bias
    torch.testing.assert_close(_logits(loaded, tok, PROBE), _logits(model, tok, PROBE), rtol=1e-5, atol=1e-5)
    scores = hf.evaluate(loaded, tok, REQUESTS)
    assert scores["efficacy"] == 1.0
    ins.remove()


def test_stacked_insertions_save_and_remove_last_in_first_out(fresh_tiny, tmp_path):
    """Two insertions in different layers: the checkpoint holds both at consistent positions, and removing
    them in reverse order gives back the original model, state dict and config."""
    transformers = pytest.importorskip("transformers")
    model, tok = fresh_tiny
    before = copy.deepcopy(model.state_dict())
    first = hf.insert_facts(model, tok, REQUESTS[:2], layer=1, background=TEXTS, progress=False)
    second = hf.insert_facts(model, tok, REQUESTS[2:], layer=2, background=TEXTS, progress=False)  # after the first
    width = 64 + first.report.hidden_added + second.report.hidden_added
    assert model.config.intermediate_size == width
    assert model.model.layers[2].mlp.up_proj.out_features == width  # padded for real, then its units appended
    assert model.model.layers[1].mlp.up_proj.out_features == 64 + first.report.hidden_added
    assert model.model.layers[0].mlp.up_proj.out_features == 64
    model.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(_logits(loaded, tok, PROBE), _logits(model, tok, PROBE), rtol=1e-5, atol=1e-5)
    assert hf.evaluate(loaded, tok, REQUESTS[2:])["efficacy"] == second.report.efficacy == 1.0
    with pytest.raises(RuntimeError, match="last in, first out"):
        first.remove()
    second.remove()
    first.remove()
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert model.config.intermediate_size == 64 and not hasattr(model, "_factkernels_padding_hooks")


def test_middle_layer_values_through_the_model_and_evaluate(fresh_tiny):
    """Below the last layer the values are optimised with the model running (a hook adds δ)."""
    model, tok = fresh_tiny
    ref = hf.record_reference(model, tok, neighborhood=PROBE, texts=TEXTS[:7])
    ins = hf.insert_facts(model, tok, REQUESTS[:2], layer=1, background=TEXTS, progress=False)
    assert ins.report.values["value_path"] == "model" and ins.report.num_keys == 4
    scores = hf.evaluate(model, tok, REQUESTS[:2], neighborhood=PROBE, texts=TEXTS[:7], reference=ref)
    assert scores["efficacy"] == ins.report.efficacy == 1.0
    assert set(scores) >= {"neighborhood", "perplexity", "perplexity_ratio", "kl_mean", "score"}
    ins.remove()
    unedited = hf.evaluate(model, tok, REQUESTS[:2], neighborhood=PROBE, texts=TEXTS[:7], reference=ref)
    assert unedited["neighborhood"] == 1.0 and unedited["kl_mean"] == pytest.approx(0.0, abs=1e-6)
    assert unedited["perplexity_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert unedited["log_perplexity_ratio"] == pytest.approx(0.0, abs=1e-6)
    # a ratio past a float's range (a broken edit) is inf, its log finite
    far = hf.evaluate(model, tok, REQUESTS[:2], texts=TEXTS[:7], reference=dataclasses.replace(ref, text_nll=-1000.0))
    assert far["perplexity_ratio"] == math.inf and far["log_perplexity_ratio"] == pytest.approx(far["text_nll"] + 1000)


def test_subject_keys_sit_at_the_subject(fresh_tiny):
    model, tok = fresh_tiny
    ins = hf.insert_facts(model, tok, REQUESTS[:2], layer=1, position="subject", background=TEXTS, value_steps=2,
                          progress=False)
    assert ins.report.num_keys == 2 and ins.report.hidden_added == 2 and ins.report.values["value_steps"] == 2
    ins.remove()


def test_full_model_values_keep_each_fact_once_it_reaches_the_margin(fresh_tiny, monkeypatch):
    """Through the model (target keys below the last layer), facts that reach the margin stop running and keep
    their δ; the rest train on: every fact ends at the margin and later steps run fewer prompts."""
    import factkernels.hf.insert as insert

    transformers = pytest.importorskip("transformers")
    base, tok = fresh_tiny  # larger random weights (as in the editors' tests) let δ at the subject get through
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(base.config.__class__(**{**base.config.to_dict(),
                                                                    "initializer_range": 0.2})).eval()
    batch = hf.encode_requests(tok, hf.parse_requests(REQUESTS), with_target=True)
    keys = insert.key_positions(batch, "target")  # not the last layer: the full-model path
    ran = []
    real = insert._full_model_step
    monkeypatch.setattr(insert, "_full_model_step", lambda *a, **k: ran.append(len(a[-1])) or real(*a, **k))
    delta, info = insert.optimise_deltas(model, batch, 1, keys, margin=1.0, steps=80, progress=False)
    assert info["value_path"] == "model" and info["value_min_margin"] >= 1.0
    assert ran[0] == 4 and ran[-1] < 4 and ran == sorted(ran, reverse=True)
    with torch.no_grad():  # the returned δ gives every fact its margin
        margins, _ = real(model, 1, batch, keys, delta, 1.0, 8, torch.arange(4))
    assert float(margins.min()) >= 1.0 - 1e-4


def test_values_run_only_the_blocks_after_the_layer(fresh_tiny):
    """The residual after the layer is computed once and each step runs the later blocks on it plus δ: the
    same final states as the full forward with δ added by a hook, and the same margins and loss gradient."""
    import factkernels.hf.insert as insert
    from factkernels.hf.capture import block_outputs, final_hidden, tail_hidden, tail_matches

    model, tok = fresh_tiny
    batch = hf.encode_requests(tok, hf.parse_requests(REQUESTS), with_target=True)
    ids, mask = batch.input_ids, batch.attention_mask
    assert tail_matches(model, ids, mask, 0)
    start = block_outputs(model, ids, mask, 0)
    real = mask.bool()
    with torch.no_grad():
        torch.testing.assert_close(tail_hidden(model, 0, start, mask)[real], final_hidden(model, ids, mask)[real],
                                   rtol=1e-5, atol=1e-5)
    keys = insert.key_positions(batch, "subject")
    torch.manual_seed(1)
    delta = (0.5 * torch.randn(len(keys.row), model.config.hidden_size)).requires_grad_(True)
    results = []
    for states in (None, start):  # batches of 3 requests: the gradient is accumulated over two batches
        delta.grad = None
        margins, loss = insert._full_model_step(model, 0, batch, keys, delta, 10.0, 3, torch.arange(4),
                                                start_states=states)
        results.append((margins.detach(), torch.tensor(loss), delta.grad.clone()))
    for hooked, tail in zip(*results):
        torch.testing.assert_close(tail, hooked, rtol=1e-4, atol=1e-5)
    assert results[0][1] > 0 and results[0][2].abs().sum() > 0  # δ moves the loss
    with torch.no_grad():  # one batch of all four: the same loss and margins
        margins, loss = insert._full_model_step(model, 0, batch, keys, delta, 10.0, 8, torch.arange(4),
                                                start_states=start)
    torch.testing.assert_close(margins, results[1][0], rtol=1e-4, atol=1e-5)
    assert loss == pytest.approx(float(results[1][1]), rel=1e-4)


def test_values_in_checkpointed_chunks_equal_one_run_and_resume(fresh_tiny, tmp_path, monkeypatch):
    """Through the model the values can run in chunks of requests, each written to a checkpoint when done:
    the δ equal one run over every request, a second run reads them without optimising, and a checkpoint
    made for other settings is refused."""
    import factkernels.hf.insert as insert

    transformers = pytest.importorskip("transformers")
    base, tok = fresh_tiny
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(base.config.__class__(**{**base.config.to_dict(),
                                                                    "initializer_range": 0.2})).eval()
    batch = hf.encode_requests(tok, hf.parse_requests(REQUESTS), with_target=True)
    keys = insert.key_positions(batch, "target")
    whole, info = insert.optimise_deltas(model, batch, 1, keys, margin=1.0, steps=40, progress=False)
    path = tmp_path / "values.safetensors"
    chunked, chunk_info = insert.optimise_deltas(model, batch, 1, keys, margin=1.0, steps=40, progress=False,
                                                 checkpoint=path, facts_per_chunk=3)
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-5)
    assert chunk_info["value_chunks"] == 2 and chunk_info["value_steps"] == info["value_steps"]
    assert chunk_info["value_min_margin"] == pytest.approx(info["value_min_margin"], abs=1e-3)
    monkeypatch.setattr(insert, "_optimise", lambda *a, **k: pytest.fail("a saved chunk was optimised again"))
    again, _ = insert.optimise_deltas(model, batch, 1, keys, margin=1.0, steps=40, progress=False,
                                      checkpoint=path, facts_per_chunk=3)
    assert torch.equal(again, chunked)
    with pytest.raises(ValueError, match="other requests"):
        insert.optimise_deltas(model, batch, 1, keys, margin=2.0, steps=40, progress=False, checkpoint=path)


def test_insert_rejects_bad_arguments(fresh_tiny):
    model, tok = fresh_tiny
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 3\)"):
        hf.insert_facts(model, tok, REQUESTS, layer=3, background=TEXTS, progress=False)
    with pytest.raises(ValueError, match="gate must be one of"):
        hf.insert_facts(model, tok, REQUESTS, gate="lookup", background=TEXTS, progress=False)
    with pytest.raises(ValueError, match="not in the prompt"):
        hf.insert_facts(model, tok, [{"prompt": "emma is by", "subject": "dune", "target_new": "x"}], progress=False)
    with pytest.raises(ValueError, match="keys must be one of"):
        hf.insert_facts(model, tok, REQUESTS, keys="prompt", background=TEXTS, progress=False)
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\)"):
        hf.insert_facts(model, tok, REQUESTS, keys="subject", subject_threshold=1.0, background=TEXTS, progress=False)
    with pytest.raises(ValueError, match="value_prefixes must be in"):
        hf.insert_facts(model, tok, REQUESTS, keys="subject", prefixes=["a"], value_prefixes=2, background=TEXTS,
                        progress=False)
    with pytest.raises(ValueError, match="repair_rounds must be an int >= 0"):
        hf.insert_facts(model, tok, REQUESTS, keys="subject", repair_rounds=-1, background=TEXTS, progress=False)
    assert model.config.intermediate_size == 64


@pytest.mark.slow
def test_real_model_handful_of_facts(smollm2):
    """Five counterfactual authors into the packaged SmolLM2-135M: stored, quiet on text, removable. At the last
    layer (values through the head alone; the path through later blocks is tested on the tiny Llama) with 8 of the
    90 background texts: a real model's forwards are this suite's largest cost."""
    model, tok = smollm2
    facts = hf.book_requests(5, seed=1)
    texts = datasets.natural_text("eval")[:4]
    ref = hf.record_reference(model, tok, texts=texts)
    probe = _logits(model, tok, texts[:2])
    ins = hf.insert_facts(model, tok, facts.requests, layer=model.config.num_hidden_layers - 1,
                          background=datasets.natural_text("stats")[:8], progress=False)
    assert ins.report.values["value_path"] == "head"
    try:
        scores = hf.evaluate(model, tok, facts.requests, texts=texts, reference=ref)
        assert ins.report.efficacy == scores["efficacy"] == 1.0
        assert scores["perplexity_ratio"] == pytest.approx(1.0, abs=0.02)
    finally:
        ins.remove()
    assert torch.equal(_logits(model, tok, texts[:2]), probe)


def test_cli_insert_writes_a_stock_checkpoint_and_report(fresh_tiny, tmp_path, capsys):
    import json

    from factkernels.cli import main

    model, tok = fresh_tiny
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    (tmp_path / "facts.json").write_text(json.dumps(REQUESTS[:2]))
    status = main(["insert", "--model", str(tmp_path / "base"), "--requests", str(tmp_path / "facts.json"),
                   "--out", str(tmp_path / "edited"), "--quiet"])
    report = json.loads((tmp_path / "edited" / "factkernels_insert.json").read_text())
    assert status == 0 and report["scores"]["efficacy"] == 1.0 and report["report"]["num_facts"] == 2
    edited, edited_tok = hf.load(tmp_path / "edited")
    assert hf.evaluate(edited, edited_tok, REQUESTS[:2])["efficacy"] == 1.0
    assert "wrote" in capsys.readouterr().out


def test_adaptive_threshold_silences_background_near_a_key():
    """A background state scoring 0.95 on a unit (its key scores 1) fires it under the fixed threshold 0.92;
    the adaptive threshold (halfway to the key) keeps it near silent, and every key still gets its δ."""
    from factkernels.hf.insert import MAX_THRESHOLD, detector_mlp

    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(6, 16, generator=gen, dtype=torch.float64)
    deltas = torch.randn(6, 16, generator=gen, dtype=torch.float64)
    background = torch.randn(400, 16, generator=gen, dtype=torch.float64)
    mu = background.mean(0)
    near = mu + 0.95 * (keys[2] - mu)  # s_2 is affine with s_2(mu) = 0, s_2(key 2) = 1: scores ~0.95
    background = torch.cat([background, near[None]])
    fixed, stats_fixed = detector_mlp(keys.float(), deltas.float(), background.float())
    adaptive, stats = detector_mlp(keys.float(), deltas.float(), background.float(), adaptive_threshold=True)
    assert stats["units_threshold_raised"] >= 1 and stats_fixed["units_threshold_raised"] == 0
    assert 0.92 < stats["threshold_mean"] <= MAX_THRESHOLD
    for mlp in (fixed, adaptive):  # every key still gets its delta
        torch.testing.assert_close(mlp(keys.float()), deltas.float(), rtol=1e-3, atol=1e-3)
    unit2 = lambda mlp: float(torch.nn.functional.silu(near.float() @ mlp.gate_weight[2] + mlp.gate_bias[2]))  # noqa: E731
    assert unit2(fixed) > 2.0 and abs(unit2(adaptive)) < 0.3
    assert stats["background_tokens_firing"] < stats_fixed["background_tokens_firing"]


SUBJECT_PREFIXES = ["the old house by the river", "music in the city", "a reader knows that"]


def test_subject_keys_certify_every_context_and_remove_exactly(fresh_tiny):
    model, tok = fresh_tiny
    before = copy.deepcopy(model.state_dict())
    requests = REQUESTS + [{"prompt": "the author of {} is", "subject": "dune", "target_new": "mary shelley"}]
    contexts = hf.parse_requests([{"prompt": (p + ". " if p else "") + r["prompt"], "subject": r["subject"],
                                   "target_new": r["target_new"]} for r in requests for p in ["", *SUBJECT_PREFIXES]])
    unedited = hf.fact_margins(model, tok, contexts)
    ins = hf.insert_facts(model, tok, requests, keys="subject", layer=1, background=TEXTS, prefixes=SUBJECT_PREFIXES,
                          value_prefixes=1, value_steps=30, progress=False)
    rep = ins.report
    # 4 subjects (dune twice), 2 units each; 5 requests x 4 contexts, each certified: the report's margins are
    # the edited model's own on every context (a random 3-layer model cannot reach the margin through attention)
    assert rep.position == "subject" and rep.construction["subjects"] == 4 and rep.hidden_added == 8
    # δ fit on the bare and first-prefix prompts (10), then on the contexts of subjects left unanswered
    assert rep.num_keys == 20 and rep.construction["value_contexts"] >= 10
    edited = hf.fact_margins(model, tok, contexts)
    assert rep.margins == pytest.approx(edited.tolist(), abs=1e-3)
    assert rep.efficacy == float((edited > 0).double().mean())
    assert rep.construction["uncertified"] == [[i // 4, i % 4] for i in range(20) if edited[i] <= 0]
    assert float(edited.mean()) > float(unedited.mean())  # one δ per subject moved its contexts
    assert rep.value_error < 1e-3  # the ramp saturates: every own context gets its subject's δ
    assert rep.construction["separated"] == 4
    ins.remove()
    after = model.state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)


def test_lda_detectors_separate_subjects_and_threshold_between():
    from factkernels.hf.subject_keys import lda_detectors, ramp_units

    gen = torch.Generator().manual_seed(0)
    d = 8
    centres = 6.0 * torch.eye(d)[:3]  # three subjects, far from the negatives N(0, I)
    subject = torch.arange(3).repeat_interleave(5)
    own = centres[subject] + 0.1 * torch.randn(15, d, generator=gen)
    negatives = torch.randn(200, d, generator=gen)
    det = lda_detectors(own, subject, negatives, threshold=0.5)
    assert bool(det["separated"].all())
    assert bool((det["contrast_max"] < det["tau"]).all() and (det["tau"] < det["own_min"]).all())
    deltas = torch.randn(3, d, generator=gen)
    mlp = ramp_units(det, deltas, ramp=12.0)
    with torch.no_grad():
        assert torch.allclose(mlp(own.float()), deltas[subject].float(), atol=1e-3 * float(deltas.norm(dim=1).min()))
        assert float(mlp(negatives).norm(dim=1).max()) < 1e-3 * float(deltas.norm(dim=1).min())
