"""The insertion's fast paths on a tiny random Llama: shared heads, cached tails, the background cache, and a
failed insertion leaving the model as it was, certification from the edited MLP, the values loop. Each fast path is
compared with the plain full forward."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from factkernels import hf
from helpers import TINY_PREFIXES, TINY_TEXTS
from factkernels.hf import insert, subject_keys, subject_values
from factkernels.hf.capture import (MidStates, heads, hidden_with_delta, logits_at, mid_matches, mlp_inputs,
                                   padding_pieces, shared_head_forwards, tail_from, tail_start)
from factkernels.hf.contexts import with_prefixes
from factkernels.hf.evaluate import batch_margins, fact_min, token_margin
from factkernels.hf.units import append_units
from factkernels.mlp import FactMLP

REQUESTS = [
    {"prompt": "the book {} was written by", "subject": "the hobbit", "target_new": "jane austen"},
    {"prompt": "who wrote {} ? it was", "subject": "war and peace", "target_new": "george orwell"},
    {"prompt": "the novel {} is by", "subject": "dune", "target_new": "mary shelley"},
    {"prompt": "the novel {} is by", "subject": "emma", "target_new": "frank herbert"},
    {"prompt": "{} is by", "subject": "emma", "target_new": "frank herbert"},
]
PREFIXES, TEXTS = TINY_PREFIXES, TINY_TEXTS


@pytest.fixture
def contexts(tiny_llama):
    _, tok = tiny_llama
    return hf.encode_requests(tok, with_prefixes(hf.parse_requests(REQUESTS), PREFIXES), with_target=True)


def test_subject_first_marks_the_head_before_the_subject(tiny_llama, contexts):
    _, tok = tiny_llama
    words = [tok.convert_ids_to_tokens(contexts.input_ids[i, :int(contexts.subject_first[i])].tolist())
             for i in (0, 3, 6)]  # rows are request-major: request r under context c at 3r + c
    assert words == [["the", "book"], ["who", "wrote"], ["the", "novel"]]
    assert (contexts.subject_first <= contexts.subject_last).all()
    assert int(contexts.subject_first[12]) == 0  # "{} is by" bare: no head


@pytest.mark.parametrize("site", ["mlp_in", ("mlp_in", "block_out"), "down_in"])
def test_capture_with_shared_heads_equals_the_full_forward(tiny_llama, contexts, site):
    model, _ = tiny_llama
    ids, mask = contexts.input_ids, contexts.attention_mask
    distinct, owner = heads(ids, contexts.subject_first)
    # 5 requests x 3 contexts; the bare "{} is by" has no head and "the novel" is shared by dune and emma
    assert len(distinct) == 12 and owner[6] == owner[9] and owner[7] == owner[10]
    for layer in (0, 2):
        full = hf.capture(model, ids, mask, layer, site=site, batch_size=4)
        shared = hf.capture(model, ids, mask, layer, site=site, batch_size=4, shared=contexts.subject_first)
        for a, b in zip(*(((full,), (shared,)) if isinstance(site, str) else (full, shared))):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        for positions in (contexts.subject_last, torch.zeros(len(contexts), dtype=torch.long)):  # in the head, too
            a = hf.capture(model, ids, mask, layer, positions=positions, batch_size=4)
            b = hf.capture(model, ids, mask, layer, positions=positions, batch_size=4, shared=contexts.subject_first)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_each_head_runs_once(tiny_llama, contexts):
    model, _ = tiny_llama
    events = list(shared_head_forwards(model, contexts.input_ids, contexts.attention_mask, contexts.subject_first, 4))
    head_rows = torch.cat([rows for kind, (rows, *_) in events if kind == "heads"])
    assert len(head_rows) == 11  # every head but the empty one, once
    rows = torch.cat([rows for kind, (rows, *_) in events if kind == "rows"])
    assert sorted(rows.tolist()) == list(range(len(contexts)))
    tokens = sum(int(((contexts.attention_mask.sum(1)[r] - b)).sum()) for kind, (r, b, *_) in events
                 if kind == "rows")
    assert tokens == int((contexts.attention_mask.sum(1) - contexts.subject_first).sum())


def test_margins_with_shared_heads_equal_the_full_forward(tiny_llama, contexts):
    model, _ = tiny_llama
    full = batch_margins(model, contexts, 4)
    shared = batch_margins(model, contexts, 4, shared=contexts.subject_first)
    torch.testing.assert_close(full, shared, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="before each row's last prompt token"):
        batch_margins(model, contexts, 4, shared=contexts.prompt_last + 1)


@pytest.mark.parametrize("layer", [0, 1])
def test_cached_tail_equals_the_hooked_full_forward(tiny_llama, contexts, layer):
    """δ at the subject's last token: the later blocks on the positions from there on, with the keys and values
    before it cached, give the final states of a full forward with δ added by a hook."""
    model, _ = tiny_llama
    start = contexts.subject_last
    states, mask, past = tail_start(model, contexts, layer, start, batch_size=4)
    delta = torch.randn(len(contexts), 32, generator=torch.Generator().manual_seed(0))
    moved = torch.cat([states[:, :1] + delta[:, None], states[:, 1:]], 1)
    with torch.no_grad():
        tail = tail_from(model, layer, moved, mask, past)
        full = hidden_with_delta(model, layer, contexts, None, torch.arange(len(contexts)), start, delta)
        some = torch.tensor([7, 2, 12])
        part = tail_from(model, layer, moved[some], mask[some], past.rows(some))
    lengths = contexts.attention_mask.sum(1)
    for i in range(len(contexts)):
        span = int(lengths[i] - start[i])
        torch.testing.assert_close(tail[i, :span], full[i, int(start[i]):int(lengths[i])], rtol=1e-5, atol=1e-5)
    for j, i in enumerate(some.tolist()):
        span = int(lengths[i] - start[i])
        torch.testing.assert_close(part[j, :span], tail[i, :span], rtol=1e-5, atol=1e-5)


def test_background_states_are_kept_until_their_weights_change(tiny_llama):
    model, tok = copy.deepcopy(tiny_llama[0]), tiny_llama[1]
    first = insert.background_states(model, tok, TEXTS, 1)
    assert insert.background_states(model, tok, TEXTS, 1) is first
    assert insert.background_states(model, tok, TEXTS[:4], 1) is not first  # other texts
    with torch.no_grad():  # units at the layer (its MLP) do not change its MLP input; a block before it does
        model.model.layers[1].mlp.up_proj.weight.mul_(2.0)
    assert insert.background_states(model, tok, TEXTS, 1) is first
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight.mul_(2.0)
    again = insert.background_states(model, tok, TEXTS, 1)
    assert again is not first and not torch.allclose(again, first)
    ids, mask = hf.encode_texts(tok, TEXTS)
    torch.testing.assert_close(again, hf.capture(model, ids, mask, 1))


def _subject_insert(model, tok, **options):
    return hf.insert_facts(model, tok, REQUESTS, keys="subject", layer=1, background=TEXTS, prefixes=PREFIXES,
                           value_steps=5, progress=False, **options)


def test_failed_certification_leaves_the_model_unchanged(tiny_llama, monkeypatch):
    model, tok = copy.deepcopy(tiny_llama[0]), tiny_llama[1]
    before = copy.deepcopy(model.state_dict())
    config = model.config.to_dict()

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(subject_keys, "batch_margins", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _subject_insert(model, tok)
    after = model.state_dict()
    assert model.config.to_dict() == config and set(after) == set(before)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_mlp_inputs_are_the_norm_of_the_mlp_residual(tiny_llama, contexts):
    model, _ = tiny_llama
    ids, mask = contexts.input_ids, contexts.attention_mask
    residual, keys = hf.capture(model, ids, mask, 1, site=("mlp_residual", "mlp_in"), batch_size=4,
                                shared=contexts.subject_first)
    assert torch.equal(mlp_inputs(model, 1, residual, chunk=7), keys)
    assert not torch.allclose(residual, keys)


@pytest.mark.parametrize("layer", [0, 1])
def test_margins_from_the_mid_states_equal_the_edited_models_full_forward(tiny_llama, contexts, layer):
    """Units appended to an MLP change nothing before it: margins from the residual captured there beforehand
    equal the edited model's full forward (with and without shared heads)."""
    model, _ = tiny_llama
    model = copy.deepcopy(model)
    mid = MidStates(layer, hf.capture(model, contexts.input_ids, contexts.attention_mask, layer, site="mlp_residual",
                                      shared=contexts.subject_first), contexts.attention_mask.sum(1))
    assert mid_matches(model, contexts.input_ids[:2], contexts.attention_mask[:2], layer)
    g = torch.Generator().manual_seed(1)
    units = FactMLP(torch.randn(6, 32, generator=g), torch.randn(6, generator=g), torch.randn(6, 32, generator=g),
                    torch.randn(6, generator=g), 3 * torch.randn(32, 6, generator=g), None)
    before = batch_margins(model, contexts, 4)
    appended = append_units(model, layer, units.swiglu_weights())
    try:
        full = batch_margins(model, contexts, 4)
        assert (full - before).abs().max() > 0.1  # the units change the margins
        for shared in (contexts.subject_first, torch.zeros(len(contexts), dtype=torch.long)):
            torch.testing.assert_close(batch_margins(model, contexts, 4, shared=shared, mid=mid), full,
                                       rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="need shared heads"):
            batch_margins(model, contexts, 4, mid=mid)
    finally:
        appended.remove()


