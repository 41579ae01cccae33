"""factkernels.hf editors (ROME/MEMIT/AlphaEdit/GRACE/WISE), causal tracing, key statistics and the shipped text,
on a tiny random Llama."""

import pytest
import torch

from factkernels import datasets, hf
from factkernels.editing import hparams
from factkernels.hf.editors import context_keys, edit
from factkernels.hf.residual import residual_targets
from factkernels.hf.statistics import key_second_moments

REQUESTS = [
    {"prompt": "the book {} was written by", "subject": "the hobbit", "target_new": "jane austen"},
    {"prompt": "who wrote {} ? it was", "subject": "war and peace", "target_new": "george orwell"},
]
TEXTS = ["the old house of the river city in the morning rain", "people knows that time and music and water",
         "a new day on the stone tree light", "the reader of the novel knows the author of the book"] * 3
# Random small weights pass little from the subject to the last token; these settings let δ get through.
STRONG = {"clamp_norm": 1e3, "steps": 40, "lr": 0.5, "weight_decay": 0.0, "kl_factor": 0.0}
# Fewer generated prefixes than published (1 + 2 contexts), to keep the tiny tests fast.
FEW = {"prefixes": ((4, 2),)}


@pytest.fixture(scope="module")
def llama(tiny_llama):
    """The tiny word-level Llama with larger random weights (initializer_range 0.2), so edits can act."""
    transformers = pytest.importorskip("transformers")
    base, tok = tiny_llama
    config = base.config.__class__(**{**base.config.to_dict(), "initializer_range": 0.2})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), tok


def _target_nll(model, tok, requests):
    from factkernels.hf.residual import target_nll as nll

    with torch.no_grad():
        return nll(model, hf.encode_requests(tok, hf.parse_requests(requests), with_target=True))


def _logits(model, tok):
    batch = hf.encode_requests(tok, hf.parse_requests(REQUESTS))
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


@pytest.mark.parametrize("method, layers, extra", [
    ("rome", (1,), {}),
    ("memit", (1,), {}),
    ("alphaedit", (1,), {"nullspace_threshold": 1.0, "l2": 1e-4}),  # C's eigenvalues below 1: 33 of 64
])
def test_edit_moves_the_target_and_restore_is_exact(llama, tmp_path, method, layers, extra):
    model, tok = llama
    stats = key_second_moments(model, tok, layers, texts=TEXTS, cache_dir=tmp_path)
    before_logits = _logits(model, tok)
    before_nll = _target_nll(model, tok, REQUESTS)
    result = edit(model, tok, REQUESTS, method=method, layers=layers, stats=stats, progress=False, **STRONG, **FEW,
                  **extra)
    after_nll = _target_nll(model, tok, REQUESTS)
    edited_logits = _logits(model, tok)
    result.restore()
    assert result.report["nll_target"] < result.report["nll_before"] - 0.5  # δ reached the target
    assert float(after_nll.mean()) < float(before_nll.mean()) - 0.1  # and the weight edit carries it
    last = hf.encode_requests(tok, hf.parse_requests(REQUESTS)).prompt_last
    rows = torch.arange(len(REQUESTS))
    assert not torch.equal(edited_logits[rows, last].argmax(-1), before_logits[rows, last].argmax(-1))  # greedy changed
    assert torch.equal(_logits(model, tok), before_logits)
    if method == "alphaedit":
        assert 0 < result.report["null_space_dims"][1] < 64


def test_rome_writes_its_targets_exactly(llama, tmp_path):
    """ROME's rank-one edit makes W k* = v* = h + δ for the bare prompt's key k* (δ from the same residual
    step), along C⁻¹u with u the key averaged over the contexts (ROME's compute_u)."""
    model, tok = llama
    requests = hf.parse_requests(REQUESTS[:1])
    stats = key_second_moments(model, tok, [1], texts=TEXTS, cache_dir=tmp_path)
    result = edit(model, tok, requests, method="rome", layers=[1], stats=stats, progress=False, **STRONG, **FEW)
    prefixes = result.report["prefixes"]
    assert len(prefixes) == 2
    try:
        edited = model.model.layers[1].mlp.down_proj.weight.detach().clone()
        result.restore()
        mean_keys, keys, _ = context_keys(model, tok, requests, prefixes, 1, 1)
        contexts = hf.encode_requests(tok, [hf.Request(p + ". " + requests[0].prompt, requests[0].subject,
                                                       requests[0].target_new) for p in prefixes])
        each = hf.capture(model, contexts.input_ids, contexts.attention_mask, 1, site="down_in",
                          positions=contexts.subject_last)
        torch.testing.assert_close(mean_keys, torch.cat([keys, each]).mean(0, keepdim=True))
        targets = result.targets
        with torch.no_grad():
            written = keys @ edited.T
        torch.testing.assert_close(written, targets.mlp_out + targets.delta, rtol=1e-4, atol=1e-4)
        assert (targets.delta.norm(dim=1) > 1.0).all()
        change = edited - model.model.layers[1].mlp.down_proj.weight.detach()
        cov = stats[1] + 1e-4 * stats[1].diagonal().mean() * torch.eye(64)
        direction = torch.linalg.solve(cov, mean_keys[0])
        row = change[change.norm(dim=1).argmax()]
        assert abs(float(torch.nn.functional.cosine_similarity(row, direction, dim=0))) > 0.999
    finally:
        result.restore()


