"""whitening (seed 000 §3.3): the cost of ours against whitening strength alpha on anisotropic values.

    factkernels experiment whitening --scale quick --out runs/
"""

from __future__ import annotations

from ..embeddings import FAMILIES
from . import engine
from .cost_cells import COST_DEVICES, DEFAULT_MULTIPLIER, cost_cell, cost_rows, num_facts, run_cost_cell, setting_text
from .engine import Claim, Finding
from .summary_math import ratio


CLAIMS = (
    Claim("000-fig2a-whitening", "000", "§3.3, Fig. 2a", "embedding whitening lowers the cost of our MLPs at low rho",
          "up to 32× fewer parameters (reproduced: ≥ 24×; partly: ≥ 4×)"),
)


def _family_kappa(family: str) -> float:
    """The condition number κ of a whitening family's keys (inverse of :func:`_kappa_family`)."""
    return 1.0 if family == "spherical" else float(family.removeprefix("anisotropic-"))


def _kappa_family(kappa: float) -> str:
    name = "spherical" if kappa == 1 else f"anisotropic-{kappa:g}"
    if name not in FAMILIES:
        raise ValueError(f"kappa={kappa:g} has no family; choose from {sorted(FAMILIES)}")
    return name


def grid(scale: str) -> list[dict]:
    dim, seeds, kappas, strengths = {
        "tiny": (8, 1, (256.0,), (0.0, 1.0)),
        "quick": (16, 3, (1.0, 16.0, 256.0, 1024.0), (0.0, 0.5, 1.0)),
        "seed": (32, 3, (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0), (0.0, 0.25, 0.5, 0.75, 1.0)),
    }[scale]
    mults = {"multipliers": [DEFAULT_MULTIPLIER]} if scale == "tiny" else {}
    return [cost_cell("ours", _kappa_family(k), num_facts(dim, 0.25 if scale != "tiny" else 0.5), dim, seeds,
                      whiten=a, **mults) for k in kappas for a in strengths]


def summarize(cells: list[engine.Cell]) -> dict:
    gains = {}
    strengths = sorted({c.config["whiten"] for c in cells})
    for family in dict.fromkeys(c.config["family"] for c in cells):
        row = {c.config["whiten"]: c.result["parameters"] for c in cells if c.config["family"] == family}
        gains[family] = ratio(row.get(strengths[0]), row.get(strengths[-1]))
    finite = {k: g for k, g in gains.items() if g is not None}
    best = max(finite, key=finite.get) if finite else None
    if best is None:
        finding = Finding("-", setting_text(cells, ""), "not run", "no family stored at both strengths")
    else:
        ours = f"max {finite[best]:.1f}× ({best}); " + ", ".join(f"{k}: {g:.2f}×" for k, g in finite.items())
        verdict = "reproduced" if finite[best] >= 24 else "partly" if finite[best] >= 4 else "not reproduced"
        by_kappa = [finite[f] for f in sorted(finite, key=_family_kappa)]
        grows = len(by_kappa) >= 2 and all(b >= a for a, b in zip(by_kappa, by_kappa[1:]))
        reason = ("gain reaches the paper's order" if verdict == "reproduced" else
                  f"gain {'grows' if grows else 'does not grow steadily'} with κ; the paper's lowest-ρ embeddings "
                  "are not specified")
        finding = Finding(ours, setting_text(cells, "d=32, F=256, 3 seeds; its low-ρ embeddings unspecified") +
                          f"; α ∈ {strengths}, gain = cost(α=0)/cost(α=1)", verdict, reason)
    return {"rows": cost_rows(cells), "gains": gains, "max_gain": finite.get(best) if best else None,
            "claims": {"000-fig2a-whitening": finding}}


def plot(summary: dict, cells: list[engine.Cell]) -> dict:
    from .plotting import panels

    fig, (ax,) = panels(1)
    for family in dict.fromkeys(r["family"] for r in summary["rows"]):
        row = sorted((r["whiten"], r["parameters"]) for r in summary["rows"] if r["family"] == family and r["parameters"])
        ax.plot([a for a, _ in row], [p for _, p in row], marker="o", label=family)
    ax.set(yscale="log", xlabel="whitening strength α", ylabel="fact-storage cost (parameters)",
           title=f"whitening (max gain {summary['max_gain'] or 0:.1f}×; paper: up to 32×)")
    ax.legend(fontsize=8)
    return {"whitening": fig}


EXPERIMENT = engine.register(engine.Experiment(
    "whitening", "cost of ours against whitening strength alpha on anisotropic values (Sec. 3.3)",
    CLAIMS, grid, run_cost_cell, summarize, plot, devices=COST_DEVICES))
