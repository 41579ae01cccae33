"""factkernels.editing: the registry, hyperparameter dataclasses and update rules, model-free."""

import pytest
import torch

from factkernels import editing


def test_registry_names_every_method_once_with_its_dataclass():
    assert set(editing.METHODS) == {"rome", "memit", "alphaedit", "grace", "wise", "mlp_swap", "ours"}
    assert editing.method_names(toy_lm=True) == ("rome", "memit", "alphaedit", "mlp_swap")
    assert editing.method_names(real_lm=True, kind="weights") == ("rome", "memit", "alphaedit")
    assert isinstance(editing.hparams("grace"), editing.GRACEHparams)
    with pytest.raises(ValueError, match="unknown hyperparameters for rome: \\['lam'\\]"):
        editing.hparams("rome", lam=1.0)
    with pytest.raises(ValueError, match="method must be one of"):
        editing.hparams("lora")


def test_published_settings_as_the_reference_configs():
    rome, memit, alpha = editing.hparams("rome"), editing.hparams("memit"), editing.hparams("alphaedit")
    assert (rome.steps, rome.lr, rome.clamp_norm, rome.weight_decay, rome.kl_factor) == (20, 0.5, 4.0, 0.5, 0.0625)
    assert sum(count for _, count in rome.prefixes) == 20 and rome.prefix_starts == ("",)
    assert sum(count for _, count in memit.prefixes) == 5 and len(memit.prefix_starts) == 5
    assert (memit.mom2_weight, memit.clamp_norm, memit.layers) == (1.5e4, 0.75, (3, 4, 5, 6, 7, 8))
    assert (alpha.lr, alpha.nullspace_threshold, alpha.l2, alpha.batch_size) == (0.1, 2e-2, 10.0, 100)
    moved = editing.hparams("alphaedit", num_layers=16, mlp_width=4096)
    assert moved.layers == (2, 3, 4, 5, 6) and moved.nullspace_threshold == 2e-2


def test_smollm2_preset_is_what_tracing_the_sweep_and_the_sanity_gate_chose():
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "hf"
    traced = json.loads((results / "causal_trace_layers.json").read_text())["chosen_layers"]
    swept = json.loads((results / "editor_validation_sweep.json").read_text())["methods"]
    gate = json.loads((results / "editor_sanity_gate_alphaedit_lr0.5.json").read_text())["methods"]["alphaedit"]
    published_gate = json.loads((results / "editor_sanity_gate.json").read_text())["methods"]["alphaedit"]
    tuned = {m: editing.methods.json_ready(o) for m, o in editing.TUNED["smollm2-135m"].items()}
    assert set(tuned) == set(editing.method_names(real_lm=True)) - {"ours"}
    for method in traced:
        assert tuned[method]["layers"] == traced[method]
    for method, entry in swept.items():  # a swept method takes its best point's settings (ties: the first)
        chosen = {k: v for k, v in entry["chosen"].items() if k != "layers"}
        assert {k: v for k, v in tuned[method].items() if k != "layers"} == chosen
        scores = [p["scores"]["score"] for p in entry["points"]]
        assert entry["points"][scores.index(max(scores))]["overrides"] == entry["chosen"]
        assert max(scores) == entry["chosen_scores"]["score"]
    # WISE's points that differ only in act_ratio route one trained side memory, each with its own threshold
    memories: dict = {}
    for point in swept["wise"]["points"]:
        hp, report = point["hparams"], point["report"]
        assert report["routing_threshold"] == pytest.approx(report["min_act"] * hp["act_ratio"])
        trained_with = json.dumps({k: v for k, v in hp.items() if k != "act_ratio"}, sort_keys=True)
        memories.setdefault(trained_with, set()).add((report["min_act"], report["side_memory_change"]))
    assert len(memories) < len(swept["wise"]["points"]) and all(len(m) == 1 for m in memories.values())
    assert tuned["alphaedit"]["lr"] == gate["hparams"]["lr"] and gate["efficacy_score"] >= 0.95
    # the sanity gate run with the preset: every editor it ran edited with the preset's settings and passed
    preset_gate = json.loads((results / "editor_sanity_gate_preset.json").read_text())
    assert preset_gate["overrides"]["preset"] == "smollm2-135m" and {"memit", "alphaedit"} <= set(preset_gate["methods"])
    for method, entry in preset_gate["methods"].items():
        assert all(entry["hparams"][k] == v for k, v in tuned[method].items()) and entry["efficacy_score"] >= 0.95
    assert published_gate["hparams"]["lr"] == editing.hparams("alphaedit").lr and published_gate["efficacy_score"] < 0.95
    smollm2 = {"num_layers": 30, "mlp_width": 1536}
    for method, overrides in tuned.items():  # the preset applies its overrides; the published settings stay default
        preset = editing.as_dict(editing.hparams(method, **smollm2, preset="smollm2-135m"))
        published = editing.as_dict(editing.hparams(method, **smollm2))
        assert {k for k in preset if preset[k] != published[k]} <= set(overrides)
        assert all(preset[k] == v for k, v in overrides.items())
    assert editing.hparams("memit", **smollm2, preset="smollm2-135m", mom2_weight=1.0).mom2_weight == 1.0
    with pytest.raises(ValueError, match="preset must be one of"):
        editing.hparams("memit", preset="gpt2")