def test_context_keys_are_the_full_forwards_keys_and_states(llama):
    """Keys over the contexts (shared heads, each forward stopped at its layer) are the down projection's inputs of
    a full forward of every row, and the current z its residual stream after the state layer on the bare prompt."""
    model, tok = llama
    requests = hf.parse_requests(REQUESTS + [{"prompt": "{} was written by", "subject": "dune", "target_new": "x"}])
    prefixes = ["the old house", "people knows that time and music"]
    mean_keys, keys, states = context_keys(model, tok, requests, prefixes, 0, 1)
    rows = hf.encode_requests(tok, [hf.Request(c.format(r.prompt), r.subject, r.target_new) for r in requests
                                    for c in ["{}"] + [p + ". {}" for p in prefixes]])
    from factkernels.hf.capture import record_inputs

    with record_inputs(model.model.layers[0].mlp.down_proj) as seen, torch.no_grad():
        out = model.model(input_ids=rows.input_ids, attention_mask=rows.attention_mask, output_hidden_states=True)
    at = torch.arange(len(rows)), rows.subject_last
    full_keys = seen[0][at].view(len(requests), 3, -1)
    torch.testing.assert_close(keys, full_keys[:, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mean_keys, full_keys.mean(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(states, out.hidden_states[2][at].view(len(requests), 3, -1)[:, 0], rtol=1e-5,
                               atol=1e-6)


def test_reused_targets_give_the_same_edit_and_are_checked(llama, tmp_path, monkeypatch):
    """An update-rule grid reuses δ: the same mom2_weight gives the same weights without a residual step."""
    model, tok = llama
    stats = key_second_moments(model, tok, [0, 1], texts=TEXTS, cache_dir=tmp_path)
    first = edit(model, tok, REQUESTS, method="memit", layers=[0, 1], stats=stats, progress=False, **STRONG, **FEW)
    edited = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    first.restore()
    import factkernels.hf.editors as editors

    def no_step(*_args, **_kwargs):
        raise AssertionError("δ was re-trained")

    monkeypatch.setattr(editors, "residual_targets", no_step)
    again = edit(model, tok, REQUESTS, method="memit", layers=[0, 1], stats=stats, progress=False,
                 targets=first.targets, **STRONG, **FEW)
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight, edited) and again.report["targets_reused"]
    again.restore()
    weaker = edit(model, tok, REQUESTS, method="memit", layers=[0, 1], stats=stats, progress=False,
                  targets=first.targets, mom2_weight=1e6, **STRONG, **FEW)
    assert not torch.equal(model.model.layers[0].mlp.down_proj.weight, edited)
    weaker.restore()
    weights = [p.detach().clone() for p in model.parameters()]
    for kwargs, message in [({"layers": [0]}, "trained at layer 1"), ({"lr": 0.1}, "lr=0.5/0.1"),
                            ({"requests": REQUESTS[:1]}, "hold 2 facts but 1")]:
        args = {"layers": [0, 1], "requests": REQUESTS, **STRONG, **FEW, **kwargs}
        with pytest.raises(ValueError, match=message):
            edit(model, tok, method="memit", stats=stats, progress=False, targets=first.targets, **args)
    with pytest.raises(TypeError, match="ResidualTargets"):
        edit(model, tok, REQUESTS, method="memit", layers=[0, 1], stats=stats, targets=first.targets.delta, **FEW)
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))


def test_a_checkpoint_folder_shares_one_delta_between_memit_and_alphaedit(llama, tmp_path, monkeypatch):
    """δ kept in a folder is named by what it depends on: AlphaEdit with MEMIT's residual settings reads MEMIT's
    δ back (no residual step) and edits as it does when it trains its own; other settings get another file."""
    model, tok = llama
    stats = key_second_moments(model, tok, [0, 1], texts=TEXTS, cache_dir=tmp_path)
    folder = tmp_path / "targets"
    alpha = {"method": "alphaedit", "layers": [0, 1], "nullspace_threshold": 1.0, "l2": 1e-4}
    own = edit(model, tok, REQUESTS, stats=stats, progress=False, **alpha, **STRONG, **FEW)
    expected = [model.model.layers[i].mlp.down_proj.weight.detach().clone() for i in (0, 1)]
    own.restore()
    memit = edit(model, tok, REQUESTS, method="memit", layers=[0, 1], stats=stats, progress=False,
                 checkpoint=folder, **STRONG, **FEW)
    memit.restore()
    assert len(list(folder.iterdir())) == 1 and memit.report["targets_restored_seconds"] == 0
    import factkernels.hf.residual as residual

    def no_step(*_args, **_kwargs):
        raise AssertionError("δ was re-trained")

    monkeypatch.setattr(residual, "_train_chunk", no_step)
    shared = edit(model, tok, REQUESTS, stats=stats, progress=False, checkpoint=folder, **alpha, **STRONG, **FEW)
    try:
        assert all(torch.equal(model.model.layers[i].mlp.down_proj.weight, w) for i, w in zip((0, 1), expected))
        assert shared.report["targets_restored_seconds"] > 0
        assert shared.report["targets_seconds"] >= shared.report["targets_restored_seconds"]
    finally:
        shared.restore()
    with pytest.raises(AssertionError, match="re-trained"):  # another learning rate: another δ, another file
        edit(model, tok, REQUESTS, stats=stats, progress=False, checkpoint=folder, **alpha, **{**STRONG, "lr": 0.4},
             **FEW)


