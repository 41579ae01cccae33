"""Every compiled kernel against its pure-torch twin (float64 reference)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from factkernels import _ops
from helpers import DEVICES


def test_extension_is_compiled():
    # The suite must exercise the compiled kernels, not only the torch twins.
    info = _ops.build_info()
    assert info["compiled"], "factkernels._C is missing: install the package (pip install .) before testing"
    assert info["cpu_threads"] >= 1
    if info["cuda"]:  # CI builds the CUDA kernels (nvcc, no GPU): for which architectures
        assert info["cuda_archs"]


def _rand(gen, *shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def _wide(t):
    """The same values with a leading dimension larger than the width (a column slice)."""
    pad = torch.zeros(t.shape[0], t.shape[1] + 3, dtype=t.dtype, device=t.device)
    pad[:, 1 : 1 + t.shape[1]] = t
    return pad[:, 1 : 1 + t.shape[1]]


def _close(kernel, reference, dtype):
    """Max error relative to the largest reference entry: float32 sums of <= ~150 terms."""
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    scale = reference.abs().max().clamp_min(1.0)
    assert kernel.shape == reference.shape
    assert (kernel.double() - reference).abs().max() <= tol * scale


dims = st.integers(1, 70)
dtypes = st.sampled_from([torch.float32, torch.float64])


@pytest.mark.parametrize("device", ["cpu"])  # no CUDA kernel (see _ops.CPU_ONLY_KERNELS)
@settings(max_examples=25, deadline=None)
@given(n=dims, k=dims, h=dims, dtype=dtypes, act=st.sampled_from(sorted(_ops.ACTIVATIONS)), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gate_features(device, n, k, h, dtype, act, bias, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w = _rand(gen, n, k, dtype=dtype, device=device), _rand(gen, h, k, dtype=dtype, device=device)
    b = _rand(gen, h, dtype=dtype, device=device) if bias else None
    out = _ops.gate_features(_wide(x), w, b, act, backend="kernels")
    ref = _ops.gate_features(x.double(), w.double(), None if b is None else b.double(), act, backend="torch")
    _close(out, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 150), h=dims, q=dims, dtype=dtypes, seed=st.integers(0, 2**16))
def test_hadamard_gram(device, n, h, q, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    s, p = _rand(gen, n, h, dtype=dtype, device=device), _rand(gen, n, q, dtype=dtype, device=device)
    out = _ops.hadamard_gram(_wide(s), p, backend="kernels")
    _close(out, _ops.hadamard_gram(s.double(), p.double(), backend="torch"), dtype)
    assert torch.equal(out, out.T)
    lower = _ops.hadamard_gram(_wide(s), p, lower=True, backend="kernels")  # the same lower triangle, nothing more
    assert torch.equal(lower.tril(), out.tril())


@pytest.mark.parametrize("device", ["cpu"])  # no CUDA kernel (see _ops.CPU_ONLY_KERNELS)
@settings(max_examples=25, deadline=None)
@given(n=dims, h=st.integers(1, 30), q=dims, m=st.integers(1, 20), dtype=dtypes, seed=st.integers(0, 2**16))
def test_gadget_products(device, n, h, q, m, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    s, p = _rand(gen, n, h, dtype=dtype, device=device), _rand(gen, n, q, dtype=dtype, device=device)
    coef, y = _rand(gen, m, h, q, dtype=dtype, device=device), _rand(gen, n, m, dtype=dtype, device=device)
    _close(_ops.gadget_matvec(s, _wide(p), coef, backend="kernels"),
           torch.einsum("ir,ic,jrc->ij", s.double(), p.double(), coef.double()), dtype)
    _close(_ops.gadget_rmatvec(_wide(s), p, _wide(y), backend="kernels"),
           torch.einsum("ij,ir,ic->jrc", y.double(), s.double(), p.double()), dtype)
    # the twins themselves agree with the einsum definitions
    _close(_ops.gadget_matvec(s, p, coef, backend="torch"),
           torch.einsum("ir,ic,jrc->ij", s.double(), p.double(), coef.double()), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gadget_twins_in_row_blocks_match_one_block(monkeypatch, dtype):
    """The twins bound their (rows, m·h̃) temporary by blocks of rows (_ops.GADGET_TWIN_BYTES): blocks of 256 rows
    that do not divide n = 1,000 (three full blocks and one of 232) give the one-block result."""
    gen = torch.Generator().manual_seed(3)
    n, h, q, m = 1000, 6, 9, 5
    s, p = _rand(gen, n, h, dtype=dtype), _rand(gen, n, q, dtype=dtype)
    coef, y = _rand(gen, m, h, q, dtype=dtype), _rand(gen, n, m, dtype=dtype)
    whole = _ops.gadget_matvec(s, p, coef, backend="torch"), _ops.gadget_rmatvec(s, p, y, backend="torch")
    monkeypatch.setitem(_ops.GADGET_TWIN_BYTES, "cpu", 1)  # every block as small as GADGET_TWIN_MIN_ROWS allows
    exact = torch.einsum("ij,ir,ic->jrc", y.double(), s.double(), p.double())
    for rows in (256, 7, 1):  # 1,000 = 3 x 256 + 232 = 142 x 7 + 6
        monkeypatch.setattr(_ops, "GADGET_TWIN_MIN_ROWS", rows)
        assert _ops.gadget_twin_rows(m * h, s) == rows
        matvec, rmatvec = _ops.gadget_matvec(s, p, coef, backend="torch"), _ops.gadget_rmatvec(s, p, y, backend="torch")
        assert torch.allclose(matvec, whole[0], rtol=0, atol=8 * torch.finfo(dtype).eps * whole[0].abs().max())
        # the sum over rows is split into blocks: equal up to rounding, and as close to the float64 sums
        assert torch.allclose(rmatvec, whole[1], rtol=0, atol=50 * torch.finfo(dtype).eps * whole[1].abs().max())
        _close(rmatvec, exact, dtype)


def test_gadget_products_are_adjoint():
    gen = torch.Generator().manual_seed(0)
    s, p = _rand(gen, 40, 7, dtype=torch.float64), _rand(gen, 40, 9, dtype=torch.float64)
    coef, y = _rand(gen, 3, 7, 9, dtype=torch.float64), _rand(gen, 40, 3, dtype=torch.float64)
    lhs = (_ops.gadget_matvec(s, p, coef, backend="kernels") * y).sum()
    rhs = (_ops.gadget_rmatvec(s, p, y, backend="kernels") * coef).sum()
    assert torch.allclose(lhs, rhs, rtol=1e-12)


@pytest.mark.parametrize("device", ["cpu"])  # no CUDA kernel (see _ops.CPU_ONLY_KERNELS)
@settings(max_examples=25, deadline=None)
@given(n=dims, d_in=dims, groups=st.integers(1, 4), hg=st.integers(1, 24), d_out=dims, dtype=dtypes,
       act=st.sampled_from(sorted(_ops.ACTIVATIONS)), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_gated_forward(device, n, d_in, groups, hg, d_out, dtype, act, bias, seed):
    gen = torch.Generator().manual_seed(seed)
    h = groups * hg
    r = lambda *shape: _rand(gen, *shape, dtype=dtype, device=device)  # noqa: E731
    x, wg, wu, wd = r(n, d_in), r(hg, d_in), r(h, d_in), r(d_out, h)
    bg, bu, bd = (r(hg), r(h), r(d_out)) if bias else (None, None, None)
    out = _ops.gated_forward(_wide(x), wg, bg, wu, bu, wd, bd, act, backend="kernels")
    dbl = lambda t: None if t is None else t.double()  # noqa: E731
    ref = _ops.gated_forward(*(dbl(t) for t in (x, wg, bg, wu, bu, wd, bd)), act, backend="torch")
    _close(out, ref, dtype)


@pytest.mark.parametrize("device", ["cpu"])  # no CUDA kernel (see _ops.CPU_ONLY_KERNELS)
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 90), nv=st.integers(1, 300), d=dims, dtype=dtypes, with_target=st.booleans(),
       seed=st.integers(0, 2**16))
def test_decode(device, n, nv, d, dtype, with_target, seed):
    gen = torch.Generator().manual_seed(seed)
    y, v = _rand(gen, n, d, dtype=dtype, device=device), _rand(gen, nv, d, dtype=dtype, device=device)
    target = torch.randint(nv, (n,), generator=gen).to(device) if with_target else None
    index, margin = _ops.decode(_wide(y), v, target, backend="kernels")
    scores = y.double() @ v.double().T
    ref_index = scores.argmax(1)
    # argmax may differ only on numerical near-ties
    best = scores.max(1).values
    assert (scores.gather(1, index[:, None]).squeeze(1) >= best - 1e-4 * best.abs().clamp_min(1)).all()
    assert ((index == ref_index) | (scores.gather(1, index[:, None]).squeeze(1) - best).abs().lt(1e-4)).all()
    t = ref_index if target is None else target
    own = scores.gather(1, t[:, None]).squeeze(1)
    others = scores.scatter(1, t[:, None], -math.inf).max(1).values
    ref_margin = own - others
    finite = torch.isfinite(ref_margin)
    assert torch.equal(torch.isfinite(margin), finite)
    assert torch.allclose(margin[finite].double(), ref_margin[finite], atol=1e-4 if dtype == torch.float32 else 1e-10)


def test_decode_twin_streams_in_chunks():
    gen = torch.Generator().manual_seed(3)
    y, v = _rand(gen, 50, 8), _rand(gen, 70, 8)
    full = _ops.decode(y, v, backend="torch", chunk=4096)
    chunked = _ops.decode(y, v, backend="torch", chunk=7)
    assert torch.equal(full[0], chunked[0]) and torch.allclose(full[1], chunked[1], atol=1e-5)


def test_ops_reject_bad_input():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="weight"):
        _ops.gate_features(x, torch.randn(5, 4), None, "silu")
    with pytest.raises(TypeError, match="dtype"):
        _ops.hadamard_gram(x, torch.randn(4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="activation"):
        _ops.gate_features(x, torch.randn(5, 3), None, "relu")
    with pytest.raises(ValueError, match="divide"):
        _ops.gated_forward(x, torch.randn(3, 3), None, torch.randn(4, 3), None, torch.randn(2, 4), None, "silu")
    with pytest.raises(ValueError, match="backend"):
        _ops.decode(x, x, backend="fast")
    with pytest.raises(RuntimeError, match="kernels"):
        _ops.decode(x.half(), x.half(), backend="kernels")


# Bad input the kernels would read past or leave unwritten: _ops must reject it for both backends alike.
_x, _w = torch.randn(4, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
_wg, _wu, _wd = torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64), \
    torch.randn(6, 4, dtype=torch.float64)
_v = torch.randn(7, 3, dtype=torch.float64)
_one = torch.ones(1, dtype=torch.float64)
BAD_CALLS = {
    "gate bias (1,)": (ValueError, lambda b: _ops.gate_features(_x, _w, _one, "silu", backend=b)),
    "gate bias 2-D": (ValueError, lambda b: _ops.gate_features(_x, _w, torch.ones(1, 5).double(), "silu", backend=b)),
    "gated gate_bias (1,)": (ValueError, lambda b: _ops.gated_forward(_x, _wg, _one, _wu, None, _wd, None, "silu",
                                                                      backend=b)),
    "gated up_bias (1,)": (ValueError, lambda b: _ops.gated_forward(_x, _wg, None, _wu, _one, _wd, None, "silu",
                                                                    backend=b)),
    "gated down_bias (1,)": (ValueError, lambda b: _ops.gated_forward(_x, _wg, None, _wu, None, _wd, _one, "silu",
                                                                      backend=b)),
    "gated bias list": (TypeError, lambda b: _ops.gated_forward(_x, _wg, [0.0, 0.0], _wu, None, _wd, None, "silu",
                                                                backend=b)),
    "decode zero values": (ValueError, lambda b: _ops.decode(_x, _v[:0], backend=b)),
    "decode target too large": (ValueError, lambda b: _ops.decode(_x, _v, torch.tensor([0, 1, 7, 2]), backend=b)),
    "decode target negative": (ValueError, lambda b: _ops.decode(_x, _v, torch.tensor([0, -1, 3, 2]), backend=b)),
    "decode float target": (TypeError, lambda b: _ops.decode(_x, _v, torch.zeros(4), backend=b)),
    "coef not a tensor": (TypeError, lambda b: _ops.gadget_matvec(_x, _x, [[0.0]], backend=b)),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_kernel_and_twin_reject_alike(case):
    error, call = BAD_CALLS[case]
    for backend in ("kernels", "torch"):
        with pytest.raises(error):
            call(backend)


@pytest.mark.parametrize("device", ["cpu"])  # no CUDA kernel (see _ops.CPU_ONLY_KERNELS)
def test_decode_edge_sizes_match_twin(device):
    # One value (no runner-up: margin +inf) and zero rows: kernel and twin agree exactly.
    y, v = torch.randn(5, 3, dtype=torch.float64, device=device), torch.randn(1, 3, dtype=torch.float64, device=device)
    for target in (None, torch.zeros(5, dtype=torch.int64, device=device)):
        k, t = _ops.decode(y, v, target, backend="kernels"), _ops.decode(y, v, target, backend="torch")
        assert torch.equal(k[0], t[0]) and torch.equal(k[1], t[1]) and bool(torch.isinf(k[1]).all())
    k, t = _ops.decode(y[:0], v, backend="kernels"), _ops.decode(y[:0], v, backend="torch")
    assert k[0].shape == t[0].shape == (0,) and k[1].shape == t[1].shape == (0,)


_EMPTY_PRODUCTS = {
    # (name, call): every empty dimension of the gadget products and the gated MLP. No hidden units
    # used to return uninitialised memory (gated_forward) or divide by zero (gadget_matvec) on CPU.
    "matvec h=0": lambda r, b: _ops.gadget_matvec(r(3, 0), r(3, 4), r(2, 0, 4), backend=b),
    "matvec q=0": lambda r, b: _ops.gadget_matvec(r(3, 3), r(3, 0), r(2, 3, 0), backend=b),
    "matvec n=0": lambda r, b: _ops.gadget_matvec(r(0, 3), r(0, 4), r(2, 3, 4), backend=b),
    "matvec m=0": lambda r, b: _ops.gadget_matvec(r(3, 3), r(3, 4), r(0, 3, 4), backend=b),
    "rmatvec h=0": lambda r, b: _ops.gadget_rmatvec(r(3, 0), r(3, 4), r(3, 2), backend=b),
    "rmatvec q=0": lambda r, b: _ops.gadget_rmatvec(r(3, 3), r(3, 0), r(3, 2), backend=b),
    "rmatvec n=0": lambda r, b: _ops.gadget_rmatvec(r(0, 3), r(0, 4), r(0, 2), backend=b),
    "rmatvec m=0": lambda r, b: _ops.gadget_rmatvec(r(3, 3), r(3, 4), r(3, 0), backend=b),
    "gated h=0": lambda r, b: _ops.gated_forward(r(40, 4), r(2, 4), None, r(0, 4), None, r(5, 0), r(5), "silu",
                                                 backend=b),
    "gated n=0": lambda r, b: _ops.gated_forward(r(0, 4), r(2, 4), None, r(4, 4), None, r(5, 4), None, "silu",
                                                 backend=b),
    "gated d_in=0": lambda r, b: _ops.gated_forward(r(3, 0), r(2, 0), r(2), r(4, 0), r(4), r(5, 4), r(5), "silu",
                                                    backend=b),
    "gated d_out=0": lambda r, b: _ops.gated_forward(r(3, 4), r(2, 4), None, r(4, 4), None, r(0, 4), None, "silu",
                                                     backend=b),
}


@pytest.mark.parametrize("device", ["cpu"])  # no CUDA kernel (see _ops.CPU_ONLY_KERNELS)
@pytest.mark.parametrize("case", sorted(_EMPTY_PRODUCTS))
def test_empty_dimensions_match_twin(device, case):
    # Each call twice with the same numbers: the kernel and the twin give the same shape and values (an empty
    # sum is 0, so what is left is the bias or nothing).
    def numbers(seed):
        gen = torch.Generator().manual_seed(seed)
        return lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)

    kernel = _EMPTY_PRODUCTS[case](numbers(0), "kernels")
    twin = _EMPTY_PRODUCTS[case](numbers(0), "torch")
    assert kernel.shape == twin.shape
    assert torch.allclose(kernel, twin, atol=1e-12), (kernel, twin)


@pytest.mark.parametrize("device", ["cpu"])  # no CUDA kernel (see _ops.CPU_ONLY_KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_nan_scores_match_twin(device, dtype):
    # NaN ranks first (torch.argmax): index of the row's first NaN score, margin NaN; other rows decode as usual.
    gen = torch.Generator().manual_seed(5)
    y, v = _rand(gen, 40, 6, dtype=dtype, device=device), _rand(gen, 300, 6, dtype=dtype, device=device)
    v[17, 0], v[230, 0] = math.inf, math.inf  # rows with y[i, 0] = 0 score 0 * inf = NaN there, others ±inf
    y[:10, 0] = 0.0
    y[12] = math.nan  # every score of row 12 is NaN: index 0
    for target in (None, torch.randint(300, (40,), generator=gen).to(device)):
        (k_index, k_margin), (t_index, t_margin) = (_ops.decode(y, v, target, backend=b) for b in ("kernels", "torch"))
        assert torch.equal(k_index, t_index)
        nan = torch.isnan(t_margin)
        assert torch.equal(torch.isnan(k_margin), nan) and int(nan.sum()) >= 11
        assert torch.allclose(k_margin[~nan].double(), t_margin[~nan].double(), atol=1e-4)
    assert bool((k_index[:10] == 17).all()) and int(k_index[12]) == 0


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), c=st.integers(1, 300), spread=st.sampled_from([1.0, 30.0, 400.0]), dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_softmax_cross_entropy(device, n, c, spread, dtype, seed):
    # spread 400: most logits fall more than XENT_EXP_FLOOR below their row's max and count at the floor
    gen = torch.Generator().manual_seed(seed)
    logits = _rand(gen, n, c, dtype=dtype, device=device) * spread
    target = torch.randint(c, (n,), generator=gen).to(device)
    target[: n // 2] = logits[: n // 2].argmax(1)  # rows that hit
    loss, hit, prob = _ops.softmax_cross_entropy(_wide(logits), target, backend="kernels")
    ref_loss, ref_hit, ref_prob = _ops.softmax_cross_entropy(logits.double(), target, backend="torch")
    assert loss.dtype == prob.dtype == dtype and hit.dtype == torch.bool
    _close(loss, ref_loss, dtype)
    _close(prob, ref_prob, dtype)
    assert torch.equal(hit, ref_hit) and bool(hit[: n // 2].all())
    exact = torch.nn.functional.cross_entropy(logits.double(), target, reduction="none")
    assert torch.allclose(ref_loss, exact, rtol=1e-12, atol=1e-12)  # the floor changes nothing torch can see


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_cross_entropy_ties_nans_and_bad_targets(device, dtype):
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.0, math.nan, 1.0, 2.0], [-math.inf, 0.0, 5.0, 5.0]],
                          dtype=dtype, device=device)
    target = torch.tensor([2, 3, 0], device=device)
    (k_loss, k_hit, k_prob), (t_loss, t_hit, t_prob) = (
        _ops.softmax_cross_entropy(logits, target, backend=b) for b in ("kernels", "torch"))
    assert k_hit.tolist() == t_hit.tolist() == [True, False, False]  # a tie for the top is a hit
    for k, t in ((k_loss, t_loss), (k_prob, t_prob)):
        assert torch.equal(torch.isnan(k), torch.isnan(t))  # the NaN row, and only it
        assert torch.allclose(k[~torch.isnan(t)], t[~torch.isnan(t)], rtol=1e-6, atol=1e-30)
    assert bool(torch.isnan(k_prob[1]).all()) and not bool(torch.isnan(k_prob[[0, 2]]).any())
    assert float(k_loss[0]) == pytest.approx(math.log(2 + math.exp(-2.0) + math.exp(-5.0)), rel=1e-6)
    assert float(k_loss[2]) == math.inf  # the target's logit is -inf; the -inf logit still weighs e^-80
    assert float(k_prob[2, 0]) == pytest.approx(math.exp(-80.0) / (2 + math.exp(-5.0)), rel=1e-5)
    for bad, error in ((torch.tensor([0, 4, 1]), "lie in"), (torch.tensor([0.0, 1.0, 2.0]), "integer"),
                       (torch.tensor([0, 1]), "shape")):
        with pytest.raises((ValueError, TypeError), match=error):
            _ops.softmax_cross_entropy(logits, bad.to(device), backend="kernels")


def test_cuda_kernels_fall_back_when_unusable():
    built = {"cuda": True, "cuda_runtime_version": 13000, "cuda_driver_version": 12040, "cuda_devices": 0}
    reason = _ops._cuda_unusable_reason
    assert "CUDA 13" in reason(built, "12.4", True) and "CUDACXX" in reason(built, "12.4", True)
    assert "no device" in reason(built, "13.0", True)  # driver older than the static runtime
    assert reason(dict(built, cuda_devices=2), "13.0", True) is None
    assert "no usable CUDA device" in reason(dict(built, cuda_devices=2), "13.0", False)
    assert "without CUDA" in reason({"cuda": False}, "12.4", True)
    assert reason({"cuda": False}, None, False) is None


def test_auto_backend_runs_on_cuda_only_the_kernels_that_beat_their_twins():
    # CPU: every kernel. CUDA: the three that won their races on the GPUs and the one kept for memory
    # (CUDA_AUTO_KERNELS' comment); the GEMM-shaped rest run their cuBLAS-backed twins and have no CUDA kernel
    # any more; U*'s corral steps and re-checks never had one (batched twins run there). U*'s
    # whole corral solves have one (a warp per row), which beat the batched torch solver on an H200.
    assert all(_ops.auto_runs_kernel(op, "cpu") for op in _ops.KERNEL_OPS)
    on_cuda = {op for op in _ops.KERNEL_OPS if _ops.auto_runs_kernel(op, "cuda")}
    assert on_cuda == {"hadamard_gram", "softmax_cross_entropy", "max_head_scores", "star_topk", "corral_solve"}
    assert _ops.CPU_ONLY_KERNELS == {"gate_features", "gadget_matvec", "gadget_rmatvec", "gated_forward", "decode",
                                     "exact_star_scores", "corral_minor"}
    assert not on_cuda & _ops.CPU_ONLY_KERNELS
    assert all(hasattr(_ops, op) for op in _ops.KERNEL_OPS)
    with pytest.raises(ValueError, match="op must be one of"):
        _ops.auto_runs_kernel("decoder", "cuda")
    # star_topk's CUDA kernel only where it won its races: small k, fewer than 16,384 values
    assert _ops.star_topk_auto_runs_kernel(384, 1 << 20, "cpu")
    assert _ops.star_topk_auto_runs_kernel(8, 4096, "cuda")
    assert not _ops.star_topk_auto_runs_kernel(96, 4096, "cuda")
    assert not _ops.star_topk_auto_runs_kernel(8, 16384, "cuda")


@pytest.mark.cuda
def test_auto_backend_on_cuda_runs_the_twin_or_the_kernel_as_chosen():
    gen = torch.Generator().manual_seed(0)
    x, w = _rand(gen, 300, 16, device="cuda"), _rand(gen, 40, 16, device="cuda")
    assert torch.equal(_ops.gate_features(x, w, None, "silu"), _ops.gate_features(x, w, None, "silu", backend="torch"))
    logits, target = _rand(gen, 300, 50, device="cuda"), torch.randint(50, (300,), generator=gen).cuda()
    chosen, kernel = (_ops.softmax_cross_entropy(logits, target, backend=b) for b in ("auto", "kernels"))
    assert all(torch.equal(a, b) for a, b in zip(chosen, kernel))


def test_build_info_is_read_once():
    # cpu_threads is read live by build_info(); what the ops decide on (compiled, cuda) is fixed
    assert _ops._build() is _ops._build()
    assert all(_ops._build()[key] == _ops.build_info()[key] for key in ("compiled", "cuda", "cuda_devices"))
    assert _ops._launch_args(torch.zeros(1, dtype=torch.float64)) == ("cpu", "float64")


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_kernels_launch_on_the_tensors_device():
    # Tensors on cuda:1 while cuda:0 is current: the kernel runs on cuda:1 and leaves cuda:0 current.
    gen = torch.Generator().manual_seed(0)
    s, p = _rand(gen, 50, 20, device="cuda:1"), _rand(gen, 50, 30, device="cuda:1")
    with torch.cuda.device(0):
        out = _ops.hadamard_gram(s, p, backend="kernels")
        assert torch.cuda.current_device() == 0
    _close(out, _ops.hadamard_gram(s.double(), p.double(), backend="torch"), torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1, 31, 3000])
def test_cuda_star_topk_splits_match_twin(n):
    # star_topk splits the values into ranges for few rows and merges their lists (lowest j first on ties)
    gen = torch.Generator().manual_seed(n)
    w = _rand(gen, 6000, 16, dtype=torch.float64, device="cuda")
    w[4000] = w[5000] = w[3]  # value 3 scores 0 against both, in two ranges: 4000 must come first
    rows = torch.tensor([3] + [97 * i for i in range(1, min(n, 40))], device="cuda")
    for outputs in (None, _rand(gen, rows.numel(), 16, dtype=torch.float64, device="cuda")):
        (kv, kx), (tv, tx) = (_ops.star_topk(w, 9, outputs, rows, backend=b) for b in ("kernels", "torch"))
        assert torch.allclose(kv, tv, rtol=1e-9, atol=1e-12) and torch.equal(kx, tx)


@pytest.mark.cuda
def test_cpu_only_kernels_run_their_twins_on_cuda():
    gen = torch.Generator().manual_seed(0)
    y, v = _rand(gen, 50, 8, device="cuda"), _rand(gen, 70, 8, device="cuda")
    auto, twin = _ops.decode(y, v), _ops.decode(y, v, backend="torch")
    assert torch.equal(auto[0], twin[0]) and torch.equal(auto[1], twin[1])
    with pytest.raises(RuntimeError, match="decode has no CUDA kernel"):
        _ops.decode(y, v, backend="kernels")
