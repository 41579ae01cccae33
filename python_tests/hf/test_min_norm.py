"""factkernels.hf.min_norm: the smallest δ meeting linear margin constraints, and the projection that keeps rows."""

import torch

from factkernels.hf.min_norm import min_norm_point, project_min_norm


def test_min_norm_point_meets_the_kkt_conditions():
    """x = gᵀλ, λ ≥ 0, g x ≥ b, and λ_i > 0 only where row i is tight: the convex QP's optimum. Inactive rows
    (b below what the others already give) get λ = 0; b ≤ 0 gives x = 0."""
    gen = torch.Generator().manual_seed(0)
    for k, d in ((1, 5), (4, 16), (9, 12)):
        g = torch.randn(k, d, generator=gen, dtype=torch.float64)
        b = torch.randn(k, generator=gen, dtype=torch.float64) + 1.0
        x = min_norm_point(g, b, sweeps=5000)
        lam = torch.linalg.lstsq(g.T, x[:, None]).solution.squeeze(1)
        slack = g @ x - b
        assert float(slack.min()) > -1e-6
        assert float(lam.min()) > -1e-6 and float((lam * slack).abs().max()) < 1e-5
        # no feasible point is shorter: a random feasible direction from x only grows the norm
        for _ in range(20):
            y = x + 0.1 * torch.randn(d, generator=gen, dtype=torch.float64)
            if bool((g @ y >= b).all()):
                assert float(y.norm()) >= float(x.norm()) - 1e-9
    assert float(min_norm_point(torch.eye(3), -torch.ones(3)).abs().max()) == 0.0


def test_projection_shrinks_only_at_the_margin_and_keeps_every_row():
    """With exactly linear margins m_r(δ) = g_r·δ, one round lands on the minimum-norm δ of subjects whose rows are
    at the margin; a subject with a row below it keeps its δ; every moved row still holds the margin."""
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(6, 8, generator=gen)
    subject = torch.tensor([0, 0, 0, 1, 1, 1])
    delta = torch.stack([g[:3].sum(0), g[3:].sum(0)]) * 3.0

    def margins_of(rows, steps, grad):
        return (g[rows] * steps).sum(1), g[rows].clone() if grad else None

    before, _ = margins_of(torch.arange(6), delta[subject], False)
    margin = float(before[:3].min()) - 1.0  # subject 0 past the margin
    delta[1] = delta[1] * 0  # its rows at 0: below the margin
    out, info = project_min_norm(delta, subject, margins_of, margin=margin, slack=1e-2, rounds=2)
    after, _ = margins_of(torch.arange(3), out[subject[:3]], False)
    assert float(after.min()) >= margin - 1e-4
    assert torch.allclose(out[0], min_norm_point(g[:3], torch.full((3,), margin + 1e-2)).float(), atol=1e-3)
    assert float(out[0].norm()) < float(delta[0].norm()) and torch.equal(out[1], delta[1])
    assert info["projection_rounds"] == 2 and info["norm_after"] < info["norm_before"]
