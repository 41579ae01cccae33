"""factkernels.hf.subject_keys: detector groups, mentions, the LDA threshold's contrast, negatives, essence rows."""

import pytest
import torch

from factkernels import hf
from factkernels.hf.capture import encode_texts
from factkernels.hf.subject_keys import (detector_groups, lda_detectors, lookalike_states, lookalike_tokens,
                                        missed_groups, ramp_units, subject_contexts, subject_detectors, subject_mentions)
from helpers import TINY_PREFIXES, TINY_TEXTS


def test_contexts_say_which_rows_open_with_the_subject(tiny_llama):
    _, tok = tiny_llama
    requests = hf.parse_requests([
        {"prompt": "{} was written by", "subject": "dune", "target_new": "mary shelley"},
        {"prompt": "the novel {} is by", "subject": "dune", "target_new": "mary shelley"},
        {"prompt": "the author of {} is", "subject": "emma", "target_new": "frank herbert"}])
    ctx = subject_contexts(tok, requests, ["the old house", "music in the city"])
    # rows: 3 requests x (bare + 2 prefixes); only dune's bare "{} was written by" opens the text
    assert ctx.opens.tolist() == [True] + [False] * 8
    assert ctx.subject.tolist() == [0] * 6 + [1] * 3


def test_only_split_subjects_get_a_detector_per_placement():
    subject = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    opens = torch.tensor([True, False, False, True, False, False, False])
    group, group_subject = detector_groups(subject, opens, torch.tensor([True, False, True]))
    assert group_subject.tolist() == [0, 0, 1, 2]  # subject 2 never opens a text: one detector
    assert group.tolist() == [1, 0, 0, 2, 2, 3, 3]
    group, group_subject = detector_groups(subject, opens, torch.zeros(3, dtype=torch.bool))
    assert torch.equal(group, subject) and group_subject.tolist() == [0, 1, 2]


def test_subject_mentions_mark_the_last_token_of_each_occurrence(tiny_llama):
    _, tok = tiny_llama
    ids, mask = encode_texts(tok, ["we read war and peace and then dune", "war music . dune and war and peace"])
    got = subject_mentions(tok, ["war and peace", "dune", "emma"], ids, mask)
    words = [t.split() for t in ["we read war and peace and then dune", "war music . dune and war and peace"]]
    flat = [w for row in words for w in row]
    assert got.shape == (len(flat), 3)
    assert [i for i in range(len(flat)) if got[i, 0]] == [4, 15]  # "peace" ending each "war and peace"
    assert [i for i in range(len(flat)) if got[i, 1]] == [7, 11]
    assert not got[:, 2].any()


def test_a_mention_of_the_subject_is_not_contrast():
    """A negative state at the subject's own key (its name in ordinary text) leaves it unseparated, and its
    threshold must then sit below the own keys; marked as a mention, it is left out and τ sits between."""
    gen = torch.Generator().manual_seed(0)
    d = 8
    centres = 6.0 * torch.eye(d)[:2]
    subject = torch.arange(2).repeat_interleave(5)
    own = centres[subject] + 0.1 * torch.randn(10, d, generator=gen)
    negatives = torch.cat([torch.randn(200, d, generator=gen), centres[:1] * 1.05])
    plain = lda_detectors(own, subject, negatives)
    assert plain["separated"].tolist() == [False, True]
    # one look-alike negative against five own keys: the fewest errors keep every own key (τ below them all)
    assert plain["own_dropped"].tolist() == [0, 0] and bool((plain["tau"] < plain["own_min"]).all())
    mentions = torch.zeros(len(negatives), 2, dtype=torch.bool)
    mentions[-1, 0] = True
    det = lda_detectors(own, subject, negatives, mentions=mentions)
    assert det["separated"].all() and bool((det["tau"] < det["own_min"]).all())
    assert float(plain["contrast_max"][0]) > 1.0 > float(det["own_min"][0]) > float(det["contrast_max"][0])
    mlp = ramp_units(det, torch.randn(2, d, generator=gen))
    with torch.no_grad():  # silent on the ordinary negatives, firing on the mention
        assert float(mlp(negatives[:-1]).norm(dim=1).max()) < 1e-3
        assert float(mlp(negatives[-1:]).norm()) > 0.1


def test_an_unseparated_filter_drops_the_own_key_that_sits_in_ordinary_text():
    """One of a subject's keys inside the negatives' cloud (a title whose last token is an ordinary word): keeping it
    would fire the detector on half the negatives, so the cut with the fewest training errors leaves it out (one
    error), τ sits above every negative, and the detector is silent on them while its other keys get δ whole."""
    gen = torch.Generator().manual_seed(1)
    d = 8
    centres = 6.0 * torch.eye(d)[:2]
    subject = torch.arange(2).repeat_interleave(5)
    own = centres[subject] + 0.1 * torch.randn(10, d, generator=gen)
    own[4] = 0.0  # subject 0's fifth context looks like ordinary text
    negatives = torch.randn(400, d, generator=gen)
    det = lda_detectors(own, subject, negatives)
    assert det["separated"].tolist() == [False, True] and det["own_dropped"].tolist() == [1, 0]
    scores = ((negatives.double() - det["mu"]) @ det["w"].T)
    assert bool((scores.amax(0) < det["tau"]).all()) and bool((det["tau"] < det["own_min"]).all())
    deltas = torch.randn(2, d, generator=gen)
    mlp = ramp_units(det, deltas)
    with torch.no_grad():
        assert float(mlp(negatives).norm(dim=1).max()) < 1e-3 * float(deltas.norm(dim=1).min())
        kept = torch.arange(10) != 4
        torch.testing.assert_close(mlp(own[kept]), deltas[subject[kept]], rtol=0, atol=1e-3)
    # a detector of its own cannot lift that key out of the text either: the pass leaves as many out and is undone
    import types

    ctx = types.SimpleNamespace(subject=subject, opens=torch.zeros(10, dtype=torch.bool), subjects=["a", "b"])
    again, group, group_subject = subject_detectors(own, ctx, negatives,
                                                    mentions=torch.zeros(len(negatives), 2, dtype=torch.bool))
    assert group_subject.tolist() == [0, 1] and torch.equal(group, subject)
    assert again["missed"].nonzero().flatten().tolist() == [4]
    torch.testing.assert_close(again["tau"], det["tau"], rtol=0, atol=0)