def test_a_sequential_edit_resumes_every_finished_batch_from_a_checkpoint_folder(llama, tmp_path, monkeypatch):
    """AlphaEdit in batches of one keeps a δ file per batch, named by the weights the earlier batches left: a rerun
    reads each back (no residual step) and leaves the same weights; an explicit file keeps no sequential δ."""
    model, tok = llama
    stats = key_second_moments(model, tok, [0, 1], texts=TEXTS, cache_dir=tmp_path)
    folder = tmp_path / "targets"
    alpha = {"method": "alphaedit", "layers": [0, 1], "nullspace_threshold": 1.0, "l2": 1e-4, "batch_size": 1}
    first = edit(model, tok, REQUESTS, stats=stats, progress=False, checkpoint=folder, **alpha, **STRONG, **FEW)
    expected = [model.model.layers[i].mlp.down_proj.weight.detach().clone() for i in (0, 1)]
    first.restore()
    assert first.report["batches"] == len(REQUESTS) >= 2
    assert len(list(folder.iterdir())) == len(REQUESTS) and first.report["targets_restored_seconds"] == 0
    import factkernels.hf.residual as residual

    def no_step(*_args, **_kwargs):
        raise AssertionError("δ was re-trained")

    with monkeypatch.context() as patch:
        patch.setattr(residual, "_train_chunk", no_step)
        again = edit(model, tok, REQUESTS, stats=stats, progress=False, checkpoint=folder, **alpha, **STRONG, **FEW)
        try:
            assert all(torch.equal(model.model.layers[i].mlp.down_proj.weight, w) for i, w in zip((0, 1), expected))
            assert again.report["targets_restored_seconds"] > 0
        finally:
            again.restore()
    single = tmp_path / "one.safetensors"
    edit(model, tok, REQUESTS, stats=stats, progress=False, checkpoint=single, **alpha, **STRONG, **FEW).restore()
    assert not single.exists()


