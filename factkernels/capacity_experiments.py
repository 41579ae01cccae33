"""Fact-storage cost experiments of seed 000 (§3.1, §3.3, §4.4, Figure 2) and the ``capacity`` command.

    factkernels capacity --method ours --d 32 --facts 256 --seeds 3 --json out.json
    factkernels experiment rho-vs-cost --quick --out results/     # and whitening, scaling, hybrids

Every cost is :func:`factkernels.capacity.sampled_storage_cost`: seed s draws a fact set of the
family (tied K = V, random bijection, A.1.1) and seeds the method; a size stores when every
fact of every seed is stored (eps_acc = 0). Each experiment writes ``NAME.json`` (config, every
cost with its search trace, the fits, and the seed's claimed numbers beside ours) and ``NAME.png``.
Without ``--quick`` the grids are the seed's (hours to days on CPU); ``--quick`` shrinks d, F and
the seeds, caps the GD MLP at 3000 steps and leaves GD out of "scaling" (its GD/ours ratio comes
from "hybrids"), so that each experiment runs in a few minutes on 2 busy CPU cores.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from . import geometry
from .capacity import StorageCost, methods, sampled_storage_cost
from .embeddings import FAMILIES, family_fact_set
from .environment import environment
from .progress import progress_bar
from .results import save_figure, write_json

# What the seed reports (§3.1, §3.3, §4.4 and the caption of Figure 2), for the JSON and the README.
SEED_CLAIMS = {
    "rho-vs-cost": {"r2": "> 0.97 (Fig. 2a: rho predicts MLP size, ours and GD)"},
    "whitening": {"max_gain": "up to 32x fewer parameters for our MLPs at low rho (Fig. 2a)"},
    "scaling": {"ntk_over_ours": "5-150x (ours has 5-150x lower cost than NTK, Fig. 2b)",
                "ours_over_gd": "~20x (GD MLPs have ~20x lower cost than ours)",
                "ntk": "diverges for large alpha = F / d^2 at each d (Fig. 2c)"},
    "hybrids": {"gd+jl": "~3x lower cost than ours", "bin+gd": "~4x lower cost than ours",
                "gd+gd": "~8x lower cost than ours", "gap_to_gd": "narrows from ~20x (ours) to ~4x (GD+GD)"},
}


@dataclass(frozen=True)
class Grid:
    """One experiment's sweep. dims: d; facts_per_d2: F = ratio · d² (the seed's α, 0.25 by default);
    families: names in :data:`factkernels.embeddings.FAMILIES`; kappas / strengths: the whitening
    sweep; gd_steps: step cap of the GD MLP (the seed: 20000 with early stopping)."""

    methods: tuple[str, ...]
    dims: tuple[int, ...]
    facts_per_d2: tuple[float, ...] = (0.25,)
    seeds: int = 3
    families: tuple[str, ...] = ("spherical",)
    kappas: tuple[float, ...] = (1.0,)
    strengths: tuple[float, ...] = (0.0,)
    gd_steps: int = 20000
    max_size: int = 1 << 17

    def num_facts(self, dim: int, ratio: float) -> int:
        return max(2, round(ratio * dim * dim))


@dataclass(frozen=True)
class Experiment:
    """An experiment: its grids and the functions that measure (grid -> payload) and plot (payload -> figure)."""

    name: str
    help: str
    full: Grid
    quick: Grid
    measure: Callable[[Grid, bool], dict]
    plot: Callable[[dict], object]


# ----------------------------------------------------------------------------- measuring


def _method_options(method: str, grid: Grid) -> dict:
    return {"steps": grid.gd_steps} if method == "gd" else {}


def measure_cost(method: str, family: str, num_facts: int, dim: int, grid: Grid, **options) -> dict:
    """Cost of one (method, family, F, d) cell over ``grid.seeds`` sampled fact sets, as a JSON-ready dict."""
    sample = functools.partial(family_fact_set, family, num_facts, dim)
    cost: StorageCost = sampled_storage_cost(method, sample, seeds=grid.seeds, max_size=grid.max_size, progress=False,
                                             **_method_options(method, grid), **options)
    rho = float(np.mean([geometry.decodability(sample(seed=s).V) for s in range(grid.seeds)]))
    return {"method": method, "family": family, "facts": num_facts, "d": dim, "options": options, "rho": rho,
            "size_name": cost.size_name, "size": cost.size, "parameters": cost.parameters,
            "trace": [[t.size, t.stored, min(t.accuracies)] for t in cost.trace]}


def loglog_fit(x: list[float], y: list[float]) -> Optional[dict]:
    """Least squares log y = a + b log x: {"slope": b, "intercept": a, "r2", "points"}; None below 3 points."""
    if len(x) < 3:
        return None
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    slope, intercept = np.polyfit(lx, ly, 1)
    residual = ly - (intercept + slope * lx)
    total = ((ly - ly.mean()) ** 2).sum()
    r2 = 1.0 - (residual**2).sum() / total if total > 0 else float("nan")
    return {"slope": float(slope), "intercept": float(intercept), "r2": float(r2), "points": len(x)}


def _cells(grid: Grid, quiet: bool, jobs: list[tuple], desc: str) -> list[dict]:
    """measure_cost for every (method, family, F, d, options) job, with one progress bar."""
    return [measure_cost(method, family, facts, dim, grid, **options)
            for method, family, facts, dim, options in progress_bar(jobs, desc=desc, enabled=not quiet)]


def _ratio(numerator: Optional[int], denominator: Optional[int]) -> Optional[float]:
    return None if not numerator or not denominator else numerator / denominator


def measure_rho_vs_cost(grid: Grid, quiet: bool) -> dict:
    """§3.1 / Fig. 2a: cost of each method on each embedding family, and log cost ~ log ρ per method."""
    dim = grid.dims[0]
    facts = grid.num_facts(dim, grid.facts_per_d2[0])
    cells = _cells(grid, quiet, [(m, fam, facts, dim, {}) for m in grid.methods for fam in grid.families],
                   "rho-vs-cost")
    fits = {}
    for method in grid.methods:
        ok = [c for c in cells if c["method"] == method and c["parameters"]]
        fits[method] = loglog_fit([c["rho"] for c in ok], [c["parameters"] for c in ok])
    return {"cells": cells, "fits": fits,
            "summary": {m: None if f is None else {"r2": f["r2"], "slope": f["slope"]} for m, f in fits.items()}}


def measure_whitening(grid: Grid, quiet: bool) -> dict:
    """§3.3: cost of our MLPs on anisotropic values (condition number κ) against whitening strength α."""
    dim = grid.dims[0]
    facts = grid.num_facts(dim, grid.facts_per_d2[0])
    jobs = [(m, _kappa_family(k), facts, dim, {"whiten": a}) for m in grid.methods for k in grid.kappas
            for a in grid.strengths]
    cells = _cells(grid, quiet, jobs, "whitening")
    gains = {}
    for method in grid.methods:
        for kappa in grid.kappas:
            row = {c["options"]["whiten"]: c["parameters"] for c in cells
                   if c["method"] == method and c["family"] == _kappa_family(kappa)}
            gains[f"{method} kappa={kappa:g}"] = _ratio(row.get(min(grid.strengths)), row.get(max(grid.strengths)))
    finite = [g for g in gains.values() if g is not None]
    return {"cells": cells, "gains": gains, "summary": {"max_gain": max(finite) if finite else None}}


def _kappa_family(kappa: float) -> str:
    name = "spherical" if kappa == 1 else f"anisotropic-{kappa:g}"
    if name not in FAMILIES:
        raise ValueError(f"kappa={kappa:g} has no family; choose from {sorted(FAMILIES)}")
    return name


def measure_scaling(grid: Grid, quiet: bool) -> dict:
    """§4.4 / Fig. 2b–c: cost of each method on spherical fact sets, d in ``dims``, F = α d²."""
    jobs = [(m, "spherical", grid.num_facts(d, r), d, {}) for d in grid.dims for r in grid.facts_per_d2
            for m in grid.methods]
    cells = _cells(grid, quiet, jobs, "scaling")
    by_point: dict = {}
    for c in cells:
        by_point.setdefault((c["d"], c["facts"]), {})[c["method"]] = c["parameters"]
    ratios = []
    for (dim, facts), row in sorted(by_point.items()):
        ratios.append({"d": dim, "facts": facts, "ntk_over_ours": _ratio(row.get("ntk"), row.get("ours")),
                       "ours_over_gd": _ratio(row.get("ours"), row.get("gd"))})
    summary = {}
    for key in ("ntk_over_ours", "ours_over_gd"):
        values = [r[key] for r in ratios if r[key] is not None]
        summary[key] = {"min": min(values), "max": max(values)} if values else None
    summary["ntk_not_stored"] = [[c["d"], c["facts"]] for c in cells if c["method"] == "ntk" and c["size"] is None]
    return {"cells": cells, "ratios": ratios, "summary": summary}


def measure_hybrids(grid: Grid, quiet: bool) -> dict:
    """§4.4 ablation: our Bin+JL against GD+JL, Bin+GD, GD+GD and the GD MLP on spherical fact sets."""
    dim = grid.dims[0]
    facts = grid.num_facts(dim, grid.facts_per_d2[0])
    cells = _cells(grid, quiet, [(m, "spherical", facts, dim, {}) for m in grid.methods], "hybrids")
    cost = {c["method"]: c["parameters"] for c in cells}
    summary = {f"ours_over_{m}": _ratio(cost.get("ours"), cost.get(m)) for m in grid.methods if m != "ours"}
    summary["gap_to_gd"] = {m: _ratio(cost.get(m), cost.get("gd")) for m in grid.methods if m != "gd"}
    return {"cells": cells, "summary": summary}


# ----------------------------------------------------------------------------- plots


def _axes(ncols: int = 1, width: float = 5.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width * ncols, 3.8), squeeze=False)


def _plain_log_ticks(*axes) -> None:
    """Integer labels at the major ticks of log axes and none at the minor ones (they overlap)."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    for axis in axes:
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())