def test_missed_contexts_form_one_group_per_detector_they_fall_out_of():
    group = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    missed = torch.tensor([False, True, False, False, True, False, True])
    regrouped, group_subject = missed_groups(group, torch.tensor([0, 0, 1]), missed)
    assert regrouped.tolist() == [0, 3, 1, 1, 4, 2, 4] and group_subject.tolist() == [0, 0, 1, 0, 1]


def test_the_contexts_a_cut_leaves_out_get_a_detector_of_their_own():
    """Two of subject 0's keys sit apart from its others (a subject opening the text), with ordinary text between
    them: no one filter passes both without the text, so the first cut leaves them out. A detector of their own
    separates them, every key then gets its subject's δ once and the text stays silent."""
    import types

    gen = torch.Generator().manual_seed(2)
    d = 8
    e = torch.eye(d)
    subject = torch.tensor([0] * 8 + [1] * 5)
    own = torch.cat([6 * e[0] + 0.1 * torch.randn(6, d, generator=gen), (6 * e[2]).repeat(2, 1),
                     6 * e[1] + 0.1 * torch.randn(5, d, generator=gen)])
    negatives = torch.cat([torch.randn(400, d, generator=gen), 3 * (e[0] + e[2]) + 0.3 * torch.randn(40, d, generator=gen)])
    one = lda_detectors(own, subject, negatives, within=0.0)
    assert one["separated"].tolist() == [False, True] and one["missed"].nonzero().flatten().tolist() == [6, 7]
    ctx = types.SimpleNamespace(subject=subject, opens=torch.zeros(len(subject), dtype=torch.bool), subjects=["a", "b"])
    det, group, group_subject = subject_detectors(own, ctx, negatives, within=0.0,
                                                  mentions=torch.zeros(len(negatives), 2, dtype=torch.bool))
    assert group_subject.tolist() == [0, 1, 0] and group.tolist() == [0] * 6 + [2, 2] + [1] * 5
    assert det["separated"].all() and not det["missed"].any()
    first, first_group, _ = subject_detectors(own, ctx, negatives, within=0.0, own_for_missed=False,
                                              mentions=torch.zeros(len(negatives), 2, dtype=torch.bool))
    assert torch.equal(first_group, subject) and first["missed"].nonzero().flatten().tolist() == [6, 7]
    deltas = torch.randn(2, d, generator=gen)
    mlp = ramp_units(det, deltas[group_subject])
    with torch.no_grad():
        torch.testing.assert_close(mlp(own), deltas[subject], rtol=0, atol=1e-3)
        assert float(mlp(negatives).norm(dim=1).max()) < 1e-6


def test_negatives_in_parts_give_the_detectors_of_one_pass(monkeypatch):
    """The negatives' moments, contrast scores and firing are taken NEGATIVE_ROWS rows at a time (a union of every
    known fact has ~850k negatives): parts of 7 rows give the filters, thresholds and firing of one pass."""
    from factkernels.hf import subject_keys

    gen = torch.Generator().manual_seed(1)
    d = 8
    subject = torch.arange(3).repeat_interleave(4)
    own = 5.0 * torch.eye(d)[:3][subject] + 0.2 * torch.randn(12, d, generator=gen)
    negatives = torch.cat([torch.randn(100, d, generator=gen), own[:1] * 1.02])
    mentions = torch.zeros(len(negatives), 3, dtype=torch.bool)
    mentions[-1, 0] = True
    whole = lda_detectors(own, subject, negatives, mentions=mentions, partner_weight=0.01)
    fired = subject_keys.detector_firing(whole, negatives, 12.0)
    monkeypatch.setattr(subject_keys, "NEGATIVE_ROWS", 7)
    parts = lda_detectors(own, subject, negatives, mentions=mentions, partner_weight=0.01)
    for key in ("w", "mu", "tau", "own_min", "contrast_max"):
        torch.testing.assert_close(parts[key], whole[key], rtol=1e-10, atol=1e-12)
    assert torch.equal(parts["separated"], whole["separated"])
    assert torch.equal(subject_keys.detector_firing(parts, negatives, 12.0), fired) and bool(fired[-1])


def test_lookalikes_are_extensions_and_embedding_neighbours(tiny_llama):
    """" a" -> the words that extend it with the lowest ids, then the nearest input embeddings; never a subject's
    own last token or a special token."""
    model, tok = tiny_llama
    vocab = tok.get_vocab()
    own = torch.tensor([vocab["a"], vocab["dune"], vocab["a"]])
    emb = model.get_input_embeddings().weight
    got = lookalike_tokens(tok, emb, own, extensions=3, neighbours=2)
    assert sorted(got) == sorted({vocab["a"], vocab["dune"]})
    extending = sorted(i for w, i in vocab.items() if w.startswith("a") and w != "a")
    assert got[vocab["a"]][:3] == extending[:3]
    banned = {vocab["a"], vocab["dune"], *tok.all_special_ids, *extending[:3]}
    cos = torch.nn.functional.normalize(emb.detach(), dim=1) @ torch.nn.functional.normalize(emb[vocab["a"]].detach(), dim=0)
    nearest = [i for i in cos.argsort(descending=True).tolist() if i not in banned][:2]
    assert got[vocab["a"]][3:] == nearest
    assert not set(got[vocab["dune"]]) & {vocab["a"], vocab["dune"], *tok.all_special_ids}
    assert lookalike_tokens(tok, emb, own, extensions=0, neighbours=0) == {vocab["a"]: [], vocab["dune"]: []}


