"""Tests of factkernels.geometry: output margins and whitening."""

import math

import numpy as np
import pytest
import torch

from factkernels import _ops
from factkernels import geometry as geo
from factkernels.embeddings import anisotropic, spherical
from factkernels.ustar import decodability
from helpers import direct_margins


def test_output_margins_unit_values():
    V = spherical(64, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    m = geo.output_margins(V, V)
    G = V @ V.T
    G.fill_diagonal_(-math.inf)
    cmax = G.max(dim=1).values
    expected = torch.sqrt((1 - cmax) / 2)  # (1 - c) / sqrt(2 - 2c)
    assert torch.allclose(m, expected, atol=1e-12)


def test_output_margins_direct():
    g = torch.Generator().manual_seed(4)
    V = torch.randn(25, 4, generator=g, dtype=torch.float64)
    V[7] = V[2]
    U = torch.randn(25, 4, generator=g, dtype=torch.float64) * 3
    m = geo.output_margins(V, U)
    assert np.allclose(m.numpy(), direct_margins(V.numpy(), U.numpy()), atol=1e-12)
    assert m[7].item() <= 0 and m[2].item() <= 0
    # float32 in, float32 out
    assert geo.output_margins(V.float(), U.float()).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_output_margins_streaming_matches_definition(dtype):
    V = torch.randn(90, 7, generator=torch.Generator().manual_seed(8), dtype=torch.float64).to(dtype)
    V[5] = V[9]  # identical values: margin 0
    U = torch.randn(90, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    ref = direct_margins(V.double().numpy(), U.double().numpy())
    for backend in ("kernels", "torch"):
        m = geo.output_margins(V, U, backend=backend)
        assert m.dtype == dtype
        assert np.allclose(m.double().numpy(), ref, atol=1e-6 if dtype == torch.float32 else 1e-12)
    assert m[5].item() <= 0.0 and m[9].item() <= 0.0


def _aniso_embeddings(F=400, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    return torch.randn(F, d, generator=g, dtype=torch.float64) @ A


def test_whitening_full():
    E = _aniso_embeddings()
    Ew, W = geo.whiten(E, alpha=1.0, eps=1e-9)
    assert torch.allclose(W, W.T, atol=1e-12)
    assert torch.allclose(Ew, E @ W)
    assert torch.allclose(Ew.T @ Ew / E.shape[0], torch.eye(8, dtype=torch.float64), atol=1e-6)
    # the default eps = 1e-6 only perturbs by ~eps / lambda_min
    Ew2, _ = geo.whiten(E)
    assert torch.allclose(Ew2.T @ Ew2 / E.shape[0], torch.eye(8, dtype=torch.float64), atol=1e-4)


def test_whitening_strength():
    E = _aniso_embeddings(seed=1)
    W0 = geo.whitening_transform(E, alpha=0.0)
    assert torch.equal(W0, torch.eye(8, dtype=torch.float64))
    Wh = geo.whitening_transform(E, alpha=0.5)
    W1 = geo.whitening_transform(E, alpha=1.0)
    assert torch.allclose(Wh @ Wh, W1, rtol=1e-8, atol=1e-10)
    assert torch.allclose(Wh, Wh.T, atol=1e-12)
    assert geo.whitening_transform(E.float(), alpha=0.5).dtype == torch.float32


def test_whitening_improves_decodability():
    V = anisotropic(spherical(128, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64), 50.0)
    Vw, _ = geo.whiten(V)
    assert decodability(Vw) > decodability(V)


@pytest.mark.parametrize(
    "bad,exc",
    [
        ([[0.0, 1.0], [1.0, 0.0]], TypeError),
        (torch.ones(4), ValueError),
        (torch.ones(1, 3), ValueError),
        (torch.tensor([[0.0, 1.0], [math.nan, 0.0]]), ValueError),
    ],
)
def test_bad_values(bad, exc):
    with pytest.raises(exc, match="V"):
        geo.output_margins(bad, torch.ones(2, 2))


def test_bad_outputs_and_whitening_options():
    V = spherical(5, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="U"):
        geo.output_margins(V, V.double())
    with pytest.raises(ValueError, match="U"):
        geo.output_margins(V, V[:4])
    with pytest.raises(ValueError, match="U"):
        geo.output_margins(V, torch.zeros_like(V))
    with pytest.raises(ValueError, match="U"):
        geo.output_margins(V, V.to("meta"))
    with pytest.raises(TypeError, match="U"):
        geo.output_margins(V, V.numpy())
    with pytest.raises(ValueError, match="alpha"):
        geo.whiten(V, alpha=1.5)
    with pytest.raises(ValueError, match="eps"):
        geo.whitening_transform(V, eps=-1.0)
    with pytest.raises(ValueError, match="E"):
        geo.whiten(torch.tensor([[math.nan, 1.0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_value_margins_equal_the_output_margins_of_u_equal_v(dtype, backend):
    gen = torch.Generator().manual_seed(0)
    for trial in range(12):
        n, d = int(torch.randint(3, 200, (1,), generator=gen)), int(torch.randint(2, 24, (1,), generator=gen))
        V = torch.randn(n, d, generator=gen, dtype=dtype)
        if trial % 3 == 0:
            V = V + 3.0 * torch.randn(1, d, generator=gen, dtype=dtype)  # a common offset
        if trial % 3 == 1:
            V = torch.nn.functional.normalize(V, dim=1)
        torch.testing.assert_close(geo.checked_value_margins(V, backend=backend),
                                   geo.checked_output_margins(V, V, backend=backend), rtol=0, atol=0)
    inside = torch.tensor([[1.0, 0.0], [0.4, 0.4], [0.0, 1.0]], dtype=dtype)  # v_1 inside the others' hull
    margins = geo.checked_value_margins(inside, backend=backend)
    assert margins[1] < 0 < margins[0] and torch.equal(margins, geo.checked_output_margins(inside, inside))


@pytest.mark.skipif(not _ops.HAS_EXTENSION, reason="compiled extension not built")
@pytest.mark.parametrize("n, d, k, dtype", [(4096, 128, 4, torch.float32), (1000, 33, 7, torch.float32),
                                            (777, 16, 3, torch.float64)])
def test_the_symmetric_value_pass_gives_the_two_sided_lists_bit_for_bit(n, d, k, dtype):
    """Every value against all others with p = w (the value-margin pass): each pair's Gram entry is computed once
    and scores both rows; the lists equal those of the two-sided pass (rows in two halves) exactly, equal and
    nearly equal values (the exact path) included."""
    V = spherical(n, d, generator=torch.Generator().manual_seed(n)).to(dtype)
    V[5], V[n - 100] = V[17], V[2] * (1 + 1e-7)
    scaled = V / V.norm(dim=1).max()
    scores, index = _ops.star_topk(scaled, k, backend="kernels")
    halves = [_ops.star_topk(scaled, k, rows=torch.arange(a, b), backend="kernels") for a, b in ((0, n // 2), (n // 2, n))]
    assert torch.equal(scores, torch.cat([h[0] for h in halves])) and torch.equal(index, torch.cat([h[1] for h in halves]))
    assert index[5, 0] == 17 and index[17, 0] == 5 and bool((index != torch.arange(n)[:, None]).all())