def test_residual_targets_train_each_fact_on_its_own(llama):
    """Facts stop at their own early-stop step and only the others keep running: δ trained for all requests
    in one chunk equals δ trained one request at a time (and a fact that stopped keeps the δ it stopped with)."""
    model, tok = llama
    requests = hf.parse_requests(REQUESTS + [{"prompt": "the novel {} is by", "subject": "dune",
                                              "target_new": "mary shelley"}])
    settings = dict(steps=40, lr=0.5, weight_decay=0.0, clamp_norm=1e3, clamp_to="layer", kl_factor=0.05,
                    early_stop=3.5, progress=False)
    together = residual_targets(model, tok, requests, 1, chunk=3, **settings)
    alone = [residual_targets(model, tok, [r], 1, chunk=1, **settings) for r in requests]
    torch.testing.assert_close(together.delta, torch.cat([a.delta for a in alone]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(together.nll_after, torch.cat([a.nll_after for a in alone]), rtol=1e-4, atol=1e-4)
    stopped = together.nll_after < 3.5
    assert bool(stopped.any()) and not bool(stopped.all())  # some facts stopped early, others ran every step


@pytest.mark.parametrize("layer, settings", [
    (0, dict(steps=15, lr=0.5, weight_decay=0.1, clamp_norm=1e3, clamp_to="mlp", kl_factor=0.05, early_stop=3.5)),
    # the preset's residual settings: the clamp binds, the KL term and two context prefixes
    (1, dict(steps=25, lr=0.5, weight_decay=0.5, clamp_norm=0.75, clamp_to="layer", kl_factor=0.0625,
             early_stop=5e-2, prefixes=["the old house", "people knows that time and music"])),
])
def test_residual_targets_run_the_later_blocks_from_the_subject_as_the_full_forward(llama, monkeypatch, layer,
                                                                                   settings):
    """Each step runs only the blocks after the edited layer from the subject's last token on, the tokens before
    it as cached keys and values: same δ, NLLs and early stops as adding δ by a hook in the full forward (the path
    kept for models whose tail does not match), with the KL prompt, clamping and context prefixes."""
    import factkernels.hf.residual as residual

    model, tok = llama
    requests = hf.parse_requests(REQUESTS + [{"prompt": "the novel {} is by", "subject": "dune",
                                              "target_new": "mary shelley"}])
    tails = []
    real_tail = residual.tail_with_delta

    def spied(*args):
        hidden = real_tail(*args)
        tails.append(hidden.shape[1])
        return hidden

    monkeypatch.setattr(residual, "tail_with_delta", spied)
    tail = residual_targets(model, tok, requests, layer, progress=False, chunk=3, **settings)
    full_width = hf.encode_requests(tok, requests, with_target=True).input_ids.shape[1]
    assert tails and max(tails) < full_width - 2, "the steps did not start at the subject"
    monkeypatch.setattr(residual, "tail_matches", lambda *a: False)
    hooked = residual_targets(model, tok, requests, layer, progress=False, chunk=3, **settings)
    for name in ("delta", "mlp_out", "layer_out", "nll_before", "nll_after"):
        torch.testing.assert_close(getattr(tail, name), getattr(hooked, name), rtol=1e-5, atol=2e-5)
    assert float(tail.delta.abs().max()) > 0.5
    if settings["early_stop"] > 1:  # some facts stopped early, others ran every step
        stopped = tail.nll_after < settings["early_stop"]
        assert bool(stopped.any()) and not bool(stopped.all())
    else:  # the clamp binds: ||δ|| = 0.75 ||h||
        torch.testing.assert_close(tail.delta.norm(dim=1), 0.75 * tail.layer_out.norm(dim=1), rtol=1e-4, atol=0)


def test_environment_records_the_real_model_packages_once_imported(llama):
    import transformers

    from factkernels.environment import environment

    assert environment()["transformers"] == transformers.__version__


def test_checkpoint_fingerprint_ignores_where_the_model_was_loaded_from(llama):
    from factkernels.hf.checkpoint import fingerprint

    model, _ = llama
    ids = torch.arange(6).reshape(2, 3)
    before = fingerprint(model, 1, (ids,), {"steps": 5})
    path, version = model.config._name_or_path, model.config.transformers_version
    try:
        model.config._name_or_path, model.config.transformers_version = "/elsewhere/model", "0.0.1"
        assert fingerprint(model, 1, (ids,), {"steps": 5}) == before  # a reinstall keeps checkpoints readable
    finally:
        model.config._name_or_path, model.config.transformers_version = path, version
    assert fingerprint(model, 1, (ids,), {"steps": 6}) != before
    assert fingerprint(model, 0, (ids,), {"steps": 5}) != before
    assert fingerprint(model, 1, (ids + 1,), {"steps": 5}) != before


def test_residual_targets_resume_from_a_chunk_checkpoint(llama, tmp_path, monkeypatch):
    """Each finished chunk is written at once: a run stopped after its first chunk resumes there, gives the same
    δ as one run, counts the stored chunk's seconds, and the file is refused for other settings."""
    import factkernels.hf.residual as residual

    model, tok = llama
    requests = hf.parse_requests(REQUESTS + [{"prompt": "the novel {} is by", "subject": "dune",
                                              "target_new": "mary shelley"}])
    settings = dict(steps=20, lr=0.5, weight_decay=0.0, clamp_norm=1e3, clamp_to="layer", kl_factor=0.05,
                    progress=False)
    whole = residual_targets(model, tok, requests, 1, chunk=2, **settings)
    path = tmp_path / "targets.safetensors"
    real, calls = residual.tail_start, []

    def stop_in_second_chunk(model, batch, *args, **kwargs):
        calls.append(len(batch))
        if len(calls) > 1 and len(batch) == 1:  # the second chunk (one request) starts: the session ends
            raise KeyboardInterrupt
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(residual, "tail_start", stop_in_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        residual_targets(model, tok, requests, 1, chunk=2, checkpoint=path, **settings)
    monkeypatch.setattr(residual, "tail_start", real)
    resumed = residual_targets(model, tok, requests, 1, chunk=2, checkpoint=path, **settings)
    for name in ("delta", "mlp_out", "layer_out", "nll_before", "nll_after"):
        torch.testing.assert_close(getattr(resumed, name), getattr(whole, name), rtol=1e-5, atol=1e-6)
    assert resumed.restored_seconds > 0 and whole.restored_seconds == 0.0
    with pytest.raises(ValueError, match="other requests"):
        residual_targets(model, tok, requests, 1, chunk=1, checkpoint=path, **settings)


def test_alphaedit_with_an_empty_null_space_changes_nothing(llama, tmp_path):
    model, tok = llama
    stats = key_second_moments(model, tok, [0, 1], texts=TEXTS, cache_dir=tmp_path)
    weights = [p.detach().clone() for p in model.parameters()]
    result = edit(model, tok, REQUESTS, method="alphaedit", layers=[0, 1], stats=stats, progress=False,
                  nullspace_threshold=-1.0, **STRONG, **FEW)
    assert result.report["null_space_dims"] == {0: 0, 1: 0}
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))


def test_second_moments_match_captured_keys_and_cache_round_trips(llama, tmp_path, monkeypatch):
    model, tok = llama
    first = key_second_moments(model, tok, [0, 2], texts=TEXTS, cache_dir=tmp_path)
    ids, mask = hf.encode_texts(tok, TEXTS)
    keys = hf.capture(model, ids, mask, 2, site="down_in").double()
    # capture batches rows by length (other padded widths than the statistics pass): float32 rounding apart
    torch.testing.assert_close(first[2].double(), keys.T @ keys / keys.shape[0], rtol=1e-4, atol=1e-7)
    assert len(list((tmp_path / "mom2").glob("*.safetensors"))) == 2

    import factkernels.hf.statistics as statistics

    def no_pass(*_args, **_kwargs):
        raise AssertionError("a cached second moment was recomputed")

    monkeypatch.setattr(statistics, "encode_texts", no_pass)
    again = key_second_moments(model, tok, [2, 0], texts=TEXTS, cache_dir=tmp_path)
    assert list(again) == [0, 2] and all(torch.equal(again[k], first[k]) for k in first)
    with pytest.raises(AssertionError, match="recomputed"):  # other text: another cache entry
        key_second_moments(model, tok, [0], texts=TEXTS[:2], cache_dir=tmp_path)


def test_second_moments_stop_after_the_highest_layer_asked_for(llama, tmp_path):
    model, tok = llama
    both = key_second_moments(model, tok, [0, 1], texts=TEXTS, cache_dir=False, batch_size=5)
    calls = []
    handle = model.model.layers[2].register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        low = key_second_moments(model, tok, [0], texts=TEXTS, cache_dir=False, batch_size=3)
    finally:
        handle.remove()
    assert not calls  # layer 2 never ran
    assert all(isinstance(c, torch.Tensor) and c.shape == (64, 64) for c in (*both.values(), *low.values()))
    torch.testing.assert_close(low[0], both[0], rtol=1e-5, atol=1e-7)  # other batch widths: float32 rounding


def test_a_second_pass_over_the_same_c_waits_for_the_first_and_reads_its_file(llama, tmp_path, monkeypatch):
    import fcntl
    import threading

    from factkernels.hf import statistics

    model, tok = llama
    path = statistics.second_moment_path(model, 1, texts=TEXTS, cache_dir=tmp_path)
    path.parent.mkdir(parents=True)
    waiting, results = threading.Event(), {}
    monkeypatch.setattr(statistics, "log_line", lambda text: waiting.set())
    monkeypatch.setattr(statistics, "_second_moments", lambda *a, **k: pytest.fail("the pass was repeated"))
    monkeypatch.setattr(statistics.sys.stderr, "isatty", lambda: False)
    with open(path.with_suffix(".lock"), "w") as lock:  # "another process" is computing layer 1
        fcntl.flock(lock, fcntl.LOCK_EX)
        second = threading.Thread(target=lambda: results.update(
            key_second_moments(model, tok, [1], texts=TEXTS, cache_dir=tmp_path)))
        second.start()
        assert waiting.wait(60)
        cov = torch.eye(64)
        statistics._save(path, {"second_moment": cov}, {"tokens": "7", "documents": "12"})
    second.join(60)
    assert torch.equal(results[1], cov)


def test_editors_take_c_from_the_hparams_corpus(llama, tmp_path):
    from factkernels.hf import statistics

    model, tok = llama
    assert hparams("memit").mom2_dataset == "wikipedia" and hparams("rome").mom2_n_samples is None
    assert statistics.mom2_texts("smollm2_text", 3) == datasets.natural_text("stats")[:3]
    assert statistics.mom2_texts("wikipedia", 2) == datasets.wikipedia_leads(2)
    result = edit(model, tok, REQUESTS[:1], method="memit", layers=[1], cache_dir=tmp_path, progress=False,
                  mom2_dataset="smollm2_text", mom2_n_samples=3, **STRONG, **FEW)
    result.restore()
    tokens = int(hf.encode_texts(tok, datasets.natural_text("stats")[:3], max_length=2048)[1].sum())
    assert result.report["stats_tokens"] == {1: tokens}
    assert result.report["hparams"]["mom2_dataset"] == "smollm2_text"
    with pytest.raises(ValueError, match="mom2_dataset must be one of"):
        edit(model, tok, REQUESTS, method="memit", layers=[1], cache_dir=tmp_path, mom2_dataset="wikitext")
    with pytest.raises(ValueError, match="mom2_n_samples must be in"):
        statistics.mom2_texts("smollm2_text", 1000)


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "lora"}, "method must be one of"),
    ({"method": "mlp_swap"}, "method must be one of"),
    ({"method": "memit", "bogus": 1}, "unknown hyperparameters"),
    ({"method": "rome", "layers": (0, 1)}, "must be one layer"),
    ({"method": "memit", "layers": (1, 0)}, "increasing"),
    ({"method": "memit", "layers": (0, 3)}, r"layer must be an int in \[0, 3\)"),
])
def test_bad_edit_arguments(llama, kwargs, message):
    model, tok = llama
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=message):
        edit(model, tok, REQUESTS, stats={}, progress=False, **kwargs)
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))


