"""FactMLP: forward vs the SwiGLU formula, export layout, save/load round trip."""

import pytest
import torch

from factkernels import FactMLP, construct


def test_swiglu_layout_matches_forward(small_facts):
    K, V, f = small_facts
    mlp = construct(K, V, f, progress=False)
    w = mlp.swiglu_weights()
    h, d = mlp.hidden_size, K.shape[1]
    assert w["gate_proj.weight"].shape == (h, d) and w["up_proj.weight"].shape == (h, d)
    assert w["down_proj.weight"].shape == (d, h)
    hidden = torch.nn.functional.silu(K @ w["gate_proj.weight"].T + w["gate_proj.bias"])
    out = (hidden * (K @ w["up_proj.weight"].T + w["up_proj.bias"])) @ w["down_proj.weight"].T + w["down_proj.bias"]
    assert torch.allclose(mlp(K), out, atol=1e-9)
    assert mlp.num_parameters == sum(t.numel() for t in w.values())


def test_forward_keeps_leading_dimensions(small_facts):
    K, V, f = small_facts
    mlp = construct(K, V, f, progress=False)
    batch = K[:12].reshape(3, 4, -1)
    assert torch.allclose(mlp(batch).reshape(12, -1), mlp(K[:12]))
    with pytest.raises(ValueError, match="last dimension"):
        mlp(torch.randn(3, 5, dtype=K.dtype))


def test_autograd_falls_back_to_torch(small_facts):
    K, V, f = small_facts
    mlp = construct(K, V, f, progress=False)
    x = K[:5].clone().requires_grad_(True)
    mlp(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_save_load_round_trip(tmp_path, small_facts):
    K, V, f = small_facts
    mlp = construct(K, V, f, progress=False)
    path = tmp_path / "facts.safetensors"
    mlp.save(path)
    loaded = FactMLP.load(path)
    assert torch.equal(loaded(K), mlp(K))
    assert loaded.activation == mlp.activation
    assert loaded.report.m == mlp.report.m and loaded.report.accuracy == 1.0
    assert torch.equal(loaded.predict(K, V), f)


def test_load_rejects_foreign_files(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="not a factkernels FactMLP"):
        FactMLP.load(path)


def test_constructor_validates_shapes():
    with pytest.raises(ValueError, match="divide"):
        FactMLP(torch.randn(3, 4), None, torch.randn(4, 4), None, torch.randn(4, 4), None)
    with pytest.raises(ValueError, match="down_weight"):
        FactMLP(torch.randn(2, 4), None, torch.randn(4, 4), None, torch.randn(4, 3), None)
