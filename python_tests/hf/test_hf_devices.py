"""device= of hf.insert_facts and hf.edit: the model is moved where asked and the edit runs there; on a GPU
(skipped without one) the edit matches the CPU's."""

import copy

import pytest
import torch

from factkernels import hf
from helpers import TINY_PREFIXES, TINY_TEXTS

REQUESTS = [
    {"prompt": "the book {} was written by", "subject": "the hobbit", "target_new": "jane austen"},
    {"prompt": "the novel {} is by", "subject": "dune", "target_new": "mary shelley"},
    {"prompt": "{} is by", "subject": "emma", "target_new": "frank herbert"},
]
PREFIXES, TEXTS = TINY_PREFIXES, TINY_TEXTS


def _insert(model, tok, **options):
    return hf.insert_facts(model, tok, REQUESTS, keys="subject", layer=1, background=TEXTS, prefixes=PREFIXES,
                           value_steps=5, progress=False, **options)


def _on(model, kind):
    return all(p.device.type == kind for p in model.parameters())


def test_insert_facts_runs_on_the_device_asked(tiny_llama):
    model, tok = copy.deepcopy(tiny_llama[0]), tiny_llama[1]
    ins = _insert(model, tok, device="cpu")
    assert _on(model, "cpu") and ins.report.num_keys == 9
    timings = ins.report.timings
    assert set(timings) >= {f"{stage}{kind}" for stage in ("background", "capture", "values", "construct", "verify",
                                                           "total") for kind in ("", "_cpu")}
    with pytest.raises(ValueError, match="value_prefixes"):  # refused before anything moves
        _insert(model, tok, device="meta", value_prefixes=3)
    assert _on(model, "cpu")


def test_a_gpu_runs_larger_forwards_and_the_cpu_keeps_its_own(tiny_llama):
    """Without batch_size, insertion runs 32 rows a forward on a CPU (its pieces cut where padding costs more than
    PIECE_OVERHEAD tokens) and GPU_BATCH_SIZE rows on another device, where padding rarely splits them."""
    from factkernels.hf.capture import (GPU_BATCH_SIZE, PIECE_OVERHEAD, default_batch_size, padding_pieces,
                                        piece_overhead)

    cpu_model, meta_model = tiny_llama[0], copy.deepcopy(tiny_llama[0]).to("meta")
    assert default_batch_size(cpu_model) == 32 and piece_overhead(cpu_model) == PIECE_OVERHEAD
    assert default_batch_size(meta_model) == GPU_BATCH_SIZE > 32 and piece_overhead(meta_model) > PIECE_OVERHEAD
    lengths = torch.arange(4, 20).repeat_interleave(16)  # 256 rows of 4..19 tokens
    on_cpu = padding_pieces(lengths, default_batch_size(cpu_model), piece_overhead(cpu_model))
    on_gpu = padding_pieces(lengths, default_batch_size(meta_model), piece_overhead(meta_model))
    assert len(on_cpu) >= 16 and len(on_gpu) == 1


def _edit(model, tok, method, device):
    stats = {1: torch.eye(64)} if method in ("rome", "memit", "alphaedit") else None  # C given: no text pass
    few = {"prefixes": ((4, 1),)} if stats else {}
    return hf.edit(model, tok, REQUESTS[:2], method=method, layers=[1], progress=False, device=device, stats=stats,
                   steps=3, **few)


@pytest.mark.parametrize("method", ["rome", "grace"])
def test_edit_runs_on_the_device_asked(tiny_llama, method):
    model, tok = copy.deepcopy(tiny_llama[0]), tiny_llama[1]
    result = _edit(model, tok, method, "cpu")
    assert _on(model, "cpu") and result.report["method"] == method
    result.restore()


@pytest.mark.cuda
def test_subject_insertion_on_cuda_matches_the_cpu(tiny_llama):
    model, tok = tiny_llama
    on_cpu = _insert(copy.deepcopy(model), tok)
    gpu_model = copy.deepcopy(model)
    on_gpu = _insert(gpu_model, tok, device="cuda")
    assert _on(gpu_model, "cuda")
    assert on_gpu.report.margins == pytest.approx(on_cpu.report.margins, abs=1e-2)
    on_gpu.remove()
    assert _on(gpu_model, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("method", ["rome", "memit", "alphaedit", "grace", "wise"])
def test_every_editor_runs_on_cuda(tiny_llama, method):
    model, tok = copy.deepcopy(tiny_llama[0]), tiny_llama[1]
    result = _edit(model, tok, method, "cuda")
    assert _on(model, "cuda")
    result.restore()
