"""factkernels.hf: loading, layout, requests and hooks on a tiny random Llama (and the packaged model)."""

import json

import pytest
import torch

from factkernels import hf
from factkernels.hf.requests import Request

REQUESTS = [
    {"prompt": "the book {} was written by", "subject": "the hobbit", "target_new": "jane austen"},
    {"prompt": "who wrote {} ? it was", "subject": "war and peace", "target_new": "george orwell"},
    {"prompt": "the novel {} is by", "subject": "dune", "target_new": "mary shelley"},
]


# ----------------------------------------------------------------------------- requests


def test_requests_parse_and_normalise(tmp_path):
    parsed = hf.parse_requests(REQUESTS)
    assert parsed[0] == Request("the book {} was written by", "the hobbit", " jane austen")
    assert parsed[0].text == "the book the hobbit was written by"
    literal = hf.make_request({"prompt": "The Hobbit was written by", "subject": "The Hobbit", "target_new": "X"})
    assert literal.prompt == "{} was written by"
    counterfact = {"requested_rewrite": {"prompt": "{} is by", "subject": "Dune", "target_new": {"str": "Emma"},
                                         "target_true": {"str": "Frank Herbert"}}}
    assert hf.make_request(counterfact) == Request("{} is by", "Dune", " Emma", " Frank Herbert")
    (tmp_path / "r.json").write_text(json.dumps({"requests": REQUESTS}))
    assert hf.parse_requests(tmp_path / "r.json") == parsed
    (tmp_path / "r.csv").write_text("prompt,subject,target_new\n" + "\n".join(
        f"\"{r['prompt']}\",{r['subject']},{r['target_new']}" for r in REQUESTS))
    assert hf.parse_requests(str(tmp_path / "r.csv")) == parsed


@pytest.mark.parametrize("bad, message", [
    ({"prompt": "{} was written by", "subject": "", "target_new": " X"}, "subject is empty"),
    ({"prompt": "Dune was written by", "subject": "Emma", "target_new": " X"}, "not in the prompt"),
    ({"prompt": "{} was written by", "subject": "Dune", "target_new": "  "}, "target_new is empty"),
    ({"prompt": "{} was written by", "subject": "Dune"}, "target_new must be a string"),
    ({"prompt": "{} and {} wrote", "subject": "Dune", "target_new": " X"}, "more than one"),
    ({"prompt": "Who wrote {}", "subject": "Dune", "target_new": " X"}, "ends with the subject"),
])
def test_bad_requests_are_rejected(bad, message):
    with pytest.raises(ValueError, match=message):
        hf.parse_requests([bad])


def test_bad_request_containers():
    with pytest.raises(ValueError, match="empty"):
        hf.parse_requests([])
    with pytest.raises(TypeError, match="list of request dicts"):
        hf.parse_requests({"prompt": "x"})
    with pytest.raises(ValueError, match="different targets"):
        hf.parse_requests([REQUESTS[0], dict(REQUESTS[0], target_new="emma")])


def test_book_requests_are_counterfactual_and_seeded():
    a, b = hf.book_requests(20, seed=3), hf.book_requests(20, seed=3)
    assert a.to_dict() == b.to_dict()
    assert len(a.requests) == 20 and len(a.paraphrases) == 40 and len(a.neighborhood) == 20
    assert all(r.target_new != r.target_true and r.prompt == hf.BOOK_PROMPTS[0] for r in a.requests)
    subjects = {r.subject for r in a.requests}
    assert {p.subject for p in a.paraphrases} == subjects
    assert all(p.prompt != hf.BOOK_PROMPTS[0] for p in a.paraphrases)
    assert not any(s in n for s in subjects for n in a.neighborhood if n.endswith(f" {s} is"))


# ----------------------------------------------------------------------------- layout


def test_layout_and_layer_range(tiny_llama):
    model, _ = tiny_llama
    assert len(hf.mlp_layers(model)) == 3
    assert hf.mlp_module(model, 2) is model.model.layers[2].mlp
    for layer in (3, -1, 1.0):
        with pytest.raises(ValueError, match=r"layer must be an int in \[0, 3\)"):
            hf.mlp_module(model, layer)


def test_unknown_layout_is_rejected(tiny_llama):
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10))
    with pytest.raises(ValueError, match="unsupported model layout: GPT2LMHeadModel"):
        hf.mlp_layers(gpt2)
    model, _ = tiny_llama

    class NoMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
            self.config = model.config

    with pytest.raises(ValueError, match=r"layers\[0\] has no mlp"):
        hf.mlp_layers(NoMLP())


# ----------------------------------------------------------------------------- hooks


