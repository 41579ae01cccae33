"""One command for a GPU machine: the CUDA tests and every GPU benchmark, into one JSON.

    python benchmarks/gpu_suite.py --out benchmarks/results/          # writes gpu_suite-<gpu>.json there
    python benchmarks/gpu_suite.py --out r.json --skip-tests          # benchmarks only
    python benchmarks/gpu_suite.py --out r.json --only tests,kernels  # some sections
    python benchmarks/gpu_suite.py --device cpu --quick --skip-tests  # smoke run of the script itself, tiny sizes

What it runs (all on --device, default cuda):
  tests      pytest -m cuda in a subprocess; its summary line, exit status and the end of its output
  kernels    every compiled kernel against its torch twin (bench.py's races; on CUDA they include
             decode of 65,536 x 65,536 at d = 256) and the fused max-over-heads scores; then star_topk at U*'s
             pass widths (STAR_TOPK_RACES: 4,096 and 16,384 x 128, 65,536 x 256 on an eighth of the rows) with
             the share of indices kernel and twin agree on
  construct  d = 128, F = |V| = 4,096: outputs="values" with the Cholesky solve (bench.py's race), then
             outputs="values" and the default construct (margin-optimal outputs) with their own defaults, each
             beside one Cholesky of 4,096, with its phases and one profiled call: launches, stream syncs,
             copies, host syncs and the top 15 device kernels by time (profile_call)
  scale      outputs="values", solver="auto" at d = 1,024, F = |V| = 2^18 (--scale-facts), each phase beside
             its GEMM-rate limit; then F = 2^20 through the memory guard only: refused at once with its
             estimate, or "fits" (not built: it would take far longer than a lent call)
  ustar      margin_optimal_outputs (U*), USTAR_ROWS: |V| = 4,096, d = 128 (auto, dense, active_set; the active
             set with backend kernels: CUDA corral_solve and star_topk, and torch: their twins), 16,384 x 128
             (active_set, dense) and, unless --no-ustar-large, 65,536 x 256 (backend auto and torch): time,
             rho, streaming passes and one pass's time, and (below each row's threshold) kernel launches, host
             syncs, copies and the top device kernels (ustar_launches.py)
  gd_batch   GD cost searches with every seed (and, for the GD MLP, the sizes ahead) as one batch vs one
             model at a time (gd_batch.py's race at its CPU setting, d = 16, F = 64, 3 seeds, one run each),
             and the cost of one step of 1, 3, 9, 21 GD MLPs as one batch (and of 1 and 3 at F = 256 ... 2,048),
             and a GD step with the cross-entropy kernel against its torch twin
  largest_f  cg builds at --largest-d (default 128), F = |V| doubling from 8,192 until one runs out of
             memory or takes longer than --max-seconds: the largest F that fits, with its time

The JSON is rewritten after every section (in the order above, largest_f last), so a run cut off keeps what
finished; a section that raises records its traceback and the rest still run (exit status 1).
Without a usable CUDA device it prints why and exits with status 2, writing nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

import factkernels
from factkernels import _ops
from factkernels.embeddings import random_fact_set

from bench import (bench_attention, bench_construct, bench_kernels, cholesky_seconds, device_info, gemm_rate, race,
                   sync, timeit)
from gd_batch import race as race_gd_searches
from gd_batch import step_costs as gd_step_costs
from gd_batch import loss_kernel_race as gd_loss_kernel_race
from gd_batch import step_costs_by_size as gd_step_costs_by_size
from ustar_launches import measure as measure_ustar
from ustar_launches import profile_counts, profiler

ROOT = Path(__file__).resolve().parent.parent
NO_DEVICE_STATUS = 2
SECTIONS = ("tests", "kernels", "attention", "construct", "ustar", "scale", "gd_batch", "largest_f")


def cuda_unavailable_reason(device: torch.device) -> str | None:
    """Why the suite cannot run on ``device`` (None when it can)."""
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return "no CUDA device is available to torch (torch.cuda.is_available() is False)"
    if not _ops.build_info().get("cuda"):
        return ("factkernels was built without CUDA kernels; rebuild with "
                "FACTKERNELS_CUDA=ON pip install --no-build-isolation -e .")
    return None


def run_cuda_tests(timeout_seconds: float) -> dict:
    """pytest -m cuda in a fresh process: the summary line, counts, failures and the end of its output.

    -I keeps the repo root (whose factkernels/ has no compiled _C) off sys.path, so the tests import the
    installed package, as the console script would."""
    start = time.perf_counter()
    command = [sys.executable, "-I", "-m", "pytest", "-m", "cuda", "-q", "-rfE", "--tb=short", "-p",
               "no:cacheprovider"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_seconds)
        stdout, stderr, returncode = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as err:
        stdout, stderr, returncode = (err.stdout or b"").decode(), f"timed out after {timeout_seconds:.0f} s", None
    lines = [line for line in stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else stderr.strip()[-500:]
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)",
                                                                summary)}
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    print(f"cuda tests: {summary}", flush=True)
    return {"returncode": returncode, "summary": summary, "counts": counts, "failures": failures,
            "output_tail": stdout[-20000:], "stderr_tail": stderr[-4000:], "seconds": time.perf_counter() - start}


def profile_call(run, device: torch.device) -> dict:
    """One call of ``run`` (already warmed up) under torch.profiler: its operators and host syncs and, on a GPU,
    its kernel launches, stream syncs and copies and the top device kernels by time (ustar_launches.profile_counts),
    and its wall time with the profiler on."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profiler(activities) as prof:
        begin = time.perf_counter()
        run()
        sync(device)
        seconds = time.perf_counter() - begin
    return dict(profile_counts(prof), profiled_ms=seconds * 1e3)