def test_default_layers_follow_the_published_depth_and_lambda_the_width():
    smollm2 = {"num_layers": 30, "mlp_width": 1536}
    assert hparams("memit", **smollm2).layers == (3, 4, 5, 6, 7, 8)
    assert hparams("rome", **smollm2).layers == (5,)
    assert hparams("alphaedit", **smollm2).layers == (4, 5, 6, 7, 8)
    assert hparams("memit", **smollm2).mom2_weight == pytest.approx(1.5e4 * 1536 / 16384)  # GPT-J's, by width
    assert hparams("memit", **smollm2, mom2_weight=1.0).mom2_weight == 1.0  # sweepable
    assert hparams("memit", num_layers=3, mlp_width=64).layers == (0, 1, 2)


def test_delta_penalty_is_the_references_norm_over_squared_norm():
    from factkernels.hf.residual import delta_penalty

    delta = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # ||δ|| = 5, 1
    ref = torch.tensor([2.0, 10.0])
    torch.testing.assert_close(delta_penalty(delta, ref, 0.5), torch.tensor([0.5 * 5 / 4, 0.5 * 1 / 100]))


def test_kl_term_reads_the_subjects_last_token_of_the_essence_prompt(llama):
    from factkernels.hf.residual import KL_PROMPT, subject_log_probs

    model, tok = llama
    batch = hf.encode_requests(tok, [hf.Request(KL_PROMPT, "the hobbit", " x")])
    assert int(batch.subject_last[0]) == 1 and int(batch.prompt_last[0]) == 3  # "the hobbit | is a"
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits
        torch.testing.assert_close(subject_log_probs(model, batch), logits[:, 1].log_softmax(-1))