def test_subject_and_prompt_positions(tiny_llama):
    _, tok = tiny_llama
    batch = hf.encode_requests(tok, hf.parse_requests(REQUESTS), with_target=True)
    # "the book the hobbit was written by" -> hobbit is token 3, prompt ends at token 6
    assert batch.subject_last.tolist() == [3, 4, 2]
    assert batch.prompt_last.tolist() == [6, 7, 4]
    assert batch.target_len.tolist() == [2, 2, 2]
    assert tok.convert_ids_to_tokens(batch.target_ids(0)) == ["jane", "austen"]
    assert batch.attention_mask.sum(1).tolist() == [9, 10, 7]
    assert (batch.input_ids[2, 7:] == tok.pad_token_id).all()


@pytest.mark.parametrize("site", ["mlp_in", "down_in"])
def test_hooks_capture_the_right_positions_with_padding(tiny_llama, site):
    """A batched, padded capture equals the same hidden state recomputed one prompt at a time."""
    model, tok = tiny_llama
    requests = hf.parse_requests(REQUESTS)
    layer = 1
    mlp = model.model.layers[layer].mlp
    for position in ("subject_last", "prompt_last"):
        keys = hf.capture_keys(model, tok, requests, layer, site=site, position=position)
        assert keys.shape == (3, 32 if site == "mlp_in" else 64)
        batch = hf.encode_requests(tok, requests)
        for i, r in enumerate(requests):
            seen = []  # the MLP input of this prompt alone, unpadded
            handle = mlp.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
            with torch.no_grad():
                model(torch.tensor([tok(r.text)["input_ids"]]))
            handle.remove()
            pos = int((batch.subject_last if position == "subject_last" else batch.prompt_last)[i])
            x = seen[0][0, pos]
            expected = x if site == "mlp_in" else mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)
            torch.testing.assert_close(keys[i], expected, rtol=1e-5, atol=1e-5)


def test_target_positions_and_margins_match_full_logits(tiny_llama):
    """Margins from logits at the target positions only equal those read off the full (b, T, vocab) logits."""
    from factkernels.hf.evaluate import batch_margins

    model, tok = tiny_llama
    batch = hf.encode_requests(tok, hf.parse_requests(REQUESTS), with_target=True)
    rows, positions, tokens = batch.target_positions()
    assert rows.tolist() == [0, 0, 1, 1, 2, 2] and positions.tolist() == [6, 7, 7, 8, 4, 5]
    assert tokens.tolist() == [t for i in range(3) for t in batch.target_ids(i)]
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    expected = []
    for i in range(3):
        at = logits[i, positions[rows == i]]
        own = at.gather(1, tokens[rows == i][:, None]).squeeze(1)
        expected.append(float((own - at.scatter(1, tokens[rows == i][:, None], float("-inf")).amax(1)).min()))
    torch.testing.assert_close(batch_margins(model, batch, batch_size=2), torch.tensor(expected), rtol=1e-5, atol=1e-5)


def test_capture_all_tokens_of_texts(tiny_llama):
    model, tok = tiny_llama
    ids, mask = hf.encode_texts(tok, ["the old house", "music and rain in the city"])
    states = hf.capture(model, ids, mask, 0)
    assert states.shape == (3 + 6, 32)
    alone = hf.capture(model, *hf.encode_texts(tok, ["the old house"]), 0)
    torch.testing.assert_close(states[:3], alone, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="site must be one of"):
        hf.capture(model, ids, mask, 0, site="attn")


def test_capture_several_sites_in_one_forward(tiny_llama):
    model, tok = tiny_llama
    ids, mask = hf.encode_texts(tok, ["the old house", "music and rain in the city"])
    keys, after = hf.capture(model, ids, mask, 0, site=("mlp_in", "block_out"))
    torch.testing.assert_close(keys, hf.capture(model, ids, mask, 0))
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    torch.testing.assert_close(after, hidden[1][mask.bool()], rtol=1e-5, atol=1e-5)  # hidden[1]: after layer 0


def test_capture_returns_rows_in_the_callers_order(tiny_llama):
    model, tok = tiny_llama
    texts = ["music and rain in the city", "the old house", "a long walk by the sea at night", "rain"]
    ids, mask = hf.encode_texts(tok, texts)
    states = hf.capture(model, ids, mask, 1, batch_size=2)  # batches by length: rows 3+1, then 0+2
    alone = torch.cat([hf.capture(model, *hf.encode_texts(tok, [t]), 1) for t in texts])
    torch.testing.assert_close(states, alone, rtol=1e-5, atol=1e-5)
    last = hf.capture(model, ids, mask, 1, positions=mask.sum(1) - 1, batch_size=2)
    ends = mask.sum(1).cumsum(0) - 1
    torch.testing.assert_close(last, alone[ends], rtol=1e-5, atol=1e-5)
