"""The fused max-over-heads kernel against its pure-torch twin (factkernels._ops.max_head_scores)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from factkernels import _ops, attention
from helpers import DEVICES

DTYPES = [torch.float32, torch.float64]


def _qk(seed, batch, h, lq, lk, dk, dtype, device):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, h, lq, dk, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, h, lk, dk, generator=gen, dtype=torch.float64)
    return q.to(device=device, dtype=dtype), k.to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 5), h=st.integers(1, 9), lq=st.integers(1, 40), lk=st.integers(1, 40),
       dk=st.integers(1, 40), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_kernel_matches_twin(device, batch, h, lq, lk, dk, dtype, seed):
    q, k = _qk(seed, batch, h, lq, lk, dk, dtype, device)
    tau = torch.randn(batch, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)
    scores, decision = _ops.max_head_scores(q, k, tau, backend="kernels")
    ref = _ops.max_head_scores(q.double(), k.double(), backend="torch")
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    assert scores.shape == decision.shape == (batch, lq, lk) and decision.dtype == torch.bool
    assert (scores.double() - ref).abs().max() <= tol * ref.abs().max().clamp_min(1.0)
    # the decision is exactly the kernel's own scores against tau
    assert torch.equal(decision, scores > tau.view(-1, 1, 1))
    assert torch.equal(_ops.max_head_scores(q, k, tau, decision_only=True, backend="kernels"), decision)
    assert torch.equal(_ops.max_head_scores(q, k, backend="kernels"), scores)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_on_a_construction_context(device, dtype):
    """The kernel's decisions on Construction I for a 3-regular graph (3 heads): every edge, nothing else."""
    graph = attention.random_graph(200, "r-regular", degree=3, seed=0)
    X = torch.eye(200, dtype=dtype)
    heads = attention.construct(graph, X, method="one-hot")
    assert heads.num_heads == 3
    q = heads.project(X[None], "queries").to(device)
    k = heads.project(X[None], "keys").to(device)
    decision = _ops.max_head_scores(q, k, heads.threshold, decision_only=True, backend="kernels")[0]
    assert torch.equal(decision.cpu(), graph.adjacency)


def test_nan_wins_the_max_like_torch():
    q, k = _qk(0, 1, 3, 2, 2, 4, torch.float32, "cpu")
    k[0, 1, 0] = float("nan")
    kernel = _ops.max_head_scores(q, k, backend="kernels")
    twin = _ops.max_head_scores(q, k, backend="torch")
    assert torch.isnan(kernel[0, :, 0]).all() and torch.isnan(twin[0, :, 0]).all()
    assert torch.isfinite(kernel[0, :, 1]).all()


def test_auto_uses_twin_for_gradients_and_other_dtypes():
    q, k = _qk(1, 2, 3, 4, 5, 2, torch.float64, "cpu")
    q.requires_grad_()
    s = _ops.max_head_scores(q, k)  # autograd needs the twin
    s.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    half = _ops.max_head_scores(q.detach().half(), k.half())
    assert half.dtype == torch.float16 and half.shape == (2, 4, 5)
    with pytest.raises(RuntimeError, match="backend='kernels'"):
        _ops.max_head_scores(q.detach().half(), k.half(), backend="kernels")


def test_bad_inputs_are_rejected():
    q, k = _qk(2, 2, 3, 4, 4, 5, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"\(batch, h, ell, d_k\)"):
        _ops.max_head_scores(q[0], k[0])
    with pytest.raises(ValueError, match="agree in batch, h and d_k"):
        _ops.max_head_scores(q, k[:, :2])
    with pytest.raises(TypeError, match="share dtype"):
        _ops.max_head_scores(q, k.double())
    with pytest.raises(ValueError, match="d_k >= 1"):
        _ops.max_head_scores(q[..., :0], k[..., :0])
    with pytest.raises(ValueError, match="decision_only=True needs"):
        _ops.max_head_scores(q, k, decision_only=True)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        _ops.max_head_scores(q, k, torch.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        _ops.max_head_scores(q, k, torch.tensor(float("inf")))
    with pytest.raises(TypeError, match="finite number"):
        _ops.max_head_scores(q, k, float("nan"))
    with pytest.raises(ValueError, match="backend must be"):
        _ops.max_head_scores(q, k, backend="fast")