def test_context_prefixes_are_generated_deterministically(llama):
    from factkernels.hf.contexts import _CACHE, context_prefixes, with_prefixes

    model, tok = llama
    rome, memit = hparams("rome"), hparams("memit")
    first = context_prefixes(model, tok, rome.prefixes, rome.prefix_starts)
    _CACHE.clear()
    assert context_prefixes(model, tok, rome.prefixes, rome.prefix_starts) == first  # seeded: same texts again
    words = [len(p.split()) for p in first]  # word-level tokens; special tokens decode to nothing
    assert len(first) == 20 and max(words[:10]) <= 5 < max(words[10:]) <= 10
    five = context_prefixes(model, tok, memit.prefixes, memit.prefix_starts)
    assert len(five) == 5 and five[0].split()[0] == "the"  # one from each start word (the rest are unknown here)
    rows = with_prefixes(hf.parse_requests(REQUESTS), five[:2])
    assert [r.prompt for r in rows[:3]] == ["the book {} was written by", five[0] + ". the book {} was written by",
                                            five[1] + ". the book {} was written by"]


def test_alphaedit_runs_sequential_batches_and_records_its_null_space(llama, tmp_path):
    model, tok = llama
    stats = key_second_moments(model, tok, [0, 1], texts=TEXTS, cache_dir=tmp_path)
    before = _target_nll(model, tok, REQUESTS)
    result = edit(model, tok, REQUESTS, method="alphaedit", layers=[0, 1], stats=stats, progress=False,
                  batch_size=1, nullspace_threshold=1.0, l2=1e-4, **STRONG, **FEW)
    after = _target_nll(model, tok, REQUESTS)
    result.restore()
    assert result.report["batches"] == 2 and result.targets is None  # δ of batch 2 on the model edited by batch 1
    assert result.report["nullspace_threshold_used"] == {0: 1.0, 1: 1.0}
    assert all(0 < d < 64 for d in result.report["null_space_dims"].values())
    assert float(after.mean()) < float(before.mean()) - 0.1
    with pytest.raises(ValueError, match="sequential"):
        edit(model, tok, REQUESTS, method="alphaedit", layers=[1], stats=stats, batch_size=1, targets=object(),
             **FEW)


def test_alphaedit_keeps_the_earlier_batches_keys_read_after_their_edits(llama, tmp_path, monkeypatch):
    """Batch 2's update at each layer gets the Gram of batch 1's keys (averaged over the contexts) as the model
    edited by all of batch 1 reads them (AlphaEdit's reference reads them after the batch)."""
    import factkernels.hf.editors as editors

    model, tok = llama
    stats = key_second_moments(model, tok, [0, 1], texts=TEXTS, cache_dir=tmp_path)
    previous, after_first = [], {}
    real = editors.update_weight

    def recording(hp, weight, keys, values, cov, **kwargs):
        previous.append(kwargs.get("previous"))
        if len(previous) == 3:  # batch 2's first layer: the model holds batch 1's edits and nothing else
            after_first.update({i: model.model.layers[i].mlp.down_proj.weight.detach().clone() for i in (0, 1)})
        return real(hp, weight, keys, values, cov, **kwargs)

    monkeypatch.setattr(editors, "update_weight", recording)
    result = edit(model, tok, REQUESTS, method="alphaedit", layers=[0, 1], stats=stats, progress=False,
                  batch_size=1, nullspace_threshold=1.0, l2=1e-4, **STRONG, **FEW)
    result.restore()
    assert len(previous) == 4 and previous[0] is None and previous[1] is None
    originals = [model.model.layers[i].mlp.down_proj.weight.detach().clone() for i in (0, 1)]
    try:
        with torch.no_grad():
            for i, weight in after_first.items():
                model.model.layers[i].mlp.down_proj.weight.copy_(weight)
        for layer, gram in zip((0, 1), previous[2:]):
            keys = context_keys(model, tok, hf.parse_requests(REQUESTS[:1]), result.report["prefixes"], layer,
                                layer)[0].double()
            torch.testing.assert_close(gram, keys.T @ keys, rtol=1e-6, atol=1e-9)
    finally:
        with torch.no_grad():
            for i, weight in zip((0, 1), originals):
                model.model.layers[i].mlp.down_proj.weight.copy_(weight)


# random weights keep WISE's unrelated text nearer its edits' distances than a trained LM does: a higher ratio
@pytest.mark.parametrize("method, extra", [("grace", {"eps": 1.0, "steps": 30}),
                                           ("wise", {"steps": 30, "act_ratio": 0.95, **FEW})])
def test_side_memories_answer_the_edit_and_restore_removes_them(llama, method, extra):
    model, tok = llama
    before = _target_nll(model, tok, REQUESTS)
    plain = _logits(model, tok)
    other = hf.encode_texts(tok, TEXTS[:1])[0]
    with torch.no_grad():
        other_logits = model(input_ids=other).logits
    result = edit(model, tok, REQUESTS, method=method, layers=[1], progress=False, **extra)
    after = _target_nll(model, tok, REQUESTS)
    with torch.no_grad():
        other_after = model(input_ids=other).logits
    result.restore()
    assert float(after.max()) < float(before.min()) - 0.5  # both edits answered
    torch.testing.assert_close(other_after, other_logits)  # unrelated text outside the memory's reach
    assert torch.equal(_logits(model, tok), plain)
    if method == "grace":
        assert result.report["codebook_entries"] == 2
    else:
        assert result.report["routing_threshold"] > 0