def bench_build(device: torch.device, d: int, num_facts: int, **options) -> dict:
    """construct at F = |V| with ``options`` (none: the default, margin-optimal outputs), beside one Cholesky of
    F: the best of 3 timed calls, the phases the build reports, then one profiled call (:func:`profile_call`)
    with its own phases."""
    keys, values, facts = (t.to(device) for t in random_fact_set(num_facts, num_facts, d, seed=0))
    built = {}

    def run():
        built["mlp"] = factkernels.construct(keys, values, facts, progress=False, **options)

    seconds = timeit(run, device, repeats=3)
    report = built["mlp"].report
    cholesky = cholesky_seconds(num_facts, device)
    outputs = options.get("outputs", "margin_optimal")
    row = {"d": d, "F": num_facts, "outputs": outputs, "options": options, "seconds": seconds,
           "accuracy": report.accuracy, "m": report.m, "solver": report.solver,
           "phases_ms": {k: round(v * 1e3, 2) for k, v in report.timings.items()},
           "limit": "one Cholesky of the F x F Gram", "limit_s": cholesky, "seconds_over_limit": seconds / cholesky}
    row["profile"] = profile_call(run, device)
    row["profile"]["phases_ms"] = {k: round(v * 1e3, 2) for k, v in built["mlp"].report.timings.items()}
    cuda = row["profile"].get("cuda", {})
    print(f"construct {outputs} d={d} F={num_facts}: {seconds * 1e3:.1f} ms = {seconds / cholesky:.1f} Choleskys "
          f"of F, accuracy {report.accuracy}, phases {row['phases_ms']}; profiled: {row['profile']['aten_ops']} aten "
          f"ops, {row['profile']['host_syncs']} host syncs, {cuda.get('kernel_launches')} launches, "
          f"{cuda.get('stream_synchronize')} stream syncs, {cuda.get('memcpy')} copies, device busy "
          f"{row['profile'].get('device_busy_ms')} ms", flush=True)
    for kernel in row["profile"].get("top_device_kernels", []):
        print(f"  {kernel['total_ms']:9.3f} ms {kernel['calls']:6d}x  {kernel['name'][:100]}", flush=True)
    return row


