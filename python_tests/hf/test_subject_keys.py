"""factkernels.hf.subject_keys: detector groups, subject mentions, the LDA threshold's contrast."""

import torch

from factkernels import hf
from factkernels.hf.capture import encode_texts
from factkernels.hf.subject_keys import detector_groups, lda_detectors, ramp_units, subject_contexts, subject_mentions


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
    mentions = torch.zeros(len(negatives), 2, dtype=torch.bool)
    mentions[-1, 0] = True
    det = lda_detectors(own, subject, negatives, mentions=mentions)
    assert det["separated"].all() and bool((det["tau"] < det["own_min"]).all())
    assert float(plain["contrast_max"][0]) > 1.0 > float(det["own_min"][0]) > float(det["contrast_max"][0])
    mlp = ramp_units(det, torch.randn(2, d, generator=gen))
    with torch.no_grad():  # silent on the ordinary negatives, firing on the mention
        assert float(mlp(negatives[:-1]).norm(dim=1).max()) < 1e-3
        assert float(mlp(negatives[-1:]).norm()) > 0.1


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
    finally:
        ins.remove()
