"""factkernels.hf.metrics: CounterFact scores, exact match, fluency, consistency and intervals, on a tiny Llama."""

import math

import pytest
import torch

from factkernels.datasets.editing_benchmark import EditCase, Fact, Neighbour
from factkernels.hf import metrics
from factkernels.hf.requests import Request

CASES = [
    EditCase("author", "the hobbit", "jane austen", "tolkien", ("the book {} was written by", "who wrote {} ? it was"),
             ("the novel {} is by", "the author of {} is"), (Neighbour("the book {} was written by", "dune", "frank herbert"),)),
    EditCase("author", "emma", "leo tolstoy", "jane austen", ("the book {} was written by", "who wrote {} ? it was"),
             ("the novel {} is by", "the author of {} is"),
             (Neighbour("the novel {} is by", "ulysses", "james joyce"), Neighbour("the author of {} is", "dune", "frank herbert"))),
]


def test_ngram_entropy_matches_a_hand_count():
    # bigrams (a b) x2, (b a): H = h(1/3); trigrams (a b a), (b a b): 1 bit; weights 2/3, 4/3, mean of the two
    h = -(2 / 3) * math.log2(2 / 3) - (1 / 3) * math.log2(1 / 3)
    assert metrics.ngram_entropy("a b a b") == pytest.approx((2 / 3 * h + 4 / 3 * 1.0) / 2)
    assert metrics.ngram_entropy("same same same same") == 0.0
    assert metrics.ngram_entropy("x") == 0.0


def test_tfidf_similarity():
    tfidf = metrics.TfIdf(["rome is in italy", "paris is in france", "the river"])
    assert tfidf.similarity("Rome, Italy", "rome italy") == pytest.approx(1.0)
    assert tfidf.similarity("paris france", "rome italy") == 0.0
    assert tfidf.similarity("unknown words only", "rome") == 0.0
    # "is" (df 2) weighs less than "rome" (df 1): idf ln(4/3)+1 vs ln(4/2)+1
    v = tfidf.vector("rome is")
    assert v["rome"] / v["is"] == pytest.approx((math.log(4 / 2) + 1) / (math.log(4 / 3) + 1))


def test_t_interval_and_over_draws():
    got = metrics.t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t_{0.975, 2} · sd 1 / sqrt(3)
    assert got["mean"] == 2.0 and got["low"] == pytest.approx(2 - half) and got["high"] == pytest.approx(2 + half)
    assert math.isnan(metrics.t_interval([1.0])["low"])
    summary = metrics.over_draws([{"a": 1.0, "b": "x", "unedited": {"a": 0.0}}, {"a": 3.0, "unedited": {"a": 0.0}}])
    assert summary["a"]["mean"] == 2.0 and "b" not in summary and summary["unedited"]["a"]["high"] == 0.0


def test_harmonic_mean():
    assert metrics.harmonic_mean([1.0, 0.5]) == pytest.approx(2 / 3)
    assert metrics.harmonic_mean([1.0, 0.0]) == 0.0


