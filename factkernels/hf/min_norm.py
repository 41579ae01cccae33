"""The smallest δ that keeps every row at the margin: a minimum-norm projection of the subject-keyed values.

A δ added at a subject's last token is read by every later token of any text that names the subject, not only by
the questions it was fit for: at every known fact of test draw 0 all of the held-out text's KL came from the texts
naming an edited subject, and on validation subjects that KL grows faster than δ's norm squared along δ's own
direction. Adam stops at the first step where every row of a subject wins by the margin, from a path of
sign-like steps: most of that δ is not needed for the margin. Each projection round linearises every row's margin
m_r(δ) (its worst target token's, against the best other token) at the current δ, takes the smallest δ' meeting
m_r + g_r·(δ' − δ) ≥ margin + slack for all the subject's rows (:func:`min_norm_point`), and moves toward it as
far as the rows really stay at the margin (halving the step up to :data:`LINE_STEPS` times; a subject none of
whose steps keeps them stays where it is).
"""

from __future__ import annotations

from typing import Callable

import torch

# Fractions of the way to the linearised minimum-norm δ tried in turn (the first that keeps every row is taken).
LINE_STEPS = (1.0, 0.5, 0.25)


def min_norm_point(g: torch.Tensor, b: torch.Tensor, *, sweeps: int = 500) -> torch.Tensor:
    """argmin ‖x‖ subject to g x ≥ b, g (k, d), b (k,) -> x (d,): x = gᵀλ with λ ≥ 0 maximising λᵀb − ½‖gᵀλ‖²,
    by Hildreth's coordinate ascent on the dual (k is a subject's few rows). x = 0 when b ≤ 0 (0 is feasible)."""
    g, b = g.double(), b.double()
    gram = g @ g.T
    diag = gram.diagonal().clamp_min(1e-12)
    lam = torch.zeros(len(b), dtype=torch.float64, device=g.device)
    for _ in range(sweeps):
        before = lam.clone()
        for i in range(len(b)):
            lam[i] = (lam[i] + (b[i] - gram[i] @ lam) / diag[i]).clamp_min(0)
        if float((lam - before).abs().max()) <= 1e-10 * float(lam.abs().max().clamp_min(1e-30)):
            break
    return g.T @ lam


def project_min_norm(delta: torch.Tensor, subject: torch.Tensor,
                     margins_of: Callable[[torch.Tensor, torch.Tensor, bool], tuple], *, margin: float, slack: float,
                     rounds: int) -> tuple[torch.Tensor, dict]:
    """Shrink each subject's δ (S, d) while every one of its rows keeps ``margin`` (see the module docstring).
    subject (R,) long: each row's subject; margins_of(rows (k,) long, steps (k, d) each row's δ, grad) -> (worst
    token margin of each row (k,), with ``grad`` its gradient in the row's δ (k, d), else None). Only subjects whose
    rows all hold the margin move. Returns (δ, {"projection_rounds", "norm_before", "norm_after"} mean norms)."""
    delta = delta.detach().clone()
    before = float(delta.norm(dim=1).mean())
    rows = torch.arange(len(subject))
    done = 0
    for _ in range(rounds):
        m, g = margins_of(rows, delta[subject], True)
        target = delta.clone()
        moving = []
        for s in torch.unique(subject).tolist():
            at = subject == s
            if not bool((m[at] >= margin).all()):
                continue  # not at the margin yet: nothing to keep
            point = min_norm_point(g[at], margin + slack - m[at] + g[at] @ delta[s]).to(delta)
            if float(point.norm()) < float(delta[s].norm()):
                target[s], moving = point, moving + [s]
        for fraction in LINE_STEPS:
            if not moving:
                break
            trial = delta.clone()
            trial[moving] = delta[moving] + fraction * (target[moving] - delta[moving])
            at = torch.isin(subject, torch.tensor(moving))
            kept, _ = margins_of(rows[at], trial[subject[at]], False)
            holds = torch.ones(len(delta)).scatter_reduce(0, subject[at], (kept >= margin).float(), "amin") > 0
            accepted = [s for s in moving if bool(holds[s])]
            delta[accepted] = trial[accepted]
            moving = [s for s in moving if s not in accepted]
        done += 1
    return delta, {"projection_rounds": done, "norm_before": before, "norm_after": float(delta.norm(dim=1).mean())}


__all__ = ["LINE_STEPS", "min_norm_point", "project_min_norm"]
