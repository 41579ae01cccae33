"""CG preconditioners on the gadget Gram: Jacobi against the deflation of the constant vector and of the keys' span.

    OMP_NUM_THREADS=1 python benchmarks/cg_precond.py --out benchmarks/results/cg_precond-cpu.json
    python benchmarks/cg_precond.py --solve 262144x1024 --m 79 --construct none --device cuda   # a lent GPU

Solve rows: the operator ``construct`` builds for F keys of dimension d (unit Gaussian keys, the default gate of
width h̃ = ⌈1.5 F / (d+1)⌉, silu, whitened features) and m Gaussian right-hand sides (JL codes are Gaussian
projections), solved to the construction's tolerance with each preconditioner: iterations, the setup's Gram
products (``setup_columns``: k columns = k/m iterations), relative residual, CPU and wall seconds of the solve
(setup included) and of the setup alone, and the Ritz values of the deflated span in the Jacobi-scaled Gram
(what the deflation moves to 1). ``iteration_equivalents`` = iterations + setup_columns / m: the Gram products
in units of one iteration. Construct rows: ``construct(outputs="values", solver="cg")`` with each
preconditioner: every fact decoded, m, rho, margins, iterations.

``gpu_projection``: the F = 2^18, d = 1,024 values build on an H200 (session 24: solve 66.5 s in 94 Jacobi
iterations, benchmarks/runs/gpu/NOTES.md) with the iteration ratio of this run's row of largest F/(d+1),
the setup's (d+1)/m iterations and the deflation's apply (4 F k m FLOPs) at the measured float32 GEMM rate.
Not measured: a projection.
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
# The 2^18 x 1,024 values build on an H200, session 24 run 2 (gpu_suite-NVIDIA_H200-s24-run2.json; NOTES.md).
H200_BUILD = {"F": 2**18, "d": 1024, "m": 79, "gadget_width": 384, "jacobi_iterations": 94, "solve_s": 66.5,
              "total_s": 82.8, "gemm_float32_flops_per_s": 50.63e12}


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
    """The 2^18 x 1,024 build's solve with the keys deflation, from this run's largest-F/(d+1) iteration ratio."""
    by_size: dict = {}
    for row in rows:
        by_size.setdefault((row["F"], row["d"]), {})[row["preconditioner"]] = row
    complete = [group for group in by_size.values() if {"jacobi", "keys"} <= group.keys()]
    if not complete:
        return {}
    group = max(complete, key=lambda g: g["keys"]["facts_per_key_column"])
    ratio = group["keys"]["iterations"] / group["jacobi"]["iterations"]
    b = H200_BUILD
    per_iteration = b["solve_s"] / b["jacobi_iterations"]
    rank = b["d"] + 1
    iterations = math.ceil(ratio * b["jacobi_iterations"])
    apply_s = 4 * b["F"] * rank * b["m"] / b["gemm_float32_flops_per_s"]  # Uᵀ y and U c, per iteration
    setup_s = rank / b["m"] * per_iteration
    solve_s = iterations * (per_iteration + apply_s) + setup_s
    return {"measured": False, "basis": f"iteration ratio keys/jacobi {ratio:.3f} at F = {group['keys']['F']}, "
            f"d = {group['keys']['d']} (F/(d+1) = {group['keys']['facts_per_key_column']:.0f}; the 2^18 build's 256)",
            "h200_build_session24": b, "seconds_per_iteration": per_iteration, "iterations": iterations,
            "setup_s": setup_s, "apply_s_per_iteration": apply_s, "solve_s": solve_s,
            "total_s": b["total_s"] - b["solve_s"] + solve_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--solve", default="16384x128,16384x64,16384x1024", help="FxD,... for the solve rows")
    parser.add_argument("--m", type=int, default=32, help="right-hand sides of the solve rows")
    parser.add_argument("--construct", default="8192x64", help="FxD,... for construct rows, or none")
    parser.add_argument("--preconditioners", default=",".join(PRECONDITIONERS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS / "cg_precond-cpu.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    names = args.preconditioners.split(",")
    payload = {"benchmark": "cg preconditioners on the gadget Gram (issue 33)", "command": " ".join(os.sys.argv),
               "threads": torch.get_num_threads(), "loadavg_before": os.getloadavg(), "tol": solvers.RESIDUAL_TOL,
               "solve": [], "construct": []}
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