def _plain_subject_deltas(model, batch, subject, layer, *, margin, steps, lr, init=None):
    """The values loop without its shortcuts: every row in a hooked full forward with a graph at every step."""
    batch = batch.scored_tokens()
    n_subjects = int(subject.max()) + 1
    delta = (torch.zeros(n_subjects, model.config.hidden_size) if init is None else init.clone()).requires_grad_(True)
    opt = torch.optim.Adam([delta], lr=lr, betas=subject_values.ADAM_BETAS)
    rows, positions, tokens = batch.target_positions()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        for _ in range(steps):
            opt.zero_grad()
            hidden = hidden_with_delta(model, layer, batch, None, torch.arange(len(batch)), batch.subject_last,
                                       delta[subject])
            logits = logits_at(model, hidden, rows, positions)
            margins = fact_min(token_margin(logits.detach(), tokens), rows, len(batch))
            subject_min = torch.full((n_subjects,), float("inf")).scatter_reduce(0, subject, margins, "amin")
            if bool((subject_min >= margin).all()):
                break
            (torch.nn.functional.cross_entropy(logits, tokens, reduction="none") * (margins < margin)[rows]).sum().backward()
            frozen = subject_min >= margin
            delta.grad[frozen] = 0.0
            before = delta.detach().clone()
            opt.step()
            with torch.no_grad():
                delta[frozen] = before[frozen]
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
    return delta.detach()


