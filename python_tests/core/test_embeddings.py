import math

import pytest
import torch

from factkernels import embeddings, ustar


# ----------------------------------------------------------------------------- fact-set families


def test_random_fact_set_families_have_their_geometry():
    K, V, f = embeddings.random_fact_set(40, 40, 8, seed=0, tied=True)
    assert torch.equal(K, V) and torch.equal(f.sort().values, torch.arange(40))  # tied, bijective
    torch.testing.assert_close(V.norm(dim=1), torch.ones(40))
    _, V_aniso, _ = embeddings.random_fact_set(40, 40, 8, seed=0, kappa=50.0, dtype=torch.float64)
    s = torch.linalg.svdvals(V_aniso)
    assert float(s[0] / s[-1]) == pytest.approx(50.0, rel=1e-9)
    K, V, f = embeddings.random_fact_set(30, 10, 8, seed=1, fact_map="random")
    assert K.shape == (30, 8) and V.shape == (10, 8) and int(f.max()) < 10 and len(f.unique()) < 30


def test_token_fact_sets_are_real_seeded_and_distinct():
    K, V, f = embeddings.random_fact_set(64, 64, 16, seed=2, source="tokens")
    K2, V2, f2 = embeddings.random_fact_set(64, 64, 16, seed=2, source="tokens")
    assert torch.equal(K, K2) and torch.equal(V, V2) and torch.equal(f, f2)
    torch.testing.assert_close(V.norm(dim=1), torch.ones(64))
    points = torch.cat([K, V])
    assert (points @ points.T - torch.eye(128)).max() < 0.9999  # 128 distinct tokens, keys apart from values
    # projection on the principal directions keeps the real, anisotropic spectrum
    s = torch.linalg.svdvals(V.double())
    assert float(s[0] / s[-1]) > 2.0
    assert not torch.equal(V, embeddings.random_fact_set(64, 64, 16, seed=3, source="tokens").V)


def test_named_families_decode_with_falling_rho_as_kappa_grows():
    rhos = {}
    for family in embeddings.FAMILIES:
        K, V, f = embeddings.family_fact_set(family, 32, 8, seed=0)
        assert torch.equal(K, V) and K.shape == (32, 8)
        rhos[family] = ustar.decodability(V)
    assert rhos["anisotropic-256"] < rhos["anisotropic-16"] < rhos["spherical"]


def test_fact_set_requests_are_checked():
    with pytest.raises(ValueError, match="bijective map needs facts == values"):
        embeddings.random_fact_set(30, 20, 8, seed=0, fact_map="bijective")
    with pytest.raises(ValueError, match="tied keys need facts == values"):
        embeddings.random_fact_set(30, 20, 8, seed=0, tied=True)
    with pytest.raises(ValueError, match="source must be one of"):
        embeddings.random_fact_set(8, 8, 4, seed=0, source="glove")
    with pytest.raises(ValueError, match="fact_map must be one of"):
        embeddings.random_fact_set(8, 8, 4, seed=0, fact_map="injective")
    with pytest.raises(ValueError, match="dim must be a positive int"):
        embeddings.random_fact_set(8, 8, 0, seed=0)
    with pytest.raises(ValueError, match="dim must be <= 384"):
        embeddings.random_fact_set(8, 8, 400, seed=0, source="tokens")
    with pytest.raises(ValueError, match="package ships 4096"):
        embeddings.random_fact_set(3000, 3000, 8, seed=0, source="tokens")
    with pytest.raises(ValueError, match="family must be one of"):
        embeddings.family_fact_set("gaussian", 8, 4, seed=0)


@pytest.mark.parametrize("kappa", [1.0, 3.0, 100.0])
def test_anisotropic(kappa):
    E = embeddings.spherical(200, 10, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    Ek = embeddings.anisotropic(E, kappa)
    assert Ek.shape == E.shape and Ek.dtype == E.dtype
    A, s, Bh = torch.linalg.svd(E, full_matrices=False)
    Ak, sk, Bhk = torch.linalg.svd(Ek, full_matrices=False)
    assert (sk[0] / sk[-1]).item() == pytest.approx(kappa, rel=1e-9)
    assert sk[0].item() == pytest.approx(s[0].item(), rel=1e-9)
    # log-affine: log s' is an affine function of log s
    if kappa > 1:
        t = (torch.log(s) - torch.log(s[-1])) / (torch.log(s[0]) - torch.log(s[-1]))
        tk = (torch.log(sk) - torch.log(sk[-1])) / (torch.log(sk[0]) - torch.log(sk[-1]))
        assert torch.allclose(t, tk, atol=1e-9)
    # same singular subspaces: E' = A diag(s') B^T with the same A, B
    assert torch.allclose(Ek, (A * sk) @ Bh, atol=1e-9)


def test_anisotropic_float32_and_errors():
    E = embeddings.spherical(50, 4, generator=torch.Generator().manual_seed(1))
    assert embeddings.anisotropic(E, 10.0).dtype == torch.float32
    with pytest.raises(ValueError, match="kappa"):
        embeddings.anisotropic(E, 0.5)
    with pytest.raises(ValueError, match="kappa"):
        embeddings.anisotropic(E, math.inf)
    with pytest.raises(ValueError, match="E"):
        embeddings.anisotropic(torch.zeros(5, 3), 2.0)


def test_spherical():
    X = embeddings.spherical(300, 7, generator=torch.Generator().manual_seed(0))
    assert X.shape == (300, 7) and X.dtype == torch.float32
    assert torch.allclose(X.norm(dim=1), torch.ones(300), atol=1e-6)
    Y = embeddings.spherical(300, 7, generator=torch.Generator().manual_seed(0))
    assert torch.equal(X, Y)
    Z = embeddings.spherical(300, 7, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(X, Z)
    assert embeddings.spherical(4, 3, dtype=torch.float64).dtype == torch.float64
    # roughly centred
    assert X.mean(dim=0).abs().max().item() < 0.2


def test_sampler_options_are_checked():
    with pytest.raises(ValueError, match="n"):
        embeddings.spherical(0, 3)
    with pytest.raises(ValueError, match="d"):
        embeddings.spherical(3, 0)
    with pytest.raises(TypeError, match="dtype"):
        embeddings.spherical(3, 2, dtype=torch.int64)
