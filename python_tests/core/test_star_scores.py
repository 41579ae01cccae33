"""The star-score kernels (star_topk, exact_star_scores) against their pure-torch twins and the definition."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from factkernels import _ops
from helpers import DEVICES


def _wide(t):
    """The same values with a leading dimension larger than the width (a column slice)."""
    pad = torch.zeros(t.shape[0], t.shape[1] + 3, dtype=t.dtype, device=t.device)
    pad[:, 1 : 1 + t.shape[1]] = t
    return pad[:, 1 : 1 + t.shape[1]]


def _exact(W, P, rows, index):
    """Float64 score of every reported pair from the explicit difference; +inf where index is -1."""
    Wd, Pd = W.double(), P.double()
    j = index.clamp_min(0)
    diff = Wd[rows][:, None, :] - Wd[j]
    nrm = diff.norm(dim=2)
    s = torch.where(nrm > 0, (Pd[:, None, :] * diff).sum(2) / nrm.clamp_min(1e-300), torch.zeros_like(nrm))
    return torch.where(index >= 0, s, torch.full_like(s, float("inf")))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 260), d=st.integers(1, 40), k=st.integers(1, 40), r=st.integers(0, 60),
       dtype=st.sampled_from([torch.float32, torch.float64]), own_outputs=st.booleans(), dup=st.booleans(),
       seed=st.integers(0, 2**16))
def test_star_topk_matches_twin(device, n, d, k, r, dtype, own_outputs, dup, seed):
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(n, d, generator=gen, dtype=torch.float64)
    if dup and n >= 3:
        W[1] = W[0]  # identical values score 0
        W[2] = W[0] + 1e-5  # a close pair takes the explicit-difference path
    W = W.to(device=device, dtype=dtype)
    rows = torch.randint(n, (r,), generator=gen).to(device) if r else None
    rr = torch.arange(n, device=device) if rows is None else rows
    P = None if own_outputs else torch.randn(rr.numel(), d, generator=gen, dtype=torch.float64).to(device, dtype)
    vals, index = _ops.star_topk(_wide(W), k, None if P is None else _wide(P), rows, backend="kernels")
    ref_vals, _ = _ops.star_topk(W.double(), k, None if P is None else P.double(), rows, backend="torch")
    assert vals.shape == index.shape == (rr.numel(), k)
    # The documented precision: pairs just above the close threshold get their distance from
    # |w_s|^2 + |w_j|^2 - 2<w_s, w_j>, a relative error of about eps / STAR_CLOSE_REL in the score.
    rel = 3 * torch.finfo(dtype).eps / _ops.STAR_CLOSE_REL[dtype]
    finite = torch.isfinite(ref_vals)
    tol = (2e-4 if dtype == torch.float32 else 1e-10) + rel * ref_vals[finite].abs()
    assert torch.equal(torch.isfinite(vals), finite)  # n - 1 others, then +inf and -1
    assert torch.equal(index < 0, ~finite)
    assert ((vals[finite].double() - ref_vals[finite]).abs() <= tol).all()
    # each reported pair really has (about) the reported score, no pair is the value itself
    assert ((index != rr[:, None]) | (index < 0)).all()
    ex = _exact(W, W[rr] if P is None else P, rr, index)
    assert ((ex[finite] - vals[finite].double()).abs() <= tol).all()
    assert (vals[:, 1:] >= vals[:, :-1]).all()  # ascending
    real = torch.where(index >= 0, index, -1 - torch.arange(k, device=device)[None, :])
    assert (real.sort(dim=1).values.diff(dim=1) != 0).all()  # distinct pairs (ties may pick either)


def test_star_topk_twin_streams_in_chunks_and_defines_scores():
    gen = torch.Generator().manual_seed(1)
    W, P = torch.randn(40, 5, generator=gen, dtype=torch.float64), torch.randn(40, 5, generator=gen, dtype=torch.float64)
    full = _ops.star_topk(W, 39, P, backend="torch")
    chunked = _ops.star_topk(W, 39, P, backend="torch", chunk=7)
    assert torch.equal(full[1], chunked[1]) and torch.allclose(full[0], chunked[0])
    # the definition, all pairs: sorted scores of row i over j != i
    diff = W[:, None, :] - W[None, :, :]
    g = (P[:, None, :] * diff).sum(2) / diff.norm(dim=2).clamp_min(1e-300)
    g.fill_diagonal_(float("inf"))
    assert torch.allclose(full[0], g.sort(dim=1).values[:, :39], atol=1e-12)


def test_star_topk_with_a_prebuilt_operand_is_the_same_pass():
    """star_operand, built once, serves several passes over the same values (U*'s): the same scores and indices on
    the twin and the kernel; an operand of other values is refused."""
    gen = torch.Generator().manual_seed(2)
    W, P = torch.randn(60, 7, generator=gen), torch.randn(25, 7, generator=gen)
    rows = torch.randint(60, (25,), generator=gen)
    operand = _ops.star_operand(W)
    assert operand.columns.shape == (12, 60) and torch.equal(operand.columns[8], (W * W).sum(dim=1))
    for backend in ["torch"] + (["kernels"] if _ops.HAS_EXTENSION else []):
        for args in ((W, 9), (W, 9, P, rows)):
            plain, prebuilt = _ops.star_topk(*args, backend=backend), _ops.star_topk(*args, backend=backend,
                                                                                        operand=operand)
            assert torch.equal(plain[0], prebuilt[0]) and torch.equal(plain[1], prebuilt[1])
    with pytest.raises(ValueError, match="operand"):
        _ops.star_topk(W[:50], 9, operand=operand)


def _tied_scores(W, P, rows, k):
    """The definition on small-integer values (every score an exact float, so equal pairs tie exactly): scores of
    every pair from explicit differences, the k smallest per row by a stable sort (ties: lowest index first)."""
    diff = W[rows][:, None, :] - W[None, :, :]
    nrm = diff.norm(dim=2)
    g = torch.where(nrm > 0, (P[:, None, :] * diff).sum(2) / nrm.clamp_min(1e-300), torch.zeros_like(nrm))
    g[torch.arange(rows.numel()), rows] = float("inf")
    top, at = g.sort(dim=1, stable=True)
    kk = min(k, W.shape[0])
    scores = torch.full((rows.numel(), k), float("inf"), dtype=W.dtype)
    index = torch.full((rows.numel(), k), -1, dtype=torch.int64)
    scores[:, :kk], index[:, :kk] = top[:, :kk], torch.where(torch.isinf(top[:, :kk]), -1, at[:, :kk])
    return scores, index


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 70), d=st.integers(1, 4), k=st.integers(1, 80), r=st.integers(0, 50),
       own_outputs=st.booleans(), chunk=st.sampled_from([None, 1, 5]), seed=st.integers(0, 2**16))
def test_star_topk_twin_ties_take_the_lowest_index(n, d, k, r, own_outputs, chunk, seed):
    """Values in {-1, 0, 1}^d: many identical values and equal scores, so the k-th and k+1-th scores often tie
    (the twin's top-k then redoes those rows by a stable sort); within the k, equal scores come lowest index first."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.randint(-1, 2, (n, d), generator=gen).double()
    rows = torch.randint(n, (r,), generator=gen) if r else None
    rr = torch.arange(n) if rows is None else rows
    P = None if own_outputs else torch.randint(-2, 3, (rr.numel(), d), generator=gen).double()
    scores, index = _ops.star_topk(W, k, P, rows, backend="torch", chunk=chunk)
    ref_scores, ref_index = _tied_scores(W, W[rr] if P is None else P, rr, k)
    assert torch.equal(scores, ref_scores) and torch.equal(index, ref_index)


def test_star_topk_twin_redoes_chunks_with_many_close_pairs():
    """100 copies of one value: each row of a chunk has ~100 close pairs, past the twin's bound on close pairs
    found without a host sync, so the chunk is redone exactly (the copies score 0, lowest index first)."""
    gen = torch.Generator().manual_seed(0)
    W = torch.cat([torch.ones(100, 6), torch.randint(-1, 2, (40, 6), generator=gen)]).double()
    for chunk in (None, 4):
        scores, index = _ops.star_topk(W, 120, backend="torch", chunk=chunk)
        ref_scores, ref_index = _tied_scores(W, W, torch.arange(140), 120)
        assert torch.equal(index, ref_index) and torch.equal(scores, ref_scores)
        assert torch.equal(index[0, :99], torch.arange(1, 100)) and (scores[:100, :99] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 200), d=st.integers(1, 4), k=st.integers(1, 60), own_outputs=st.booleans(),
       seed=st.integers(0, 2**16))
def test_star_topk_kernel_and_twin_agree_on_exact_ties(device, n, d, k, own_outputs, seed):
    """On small-integer values both compute every score exactly, so ties are exact and the indices must agree."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.randint(-1, 2, (n, d), generator=gen).double().to(device)
    P = None if own_outputs else torch.randint(-2, 3, (n, d), generator=gen).double().to(device)
    kernel = _ops.star_topk(W, k, P, backend="kernels")
    twin = _ops.star_topk(W, k, P, backend="torch")
    assert torch.equal(kernel[0], twin[0]) and torch.equal(kernel[1], twin[1])


@pytest.mark.skipif(not _ops.HAS_EXTENSION, reason="compiled extension not built")
@pytest.mark.parametrize("k, own_outputs", [(100, True), (300, False), (20, True)])
def test_star_topk_kernel_keeps_long_lists_exact_through_many_reductions(k, own_outputs):
    """A row's list keeps its k smallest pairs in a buffer of 2k cut back to k whenever it fills: over 1,500 values
    of small integers (thousands of exactly tied scores, several cuts per row) the lists equal the twin's bit for
    bit, at k = 20 through the symmetric pass; in float32 the lists are consistent across k."""
    gen = torch.Generator().manual_seed(k)
    W = torch.randint(-2, 3, (1500, 3), generator=gen).double()
    P = None if own_outputs else torch.randint(-3, 4, (1500, 3), generator=gen).double()
    kernel = _ops.star_topk(W, k, P, backend="kernels")
    twin = _ops.star_topk(W, k, P, backend="torch")
    assert torch.equal(kernel[0], twin[0]) and torch.equal(kernel[1], twin[1])
    # in float32 (a list entry is one integer key there: the score's bits, then j; its ties are not float64's): each
    # list ascends by score, then j, and is the first k of the list of k + 50, negative scores included
    Wf, Pf = W.float(), None if P is None else P.float()
    vals, index = _ops.star_topk(Wf, k, Pf, backend="kernels")
    longer = _ops.star_topk(Wf, k + 50, Pf, backend="kernels")
    assert torch.equal(vals, longer[0][:, :k]) and torch.equal(index, longer[1][:, :k])
    tie = vals[:, 1:] == vals[:, :-1]
    assert bool((vals[:, 1:] >= vals[:, :-1]).all()) and bool((index[:, 1:][tie] > index[:, :-1][tie]).all())
    assert int(tie.sum()) > 1000 and (own_outputs or bool((vals < 0).any()))


def test_star_topk_twin_chunks_fit_its_memory_budget(monkeypatch):
    """Rows per chunk: three float (rows, |V|) temporaries and a mask within STAR_TWIN_BYTES, on a GPU within a
    quarter of its free memory too (here a stand-in GPU with 2 GiB free)."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 << 30, 80 << 30))
    gpu = SimpleNamespace(device=torch.device("cuda", 0), element_size=lambda: 4)
    assert _ops._star_twin_chunk(65536, 65536, gpu) == (512 << 20) // (65536 * 13)  # a quarter of 2 GiB
    cpu = torch.zeros(1, dtype=torch.float64)
    assert _ops._star_twin_chunk(4096, 100, cpu) == 100  # every row fits
    assert _ops._star_twin_chunk(4096, 10**6, cpu) == _ops.STAR_TWIN_BYTES["cpu"] // (4096 * 25)
    assert _ops._star_twin_chunk(10**9, 5, cpu) == 1


def test_star_topk_rejects_bad_input():
    W = torch.randn(5, 3)
    with pytest.raises(ValueError, match="k must"):
        _ops.star_topk(W, 0)
    with pytest.raises(ValueError, match="rows must lie"):
        _ops.star_topk(W, 2, rows=torch.tensor([0, 5]))
    with pytest.raises(TypeError, match="rows"):
        _ops.star_topk(W, 2, rows=torch.tensor([0.0]))
    with pytest.raises(ValueError, match="outputs"):
        _ops.star_topk(W, 2, torch.randn(4, 3))


@pytest.mark.skipif(not _ops.HAS_EXTENSION, reason="compiled extension not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,d,c", [(50, 7, 9), (300, 130, 40), (20, 1, 19)])
def test_exact_star_scores_kernel_matches_twin_and_definition(dtype, n, d, c):
    """Given pairs (scattered rows, padding -1, a duplicated value): the kernel, the twin and the float64
    definition agree; identical values score 0 and padding +inf."""
    gen = torch.Generator().manual_seed(n + d)
    W = torch.randn(n, d, generator=gen, dtype=torch.float64)
    W[3] = W[1]  # a duplicate
    rows = torch.randint(0, n, (33,), generator=gen)
    rows[0] = 1
    U = torch.randn(33, d, generator=gen, dtype=torch.float64)
    cols = torch.randint(-1, n, (33, c), generator=gen)
    cols[0, 0] = 3
    Wt, Ut = _wide(W.to(dtype)), _wide(U.to(dtype))
    got = _ops.exact_star_scores(Wt, Ut, rows, cols, backend="kernels")
    twin = _ops.exact_star_scores(Wt, Ut, rows, cols, backend="torch")
    ref = _exact(W.to(dtype), U.to(dtype), rows, cols)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert got.dtype == dtype and torch.equal(torch.isinf(got), cols < 0) and got[0, 0] == 0
    assert torch.allclose(got.double(), twin.double(), atol=tol) and torch.allclose(got.double(), ref, atol=tol)
    with pytest.raises(ValueError, match="cols entries"):
        _ops.exact_star_scores(W, U, rows, cols + n + 1, backend="kernels")
    with pytest.raises(ValueError, match="rows entries"):
        _ops.exact_star_scores(W, U, rows - n, cols, backend="kernels")
    with pytest.raises(ValueError, match="cols must"):
        _ops.exact_star_scores(W, U, rows, cols[:4], backend="kernels")