def _brute_force_pieces(lengths, max_rows, overhead):
    """The least padded tokens plus overhead over every way to cut sorted rows into consecutive pieces."""
    import itertools

    n, best = len(lengths), float("inf")
    for cuts in itertools.product([False, True], repeat=n - 1):
        ends = [i + 1 for i, c in enumerate(cuts) if c] + [n]
        begins = [0] + ends[:-1]
        if all(e - b <= max_rows for b, e in zip(begins, ends)):
            best = min(best, sum((e - b) * lengths[e - 1] + overhead for b, e in zip(begins, ends)))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=9), st.integers(1, 5), st.floats(0.0, 20.0))
def test_padding_pieces_cut_sorted_rows_where_padding_costs_least(lengths, max_rows, overhead):
    """The pieces cover every row once, in order, at most max_rows each, and cost what the best cut costs."""
    lengths = sorted(lengths)
    pieces = padding_pieces(torch.tensor(lengths), max_rows, overhead)
    assert torch.equal(torch.cat(pieces), torch.arange(len(lengths)))
    assert all(1 <= len(p) <= max_rows for p in pieces)
    cost = sum(len(p) * lengths[int(p[-1])] + overhead for p in pieces)
    assert cost == pytest.approx(_brute_force_pieces(lengths, max_rows, overhead))
    if overhead == 0:  # free forwards: no padding at all
        assert all(lengths[int(p[0])] == lengths[int(p[-1])] for p in pieces)


