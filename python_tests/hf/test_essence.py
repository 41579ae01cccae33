"""factkernels.hf.essence: the model's continuations after a subject and the bucketed KL that keeps them."""

import torch

from factkernels.hf.essence import bucketed_kl, continuations


def test_bucketed_kl_is_the_kl_over_the_named_tokens_and_the_rest():
    gen = torch.Generator().manual_seed(0)
    p, q = (torch.randn(5, 12, generator=gen).log_softmax(1) for _ in range(2))
    full = (p.exp() * (p - q)).sum(1)
    assert torch.allclose(bucketed_kl(p, q), full, atol=1e-5)  # every token named: the KL itself
    top = p.topk(3, dim=1).indices
    merged = bucketed_kl(p.gather(1, top), q.gather(1, top))
    rest_p, rest_q = 1 - p.gather(1, top).exp().sum(1), 1 - q.gather(1, top).exp().sum(1)
    expect = (p.gather(1, top).exp() * (p.gather(1, top) - q.gather(1, top))).sum(1) + rest_p * (rest_p / rest_q).log()
    assert torch.allclose(merged, expect, atol=1e-5) and bool((merged <= full + 1e-5).all())
    assert float(bucketed_kl(p.gather(1, top), p.gather(1, top)).abs().max()) < 1e-6


def test_continuations_are_the_models_greedy_text_batched_or_not(tiny_llama):
    model, tok = tiny_llama
    texts = ["the old house by the river", "music", "people know the time of"]
    batched = continuations(model, tok, texts, length=4)
    for text, got in zip(texts, batched):
        ids = tok(text, return_tensors="pt")["input_ids"]
        for _ in range(4):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert got == tok.decode(ids[0, -4:], skip_special_tokens=True)
    assert tok.padding_side == "right"

