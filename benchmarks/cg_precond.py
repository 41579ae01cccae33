"""CG preconditioners on the gadget Gram: Jacobi against the deflation of the constant vector and of the keys' span.

    OMP_NUM_THREADS=1 python benchmarks/cg_precond.py --out benchmarks/results/cg_precond-cpu.json
    python benchmarks/cg_precond.py --solve 262144x1024 --m 79 --construct none --device cuda   # a lent GPU

Solve rows: the operator ``construct`` builds for F keys of dimension d (unit Gaussian keys, the default gate of
width h̃ = ⌈1.5 F / (d+1)⌉, silu, whitened features) and m Gaussian right-hand sides (JL codes are Gaussian
projections), solved to the construction's tolerance with each preconditioner: iterations, the setup's Gram
products (``setup_columns``: k columns = k/m iterations), relative residual, CPU and wall seconds of the solve
(setup included) and of the setup alone, and the Ritz values of the deflated span in the Jacobi-scaled Gram
(what the deflation moves to 1). ``iteration_equivalents`` = iterations + setup_columns / m: the Gram products
in units of one iteration. Spectrum rows (``--spectrum``, small F): the dense eigenvalues of the Jacobi-scaled
Gram and the Ritz values of the keys' and the gate features' spans. Construct rows: ``construct(outputs="values", solver="cg")`` with each
preconditioner: every fact decoded, m, rho, margins, iterations.

``gpu_projection``: the F = 2^18, d = 1,024 values build on an H200 (session 24, H200_RUNS: run 2's Jacobi solve
and GEMM rate, run 3's other phases) with the iteration ratio of this run's row of largest F/(d+1) (and the range
over the rows where auto deflates the keys), the setup's (d+1)/(2m) iterations and the deflation's apply
(4 F k m FLOPs) at the measured float32 GEMM rate. Not measured: a projection.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch

import factkernels
from factkernels import solvers
from factkernels.encoder import augment, gadget_width, sample_gate
from factkernels.environment import environment

RESULTS = Path(__file__).resolve().parent / "results"
PRECONDITIONERS = ("jacobi", "constant", "keys")
# The 2^18 x 1,024 values build on an H200 in session 24 (benchmarks/runs/gpu/NOTES.md): run 2's float32 CG solve
# (Jacobi) and run 3's other phases (the value-margin pass on star_topk's twin, what auto runs since).
H200_RUNS = {"solve": "gpu_suite-NVIDIA_H200-s24-run2.json", "other_phases": "gpu_suite-NVIDIA_H200-s24-run3.json"}


def h200_build() -> dict:
    """The session-24 H200 figures the projection starts from, read from their committed JSON."""
    solve_run, other_run = (json.loads((RESULTS / name).read_text())["scale"] for name in H200_RUNS.values())
    phases = other_run["phases_s"]
    return {"F": solve_run["F"], "d": solve_run["d"], "m": solve_run["m"], "gadget_width": solve_run["gadget_width"],
            "jacobi_iterations": solve_run["cg_iterations"], "solve_s": solve_run["phases_s"]["solve"],
            "total_s": solve_run["phases_s"]["total"],
            "other_phases_s": sum(v for k, v in phases.items() if k not in ("solve", "total")),
            "gemm_float32_flops_per_s": solve_run["gemm_float32_flops_per_s"], "from": H200_RUNS}


def sizes(text: str) -> list[tuple[int, int]]:
    return [] if text == "none" else [tuple(int(x) for x in item.split("x")) for item in text.split(",")]


def operator(num_facts: int, d: int, device: torch.device, seed: int = 0):
    """The whitened gadget operator construct builds for unit Gaussian keys, and a generator for the targets."""
    gen = torch.Generator().manual_seed(seed)
    keys = torch.nn.functional.normalize(torch.randn(num_facts, d, generator=gen), dim=1).to(device)
    gate, bias = sample_gate(keys, gadget_width(num_facts, d, 1.5), gen)
    features = torch.nn.functional.silu(keys @ gate.T + bias)
    return solvers.GadgetOperator.whitened(features, augment(keys)), gen


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def solve_row(num_facts: int, d: int, m: int, preconditioner: str, device: torch.device) -> dict:
    op, gen = operator(num_facts, d, device)
    targets = torch.randn(num_facts, m, generator=gen).to(device)
    row = {"F": num_facts, "d": d, "m": m, "gadget_width": op.gate_features.shape[1],
           "facts_per_key_column": num_facts / (d + 1), "preconditioner": preconditioner,
           "auto_picks": solvers.auto_preconditioner(num_facts, d + 1, m)}
    if preconditioner != "jacobi":  # the setup alone, once more, for its seconds and Ritz values
        sync(device)
        wall, cpu = time.perf_counter(), time.process_time()
        precond = solvers.deflated_preconditioner(op, chunk=m, keys=preconditioner == "keys")
        sync(device)
        row.update(setup_cpu_s=time.process_time() - cpu, setup_wall_s=time.perf_counter() - wall)
        ritz = sorted((1.0 / (precond.shrink.double().flatten() + 1.0)).tolist(), reverse=True)
        row["ritz_values"] = {"top": ritz[:4], "bottom": ritz[-2:]}
        del precond
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    _, info = solvers.solve_cg(op, targets, max_iter=2000, progress=False, preconditioner=preconditioner)
    sync(device)
    row.update(solve_cpu_s=time.process_time() - cpu, solve_wall_s=time.perf_counter() - wall,
               iterations=info.iterations, setup_columns=info.setup_columns, residual=info.residual,
               iteration_equivalents=info.iterations + info.setup_columns / m)
    print(json.dumps(row), flush=True)
    return row


def spectrum_row(num_facts: int, d: int, device: torch.device) -> dict:
    """Where CG's iterations go: the dense eigenvalues of the Jacobi-scaled Gram A = D^-1/2 G D^-1/2 (float64; small
    F only) and the Ritz values of A on the keys' span [K, 1] and on the gate features' span."""
    op, _ = operator(num_facts, d, device)
    op = solvers.GadgetOperator(*(t.double() for t in (op.gate_features, op.keys_aug, op.feature_transform,
                                                         op.key_transform)))
    scale = op.diagonal().rsqrt().unsqueeze(1)
    eig = torch.linalg.eigvalsh(scale * op.dense() * scale.T).flip(0).cpu()
    row = {"F": num_facts, "d": d, "gadget_width": op.gate_features.shape[1],
           "facts_per_key_column": num_facts / (d + 1), "top": eig[:4].tolist(),
           "eigenvalue_d_plus_1": float(eig[d]), "eigenvalue_d_plus_2": float(eig[d + 1]),
           "quantiles": {str(q): float(eig[min(num_facts - 1, int(q * num_facts))]) for q in (0.5, 0.9, 0.99)},
           "min": float(eig[-1]), "condition": float(eig[0] / eig[-1]),
           "condition_without_keys_span": float(eig[d + 1] / eig[-1])}
    for name, span in (("keys_span", op.keys_aug), ("gate_span", op.gate_features)):
        q = torch.linalg.qr(span)[0]
        ritz = torch.linalg.eigvalsh(q.T @ (scale * op.matmul(scale * q))).flip(0)
        row[f"ritz_{name}"] = {"top": ritz[:3].tolist(), "median": float(ritz.median()), "min": float(ritz[-1])}
    print(json.dumps(row), flush=True)
    return row


def construct_row(num_facts: int, d: int, preconditioner: str, device: torch.device) -> dict:
    gen = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(num_facts, d, generator=gen), dim=1).to(device)
    values = torch.nn.functional.normalize(torch.randn(num_facts, d, generator=gen), dim=1).to(device)
    facts = torch.randperm(num_facts, generator=gen).to(device)
    wall, cpu = time.perf_counter(), time.process_time()
    report = factkernels.construct(keys, values, facts, outputs="values", solver="cg", cg_preconditioner=preconditioner,
                                   verify="report", progress=False).report
    row = {"F": num_facts, "d": d, "preconditioner": preconditioner, "cpu_s": time.process_time() - cpu,
           "wall_s": time.perf_counter() - wall, "m": report.m, "m_search": report.m_search, "rho": report.rho,
           "accuracy": report.accuracy, "failed": report.failed, "min_margin": report.min_margin,
           "cg_iterations": report.cg_iterations, "cg_preconditioner": report.cg_preconditioner,
           "residual": report.residual, "phases_s": report.timings}
    print(json.dumps(row), flush=True)
    return row


def gpu_projection(rows: list[dict]) -> dict:
    """The 2^18 x 1,024 build's solve with the keys deflation, from this run's keys/Jacobi iteration ratios: the row
    of largest F/(d+1) (the 2^18 build's is 256) and the range over the rows where auto picks "keys"."""
    by_size: dict = {}
    for row in rows:
        by_size.setdefault((row["F"], row["d"]), {})[row["preconditioner"]] = row
    complete = [group for group in by_size.values() if {"jacobi", "keys"} <= group.keys()]
    if not complete:
        return {}
    b = h200_build()
    per_iteration = b["solve_s"] / b["jacobi_iterations"]
    rank = b["d"] + 1
    apply_s = 4 * b["F"] * rank * b["m"] / b["gemm_float32_flops_per_s"]  # Uᵀ y and U c, per iteration
    setup_s = rank / (2 * b["m"]) * per_iteration  # half a product per basis column

    def project(ratio: float) -> dict:
        iterations = math.ceil(ratio * b["jacobi_iterations"])
        solve_s = iterations * (per_iteration + apply_s) + setup_s
        return {"ratio": ratio, "iterations": iterations, "solve_s": solve_s, "total_s": b["other_phases_s"] + solve_s}

    group = max(complete, key=lambda g: g["keys"]["facts_per_key_column"])
    ratios = [g["keys"]["iterations"] / g["jacobi"]["iterations"] for g in complete if g["keys"]["auto_picks"] == "keys"]
    return {"measured": False, "basis": f"iteration ratio keys/jacobi at F = {group['keys']['F']}, "
            f"d = {group['keys']['d']} (F/(d+1) = {group['keys']['facts_per_key_column']:.0f}; the 2^18 build's 256)",
            "h200_build_session24": b, "seconds_per_iteration": per_iteration, "setup_s": setup_s,
            "apply_s_per_iteration": apply_s,
            **project(group["keys"]["iterations"] / group["jacobi"]["iterations"]),
            "range_over_auto_keys_rows": [project(min(ratios)), project(max(ratios))] if ratios else []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--solve", default="16384x128,16384x64,16384x1024", help="FxD,... for the solve rows")
    parser.add_argument("--m", type=int, default=32, help="right-hand sides of the solve rows")
    parser.add_argument("--construct", default="8192x64", help="FxD,... for construct rows, or none")
    parser.add_argument("--spectrum", default="none", help="FxD,... for dense spectra (small F), or none")
    parser.add_argument("--preconditioners", default=",".join(PRECONDITIONERS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reproject", action="store_true",
                        help="only recompute gpu_projection of the JSON at --out from its solve rows")
    parser.add_argument("--out", type=Path, default=RESULTS / "cg_precond-cpu.json")
    args = parser.parse_args()
    if args.reproject:
        payload = json.loads(args.out.read_text())
        payload["gpu_projection"] = gpu_projection(payload["solve"])
        write(args.out, payload)
        print(json.dumps(payload["gpu_projection"], indent=1))
        return
    device = torch.device(args.device)
    names = args.preconditioners.split(",")
    payload = {"benchmark": "cg preconditioners on the gadget Gram (issue 33)", "command": " ".join(os.sys.argv),
               "threads": torch.get_num_threads(), "loadavg_before": os.getloadavg(), "tol": solvers.RESIDUAL_TOL,
               "spectrum": [], "solve": [], "construct": []}
    for num_facts, d in sizes(args.spectrum):
        payload["spectrum"].append(spectrum_row(num_facts, d, device))
        write(args.out, payload)
    for num_facts, d in sizes(args.solve):
        for name in names:
            payload["solve"].append(solve_row(num_facts, d, args.m, name, device))
            write(args.out, payload)
    for num_facts, d in sizes(args.construct):
        for name in names:
            payload["construct"].append(construct_row(num_facts, d, name, device))
            write(args.out, payload)
    payload["gpu_projection"] = gpu_projection(payload["solve"])
    payload.update(loadavg_after=os.getloadavg(), environment=environment())
    write(args.out, payload)
    print(json.dumps(payload["gpu_projection"], indent=1))


def write(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