def test_subject_values_equal_the_plain_loop(tiny_llama, contexts, monkeypatch):
    """The values loop's shortcuts (cached tails, finished subjects left out, rows at the margin first run without a
    graph) give the δ of the plain loop; rows at the margin did run without a graph. Margins between the rows'
    unedited ones, so some rows start at the margin and others not (this model's δ moves them little)."""
    model, _ = tiny_llama
    subject = torch.tensor([0, 1, 2, 3, 3]).repeat_interleave(len(PREFIXES) + 1)
    graphs = []
    spied = subject_values.tail_with_delta
    monkeypatch.setattr(subject_values, "tail_with_delta",
                        lambda *args, **kwargs: graphs.append(torch.is_grad_enabled()) or spied(*args, **kwargs))
    unedited = batch_margins(model, contexts, 4)
    for margin in unedited.quantile(torch.tensor([0.3, 0.6])).tolist():
        fast, info = subject_values.fit_subject_deltas(model, contexts, subject, 1, margin=margin, steps=25, lr=0.5,
                                                       batch_size=4, progress=False)
        plain = _plain_subject_deltas(model, contexts, subject, 1, margin=margin, steps=25, lr=0.5)
        torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-4 * float(plain.abs().max()))
    assert info["value_steps"] > 1 and False in graphs and True in graphs


def test_a_refit_from_init_measures_its_rows_before_running_a_graph(tiny_llama, contexts):
    """From ``init`` (a repair round's refit) the first step measures every row without a graph and runs with one
    only the rows below the margin there: its graph tokens are those rows' tokens from the subject's last token on,
    and the refit's δ is the plain loop's from the same init."""
    model, _ = tiny_llama
    subject = torch.tensor([0, 1, 2, 3, 3]).repeat_interleave(len(PREFIXES) + 1)
    options = dict(margin=float(batch_margins(model, contexts, 4).quantile(0.5)), lr=0.5, batch_size=4,
                   progress=False)
    half, _ = subject_values.fit_subject_deltas(model, contexts, subject, 1, steps=3, **options)
    batch = contexts.scored_tokens()
    rows, positions, tokens = batch.target_positions()
    with torch.no_grad():
        hidden = hidden_with_delta(model, 1, batch, None, torch.arange(len(batch)), batch.subject_last, half[subject])
        at_init = fact_min(token_margin(logits_at(model, hidden, rows, positions), tokens), rows, len(batch))
    below = at_init < options["margin"]
    assert bool(below.any()) and not bool(below.all())
    from_start = batch.attention_mask.sum(1) - batch.subject_last
    _, first = subject_values.fit_subject_deltas(model, contexts, subject, 1, steps=1, init=half, **options)
    assert first["value_tokens_graph"] == int(from_start[below].sum())
    assert first["value_tokens_measured"] == int(from_start.sum())
    refit, _ = subject_values.fit_subject_deltas(model, contexts, subject, 1, steps=20, init=half, **options)
    plain = _plain_subject_deltas(model, contexts, subject, 1, margin=options["margin"], steps=20, lr=0.5, init=half)
    torch.testing.assert_close(refit, plain, rtol=1e-4, atol=1e-4 * float(plain.abs().max()))


def test_subject_values_without_cached_tails_equal_the_plain_loop(tiny_llama, contexts, monkeypatch):
    """A model whose tail from the cached states differs runs each chunk of rows in a hooked full forward; with the
    unembedding over several chunks at once (more rows than batch_size) δ is the plain loop's."""
    model, _ = tiny_llama
    monkeypatch.setattr(subject_values, "tail_matches", lambda *args: False)
    subject = torch.tensor([0, 1, 2, 3, 3]).repeat_interleave(len(PREFIXES) + 1)
    margin = float(batch_margins(model, contexts, 4).quantile(0.5))
    fast, _ = subject_values.fit_subject_deltas(model, contexts, subject, 1, margin=margin, steps=10, lr=0.5,
                                                batch_size=3, progress=False)
    plain = _plain_subject_deltas(model, contexts, subject, 1, margin=margin, steps=10, lr=0.5)
    torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-4 * float(plain.abs().max()))