def test_grace_trains_different_entries_at_once_and_one_entry_edit_after_edit(llama):
    """GRACE's values train chunk rows at once: an entry's edits one after another (the same prompt and target
    twice reach one entry, the second edit continues its value), different entries apart (a radius wide enough
    that every other target splits it). Batches of 4 give the codebook and values of one edit at a time."""
    model, tok = llama
    requests = REQUESTS + [REQUESTS[0], {**REQUESTS[0], "prompt": "the novel {} was written by",
                                         "target_new": "leo tolstoy"}]
    plain = _logits(model, tok)
    books = {}
    for chunk in (1, 4):
        result = edit(model, tok, requests, method="grace", layers=[1], progress=False, eps=1e3, steps=20,
                      chunk=chunk)
        hook = next(iter(hf.layout.mlp_module(model, 1).down_proj._forward_hooks.values()))
        book = next(c.cell_contents for c in hook.__closure__ if type(c.cell_contents).__name__ == "GraceCodebook")
        books[chunk] = (book.values.clone(), book.radii.clone(), list(book.labels), result.report)
        result.restore()
    (v1, r1, l1, rep1), (v4, r4, l4, rep4) = books[1], books[4]
    assert l1 == l4 == [" jane austen", " george orwell", " leo tolstoy"] and rep1["waves"] == rep4["waves"] == 2
    torch.testing.assert_close(r4, r1)
    torch.testing.assert_close(v4, v1, rtol=1e-4, atol=1e-4)
    assert rep4["final_loss_mean"] == pytest.approx(rep1["final_loss_mean"], rel=1e-3)
    assert torch.equal(_logits(model, tok), plain)


def test_wise_trains_over_contexts_and_routes_its_memory_with_another_ratio_without_training(llama):
    from factkernels.hf.side_memory import early_stopped

    model, tok = llama
    plain = _logits(model, tok)
    result = edit(model, tok, REQUESTS, method="wise", layers=[1], progress=False, steps=30, **FEW)
    result.restore()
    report, memory = result.report, result.targets
    assert report["contexts"] == 3 and len(report["prefixes"]) == 2 and 1 <= report["steps_mean"] <= 30
    assert report["edits_routed"] == 1.0 and report["min_act"] == memory.min_act > 0
    assert report["routing_threshold"] == pytest.approx(0.88 * memory.min_act)
    again = edit(model, tok, REQUESTS, method="wise", layers=[1], progress=False, steps=30, act_ratio=0.5,
                 targets=memory, **FEW)
    routed_logits = _logits(model, tok)
    again.restore()
    assert again.targets is memory and "steps_mean" not in again.report
    assert again.report["routing_threshold"] == pytest.approx(0.5 * memory.min_act)
    assert again.report["side_memory_change"] == report["side_memory_change"]
    assert not torch.equal(routed_logits, plain) and torch.equal(_logits(model, tok), plain)
    with pytest.raises(ValueError, match="other settings \\(lr\\)"):
        edit(model, tok, REQUESTS, method="wise", layers=[1], progress=False, steps=30, lr=0.5, targets=memory, **FEW)
    with pytest.raises(ValueError, match="grace trains its own values"):
        edit(model, tok, REQUESTS, method="grace", layers=[1], progress=False, targets=memory)
    assert torch.equal(_logits(model, tok), plain)  # a refused edit leaves no hook behind
    # WISE's early stop: the last loss <= 0.02 and within 1e-4 of the one before
    assert early_stopped([0.5, 0.01, 0.01005]) and not early_stopped([0.01005])
    assert not early_stopped([0.03, 0.0300]) and not early_stopped([0.0105, 0.01])


def test_wise_stopped_part_way_continues_from_its_checkpoint(llama, tmp_path, monkeypatch):
    """WISE keeps its memory after each edit: stopped in its second edit, a rerun with the same checkpoint folder
    trains only the second and ends with the memory of a run that never stopped; other requests are refused."""
    from factkernels.hf import side_memory

    model, tok = llama
    whole = edit(model, tok, REQUESTS, method="wise", layers=[1], progress=False, steps=30, **FEW)
    whole.restore()
    real_bar = side_memory.progress_bar

    def stopped_in_the_second(items, **kwargs):
        for k, item in enumerate(items):
            if k == 1:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(side_memory, "progress_bar", stopped_in_the_second)
    plain = _logits(model, tok)
    with pytest.raises(KeyboardInterrupt):
        edit(model, tok, REQUESTS, method="wise", layers=[1], progress=False, steps=30, checkpoint=tmp_path, **FEW)
    assert torch.equal(_logits(model, tok), plain) and len(list(tmp_path.glob("wise_*.safetensors"))) == 1
    seen = []
    monkeypatch.setattr(side_memory, "progress_bar", lambda items, **kw: seen.extend(items) or real_bar(items, **kw))
    again = edit(model, tok, REQUESTS, method="wise", layers=[1], progress=False, steps=30, checkpoint=tmp_path, **FEW)
    again.restore()
    assert len(seen) == 1 and again.report["edits_restored"] == 1
    torch.testing.assert_close(again.targets.weight, whole.targets.weight, rtol=0, atol=1e-6)
    assert again.targets.min_act == pytest.approx(whole.targets.min_act, rel=1e-6)
    assert again.report["steps_mean"] == whole.report["steps_mean"]
    file = next(tmp_path.glob("wise_*.safetensors"))
    with pytest.raises(ValueError, match="made for other requests"):
        edit(model, tok, REQUESTS[:1], method="wise", layers=[1], progress=False, steps=30, checkpoint=file, **FEW)
    with pytest.raises(ValueError, match="targets and checkpoint apply to wise"):
        edit(model, tok, REQUESTS, method="grace", layers=[1], progress=False, checkpoint=tmp_path)