def test_a_lookalike_stays_below_the_threshold_and_own_keys_above():
    """A state that shares the subject's direction but differs along another (a look-alike token in the subject's
    place) passes the plain filter's threshold; with it as a look-alike the filter turns away from it: its score
    sits below τ, every own key above, and the ramp units give it nothing while the own keys get δ."""
    gen = torch.Generator().manual_seed(0)
    d = 8
    centres = 6.0 * torch.eye(d)[:2]
    subject = torch.arange(2).repeat_interleave(6)
    own = centres[subject] + 0.3 * torch.randn(12, d, generator=gen)
    negatives = torch.randn(300, d, generator=gen)
    alike = centres[:1] + 2.0 * torch.eye(d)[2:3] + 0.1 * torch.randn(4, d, generator=gen)  # near subject 0's keys
    plain = lda_detectors(own, subject, negatives)
    plain_scores = (alike.double() - plain["mu"]) @ plain["w"][0]
    assert bool((plain_scores > plain["tau"][0]).all())
    det = lda_detectors(own, subject, negatives, lookalikes=alike, lookalike_subject=torch.zeros(4, dtype=torch.long),
                        lookalike_weight=0.3)  # larger weights turn the filter onto the background's spread
    scores = (alike.double() - det["mu"]) @ det["w"][0]
    assert bool((scores < det["tau"][0]).all()) and float(det["lookalike_max"][0]) == pytest.approx(float(scores.max()))
    assert det["separated"].all() and bool((det["tau"] < det["own_min"]).all())
    deltas = torch.randn(2, d, generator=gen)
    mlp = ramp_units(det, deltas)
    with torch.no_grad():
        assert float(mlp(alike).norm(dim=1).max()) < 1e-3 * float(deltas.norm(dim=1).min())
        assert torch.allclose(mlp(own), deltas[subject], atol=1e-3 * float(deltas.norm(dim=1).max()))


@pytest.mark.parametrize("rows", [3, 20])
def test_lookalike_filter_minimises_the_penalised_objective(rows):
    """w_s solves min wᵀAw + c·mean_l (w·(x_l − μ))² subject to w·(μ_s − μ) = 1 over s's own look-alikes: the
    filter equals a direct solve of (A + c/n ZᵀZ) w ∝ μ_s − μ, with A rebuilt from its definition, with fewer
    penalty rows than d (Woodbury's small system) and with more (the (d, d) system)."""
    gen = torch.Generator().manual_seed(1)
    d, c = 6, 0.5
    subject = torch.tensor([0, 0, 0, 1, 1, 1])
    own = 4.0 * torch.eye(d)[subject] + 0.2 * torch.randn(6, d, generator=gen)
    negatives = torch.randn(50, d, generator=gen)
    alike = 4.0 * torch.eye(d)[:1] + torch.randn(rows, d, generator=gen)
    det = lda_detectors(own, subject, negatives, lookalikes=alike,
                        lookalike_subject=torch.zeros(rows, dtype=torch.long), lookalike_weight=c, within=1.0,
                        ridge=1e-2)
    k, x = own.double(), negatives.double()
    mu = x.mean(0)
    means = torch.stack([k[subject == s].mean(0) for s in range(2)])
    spread = k - means[subject]
    a = (x - mu).T @ (x - mu) / (len(x) - 1) + spread.T @ spread / (len(k) - 2)
    a += 1e-2 * a.diagonal().mean() * torch.eye(d, dtype=torch.float64)
    z = alike.double() - mu
    for s, extra in ((0, c / rows * z.T @ z), (1, 0.0)):
        w = torch.linalg.solve(a + extra, means[s] - mu)
        torch.testing.assert_close(det["w"][s], w / (w @ (means[s] - mu)))