# star_topk races at U*'s pass widths: (|V|, d, k, rows scored). 65,536 x 256 scores an eighth of the rows against
# all values (the kernel took 0.58 s and 1.71 s on a quarter at k 192 and 384 on the H200, session 24's run 1).
STAR_TOPK_RACES = ((4096, 128, 96, 4096), (4096, 128, 192, 4096), (16384, 128, 96, 16384),
                   (65536, 256, 192, 8192), (65536, 256, 384, 8192))
STAR_TOPK_QUICK_RACES = ((512, 32, 24, 512), (1024, 32, 48, 256))


def twin_by_budget(twin, device: torch.device, budgets=(1 << 30, 1 << 32, 1 << 34)) -> dict:
    """The star_topk twin's time with each working-memory budget per chunk (``_ops.STAR_TWIN_BYTES``), in ms."""
    key = device.type if device.type in _ops.STAR_TWIN_BYTES else "cpu"
    default = _ops.STAR_TWIN_BYTES[key]
    times = {}
    try:
        for budget in budgets:
            _ops.STAR_TWIN_BYTES[key] = budget
            times[budget >> 20] = timeit(twin, device, repeats=3) * 1e3
    finally:
        _ops.STAR_TWIN_BYTES[key] = default
    return times


def bench_star_topk(device: torch.device, races, rate: float) -> list[dict]:
    """star_topk's kernel against its twin (GEMMs, then torch.topk) as U*'s streaming pass runs it: unit values,
    given outputs (two products: 4 r |V| d FLOPs, the GEMM-rate limit), ``rows`` of them scored against all.
    Each row also says how far the two agree (the share of equal indices, the largest score difference) and has
    one profiled call of the twin (:func:`profile_call`)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for nv, d, k, r in races:
        v = torch.nn.functional.normalize(torch.randn(nv, d, generator=gen), dim=1).to(device)
        p = torch.nn.functional.normalize(torch.randn(r, d, generator=gen), dim=1).to(device)
        rows = torch.arange(r, device=device)
        twin = lambda: _ops.star_topk(v, k, p, rows, backend="torch")  # noqa: E731
        row = race("star_topk", {"nv": nv, "d": d, "k": k, "rows": r}, device,
                   lambda: _ops.star_topk(v, k, p, rows, backend="kernels"), twin, flops=4 * r * nv * d, rate=rate)
        row["twin_profile"] = profile_call(twin, device)  # where the twin's time goes: GEMMs, topk, elementwise
        if (nv, d, k, r) == max(races):  # the twin's chunk budget, for tuning STAR_TWIN_BYTES (one race)
            row["twin_ms_by_budget_mib"] = twin_by_budget(twin, device)
        (kv, ki), (tv, ti) = (_ops.star_topk(v, k, p, rows, backend=b) for b in ("kernels", "torch"))
        row.update(index_agreement=(ki == ti).double().mean().item(),
                   max_score_difference=(kv - tv).abs().max().item(), full_pass_rows=nv,
                   auto_runs_kernel=_ops.star_topk_auto_runs_kernel(k, nv, device.type))
        out.append(row)
        del v, p, rows, kv, ki, tv, ti
    return out


def bench_scale(device: torch.device, d: int, num_facts: int, refuse_facts: int, rate: float) -> dict:
    """outputs="values", solver="auto" at F = |V| = ``num_facts``: time, phases and peak memory, each phase beside
    its GEMM-rate limit (``rate`` FLOP/s): the margin pass and one m-search decode are |V|² d products, a CG
    iteration two gadget products of 2 F h̃ (d+1) m FLOPs. Then F = ``refuse_facts`` through the memory guard."""
    gen = torch.Generator(device=device).manual_seed(0)  # drawn on the device: 2^18 x 1,024 twice
    keys = torch.randn(num_facts, d, device=device, generator=gen)
    keys /= keys.norm(dim=1, keepdim=True)
    values = torch.randn(num_facts, d, device=device, generator=gen)
    values /= values.norm(dim=1, keepdim=True)
    facts = torch.randperm(num_facts, device=device, generator=gen)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    begin = time.perf_counter()
    mlp = factkernels.construct(keys, values, facts, outputs="values", progress=False)
    sync(device)
    seconds = time.perf_counter() - begin
    report = mlp.report
    width = report.gadget_width
    score_pass = 2 * num_facts * num_facts * d / rate
    if report.solver == "cg":
        solve = ("solve (the CG iterations' products)", 4 * num_facts * width * (d + 1) * report.m / rate
                 * report.cg_iterations)
    else:
        solve = ("solve (one Cholesky's F^3/3 FLOPs)", num_facts**3 / 3 / rate)
    row = {"d": d, "F": num_facts, "values": num_facts, "seconds": seconds, "accuracy": report.accuracy, "m": report.m,
           "m_search": report.m_search, "solver": report.solver, "cg_iterations": report.cg_iterations,
           "cg_preconditioner": report.cg_preconditioner,
           "gadget_width": width, "phases_s": report.timings, "gemm_float32_flops_per_s": rate,
           "limits_s": {"outputs (one score pass)": score_pass, "m_search (one decode per m tried)":
                        score_pass * len(report.m_search.split("->")), solve[0]: solve[1]}}
    if device.type == "cuda":
        row["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
    print(f"scale: {json.dumps(row)}", flush=True)
    del mlp, keys, values, facts
    if device.type == "cuda":
        torch.cuda.empty_cache()
    row["refusal"] = guard_only(device, d, refuse_facts, report.m)
    return row


def guard_only(device: torch.device, d: int, num_facts: int, m: int) -> dict:
    """What construct's memory guard says about outputs="values", solver="cg" at F = |V| = ``num_facts`` and
    code dimension ``m`` (the one the smaller build found; m grows with log |V| only), without building."""
    from factkernels.encoder import gadget_width
    from factkernels.memory import MemoryBudgetError, check_fits, estimate_build

    width = gadget_width(num_facts, d, 1.5)
    estimate = estimate_build(num_facts, num_facts, d, d, m=m, gadget_width=width, solver="cg", outputs="values",
                              device_type=device.type)
    begin = time.perf_counter()
    try:
        check_fits(estimate, device)
        verdict = {"fits": True, "note": "fits the free memory: not built here (far beyond a lent call's time)"}
    except MemoryBudgetError as err:
        verdict = {"fits": False, "message": str(err)}
    verdict.update(F=num_facts, d=d, m=m, estimate_bytes=estimate.total, estimate=str(estimate),
                   seconds=time.perf_counter() - begin)
    print(f"guard at F={num_facts}: {json.dumps(verdict)}", flush=True)
    return verdict


def _out_of_memory(err: BaseException) -> bool:
    return isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)) or "out of memory" in str(err).lower()


def bench_largest_f(device: torch.device, d: int, start: int, max_seconds: float) -> dict:
    """cg builds with F = |V| doubling from ``start`` until one runs out of memory or exceeds max_seconds."""
    attempts, largest = [], None
    num_facts = start
    while True:
        row = {"d": d, "F": num_facts, "solver": "cg"}
        try:
            keys, values, facts = (t.to(device) for t in random_fact_set(num_facts, num_facts, d, seed=0))
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            sync(device)
            begin = time.perf_counter()
            mlp = factkernels.construct(keys, values, facts, solver="cg", progress=False)
            sync(device)
            row.update(seconds=time.perf_counter() - begin, accuracy=mlp.report.accuracy, m=mlp.report.m)
            if device.type == "cuda":
                row["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
            del mlp
        except Exception as err:  # noqa: BLE001 - only running out of memory ends the search quietly
            if not _out_of_memory(err):
                raise
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        finally:
            keys = values = facts = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
        attempts.append(row)
        print(f"largest F: {json.dumps(row)}", flush=True)
        if "error" in row:
            break
        largest = row
        if row["seconds"] > max_seconds:
            break
        num_facts *= 2
    return {"largest": largest, "attempts": attempts, "max_seconds": max_seconds}


# U* rows: (|V|, d, method, backend, profile when the timed call took under this many seconds). The profiled call
# and the host-read count run only below it: profiling costs ~0.15 ms an operator (the H200's 65,536 x 256 call,
# 400k operators in 11 s, took ~70 s more profiled).
USTAR_ROWS = (
    (4096, 128, "auto", "auto", 20.0), (4096, 128, "dense", "auto", 20.0), (4096, 128, "active_set", "auto", 20.0),
    (4096, 128, "active_set", "kernels", 20.0), (4096, 128, "active_set", "torch", 20.0),
    (16384, 128, "active_set", "auto", 1.0), (16384, 128, "dense", "auto", 1.0))
# 65,536 x 256: time, passes and pass_seconds, profiled only below 5 s. Backend "kernels" (star_topk's CUDA kernel
# at k 192-384: 9.7 s, 8.1 s of it in passes, on the H200 in session 24's run 1) is left out; "torch" took 3.8 s.
USTAR_LARGE_ROWS = ((65536, 256, "auto", "auto", 5.0), (65536, 256, "auto", "torch", 0.0))
USTAR_QUICK_ROWS = ((512, 32, "auto", "auto", 20.0), (1024, 64, "auto", "auto", 20.0),
                    (1024, 64, "active_set", "kernels", 20.0))


def bench_ustar(device: torch.device, rows, budget_seconds: float) -> dict:
    """U* round trips (ustar_launches.measure) for each of ``rows``: time, rho, streaming passes and one pass's
    time, and, on calls under the row's profile threshold, the launches, host syncs, copies and top device
    kernels torch.profiler counts. backend "kernels" runs every compiled kernel (star_topk, and corral_solve
    where it has one on the device), "torch" their twins, "auto" what _ops picks. A row that raises (e.g.
    "kernels" without a CUDA corral_solve) records its error and the others still run; rows that would start
    after ``budget_seconds`` are listed as skipped."""
    out, begin = [], time.perf_counter()
    for n, d, method, backend, profile_below in rows:
        if time.perf_counter() - begin > budget_seconds:
            out.append({"n": n, "d": d, "method": method, "backend": backend,
                        "skipped": f"the section's budget of {budget_seconds:.0f} s was spent"})
            continue
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        try:
            out.append(measure_ustar(device, n, d, method=method, backend=backend, count_below=profile_below))
        except Exception:  # noqa: BLE001 - recorded; the next rows still measure
            out.append({"n": n, "d": d, "method": method, "backend": backend,
                        "error": traceback.format_exc()[-3000:]})
            print(f"ustar {n}x{d} {method} {backend}: failed\n{out[-1]['error']}", file=sys.stderr, flush=True)
    return {"rows": out, "targets": {"4096x128": "<= 15 ms, <= 300 launches, <= 10 host syncs",
                                     "65536x256": "<= 3 s"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="a .json file, or a folder for gpu_suite-<device>.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script, measures nothing")
    parser.add_argument("--skip-tests", action="store_true", help="benchmarks only")
    parser.add_argument("--only", type=lambda text: set(text.split(",")), default=None,
                        help=f"comma-separated sections to run, of {','.join(SECTIONS)} (default: all)")
    parser.add_argument("--largest-d", type=int, default=128, help="d of the largest-F search")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="stop the largest-F search past this")
    parser.add_argument("--tests-timeout", type=float, default=600.0, help="seconds the CUDA tests may take")
    parser.add_argument("--scale-facts", type=int, default=2**18, help="F = |V| of the scale section's build")
    parser.add_argument("--scale-d", type=int, default=1024, help="d of the scale section")
    parser.add_argument("--ustar-large", action=argparse.BooleanOptionalAction, default=True,
                        help="the U* rows at 65,536 x 256 (backend auto and torch: ~15 s on an H200)")
    parser.add_argument("--ustar-seconds", type=float, default=150.0,
                        help="U* rows that would start past this many seconds into the section are skipped")
    args = parser.parse_args(argv)
    if args.only and not args.only <= set(SECTIONS):
        parser.error(f"--only takes sections of {','.join(SECTIONS)}, got {','.join(sorted(args.only))}")
    device = torch.device(args.device)
    reason = cuda_unavailable_reason(device)
    if reason is not None:
        print(f"gpu_suite: cannot run on {device}: {reason}. Nothing was written.", file=sys.stderr)
        return NO_DEVICE_STATUS
    if device.type == "cpu" and not args.quick:
        parser.error("--device cpu is a smoke run of this script: add --quick")

    out = Path(args.out)
    if out.suffix != ".json":
        name = torch.cuda.get_device_name(device).replace(" ", "_") if device.type == "cuda" else "cpu"
        out = out / f"gpu_suite-{name}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"environment": device_info(device), "quick": args.quick, "command": sys.argv}

    def section(name: str, measure) -> None:
        """Run one section and rewrite the JSON at once: a run cut off by a lent machine's time limit keeps
        every finished section, and one that fails records its error and lets the others run."""
        if args.only and name not in args.only:
            return
        begin = time.perf_counter()
        try:
            report[name] = measure()
        except Exception:  # noqa: BLE001 - recorded in the report; the other sections still measure
            report[name] = {"error": traceback.format_exc()[-4000:]}
            print(f"{name}: failed\n{report[name]['error']}", file=sys.stderr, flush=True)
        report.setdefault("section_seconds", {})[name] = time.perf_counter() - begin
        out.write_text(json.dumps(report, indent=2, default=str))

    if not args.skip_tests:
        section("tests", lambda: run_cuda_tests(args.tests_timeout))
    rate = gemm_rate(device)
    report["gemm_float32_flops_per_s"] = rate
    section("kernels", lambda: bench_kernels(device, args.quick, rate) + bench_star_topk(
        device, STAR_TOPK_QUICK_RACES if args.quick else STAR_TOPK_RACES, rate))
    section("attention", lambda: bench_attention(device, args.quick, rate))
    d, num_facts = (32, 256) if args.quick else (128, 4096)
    section("construct", lambda: {
        "values_cholesky": bench_construct(device, [(d, num_facts, 64 if args.quick else 96)], per_gadget_max_f=0),
        "values": bench_build(device, d, num_facts, outputs="values"),
        "default": bench_build(device, d, num_facts)})
    ustar_rows = USTAR_QUICK_ROWS if args.quick else USTAR_ROWS + (USTAR_LARGE_ROWS if args.ustar_large else ())
    section("ustar", lambda: bench_ustar(device, ustar_rows, args.ustar_seconds))
    section("scale", lambda: bench_scale(device, *((32, 1024, 2**12) if args.quick else
                                                   (args.scale_d, args.scale_facts, 2**20)), rate))

    def gd_batch() -> dict:
        result = race_gd_searches(["gd", "gd+jl", "bin+gd", "gd+gd"], d=16, facts=16 if args.quick else 64,
                                  seeds=3, gd_steps=1000 if args.quick else 3000, repeats=1, device=str(device))
        # F = 64 even when quick: width 2 must store none of the facts for every model to train all steps
        result["step_cost"] = gd_step_costs(d=16, facts=64, steps=500, repeats=1, device=str(device))
        # does a batch of 3 still cost less than 3 models at F = |V| = 2,048? (capacity.SERIAL_LOGITS)
        if not args.quick:
            result["step_cost_by_size"] = gd_step_costs_by_size(repeats=1, device=str(device))
            result["loss_kernel"] = gd_loss_kernel_race(repeats=1, device=str(device))
        return result

    section("gd_batch", gd_batch)
    # last: open-ended, it doubles F until memory or --max-seconds runs out
    section("largest_f", lambda: bench_largest_f(device, 16 if args.quick else args.largest_d,
                                                 256 if args.quick else 8192, 1.0 if args.quick else args.max_seconds))
    print(f"wrote {out}")
    tests_failed = report.get("tests", {}).get("returncode", 0) not in (0, 5)  # 5: no test collected
    failed_sections = [name for name, value in report.items() if isinstance(value, dict) and "error" in value]
    return 1 if tests_failed or failed_sections else 0


if __name__ == "__main__":
    sys.exit(main())