def test_target_scores_match_the_full_forward(tiny_llama):
    model, tok = tiny_llama
    requests = [Request("the book {} was written by", "dune", " frank herbert"), Request("who wrote {} ? it", "emma", " was")]
    mean_lp, exact = metrics.target_scores(model, tok, requests, batch_size=1)
    for i, r in enumerate(requests):
        prompt = tok(r.text)["input_ids"]
        target = tok(r.target_new, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = model(torch.tensor([prompt + target])).logits[0].log_softmax(-1)
        steps = [logp[len(prompt) - 1 + t] for t in range(len(target))]
        assert float(mean_lp[i]) == pytest.approx(sum(float(s[tok_id]) for s, tok_id in zip(steps, target)) / len(target),
                                                  abs=1e-5)
        assert bool(exact[i]) == all(int(s.argmax()) == tok_id for s, tok_id in zip(steps, target))


def test_score_cases_unedited_equals_its_baseline(tiny_llama):
    model, tok = tiny_llama
    texts = ["the old house by the river and the tree", "people in the city knew the music of the year"]
    known = [Fact("author", "persuasion", "jane austen"), Fact("author", "anna karenina", "leo tolstoy")]
    base = metrics.record_baseline(model, tok, CASES, texts=texts, generate=2, known=known, max_new_tokens=6)
    assert set(base.references) == {("author", "jane austen"), ("author", "leo tolstoy")}
    assert base.references[("author", "leo tolstoy")].startswith("the novel anna karenina is by leo tolstoy")
    scores = metrics.score_cases(model, tok, CASES, base, texts=texts, max_new_tokens=6)
    assert scores["kl_mean"] == pytest.approx(0.0, abs=1e-6) and scores["perplexity_ratio"] == pytest.approx(1.0)
    for key in metrics.SCORES + ("fluency", "consistency", "score"):
        same = scores[key] == pytest.approx(scores["unedited"][key]) or (math.isnan(scores[key])
                                                                       and math.isnan(scores["unedited"][key]))
        assert same, key
    assert set(scores["by_relation"]) == {"author"} and len(scores["by_template"]["paraphrase"]) == 2
    assert scores["generations"] == 4 and 0 <= scores["fluency"] and scores["consistency_cases"] == 2
    assert 0 <= scores["consistency"] <= 1
    # efficacy score by hand: case means of [lp(new) > lp(true)] over the edit prompts, then the mean over cases
    per_case = []
    for c in CASES:
        rows = [Request(p, c.subject, " " + t) for p in c.edit_prompts for t in (c.target_new, c.target_true)]
        lp, _ = metrics.target_scores(model, tok, rows)
        per_case.append(float((lp[0::2] > lp[1::2]).double().mean()))
    assert scores["efficacy_score"] == pytest.approx(sum(per_case) / len(per_case))
    # neighbourhood magnitude by hand: p(true) - p(new) per neighbour, case means
    mags = []
    for c in CASES:
        rows = [Request(n.prompt, n.subject, " " + t) for n in c.neighbours for t in (c.target_new, n.target)]
        lp, _ = metrics.target_scores(model, tok, rows)
        mags.append(float((lp[1::2].exp() - lp[0::2].exp()).mean()))
    assert scores["neighbourhood_magnitude"] == pytest.approx(sum(mags) / len(mags), abs=1e-6)


def test_case_requests_use_every_edit_template():
    requests = metrics.case_requests(CASES)
    assert len(requests) == 4 and requests[1] == Request("who wrote {} ? it was", "the hobbit", " jane austen", " tolkien")


def test_scores_on_the_packaged_model_reproduce_the_known_filter(smollm2):
    """The unedited model answers the shipped known facts under exactly the edit templates the CSV says."""
    from factkernels.datasets.editing_benchmark import known_draw, known_facts

    model, tok = smollm2
    cases = known_draw("validation", n=4)
    flags = {(k.fact.relation, k.fact.subject): k for k in known_facts()}
    requests = [Request(t, c.subject, " " + c.target_true) for c in cases for t in c.edit_prompts + c.paraphrase_prompts]
    _, exact = metrics.target_scores(model, tok, requests)
    expected = [b for c in cases for b in flags[(c.relation, c.subject)].edit_correct
                + flags[(c.relation, c.subject)].held_out_correct]
    assert exact.tolist() == expected


def test_mentions_any_matches_whole_words_in_any_case():
    from factkernels.hf.evaluate import mentions_any

    assert mentions_any("Trade with United Kingdom grew.", ["the United Kingdom"])
    assert mentions_any("carbon dioxide", ["Carbon"]) and mentions_any("the cow.", ["cow"])
    assert not mentions_any("a trip to Moscow", ["cow"]) and not mentions_any("carbonate", ["carbon"])
    assert not mentions_any("anything", [])


def test_text_kl_is_split_by_texts_naming_an_edited_subject(tiny_llama):
    import copy

    from factkernels.hf.evaluate import record_reference, text_scores

    model, tok = tiny_llama
    edited = copy.deepcopy(model)
    with torch.no_grad():
        for p in edited.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    named = ["the hobbit was a book of the year", "people read emma in the city"]
    other = ["the old house by the river and the tree", "the music of the city was old"]
    texts = [named[0], other[0], named[1], other[1]]  # interleaved: the split follows texts, not positions
    whole = text_scores(edited, tok, texts, record_reference(model, tok, texts=texts), subjects=["The Hobbit", "emma"])
    parts = {name: text_scores(edited, tok, part, record_reference(model, tok, texts=part))
             for name, part in (("mentioned", named), ("unmentioned", other))}
    assert whole["texts_mentioning"] == 2
    assert whole["text_tokens_mentioning"] == parts["mentioned"]["text_tokens"]
    for name in ("mentioned", "unmentioned"):
        assert parts[name]["kl_mean"] > 1e-4
        assert whole[f"kl_mean_{name}"] == pytest.approx(parts[name]["kl_mean"], rel=1e-4)
    none_named = text_scores(edited, tok, other, record_reference(model, tok, texts=other), subjects=["emma"])
    assert none_named["kl_mean_mentioned"] is None and none_named["kl_mean_unmentioned"] == pytest.approx(
        none_named["kl_mean"])
    assert "kl_mean_unmentioned" not in text_scores(edited, tok, other, record_reference(model, tok, texts=other))


def test_over_draws_skips_a_metric_missing_or_none_in_a_draw():
    summary = metrics.over_draws([{"a": 1.0, "k": 0.5, "m": None}, {"a": 3.0, "m": 0.2}])
    assert set(summary) == {"a"}
