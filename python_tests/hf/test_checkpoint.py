"""factkernels.hf.checkpoint: the values fit's chunks on several workers at once (threads, one intra-op thread
each), the same δ as one worker, written as each finishes, resumed after a kill, and a failing chunk named."""

import threading

import pytest
import torch

from factkernels import hf
from helpers import TINY_TEXTS

REQUESTS = [{"prompt": "who wrote {} ? it was", "subject": "war and peace", "target_new": "orwell"},
            {"prompt": "the novel {} is by", "subject": "dune", "target_new": "shelley"},
            {"prompt": "the book {} was written by", "subject": "emma", "target_new": "tolstoy"},
            {"prompt": "the author of {} is", "subject": "ulysses", "target_new": "austen"},
            {"prompt": "{} was written by", "subject": "dune", "target_new": "shelley"}]
OPTIONS = dict(margin=1.0, steps=20, lr=0.3, batch_size=8, progress=False)


@pytest.fixture(scope="module")
def rows(strong_llama):
    """(model, batch, subject): the requests' rows, subject (5,) in 0..3."""
    from factkernels.hf.capture import encode_requests

    model, tok = strong_llama
    requests = hf.parse_requests(REQUESTS)
    subjects = {s: i for i, s in enumerate(dict.fromkeys(r.subject for r in requests))}
    return model, encode_requests(tok, requests, with_target=True), torch.tensor([subjects[r.subject]
                                                                                   for r in requests])


def fit_recording(seen: list, fail_at: int = -1, error: type = ValueError, barrier=None):
    """fit_subject_deltas that records (model id, torch threads, rows) of each call in ``seen`` and raises ``error``
    in call number ``fail_at`` (0 first); with ``barrier`` each call waits there first (calls must run at once)."""
    from factkernels.hf.subject_values import fit_subject_deltas

    lock = threading.Lock()

    def fit(model, batch, subject, layer, **kw):
        with lock:
            call = len(seen)
            seen.append((id(model), torch.get_num_threads(), len(subject)))
        if barrier is not None:
            barrier.wait()
        if call == fail_at:
            raise error("broken chunk")
        return fit_subject_deltas(model, batch, subject, layer, **kw)

    return fit


def test_two_workers_fit_one_workers_delta_at_once_on_one_thread_each(rows):
    """Two chunks on two workers run at the same time (a barrier both pass), each on its own replica of the model
    with one torch thread, and give one worker's δ, steps and margin, in chunk order; the model's weights, its
    block list and torch's thread count are as before."""
    from factkernels.hf.checkpoint import resumable_subject_fit
    from factkernels.hf.subject_values import fit_subject_deltas

    model, batch, subject = rows
    threads, layers = torch.get_num_threads(), model.model.layers
    one, one_info = resumable_subject_fit(fit_subject_deltas, model, batch, subject, 1, subjects_per_chunk=2,
                                          **OPTIONS)
    seen: list = []
    two, two_info = resumable_subject_fit(fit_recording(seen, barrier=threading.Barrier(2, timeout=120)), model,
                                          batch, subject, 1, subjects_per_chunk=2, workers=2, **OPTIONS)
    assert one_info["value_steps"] > 1 and bool((one.norm(dim=1) > 0).all())
    torch.testing.assert_close(two, one, rtol=0, atol=1e-5)
    assert two_info["value_steps"] == one_info["value_steps"] and two_info["value_chunks"] == 2
    assert two_info["value_min_margin"] == pytest.approx(one_info["value_min_margin"], abs=1e-4)
    assert two_info["value_workers"] == 2 and one_info["value_workers"] == 1
    assert len(two_info["value_chunk_cpu"]) == 2 and all(c > 0 for c in two_info["value_chunk_cpu"])
    assert max(two_info["value_chunk_steps"]) == two_info["value_steps"] and len(two_info["value_chunk_steps"]) == 2
    assert sorted(n for *_, n in seen) == sorted([int((subject < 2).sum()), int((subject >= 2).sum())])
    replicas = {m for m, _, _ in seen}
    assert {t for _, t, _ in seen} == {1} and len(replicas) == 2 and id(model) not in replicas
    assert torch.get_num_threads() == threads and model.model.layers is layers
    assert all(p.requires_grad for p in model.parameters())


