"""The 3xTF32 split behind the CUDA float32 gadget products: exact, float32-accurate, and used by both twins."""

import pytest
import torch

from factkernels import _ops

_GEN_SEED = 33


def _rel(result, reference):
    """Frobenius error of ``result`` relative to the float64 ``reference``."""
    return float((result.double() - reference).norm() / reference.norm())


def _gadget_inputs(device, n=300, h=7, q=33, m=5):
    gen = torch.Generator().manual_seed(_GEN_SEED)
    s, p, y = (torch.randn(n, k, generator=gen, dtype=torch.float64) for k in (h, q, m))
    coef = torch.randn(m, h, q, generator=gen, dtype=torch.float64)
    refs = {"matvec": torch.einsum("ir,ic,jrc->ij", s, p, coef), "rmatvec": torch.einsum("ij,ir,ic->jrc", y, s, p)}
    return [t.to(device=device, dtype=torch.float32) for t in (s, p, y, coef)], refs


def test_split_is_exact_and_hi_is_tf32():
    gen = torch.Generator().manual_seed(_GEN_SEED)
    a = torch.randn(4096, generator=gen) * torch.logspace(-30, 30, 4096)  # every sign and scale
    a = torch.cat([a, torch.tensor([0.0, -0.0, 1e-42, -3e-40, 3.4e38, 1.0 + 2**-23])])  # subnormals, extremes
    hi, lo = _ops.split_tf32(a)
    nonzero = a != 0  # -0.0 comes back as hi + lo = -0.0 + 0.0 = +0.0, equal in value
    assert torch.equal((hi + lo)[nonzero].view(torch.int32), a[nonzero].view(torch.int32))  # bit for bit
    assert torch.equal(hi + lo, a)
    assert not (hi.view(torch.int32) & ((1 << 13) - 1)).any()  # at most 10 explicit mantissa bits
    normal = a.abs() >= torch.finfo(torch.float32).tiny  # a subnormal's hi may be 0
    assert (lo.abs() <= a.abs() * 2**-10)[normal].all()
    # On a transposed (non-contiguous) view, as gadget_rmatvec passes it.
    m = torch.randn(50, 70, generator=gen)
    hi_t, lo_t = _ops.split_tf32(m.T)
    assert torch.equal(hi_t + lo_t, m.T) and torch.equal(hi_t, _ops.split_tf32(m)[0].T)
    with pytest.raises(TypeError):
        _ops.split_tf32(a.double())


def test_three_products_keep_float32_accuracy():
    gen = torch.Generator().manual_seed(_GEN_SEED)
    a64, b64 = torch.randn(200, 300, generator=gen, dtype=torch.float64), torch.randn(300, 150, generator=gen,
                                                                                     dtype=torch.float64)
    a, b = a64.float(), b64.float()
    reference = a.double() @ b.double()  # the exact product of the float32 operands, to float64 rounding
    assert _rel(_ops.matmul_3xtf32(a, b), reference) < 2e-6
    # What the split buys: the hi parts alone (a TF32 product) are ~1e-4 off, so the bound above can fail.
    a_hi, b_hi = _ops.split_tf32(a)[0], _ops.split_tf32(b)[0]
    assert _rel(a_hi @ b_hi, reference) > 1e-4
    out = torch.ones(200, 150)
    assert _rel(_ops.matmul_3xtf32(a, b, out=out), reference + 1.0) < 2e-6
    assert out.data_ptr() == _ops.matmul_3xtf32(a, b, out=out).data_ptr()


def test_twins_through_the_split_match_float64(monkeypatch):
    # The CUDA branch forced on a CPU (the three products then run in float32), with blocks small enough that
    # gadget_rmatvec sums several blocks of facts.
    monkeypatch.setattr(_ops, "_uses_3xtf32", lambda ref, flops: True)
    monkeypatch.setattr(_ops, "TF32_SPLIT_BLOCK_ELEMENTS", 35 * 7 * 5)
    (s, p, y, coef), refs = _gadget_inputs("cpu")
    assert _rel(_ops.gadget_matvec(s, p, coef, backend="torch"), refs["matvec"]) < 1e-6
    assert _rel(_ops.gadget_rmatvec(s, p, y, backend="torch"), refs["rmatvec"]) < 1e-6


def test_split_only_for_large_cuda_float32_products():
    cpu = torch.zeros(1)
    assert not _ops._uses_3xtf32(cpu, 1e15)
    if torch.cuda.is_available():
        assert _ops._uses_3xtf32(cpu.cuda(), _ops.TF32_SPLIT_MIN_FLOPS)
        assert not _ops._uses_3xtf32(cpu.cuda(), _ops.TF32_SPLIT_MIN_FLOPS / 2)
        assert not _ops._uses_3xtf32(cpu.cuda().double(), 1e15)


@pytest.mark.cuda
def test_cuda_twins_with_the_split_match_float64(monkeypatch):
    monkeypatch.setattr(_ops, "TF32_SPLIT_MIN_FLOPS", 0.0)
    (s, p, y, coef), refs = _gadget_inputs("cuda", n=4096, h=16, q=129, m=8)
    before = torch.backends.cuda.matmul.allow_tf32
    matvec = _ops.gadget_matvec(s, p, coef, backend="torch")
    rmatvec = _ops.gadget_rmatvec(s, p, y, backend="torch")
    assert torch.backends.cuda.matmul.allow_tf32 == before  # the TF32 flag is scoped to the products
    assert _rel(matvec.cpu(), refs["matvec"]) < 1e-5
    assert _rel(rmatvec.cpu(), refs["rmatvec"]) < 1e-5