def _problem(n=3, h=8, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(d, h, generator=g, dtype=torch.float64)
    keys = torch.randn(n, h, generator=g, dtype=torch.float64)
    values = torch.randn(n, d, generator=g, dtype=torch.float64)
    basis = torch.randn(h, 2 * h, generator=g, dtype=torch.float64)
    return weight, keys, values, basis @ basis.T / (2 * h)


def test_rome_edits_along_c_inverse_of_the_averaged_key():
    weight, keys, values, cov = _problem(n=1)
    u = keys + 0.3 * torch.randn(1, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    new = editing.rome_update(weight, keys, values, cov, directions=u)
    torch.testing.assert_close(keys @ new.T, values)  # the bare key maps to v* exactly
    change = new - weight  # rank one, rows along C⁻¹u
    direction = torch.linalg.solve(cov, u[0])
    assert torch.linalg.matrix_rank(change) == 1
    torch.testing.assert_close(change, torch.outer(change @ direction / direction.norm() ** 2, direction))


def test_alphaedit_keeps_earlier_batches_keys_through_their_gram():
    weight, keys, values, cov = _problem(n=2)
    projector = torch.eye(8, dtype=torch.float64)
    earlier = torch.randn(3, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    free = editing.alphaedit_update(weight, keys, values, projector, l2=1e-6)
    kept = editing.alphaedit_update(weight, keys, values, projector, l2=1e-6, previous=earlier.T @ earlier)
    assert float(((free - weight) @ earlier.T).abs().max()) > 1e-2  # without: earlier keys' outputs move
    assert float(((kept - weight) @ earlier.T).abs().max()) < 1e-4  # with: they stay, up to l2 (n + earlier <= h)
    torch.testing.assert_close(keys @ kept.T, values, atol=1e-5, rtol=0)  # and the edits still land


def test_update_weight_dispatches_and_alphaedit_relative_threshold():
    weight, keys, values, cov = _problem()
    memit = editing.update_weight(editing.hparams("memit", mom2_weight=2.0), weight, keys, values, cov)
    torch.testing.assert_close(memit, editing.memit_update(weight, keys, values, cov, 2.0))
    hp = editing.hparams("alphaedit", nullspace_relative=0.5)
    assert editing.nullspace_threshold(hp, cov) == pytest.approx(0.5 * float(cov.diagonal().mean()))
    with pytest.raises(TypeError, match="ROME, MEMIT or AlphaEdit"):
        editing.update_weight(editing.hparams("grace"), weight, keys, values, cov)


def test_grace_codebook_adds_expands_and_splits():
    book = editing.GraceCodebook()
    value = torch.zeros(2)
    assert book.add(torch.tensor([0.0, 0.0]), "a", value, eps=1.0) == 0
    assert book.add(torch.tensor([1.5, 0.0]), "a", value, eps=1.0) == 0  # same label in reach: radius grows
    assert float(book.radii[0]) == pytest.approx(1.5) and len(book) == 1
    assert book.add(torch.tensor([0.0, 2.0]), "b", value, eps=1.0) == 1  # other label in reach: split
    assert book.radii.tolist() == pytest.approx([1.0 - 1e-5, 1.0])
    assert book.add(torch.tensor([10.0, 10.0]), "a", value, eps=1.0) == 2  # nothing in reach: new entry
    hit, nearest = book.lookup(torch.tensor([[0.1, 0.0], [5.0, 5.0], [0.0, 1.9]]))
    assert hit.tolist() == [True, False, True] and nearest[[0, 2]].tolist() == [0, 1]


def test_wise_distance_and_margins():
    main = torch.zeros(2, 3, 4)
    side = torch.ones(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    side[0, 2] = 100.0  # padding: not counted
    dist = editing.wise_activation_distance(main, side, mask)
    torch.testing.assert_close(dist, torch.full((2,), float(torch.nn.functional.silu(torch.ones(4)).norm())))
    loss = editing.wise_margin_loss(torch.tensor([25.0]), torch.tensor([1.0]), 5.0, 20.0, 10.0)
    assert float(loss) == 0.0  # edit far above β, unrelated below α, gap above γ
    loss = editing.wise_margin_loss(torch.tensor([15.0]), torch.tensor([7.0]), 5.0, 20.0, 10.0)
    assert float(loss) == pytest.approx((7 - 15 + 10) + (7 - 5) + (20 - 15))