def test_a_killed_two_worker_fit_resumes_from_its_checkpoint(rows, tmp_path):
    """Killed while fitting its third chunk of four, a two-worker fit leaves every chunk that finished in its
    file; run again it fits only the others and gives the uninterrupted run's δ."""
    from factkernels.hf.checkpoint import ChunkCheckpoint, resumable_subject_fit
    from factkernels.hf.subject_values import fit_subject_deltas

    model, batch, subject = rows
    whole, _ = resumable_subject_fit(fit_subject_deltas, model, batch, subject, 1, subjects_per_chunk=1, workers=2,
                                     **OPTIONS)
    path = tmp_path / "values.safetensors"
    seen: list = []
    with pytest.raises(KeyboardInterrupt):
        resumable_subject_fit(fit_recording(seen, fail_at=2, error=KeyboardInterrupt), model, batch, subject, 1,
                              checkpoint=path, subjects_per_chunk=1, workers=2, **OPTIONS)
    with pytest.raises(ValueError, match="other requests"):  # the split is in the fingerprint
        resumable_subject_fit(fit_subject_deltas, model, batch, subject, 1, checkpoint=path, subjects_per_chunk=2,
                              workers=2, **OPTIONS)
    done = set(ChunkCheckpoint(path, _fingerprint_of(path)).chunks)
    assert 2 <= len(done) <= 3 and not path.with_suffix(".safetensors.tmp").exists()
    seen.clear()
    resumed, info = resumable_subject_fit(fit_recording(seen), model, batch, subject, 1, checkpoint=path,
                                          subjects_per_chunk=1, workers=2, **OPTIONS)
    assert len(seen) == 4 - len(done) and info["value_restored_cpu"] > 0
    torch.testing.assert_close(resumed, whole, rtol=0, atol=1e-6)


def _fingerprint_of(path) -> str:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return fh.metadata()["fingerprint"]


def test_an_error_in_one_worker_names_its_chunk_and_writes_only_whole_chunks(rows, tmp_path):
    """A chunk that raises on one of two workers: RuntimeError naming its subjects, from the error; the file
    holds whole chunks only (not that one), torch's threads and the weights' requires_grad are restored."""
    from factkernels.hf.checkpoint import ChunkCheckpoint, resumable_subject_fit

    model, batch, subject = rows
    threads = torch.get_num_threads()
    path = tmp_path / "values.safetensors"
    seen: list = []
    with pytest.raises(RuntimeError, match=r"values fit of subjects (\d)\.\.\1 failed") as raised:
        resumable_subject_fit(fit_recording(seen, fail_at=1), model, batch, subject, 1, checkpoint=path,
                              subjects_per_chunk=1, workers=2, **OPTIONS)
    assert isinstance(raised.value.__cause__, ValueError)
    failed = int(str(raised.value).split("subjects ")[1].split("..")[0])
    saved = ChunkCheckpoint(path, _fingerprint_of(path)).chunks
    assert failed not in saved and 1 <= len(saved) <= 3
    assert all(tensors["delta"].shape == (1, model.config.hidden_size) for tensors, _ in saved.values())
    assert torch.get_num_threads() == threads and all(p.requires_grad for p in model.parameters())


def test_a_replica_shares_every_weight_and_has_its_own_block_list(strong_llama):
    """shared_replica copies the module tree, not a weight: every parameter and buffer is the model's own tensor,
    and swapping the replica's block list (as a fit does) leaves the model's alone."""
    from factkernels.hf.capture import blocks_after
    from factkernels.hf.checkpoint import shared_replica

    model, _ = strong_llama
    replica = shared_replica(model)
    assert replica is not model and replica.model.layers is not model.model.layers
    ours, theirs = dict(replica.named_parameters()), dict(model.named_parameters())
    assert ours.keys() == theirs.keys() and all(ours[k] is theirs[k] for k in ours)
    assert all(a is b for a, b in zip(replica.buffers(), model.buffers()))
    with blocks_after(replica, 1):
        assert len(replica.model.layers) == 1 and len(model.model.layers) == 3


def test_workers_option(strong_llama):
    """"auto" is torch's thread count on a CPU (at most one worker per subject); bad counts are refused."""
    from factkernels.hf.checkpoint import value_workers

    model, _ = strong_llama
    assert value_workers("auto", model, 50) == torch.get_num_threads()
    assert value_workers("auto", model, 1) == 1 and value_workers(3, model, 2) == 2
    for bad in (0, -1, True, 1.5, "two"):
        with pytest.raises(ValueError, match="workers must be"):
            value_workers(bad, model, 5)


def _makespan(loads, workers: int) -> float:
    """The finish of the last of ``workers`` workers taking chunks of ``loads`` in order from one queue."""
    busy = [0.0] * workers
    for load in loads:
        busy[busy.index(min(busy))] += load
    return max(busy)


