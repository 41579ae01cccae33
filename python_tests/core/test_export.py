"""Export of FactMLPs into Hugging Face-style SwiGLU blocks and load-back."""

import pytest
import torch

import factkernels
from factkernels import export
from factkernels.baselines import gd_mlp
from factkernels.embeddings import random_fact_set

D = 12


@pytest.fixture(scope="module")
def facts():
    return random_fact_set(24, 24, D, seed=0)


@pytest.fixture(scope="module")
def constructed(facts):
    K, V, f = facts
    return factkernels.construct(K, V, f, m=32, progress=False)


def test_state_dict_names_and_shapes_follow_llama_mlp(constructed):
    sd = export.mlp_state_dict(constructed)
    h = constructed.hidden_size
    assert {k: tuple(v.shape) for k, v in sd.items()} == {
        "mlp.gate_proj.weight": (h, D), "mlp.gate_proj.bias": (h,), "mlp.up_proj.weight": (h, D),
        "mlp.up_proj.bias": (h,), "mlp.down_proj.weight": (D, h), "mlp.down_proj.bias": (D,)}
    assert constructed.gate_weight.shape[0] < h  # the compact shared gate is expanded on export


@pytest.mark.parametrize("kind", ["constructed", "gd"])
def test_block_mlp_matches_factmlp_and_stores_facts(facts, constructed, kind):
    K, V, f = facts
    mlp = constructed if kind == "constructed" else gd_mlp(K, V, f, hidden=32, steps=300, progress=False)
    block = export.SwiGLUBlock(D, mlp.hidden_size, mlp_bias=True)
    block.load_state_dict(export.block_state_dict(mlp, block))
    x = torch.randn(5, 3, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(block.mlp(x), mlp(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(block.mlp(K), mlp(K), rtol=1e-5, atol=1e-5)
        if kind == "constructed":  # the block's MLP recalls every fact
            assert torch.equal((block.mlp(K) @ V.T).argmax(1), f)


def test_block_forward_is_pre_norm_residual(constructed):
    block = export.SwiGLUBlock(D, constructed.hidden_size, num_heads=2, mlp_bias=True)
    block.load_state_dict(export.block_state_dict(constructed, block))
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        h = x + block.self_attn(block.input_layernorm(x))
        expected = h + constructed(block.post_attention_layernorm(h))
        torch.testing.assert_close(block(x), expected, rtol=1e-5, atol=1e-5)
        # causal: the first position does not see the others
        y = x.clone()
        y[:, 1:] += 1.0
        torch.testing.assert_close(block(y)[:, 0], block(x)[:, 0])


def test_write_into_model_checkpoint_and_load_back(constructed, facts, tmp_path):
    K, V, f = facts
    layers = [export.SwiGLUBlock(D, constructed.hidden_size, mlp_bias=True) for _ in range(2)]
    checkpoint = {f"model.layers.{i}.{k}": v for i, layer in enumerate(layers) for k, v in layer.state_dict().items()}
    checkpoint["model.embed_tokens.weight"] = torch.randn(7, D)
    written = export.write_mlp(checkpoint, constructed, layer=1)
    changed = {k for k in checkpoint if not torch.equal(checkpoint[k], written[k])}
    assert changed == {f"model.layers.1.mlp.{n}.{w}" for n in export.MLP_NAMES for w in ("weight", "bias")}
    path = export.save_checkpoint(written, tmp_path / "model.safetensors")
    loaded = export.load_checkpoint(path)
    back = export.read_mlp(loaded, layer=1)
    assert back.hidden_size == constructed.hidden_size
    torch.testing.assert_close(back(K), constructed(K))
    assert torch.equal(back.predict(K, V), f)


def test_write_mlp_rejects_bias_free_slots_and_wrong_shapes(constructed):
    no_bias = export.SwiGLUBlock(D, constructed.hidden_size, mlp_bias=False).state_dict()
    with pytest.raises(ValueError, match="mlp_bias=True"):
        export.write_mlp(no_bias, constructed)
    wrong = export.SwiGLUBlock(D, constructed.hidden_size + 1, mlp_bias=True).state_dict()
    with pytest.raises(ValueError, match="intermediate_size"):
        export.write_mlp(wrong, constructed)
    with pytest.raises(ValueError, match="no MLP slot"):
        export.write_mlp({"model.embed_tokens.weight": torch.zeros(2, D)}, constructed, layer=0)
    with pytest.raises(ValueError, match="layer"):
        export.layer_prefix(-1)