def _twin_subjects(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two subjects whose mean keys differ along one narrow direction e1 (ordinary text barely varies there), each
    subject's keys spreading along the direction they share (e0, as text does): a plain filter, mostly along e0,
    scores the other subject's keys about as high as its own. (own (12, d), subject (12,), negatives (300, d))."""
    d = 8
    subject = torch.arange(2).repeat_interleave(6)
    side = torch.where(subject == 0, 1.0, -1.0)[:, None]
    own = 6.0 * torch.eye(d)[0] + side * 0.1 * torch.eye(d)[1] + 0.005 * torch.randn(12, d, generator=gen)
    own += 0.6 * torch.randn(12, 1, generator=gen) * torch.eye(d)[0]
    scale = torch.ones(d)
    scale[1] = 0.02
    return own, subject, torch.randn(300, d, generator=gen) * scale


def test_a_partner_penalty_separates_twin_subjects():
    """Two subjects whose filters pass each other's keys (plain: not separated, most keys of the other subject past
    τ, so its contexts get both δ) are each other's partner with partner_weight > 0: both filters are separated,
    the other's keys score below τ (lower the larger the weight), and the ramp units give every key its own δ
    alone."""
    own, subject, negatives = _twin_subjects(torch.Generator().manual_seed(0))
    deltas = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    plain = lda_detectors(own, subject, negatives)
    assert not plain["separated"].any() and bool((plain["cross_firing"] >= 1).all())
    assert plain["partners"].tolist() == [0, 0]
    with torch.no_grad():  # some key gets the other subject's whole δ besides its own
        error = (ramp_units(plain, deltas)(own) - deltas[subject]).norm(dim=1)
    assert float(error.max()) > 0.9 * float(deltas.norm(dim=1).min())
    other_max = []
    for weight in (1.0, 10.0):
        det = lda_detectors(own, subject, negatives, partner_weight=weight)
        assert det["separated"].all() and det["cross_firing"].tolist() == [0, 0] and det["partners"].tolist() == [1, 1]
        other = ((own.double() - det["mu"]) * det["w"][1 - subject]).sum(1)
        assert bool((other < det["tau"][1 - subject]).all()) and bool((det["tau"] < det["own_min"]).all())
        other_max.append(float(other.abs().max()))
        with torch.no_grad():
            given = ramp_units(det, deltas)(own)
        assert torch.allclose(given, deltas[subject], atol=1e-3 * float(deltas.norm(dim=1).max()))
    assert other_max[1] < 0.5 * other_max[0]


def test_partner_filter_minimises_the_penalised_objective():
    """With partners, w_s solves min wᵀAw + c·mean_p (w·(x_p − μ))² subject to w·(μ_s − μ) = 1 over its partner's
    keys (a direct solve with A rebuilt from its definition), and partner_weight 0 gives the plain filters."""
    own, subject, negatives = _twin_subjects(torch.Generator().manual_seed(2))
    c = 1.0
    det = lda_detectors(own, subject, negatives, partner_weight=c)
    k, x = own.double(), negatives.double()
    mu = x.mean(0)
    means = torch.stack([k[subject == s].mean(0) for s in range(2)])
    spread = k - means[subject]
    a = (x - mu).T @ (x - mu) / (len(x) - 1) + spread.T @ spread / (len(k) - 2)
    a += 1e-2 * a.diagonal().mean() * torch.eye(8, dtype=torch.float64)
    for s in range(2):
        z = k[subject == 1 - s] - mu
        w = torch.linalg.solve(a + c / len(z) * z.T @ z, means[s] - mu)
        torch.testing.assert_close(det["w"][s], w / (w @ (means[s] - mu)))
    plain = lda_detectors(own, subject, negatives)
    torch.testing.assert_close(lda_detectors(own, subject, negatives, partner_weight=0.0)["w"], plain["w"], rtol=0,
                               atol=0)


def test_lookalike_states_are_the_contexts_with_the_last_token_swapped(tiny_llama):
    """Each look-alike sits in the subject's last place of its contexts, and its state is that of the swapped text
    (nothing after it)."""
    from factkernels.hf.capture import capture

    model, tok = tiny_llama
    vocab = tok.get_vocab()
    requests = hf.parse_requests([{"prompt": "the author of {} is", "subject": "war and peace", "target_new": "tolstoy"},
                                  {"prompt": "who wrote {} ? it was", "subject": "emma", "target_new": "austen"}])
    ctx = subject_contexts(tok, requests, ["the old house by the river"])
    swaps = {vocab["peace"]: [vocab["water"], vocab["tree"]], vocab["emma"]: [vocab["anna"]]}
    states, row = lookalike_states(model, ctx, 1, swaps, contexts=2)
    assert row.tolist() == [0, 0, 1, 1, 2, 3]  # two contexts each: every look-alike in both
    swapped = [("peace", "water"), ("peace", "tree")] * 2 + [("emma", "anna")] * 2
    for (word, alike), r, state in zip(swapped, row.tolist(), states):
        prompt = ctx.requests[r].prompt.replace("{}", ctx.requests[r].subject)
        text = prompt[:prompt.index(word)] + alike  # the text up to the subject's last word, swapped
        ids = torch.tensor([tok(text)["input_ids"]])
        expect = capture(model, ids, torch.ones_like(ids), 1, site="mlp_in")[-1]
        assert torch.allclose(state, expect, atol=1e-5), text


def test_every_context_gets_its_subjects_delta_once(tiny_llama):
    """dune opens one prompt and sits inside the other; whether its detector is split or not, each of its contexts
    receives its δ exactly once, and ordinary text that does not name a subject stays silent."""
    import copy

    model, tok = tiny_llama
    model = copy.deepcopy(model)
    texts = ["the old house by the river", "music and rain in the city on a new day", "people know the time of year",
             "a reader knows that the city is old", "dune and emma . the book dune"] * 4
    requests = [{"prompt": "{} was written by", "subject": "dune", "target_new": "mary shelley"},
                {"prompt": "the novel {} is by", "subject": "dune", "target_new": "mary shelley"},
                {"prompt": "the author of {} is", "subject": "emma", "target_new": "frank herbert"}]
    ins = hf.insert_facts(model, tok, requests, keys="subject", layer=1, background=texts,
                          prefixes=["the old house by the river", "music in the city"], value_steps=10, progress=False)
    try:
        rep = ins.report
        assert rep.construction["subjects"] == 2 and rep.construction["detectors"] in (2, 3)
        assert rep.hidden_added == 2 * rep.construction["detectors"]
        assert rep.value_error < 1e-3
        assert rep.construction["negatives_firing_off_mention"] == 0.0
        assert rep.construction["lookalikes"] > 0 and rep.construction["lookalikes_firing"] == 0
    finally:
        ins.remove()


CERT_PREFIXES = ["the old house by the river", "music in the city", "a reader knows that"]


@pytest.mark.parametrize("subject, target", [("war and peace", "orwell"), ("emma", "tolstoy")])
def test_report_lists_every_context_the_edited_model_does_not_answer(strong_llama, subject, target):
    """δ fit on the bare prompt does not carry to every prefixed context. The report's certificate is the edited
    model's own: its efficacy, margins and ``uncertified`` list agree with margins measured afresh on every
    context, and refitting the unanswered contexts' subject never leaves more of them unanswered."""
    import copy

    model, tok = strong_llama
    requests = [{"prompt": "who wrote {} ? it was", "subject": subject, "target_new": target}]
    contexts = hf.parse_requests([{**requests[0], "prompt": (p + ". " if p else "") + requests[0]["prompt"]}
                                  for p in ["", *CERT_PREFIXES]])
    unanswered = {}
    for rounds in (0, 3):
        edited = copy.deepcopy(model)
        ins = hf.insert_facts(edited, tok, requests, keys="subject", layer=1, background=TINY_TEXTS,
                              prefixes=CERT_PREFIXES, value_prefixes=0, value_steps=30, margin=1.0, repair_rounds=rounds,
                              progress=False)
        rep = ins.report
        margins = hf.fact_margins(edited, tok, contexts)
        assert rep.margins == pytest.approx(margins.tolist(), abs=1e-3)
        failing = [[0, c] for c in range(len(contexts)) if margins[c] <= 0]
        assert rep.construction["uncertified"] == failing
        assert rep.efficacy == 1 - len(failing) / len(contexts) and (rep.min_margin > 0) == (not failing)
        assert len(rep.values["repairs"]) <= rounds
        unanswered[rounds] = len(failing)
        ins.remove()
    assert unanswered[0] >= 1  # the bare prompt's δ misses a prefixed context
    assert unanswered[3] <= unanswered[0]


TWIN_REQUESTS = [{"prompt": "who wrote {} ? it was", "subject": "old farm", "target_new": "orwell"},
                 {"prompt": "the novel {} is by", "subject": "old farm", "target_new": "orwell"},
                 {"prompt": "who wrote {} ? it was", "subject": "animal farm", "target_new": "tolstoy"},
                 {"prompt": "the novel {} is by", "subject": "animal farm", "target_new": "tolstoy"}]


def test_twin_subjects_get_their_own_delta_alone_with_a_partner_penalty(tiny_llama):
    """"old farm" and "animal farm" end in one token: on the tiny Llama each plain detector passes its δ at the
    other's contexts (some key gets both δ: value error ~1). With partner_weight (the default) each is the other's
    partner, both are separated, every key gets its own subject's δ alone, and ordinary text stays silent."""
    import copy

    model, tok = tiny_llama
    model = copy.deepcopy(model)
    got = {}
    for options in ({"partner_weight": 0.0}, {}):
        ins = hf.insert_facts(model, tok, TWIN_REQUESTS, keys="subject", layer=1, background=TINY_TEXTS,
                              prefixes=CERT_PREFIXES, value_steps=5, repair_rounds=0, progress=False, **options)
        got[bool(options)] = (ins.report.construction, ins.report.value_error)
        ins.remove()
    (plain, plain_error), (partner, partner_error) = got[True], got[False]
    assert plain["cross_firing"] > 0 and plain["partnered"] == 0 and plain["separated"] == 0 and plain_error > 0.5
    assert partner["cross_firing"] == 0 and partner["partnered"] == 2 and partner["separated"] == 2
    assert partner_error < 1e-3 and partner["negatives_firing"] == 0.0
    with pytest.raises(ValueError, match="partner_weight"):
        hf.insert_facts(model, tok, TWIN_REQUESTS, keys="subject", layer=1, prefixes=CERT_PREFIXES, partner_weight=-1.0)


def test_refit_covers_the_failing_subjects_contexts_below_the_margin(strong_llama):
    """refit_uncertified adds the contexts below the margin of the subjects with an unanswered context to the fit
    and refits only those subjects, from their δ (the others keep theirs exactly)."""
    from factkernels.hf.subject_keys import SubjectUnits, refit_uncertified

    model, tok = strong_llama
    requests = hf.parse_requests([{"prompt": "who wrote {} ? it was", "subject": "war and peace", "target_new": "orwell"},
                                  {"prompt": "the novel {} is by", "subject": "dune", "target_new": "shelley"}])
    ctx = subject_contexts(tok, requests, CERT_PREFIXES)
    deltas = torch.randn(2, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    units = SubjectUnits(ctx, {}, torch.arange(2), deltas.clone(), torch.tensor([0, 4]), torch.zeros(8, 32), 12.0)
    margins = torch.tensor([0.5, -0.2, 2.0, 0.7, 4.0, 4.0, 4.0, 4.0])  # war and peace fails under prefix 1
    info = refit_uncertified(model, units, margins, layer=1, below=1.0, margin=1.0, value_steps=3, value_lr=0.1,
                             batch_size=8, progress=False)
    assert info["subjects"] == 1 and units.fit_rows.tolist() == [0, 1, 3, 4] and info["rows"] == 3
    assert torch.equal(units.deltas[1], deltas[1]) and not torch.equal(units.deltas[0], deltas[0])
    units.missed = torch.tensor([False, True] + [False] * 6)  # its detector does not reach that context
    assert not units.repairable(margins).any()


def test_essence_rows_are_kept_not_taught(strong_llama):
    """Rows marked essence never gate the fit (no margin of their own) and their KL to the unedited model's
    predictions after the subject joins the loss: with a weight, δ moves them less than without (the tiny model
    then falls short of the margin: the certification and repair of insert_facts catch that)."""
    from factkernels.hf.capture import encode_requests, hidden_with_delta, logits_at
    from factkernels.hf.essence import continuations
    from factkernels.hf.subject_values import fit_subject_deltas

    model, tok = strong_llama
    taught = hf.parse_requests([{"prompt": "who wrote {} ? it was", "subject": "emma", "target_new": "tolstoy"}])
    after = ["the old house by the river . {}", "music in the city . {}"]
    kept = [hf.Request(p, "emma", " " + c) for p, c in
            zip(after, continuations(model, tok, [p.replace("{}", "emma") for p in after], length=4))]
    batch = encode_requests(tok, taught + kept, with_target=True)
    essence = torch.tensor([False, True, True])
    subject = torch.zeros(3, dtype=torch.long)

    def kept_kl(delta):
        sub = batch.rows(slice(1, 3))
        rows, pos, _ = sub.target_positions()
        with torch.no_grad():
            lp = [logits_at(model, hidden_with_delta(model, 1, sub, None, torch.arange(2), sub.subject_last, d),
                            rows, pos).log_softmax(-1) for d in (torch.zeros(2, 32), delta[[0, 0]])]
        return float((lp[0].exp() * (lp[0] - lp[1])).sum(-1).mean())

    kl = {}
    for weight in (0.0, 3.0):
        delta, info = fit_subject_deltas(model, batch, subject, 1, margin=0.2, steps=60, lr=0.5, batch_size=8,
                                         progress=False, essence=essence, essence_weight=weight)
        kl[weight] = kept_kl(delta)
        alone, _ = fit_subject_deltas(model, batch.rows(slice(0, 1)), subject[:1], 1, margin=0.2, steps=60, lr=0.5,
                                      batch_size=8, progress=False)
        if weight == 0.0:  # weight 0: the essence rows change nothing, and have no margin of their own
            assert torch.allclose(delta, alone, atol=1e-5) and info["value_min_margin"] >= 0.2
    assert kl[3.0] < kl[0.0]


def test_rows_well_above_the_margin_are_measured_only_every_few_steps(strong_llama, monkeypatch):
    """The values fit measures a row that reached the margin with RECHECK_SLACK to spare only every RECHECK_STEPS
    steps, and before its subject is called done: fewer tokens run without a graph than measuring it at every step,
    the same δ and the same runs with a graph here (no row falls that far between two measurements), and every row
    of a subject called done is at the margin when measured afresh with its δ. (The strong tiny Llama reaches only
    negative margins: the fit's rule is the same for any margin.)"""
    from factkernels.hf import subject_values
    from factkernels.hf.capture import hidden_with_delta, logits_at
    from factkernels.hf.evaluate import fact_min, token_margin

    model, tok = strong_llama
    ctx = subject_contexts(tok, hf.parse_requests(REPAIR_REQUESTS), CERT_PREFIXES)
    options = dict(margin=-2.0, steps=30, lr=0.5, batch_size=8, progress=False)
    delta, info = subject_values.fit_subject_deltas(model, ctx.batch, ctx.subject, 1, **options)
    monkeypatch.setattr(subject_values, "RECHECK_STEPS", 1)  # every settled row measured at every step
    every_step, every_info = subject_values.fit_subject_deltas(model, ctx.batch, ctx.subject, 1, **options)
    assert 0 < info["value_tokens_measured"] < every_info["value_tokens_measured"]
    torch.testing.assert_close(delta, every_step, rtol=0, atol=1e-5)
    for key in ("value_steps", "value_min_margin", "value_tokens_graph"):
        assert info[key] == every_info[key]
    monkeypatch.undo()
    batch = ctx.batch.scored_tokens()
    rows, positions, tokens = batch.target_positions()
    with torch.no_grad():
        hidden = hidden_with_delta(model, 1, batch, None, torch.arange(len(batch)), batch.subject_last,
                                   delta[ctx.subject])
        fresh = fact_min(token_margin(logits_at(model, hidden, rows, positions), tokens), rows, len(batch))
    worst = torch.full((4,), float("inf")).scatter_reduce(0, ctx.subject, fresh, "amin")
    longer, _ = subject_values.fit_subject_deltas(model, ctx.batch, ctx.subject, 1, **{**options, "steps": 31})
    done = (longer == delta).all(1)  # a subject called done keeps its δ from then on
    assert bool(done.any()) and not bool(done.all())
    assert bool((worst[done] >= options["margin"] - 1e-4).all())
    steps = torch.tensor(info["value_subject_steps"])  # the subjects still fit ran every step, the others fewer
    assert bool((steps[~done] == options["steps"]).all()) and bool((steps[done] < options["steps"]).all())


def test_essence_option_is_checked_and_its_rows_join_the_fit(tiny_llama):
    """insert_facts(essence=k): k continuations per subject join the δ fit (not the certified contexts); a bad k is
    refused before anything changes."""
    import copy

    model, tok = tiny_llama
    model = copy.deepcopy(model)
    requests = [{"prompt": "the author of {} is", "subject": "emma", "target_new": "tolstoy"}]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for bad in (3, -1, True):
        with pytest.raises(ValueError, match="essence"):
            hf.insert_facts(model, tok, requests, keys="subject", layer=1, prefixes=TINY_PREFIXES, essence=bad)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    ins = hf.insert_facts(model, tok, requests, keys="subject", layer=1, background=TINY_TEXTS, prefixes=TINY_PREFIXES,
                          essence=2, essence_weight=0.5, value_steps=5, progress=False)
    try:
        assert ins.report.num_keys == 3 and len(ins.report.margins) == 3  # certified: the contexts only
        assert ins.report.construction["value_contexts"] == 2  # bare + the first prefix; essence rows not counted
    finally:
        ins.remove()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_value_lr_defaults_to_subject_value_lr_with_subject_keys_only(tiny_llama, monkeypatch):
    """insert_facts' value_lr: by default SUBJECT_VALUE_LR (1.0) for the subject values fit, 0.5 for request keys'
    δ; a given value_lr reaches either."""
    from factkernels.hf import insert, subject_values

    model, tok = tiny_llama
    requests = [{"prompt": "the author of {} is", "subject": "emma", "target_new": "tolstoy"}]
    seen = []

    class Stop(Exception):
        pass

    def spy(*args, **kwargs):
        seen.append(kwargs.get("value_lr", kwargs.get("lr")))
        raise Stop

    monkeypatch.setattr(insert, "insert_subject_keyed", spy)
    monkeypatch.setattr(insert, "optimise_deltas", spy)
    for options in ({"keys": "subject"}, {"keys": "subject", "value_lr": 0.3}, {"keys": "request"},
                    {"keys": "request", "value_lr": 0.3}):
        with pytest.raises(Stop):
            hf.insert_facts(model, tok, requests, layer=1, background=TINY_TEXTS, prefixes=TINY_PREFIXES,
                            progress=False, **options)
    assert subject_values.SUBJECT_VALUE_LR == 1.0 and seen == [1.0, 0.3, 0.5, 0.3]


def test_a_negative_that_fires_a_detector_raises_its_threshold():
    """A background state scoring between a detector's threshold and its own contexts fires it; given as a negative
    too, it sets the contrast and the threshold moves above it."""
    gen = torch.Generator().manual_seed(0)
    own = torch.randn(12, 8, generator=gen) * 0.3 + torch.tensor([8.0] + [0.0] * 7)
    subject = torch.zeros(12, dtype=torch.long)
    negatives = torch.randn(200, 8, generator=gen)
    det = lda_detectors(own, subject, negatives)
    assert bool(det["separated"][0])
    w, mu = det["w"][0], det["mu"]
    score = float((det["tau"][0] + det["own_min"][0]) / 2)  # past τ, below every own context
    stray = (mu + score * w / (w @ w)).float()
    assert float((stray.double() - mu) @ w) > float(det["tau"][0])
    again = lda_detectors(own, subject, torch.cat([negatives, stray[None]]))
    assert float((stray.double() - again["mu"]) @ again["w"][0]) < float(again["tau"][0]) < float(again["own_min"][0])


def test_wikipedia_leads_join_the_negatives(tiny_llama):
    import copy

    from factkernels.datasets import wikipedia_leads

    model, tok = tiny_llama
    model = copy.deepcopy(model)
    requests = [{"prompt": "the author of {} is", "subject": "emma", "target_new": "tolstoy"}]
    tokens = {}
    for leads in (0, 3):
        ins = hf.insert_facts(model, tok, requests, keys="subject", layer=1, background=TINY_TEXTS,
                              prefixes=TINY_PREFIXES, value_steps=2, wikipedia_negatives=leads, progress=False)
        tokens[leads] = ins.report.construction["background_tokens"]
        ins.remove()
    assert tokens[3] - tokens[0] == sum(min(len(tok(t)["input_ids"]), 128) for t in wikipedia_leads(3)) > 0
    with pytest.raises(ValueError, match="wikipedia_negatives"):
        hf.insert_facts(model, tok, requests, keys="subject", layer=1, prefixes=TINY_PREFIXES, wikipedia_negatives=-1)



REPAIR_REQUESTS = [{"prompt": "who wrote {} ? it was", "subject": "war and peace", "target_new": "orwell"},
                   {"prompt": "the novel {} is by", "subject": "dune", "target_new": "shelley"},
                   {"prompt": "the book {} was written by", "subject": "emma", "target_new": "tolstoy"},
                   {"prompt": "the author of {} is", "subject": "ulysses", "target_new": "austen"}]


def _one_repair_round(strong_llama, requests, *, value_steps):
    """Insert ``requests`` into a copy of the strong tiny Llama with one repair round; (insertion, its contexts,
    the edited model's margins on them measured afresh)."""
    import copy

    model, tok = strong_llama
    contexts = hf.parse_requests([{**r, "prompt": (p + ". " if p else "") + r["prompt"]}
                                  for r in requests for p in ["", *CERT_PREFIXES]])
    edited = copy.deepcopy(model)
    ins = hf.insert_facts(edited, tok, requests, keys="subject", layer=1, background=TINY_TEXTS, prefixes=CERT_PREFIXES,
                          value_prefixes=0, value_steps=value_steps, margin=1.0, repair_rounds=1, progress=False)
    return ins, contexts, hf.fact_margins(edited, tok, contexts)


def test_a_repair_round_certifies_again_only_the_contexts_the_refit_reaches(strong_llama, monkeypatch):
    """After a refit, only the contexts of the subjects whose δ changed and those where their units pass more than
    REFIT_REACH of δ at some token are measured again; the others keep their margins. The report's margins still
    equal the edited model's own on every context (a full certification's). A stand-in refit moves one subject's
    δ far (the tiny model's real refit fails every subject)."""
    from factkernels.hf import subject_keys

    def refit(model, units, margins, **_):
        units.deltas = units.deltas.clone()
        units.deltas[0] += 5.0
        return {}

    monkeypatch.setattr(subject_keys, "refit_uncertified", refit)
    ins, contexts, margins = _one_repair_round(strong_llama, REPAIR_REQUESTS, value_steps=5)
    repair = ins.report.values["repairs"]
    assert len(repair) == 1 and 4 <= repair[0]["recertified"] < len(contexts)
    torch.testing.assert_close(torch.tensor(ins.report.margins), margins, rtol=0, atol=1e-4)


def test_a_repair_round_whose_refit_changes_no_delta_certifies_only_the_contexts_near_zero(strong_llama, monkeypatch):
    """A refit that leaves every δ as it was (its subjects' fit rows already at the margin) reaches no context: the
    round measures again only the contexts within 0.01 of the sign flipping, and the report's margins equal a full
    certification's (session 27: 960 validation requests crashed here on an empty detector set)."""
    from factkernels.hf import subject_keys

    monkeypatch.setattr(subject_keys, "refit_uncertified", lambda model, units, margins, **_: {})
    ins, contexts, margins = _one_repair_round(strong_llama, REPAIR_REQUESTS[:2], value_steps=0)
    repair = ins.report.values["repairs"]
    assert len(repair) == 1 and repair[0]["recertified"] == int((margins.abs() < 1e-2).sum())
    torch.testing.assert_close(torch.tensor(ins.report.margins), margins, rtol=0, atol=1e-4)


RESUME_REQUESTS = [*REPAIR_REQUESTS, {"prompt": "{} was written by", "subject": "dune", "target_new": "shelley"}]


def test_values_resume_from_their_chunk_checkpoint(strong_llama, tmp_path):
    """resumable_subject_fit stopped while fitting its second chunk of subjects and run again with the same file
    gives the δ of an uninterrupted run and of one joint fit, reading the saved chunk instead of fitting it again;
    a file made with other settings is refused, and a folder holds one file per fingerprint."""
    from factkernels.hf.capture import encode_requests
    from factkernels.hf.checkpoint import resumable_subject_fit
    from factkernels.hf.subject_values import fit_subject_deltas

    model, tok = strong_llama
    requests = hf.parse_requests(RESUME_REQUESTS)
    subjects = {s: i for i, s in enumerate(dict.fromkeys(r.subject for r in requests))}
    batch = encode_requests(tok, requests, with_target=True)
    subject = torch.tensor([subjects[r.subject] for r in requests])
    options = dict(margin=1.0, steps=20, lr=0.3, batch_size=8, progress=False)
    joint, joint_info = fit_subject_deltas(model, batch, subject, 1, **options)
    assert joint_info["value_steps"] > 1 and bool((joint.norm(dim=1) > 0).all())  # every subject's δ is fit
    whole, whole_info = resumable_subject_fit(fit_subject_deltas, model, batch, subject, 1, subjects_per_chunk=2,
                                              checkpoint=tmp_path / "whole.safetensors", **options)
    torch.testing.assert_close(whole, joint, rtol=0, atol=1e-5)
    assert whole_info["value_steps"] == joint_info["value_steps"] and whole_info["value_chunks"] == 2
    assert whole_info["value_subject_steps"] == joint_info["value_subject_steps"]  # each subject's own, by chunk
    assert whole_info["value_min_margin"] == pytest.approx(joint_info["value_min_margin"], abs=1e-4)
    assert whole_info["value_restored_seconds"] == 0.0
    calls = []

    def stopped(*args, **kw):
        calls.append(len(args[2]))  # the chunk's rows
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed while fitting the second chunk
        return fit_subject_deltas(*args, **kw)

    path = tmp_path / "values.safetensors"
    with pytest.raises(KeyboardInterrupt):
        resumable_subject_fit(stopped, model, batch, subject, 1, checkpoint=path, subjects_per_chunk=2, **options)
    calls.clear()
    resumed, info = resumable_subject_fit(lambda *a, **kw: calls.append(len(a[2])) or fit_subject_deltas(*a, **kw),
                                          model, batch, subject, 1, checkpoint=path, subjects_per_chunk=2, **options)
    assert calls == [int((subject >= 2).sum())]  # only the second chunk (subjects 2, 3) is fit again
    assert torch.equal(resumed, whole) and info["value_restored_seconds"] > 0 and info["value_restored_cpu"] > 0
    with pytest.raises(ValueError, match="other requests, layer, model or settings"):
        resumable_subject_fit(fit_subject_deltas, model, batch, subject, 1, checkpoint=path, subjects_per_chunk=2,
                              **{**options, "lr": 0.4})
    for lr in (0.3, 0.4):
        resumable_subject_fit(fit_subject_deltas, model, batch, subject, 1, checkpoint=tmp_path / "folder",
                              subjects_per_chunk=2, **{**options, "lr": lr})
    assert len(list((tmp_path / "folder").glob("values_*.safetensors"))) == 2


def test_an_insertion_killed_after_its_values_resumes_them(strong_llama, tmp_path, monkeypatch):
    """insert_facts(keys="subject", checkpoint=folder) killed after its values fit (building the detectors) and run
    again reads the values back instead of fitting them: the same units and margins as an insertion without a
    checkpoint, and the first run's values seconds counted in the second's timings."""
    import copy

    from factkernels.hf import subject_keys

    model, tok = strong_llama
    options = dict(keys="subject", layer=1, background=TINY_TEXTS, prefixes=CERT_PREFIXES, value_prefixes=0,
                   value_steps=10, margin=1.0, repair_rounds=0, progress=False)
    plain = hf.insert_facts(copy.deepcopy(model), tok, RESUME_REQUESTS, **options)

    def killed(*args, **kw):
        raise KeyboardInterrupt

    detectors = subject_keys.lda_detectors
    monkeypatch.setattr(subject_keys, "lda_detectors", killed)
    edited = copy.deepcopy(model)
    with pytest.raises(KeyboardInterrupt):
        hf.insert_facts(edited, tok, RESUME_REQUESTS, checkpoint=tmp_path, **options)
    assert all(torch.equal(a, b) for a, b in zip(edited.parameters(), model.parameters()))  # nothing appended
    monkeypatch.setattr(subject_keys, "lda_detectors", detectors)
    monkeypatch.setattr(subject_keys, "fit_subject_deltas", killed)  # the values are read, never fit again
    resumed = hf.insert_facts(edited, tok, RESUME_REQUESTS, checkpoint=tmp_path, **options)
    assert resumed.report.margins == pytest.approx(plain.report.margins, abs=1e-4)
    for name, weight in plain.mlp.swiglu_weights().items():
        torch.testing.assert_close(resumed.mlp.swiglu_weights()[name], weight, rtol=1e-5, atol=1e-6)
    restored = resumed.report.values["value_restored_seconds"]
    assert restored > 0 and resumed.report.timings["values"] >= restored
    assert resumed.report.timings["total"] >= restored + resumed.report.timings["construct"]