def test_chunks_are_balanced_by_cost_and_taken_costliest_first():
    """One worker: runs of 100 consecutive subjects. Two: at most 4 chunks per worker holding every subject once
    (sorted, none empty), the same on a second call, costliest first with the cheapest last; taken from one queue
    they keep two workers within 5 % of an even split where two equal counts of subjects (the old split) leave
    them ~20 % apart on the same costs."""
    from factkernels.hf.checkpoint import CHUNKS_PER_WORKER, VALUE_CHUNK_SUBJECTS, subject_chunks

    cost = torch.cat([torch.full((75,), 40.0), torch.full((74,), 25.0)]) * torch.rand(
        149, generator=torch.Generator().manual_seed(0), dtype=torch.float64).add(0.5)
    one = subject_chunks(cost, 1)
    assert [len(c) for c in one] == [VALUE_CHUNK_SUBJECTS, 49] and torch.equal(torch.cat(one), torch.arange(149))
    two = subject_chunks(cost, 2)
    assert len(two) == 2 * CHUNKS_PER_WORKER and all(len(c) and torch.equal(c, c.sort().values) for c in two)
    assert torch.equal(torch.cat(two).sort().values, torch.arange(149))
    assert all(torch.equal(a, b) for a, b in zip(two, subject_chunks(cost, 2)))
    loads = [float(cost[c].sum()) for c in two]
    assert loads == sorted(loads, reverse=True) and loads[-1] < loads[0] / 2
    even = float(cost.sum()) / 2
    assert _makespan(loads, 2) <= 1.05 * even < _makespan([float(cost[:75].sum()), float(cost[75:].sum())], 2) / 1.1
    equal = subject_chunks(torch.ones(9, dtype=torch.float64), 2)  # every chunk holds a subject
    assert sorted(len(c) for c in equal) == [1] * 7 + [2] and torch.equal(torch.cat(equal).sort().values,
                                                                          torch.arange(9))
    few = subject_chunks(torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64), 2)  # one chunk each, costliest first
    assert [c.tolist() for c in few] == [[1], [2], [0]]


def test_subject_costs_count_each_subjects_tokens_after_its_last_token(rows):
    """A subject's cost is the tokens of its rows from the subject's last token to the last scored one."""
    from factkernels.hf.checkpoint import subject_costs

    _, batch, subject = rows
    tokens = batch.attention_mask.sum(1) - 1 - batch.subject_last
    expected = [float(tokens[subject == s].sum()) for s in range(4)]
    assert subject_costs(batch, subject).tolist() == expected and min(expected) > 0


def test_insertion_on_two_workers_gives_one_workers_units(strong_llama):
    """insert_facts(keys="subject", workers=2) gives the margins and δ of workers=1 (one joint fit) and reports
    the chunks and workers; a bad count is refused before the model changes."""
    import copy

    model, tok = strong_llama
    options = dict(keys="subject", layer=1, background=TINY_TEXTS, prefixes=["the old house by the river"],
                   value_prefixes=1, value_steps=10, margin=1.0, repair_rounds=0, progress=False)
    one = hf.insert_facts(copy.deepcopy(model), tok, REQUESTS, workers=1, **options)
    two = hf.insert_facts(copy.deepcopy(model), tok, REQUESTS, workers=2, **options)
    chunks = two.report.values["value_chunks"]
    assert two.report.values["value_workers"] == 2 and 2 <= chunks <= 4  # 4 subjects, at most one chunk each
    assert len(two.report.values["value_chunk_worker"]) == chunks
    assert set(two.report.values["value_chunk_worker"]) <= {0, 1}
    assert two.report.values["value_steps"] == one.report.values["value_steps"]
    assert two.report.margins == pytest.approx(one.report.margins, abs=1e-4)
    assert two.report.delta_norm_mean == pytest.approx(one.report.delta_norm_mean, rel=1e-5)
    with pytest.raises(ValueError, match="workers must be"):
        hf.insert_facts(copy.deepcopy(model), tok, REQUESTS, workers=0, **options)


def test_a_repair_refit_on_two_workers_gives_one_workers_delta(strong_llama):
    """refit_uncertified with workers=2 refits its two failing subjects in two chunks at once from their δ: the
    δ of one joint refit; the subject that did not fail keeps its δ exactly."""
    from factkernels.hf.subject_keys import SubjectUnits, refit_uncertified, subject_contexts

    model, tok = strong_llama
    ctx = subject_contexts(tok, hf.parse_requests(REQUESTS[:3]), ["the old house by the river"])
    deltas = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    margins = torch.tensor([-0.5, 0.2, 2.0, 4.0, 0.7, -0.1])  # rows: (request, prefix); subjects 0 and 2 fail
    refits = []
    for workers in (1, 2):
        units = SubjectUnits(ctx, {}, torch.arange(3), deltas.clone(), torch.tensor([0, 2, 4]), torch.zeros(6, 32),
                             12.0)
        info = refit_uncertified(model, units, margins, layer=1, below=1.0, margin=1.0, value_steps=5, value_lr=0.1,
                                 batch_size=8, progress=False, workers=workers)
        assert info["subjects"] == 2 and info.get("value_workers", 1) == workers
        assert torch.equal(units.deltas[1], deltas[1]) and not torch.equal(units.deltas[0], deltas[0])
        refits.append(units.deltas)
    torch.testing.assert_close(refits[1], refits[0], rtol=0, atol=1e-5)