def test_causal_trace_restores_clean_states(llama):
    model, tok = llama
    trace = hf.causal_trace(model, tok, "the book {} was written by", "war and peace", samples=3)
    tokens = len(trace.tokens)
    assert trace.scores.shape == (3, tokens) and trace.subject == (2, 5)
    # the clean state after the last layer at the last token gives the clean answer probability
    assert float(trace.scores[-1, -1]) == pytest.approx(trace.clean, rel=1e-5)
    # states before the subject are the same in both runs: restoring them changes nothing
    torch.testing.assert_close(trace.scores[:, :2], torch.full((3, 2), trace.corrupted), rtol=1e-5, atol=1e-7)
    assert 0 <= trace.best_layer() < 3 and trace.clean != trace.corrupted
    layer, effects = hf.traced_layer(model, tok, REQUESTS, samples=3)
    assert effects.shape == (3,) and layer == int(effects.argmax())


def test_causal_trace_of_mlp_windows_batches_like_one_restoration_at_a_time(llama):
    model, tok = llama
    args = (model, tok, "the book {} was written by", "war and peace")
    whole = hf.causal_trace(*args, samples=3, kind="mlp", window=2)
    column = hf.causal_trace(*args, samples=3, kind="mlp", window=2, tokens="subject_last", batch_rows=3)
    last = whole.subject[1] - 1
    torch.testing.assert_close(column.scores[:, last], whole.scores[:, last])  # one restoration per pass
    assert column.scores[:, :last].isnan().all() and column.subject_last().shape == (3,)
    # MLP outputs before the subject are the same in both runs: restoring them changes nothing
    torch.testing.assert_close(whole.scores[:, :2], torch.full((3, 2), whole.corrupted), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(whole.scores[:, last], torch.full((3,), whole.corrupted))
    assert whole.corrupted == pytest.approx(column.corrupted) and whole.kind == "mlp" and whole.window == 2
    with pytest.raises(ValueError, match="kind must be one of"):
        hf.causal_trace(*args, kind="attn")


def test_restoring_window_and_editor_layers_follow_rome_and_memit():
    from factkernels.hf.causal_trace import editor_layers, window_layers

    assert list(window_layers(5, 10, 30)) == list(range(0, 10))  # ROME: layer - w//2 .. layer - (-w//2)
    assert list(window_layers(20, 10, 30)) == list(range(15, 25))
    assert list(window_layers(28, 3, 30)) == [27, 28, 29] and list(window_layers(3, 1, 30)) == [3]
    effect = torch.zeros(30)
    effect[9] = 1.0
    assert editor_layers(effect, {"rome": 1, "memit": 6, "alphaedit": 5}) == {
        "rome": (9,), "memit": (4, 5, 6, 7, 8, 9), "alphaedit": (5, 6, 7, 8, 9)}
    effect = torch.zeros(30)
    effect[2] = 1.0  # too shallow to end there: the window starts at layer 0
    assert editor_layers(effect, {"memit": 6})["memit"] == (0, 1, 2, 3, 4, 5)


def test_second_moments_resume_an_interrupted_pass_and_count_tokens(llama, tmp_path, monkeypatch):
    import factkernels.hf.statistics as statistics

    model, tok = llama
    whole = key_second_moments(model, tok, [1], texts=TEXTS, cache_dir=tmp_path / "whole", batch_size=2)
    calls = []
    real = model.model.forward

    def stop_after_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(model.model, "forward", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        key_second_moments(model, tok, [1], texts=TEXTS, cache_dir=tmp_path / "run", batch_size=2, save_every=1)
    assert len(list((tmp_path / "run" / "mom2").glob("partial_*"))) == 1
    calls.clear()
    monkeypatch.setattr(model.model, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = key_second_moments(model, tok, [1], texts=TEXTS, cache_dir=tmp_path / "run", batch_size=2, save_every=1)
    assert len(calls) == len(TEXTS) // 2 - 2  # only the batches after the kept ones ran
    torch.testing.assert_close(resumed[1], whole[1])
    assert not list((tmp_path / "run" / "mom2").glob("partial_*"))
    tokens = int(hf.encode_texts(tok, TEXTS)[1].sum())
    assert statistics.second_moment_tokens(model, 1, texts=TEXTS, cache_dir=tmp_path / "run") == tokens
    assert statistics.second_moment_tokens(model, 0, texts=TEXTS, cache_dir=tmp_path / "run") is None