def plot_rho_vs_cost(payload: dict):
    """Parameters against ρ (log–log), one colour per method, with the fitted line and its R²."""
    fig, axes = _axes()
    ax = axes[0, 0]
    for method, fit in payload["measured"]["fits"].items():
        ok = [c for c in payload["measured"]["cells"] if c["method"] == method and c["parameters"]]
        label = method if fit is None else f"{method}: slope {fit['slope']:.2f}, R²={fit['r2']:.3f}"
        points = ax.scatter([c["rho"] for c in ok], [c["parameters"] for c in ok], label=label)
        for c in ok:
            ax.annotate(c["family"], (c["rho"], c["parameters"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        if fit is not None:
            xs = np.geomspace(min(c["rho"] for c in ok), max(c["rho"] for c in ok), 50)
            ax.plot(xs, np.exp(fit["intercept"]) * xs ** fit["slope"], color=points.get_facecolor()[0], lw=1)
    ax.set(xscale="log", yscale="log", xlabel="decodability ρ(V)", ylabel="fact-storage cost (parameters)",
           title=f"cost vs ρ (seed: R² {SEED_CLAIMS['rho-vs-cost']['r2'].split(' (')[0]})")
    ax.legend(fontsize=8)
    return fig


def plot_whitening(payload: dict):
    """Parameters against whitening strength α, one line per (method, κ)."""
    fig, axes = _axes()
    ax = axes[0, 0]
    cells = payload["measured"]["cells"]
    for key in dict.fromkeys((c["method"], c["family"]) for c in cells):
        row = sorted((c["options"]["whiten"], c["parameters"]) for c in cells if (c["method"], c["family"]) == key)
        stored = [(a, p) for a, p in row if p]
        ax.plot([a for a, _ in stored], [p for _, p in stored], marker="o", label=f"{key[0]}, {key[1]}")
    ax.set(yscale="log", xlabel="whitening strength α", ylabel="fact-storage cost (parameters)",
           title=f"whitening (max gain {payload['measured']['summary']['max_gain'] or 0:.1f}x; seed: up to 32x)")
    ax.legend(fontsize=8)
    return fig


def plot_scaling(payload: dict):
    """Parameters against F per method and d (log–log), and facts per parameter."""
    fig, axes = _axes(2)
    cells = payload["measured"]["cells"]
    for key in dict.fromkeys((c["method"], c["d"]) for c in cells):
        row = sorted((c["facts"], c["parameters"]) for c in cells if (c["method"], c["d"]) == key and c["parameters"])
        if row:
            axes[0, 0].plot([f for f, _ in row], [p for _, p in row], marker="o", label=f"{key[0]} d={key[1]}")
            axes[0, 1].plot([f for f, _ in row], [f / p for f, p in row], marker="o", label=f"{key[0]} d={key[1]}")
    axes[0, 0].set(xscale="log", yscale="log", xlabel="facts F", ylabel="fact-storage cost (parameters)",
                   title="cost vs F (spherical, F = α d²)")
    axes[0, 1].set(xscale="log", yscale="log", xlabel="facts F", ylabel="facts per parameter")
    _plain_log_ticks(axes[0, 0].xaxis, axes[0, 1].xaxis)
    axes[0, 0].legend(fontsize=7)
    return fig


def plot_hybrids(payload: dict):
    """One bar per method: its fact-storage cost."""
    fig, axes = _axes()
    ax = axes[0, 0]
    cells = payload["measured"]["cells"]
    ax.bar([c["method"] for c in cells], [c["parameters"] or 0 for c in cells], color="tab:blue")
    ax.set(yscale="log", ylabel="fact-storage cost (parameters)",
           title=f"encoder/decoder ablation, d={cells[0]['d']}, F={cells[0]['facts']}")
    return fig


# ----------------------------------------------------------------------------- registry

_HYBRIDS = ("ours", "gd+jl", "bin+gd", "gd+gd", "gd")
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("rho-vs-cost", "cost of ours and GD across embedding families against decodability rho (Fig. 2a)",
               full=Grid(("ours", "gd"), (32,), families=tuple(FAMILIES)),
               quick=Grid(("ours",), (16,), seeds=2, families=tuple(FAMILIES)),
               measure=measure_rho_vs_cost, plot=plot_rho_vs_cost),
    Experiment("whitening", "cost of ours against whitening strength alpha on anisotropic values (Sec. 3.3)",
               full=Grid(("ours",), (32,), kappas=(1.0, 4.0, 16.0, 64.0, 256.0, 1024.0),
                         strengths=(0.0, 0.25, 0.5, 0.75, 1.0)),
               quick=Grid(("ours",), (16,), seeds=2, kappas=(1.0, 16.0, 256.0, 1024.0), strengths=(0.0, 0.5, 1.0)),
               measure=measure_whitening, plot=plot_whitening),
    Experiment("scaling", "ours vs NTK vs GD over d and F = alpha d^2 on spherical embeddings (Fig. 2b-c)",
               full=Grid(("ours", "ntk", "gd"), (32, 64, 128), facts_per_d2=(0.125, 0.25, 0.5, 1.0)),
               quick=Grid(("ours", "ntk"), (16, 32), facts_per_d2=(0.125, 0.25, 0.5), seeds=1),
               measure=measure_scaling, plot=plot_scaling),
    Experiment("hybrids", "encoder/decoder ablation: Bin+JL (ours), GD+JL, Bin+GD, GD+GD, GD MLP (Sec. 4.4)",
               full=Grid(_HYBRIDS, (32,)),
               quick=Grid(_HYBRIDS, (16,), seeds=1, gd_steps=3000),
               measure=measure_hybrids, plot=plot_hybrids),
)}


def run_experiment(name: str, out_dir, *, quick: bool = False, grid: Optional[Grid] = None,
                   quiet: bool = False) -> dict:
    """Run a named experiment, write ``out_dir/NAME.json`` and ``out_dir/NAME.png``; return the payload.

    grid: overrides the experiment's grid (default: ``quick`` or the seed's full grid).
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"name must be one of {sorted(EXPERIMENTS)}, got {name!r}")
    experiment = EXPERIMENTS[name]
    grid = grid or (experiment.quick if quick else experiment.full)
    unknown = sorted(set(grid.methods) - set(methods))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {sorted(methods)}")
    start = time.perf_counter()
    measured = experiment.measure(grid, quiet)
    payload = {"experiment": name, "config": {**asdict(grid), "quick": quick}, "measured": measured,
               "seed_claim": SEED_CLAIMS[name], "elapsed_s": time.perf_counter() - start}
    stem = name.replace("-", "_")
    payload["files"] = {"json": str(write_json(out_dir, stem, payload)),
                        "png": str(save_figure(experiment.plot(payload), out_dir, stem))}
    return payload


# ----------------------------------------------------------------------------- command line


def _run_capacity(args: argparse.Namespace) -> int:
    _set_threads(args.threads, False)
    grid = Grid((args.method,), (args.d,), seeds=args.seeds, gd_steps=args.gd_steps, max_size=args.max_size)
    options = {"whiten": args.whiten} if args.whiten else {}
    cell = measure_cost(args.method, args.family, args.facts, args.d, grid, **options)
    if cell["parameters"] is None:
        print(f"{args.method}: no {cell['size_name']} up to {args.max_size} stores every fact "
              f"({args.family}, d={args.d}, F={args.facts}, {args.seeds} seeds)")
    else:
        print(f"{args.method}: {cell['size_name']}={cell['size']} -> {cell['parameters']:,} parameters store every "
              f"fact ({args.family}, d={args.d}, F={args.facts}, rho={cell['rho']:.3f}, {args.seeds} seeds)")
    print("tried " + ", ".join(f"{size}{'+' if stored else '-'}" for size, stored, _ in cell["trace"]))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": vars(args) | {"handler": None}, "result": cell,
                                    "environment": environment()}, indent=2, default=str))
        print(f"wrote {path}")
    return 0 if cell["parameters"] is not None else 1


def _set_threads(threads: Optional[int], quick: bool) -> None:
    """Small searches run fastest on one thread: thread hand-offs dominate them on a busy machine."""
    if threads or quick:
        torch.set_num_threads(threads or 1)


def _run_named(args: argparse.Namespace) -> int:
    _set_threads(args.threads, args.quick)
    experiment = EXPERIMENTS[args.experiment]
    grid = experiment.quick if args.quick else experiment.full
    overrides = {k: v for k, v in (("seeds", args.seeds), ("gd_steps", args.gd_steps)) if v is not None}
    if args.methods:
        overrides["methods"] = tuple(args.methods.split(","))
    payload = run_experiment(args.experiment, args.out, quick=args.quick, grid=replace(grid, **overrides),
                             quiet=args.quiet)
    print(json.dumps({"summary": payload["measured"]["summary"], "seed_claim": payload["seed_claim"]}, indent=2))
    print(f"wrote {payload['files']['json']} and {payload['files']['png']} ({payload['elapsed_s']:.0f}s)")
    return 0


def add_subcommands(subparsers, experiment_subparsers) -> None:
    """Register ``capacity`` on ``subparsers`` and the cost experiments on ``experiment_subparsers``."""
    cap = subparsers.add_parser("capacity", help="fact-storage cost of one method (binary search over its size)")
    cap.add_argument("--method", choices=sorted(methods), default="ours")
    cap.add_argument("--d", type=int, default=32, help="embedding dimension")
    cap.add_argument("--facts", type=int, default=256, help="number of facts F = |V|")
    cap.add_argument("--family", choices=sorted(FAMILIES), default="spherical", help="embedding family (tied, bijective)")
    cap.add_argument("--seeds", type=int, default=3, help="fact sets (and method seeds) that must all be stored")
    cap.add_argument("--whiten", type=float, default=0.0, help="whitening strength alpha (method 'ours')")
    cap.add_argument("--gd-steps", type=int, default=20000, help="step cap of the GD MLP ('gd')")
    cap.add_argument("--max-size", type=int, default=1 << 17, help="the search gives up above this size")
    cap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    cap.add_argument("--json", help="write config, result with search trace and environment to this JSON file")
    cap.set_defaults(handler=_run_capacity)
    for experiment in EXPERIMENTS.values():
        p = experiment_subparsers.add_parser(experiment.name, help=experiment.help)
        p.add_argument("--quick", action="store_true", help="small grid that runs in minutes on 2 CPU cores "
                       "(default: the seed's grid, hours or more on CPU)")
        p.add_argument("--out", default=f"results/{experiment.name}", help="output folder for JSON and PNG")
        p.add_argument("--seeds", type=int, default=None, help="override the number of seeds")
        p.add_argument("--methods", default=None, help=f"override the methods, comma-separated, from {sorted(methods)}")
        p.add_argument("--gd-steps", type=int, default=None, help="override the GD MLP step cap")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 with --quick, "
                       "where it is fastest, else torch's default)")
        p.add_argument("--quiet", action="store_true", help="no progress bars")
        p.set_defaults(handler=_run_named)


__all__ = ["EXPERIMENTS", "Experiment", "Grid", "SEED_CLAIMS", "loglog_fit", "measure_cost", "run_experiment",
           "add_subcommands"]
