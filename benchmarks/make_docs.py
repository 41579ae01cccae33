"""Regenerate the tables of README.md and docs/ from the JSON committed under benchmarks/results/.

A table lives in a page between ``<!-- table:NAME -->`` and ``<!-- /table -->``; everything between the
markers is rewritten from ``TABLES[NAME]``, so a number in a table is never typed by hand. Each table ends
with the JSON it was read from, as a path relative to the repository.

    python benchmarks/make_docs.py            # rewrite every table in place
    python benchmarks/make_docs.py --check    # exit 1 naming each page whose tables differ (test_docs.py runs it)
"""

import argparse
import ast
import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "benchmarks/results"
MARKED = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
# Committed experiment folders, smallest run first (the claims table reads them in this order).
RUN_FOLDERS = ("experiments", "experiments-seed", "experiments-seed-length")


@lru_cache(maxsize=None)
def load(path: str) -> dict:
    """The JSON at ``path`` (relative to the repository)."""
    return json.loads((ROOT / path).read_text())


def _rows(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# Links in a table name repository paths after REPO_LINK; render() turns it into the page's way up to the root.
REPO_LINK = "<repository>/"


def _link(path: str) -> str:
    return f"[`{path}`]({REPO_LINK}{path})"


def _source(*paths: str) -> str:
    return "\n\nFrom " + ", ".join(_link(path) for path in paths) + "."


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:.0f} MiB"


def _shape(row: dict) -> str:
    """The sizes a race ran at: its integer entries other than byte and FLOP counts."""
    return ", ".join(f"{key}={value}" for key, value in row.items()
                     if type(value) is int and key != "flops" and not key.endswith("_bytes"))


def _over_limit(row: dict) -> str:
    # The physical reference bench.py and gpu_suite.py time beside each kernel (absent in older JSON).
    return f"{row['kernel_over_limit']:.1f}×" if "kernel_over_limit" in row else "–"


# --- kernels and construction ---------------------------------------------------------------------------

def cpu_construct() -> str:
    path = f"{RESULTS}/cpu.json"
    builds = load(path)["construct"]
    floor = any("cholesky_s" in r for r in builds)  # timed beside each build since bench.py measured it
    rows = []
    for r in builds:
        per_gadget = r.get("per_gadget_s")
        rows.append([r["d"], r["F"], r["m"], _ms(r["kernels_s"]), _ms(r["torch_s"]),
                     f"{per_gadget:.1f} s" if per_gadget else "–", f"{r['speedup_vs_torch']:.2f}×",
                     f"{r['speedup_vs_per_gadget']:.0f}×" if per_gadget else "–"]
                    + ([_ms(r["cholesky_s"]) if "cholesky_s" in r else "–"] if floor else []))
    header = (["d", "F", "m", "kernels", "best pure torch", "per_gadget (Alg. 3 verbatim)", "vs torch", "vs per_gadget"]
              + (["one Cholesky of the F×F Gram (the floor)"] if floor else []))
    return _rows(header, rows) + _source(path)


def cpu_kernels() -> str:
    path = f"{RESULTS}/cpu.json"
    kernels = load(path)["kernels"]
    limit = any("kernel_over_limit" in r for r in kernels)
    rows = [[r["kernel"], _shape(r), f"{r['kernel_ms']:.1f} ms", f"{r['torch_ms']:.1f} ms", f"{r['speedup']:.2f}×"]
            + ([_over_limit(r)] if limit else []) for r in kernels]
    header = ["kernel", "shape", "kernel", "torch", "speedup"] + (["kernel / physical limit"] if limit else [])
    return _rows(header, rows) + _source(path)


def gpu_kernels() -> str:
    paths = {"H200": f"{RESULTS}/gpu_suite-NVIDIA_H200.json", "H100": f"{RESULTS}/gpu_suite-NVIDIA_H100_80GB_HBM3.json"}
    races: dict[tuple, dict] = {}
    for gpu, path in paths.items():
        suite = load(path)
        for r in suite["kernels"] + suite.get("attention", []):
            races.setdefault((r["kernel"], _shape(r)), {})[gpu] = r
    limited = {gpu for gpu in paths for by_gpu in races.values() if "kernel_over_limit" in by_gpu.get(gpu, {})}
    columns = {gpu: ("kernel", "torch", "speedup") + (("kernel / physical limit",) if gpu in limited else ())
               for gpu in paths}
    header = ["kernel", "shape"] + [f"{gpu} {column}" for gpu in paths for column in columns[gpu]]
    rows = []
    for (kernel, shape), by_gpu in races.items():
        cells = []
        for gpu in paths:
            r = by_gpu.get(gpu)
            if r and r["kernel_ms"] is None:  # a run after its CUDA kernel was removed: the twin only
                cells += ["no kernel", f"{r['torch_ms']:.2f} ms", "–"] + (["–"] if gpu in limited else [])
            else:
                cells += ([f"{r['kernel_ms']:.2f} ms", f"{r['torch_ms']:.2f} ms", f"{r['speedup']:.2f}×"]
                          + ([_over_limit(r)] if gpu in limited else []) if r else ["–"] * len(columns[gpu]))
        rows.append([kernel, shape] + cells)
    return _rows(header, rows) + _source(*paths.values())


def gpu_largest_f() -> str:
    path = f"{RESULTS}/gpu_suite-NVIDIA_H200.json"
    rows = [[r["d"], f"{r['F']:,}", r["solver"], r["m"], f"{r['seconds']:.1f} s", f"{r['accuracy']:.3f}",
             f"{r['peak_gpu_bytes'] / 2**30:.2f} GiB"] for r in load(path)["largest_f"]["attempts"]]
    return _rows(["d", "F", "solver", "m", "time", "accuracy", "peak GPU memory"], rows) + _source(path)


def ustar_scale() -> str:
    path = f"{RESULTS}/ustar_cpu.json"
    rows = []
    for case in load(path)["cases"]:
        if case["kind"] != "ustar":
            continue
        passes = (f"{case['streaming_passes']} passes of {case['pass_seconds']:.2f} s"
                  if case["streaming_passes"] else "–")
        rows.append([f"{case['n']:,}", case["d"], case["method"], f"{case['seconds']:.1f} s", passes,
                     _mib(case["peak_extra_bytes"]), f"{case['rho']:.4f}"])
    return _rows(["\\|V\\|", "d", "method", "time", "streaming passes", "peak extra memory", "ρ"], rows) + _source(path)


def construct_default() -> str:
    path, cg_path = f"{RESULTS}/ustar_cpu.json", f"{RESULTS}/construct_cg_32768.json"
    rows = []
    for case in load(path)["cases"]:
        if case["kind"] in ("construct_default", "values_vs_chol"):
            phases = case["phases_s"]
            outputs = "U* (default)" if case["kind"] == "construct_default" else "values"
            rows.append([f"{case['n']:,}", case["d"], outputs, "auto", case["threads"], f"{case['seconds']:.2f} s",
                         f"{phases['outputs']:.2f} s", f"{phases['solve']:.2f} s", _mib(case["peak_extra_bytes"]),
                         f"{case['accuracy']:.3f}"])
    cg = load(cg_path)
    report = cg["construct_json"]["report"]
    timings = report["timings"]
    rows.append([f"{report['num_facts']:,}", report["d_in"], "U* (default)", report["solver"], cg.get("threads", 1),
                 f"{timings['total'] / 60:.1f} min", f"{timings['outputs'] / 60:.1f} min",
                 f"{timings['solve'] / 60:.1f} min ({report['cg_iterations']} iterations)",
                 f"{cg['usr_bin_time']['max_rss_bytes'] / 2**30:.2f} GiB (whole process)", f"{report['accuracy']:.3f}"])
    header = ["F = \\|V\\|", "d", "outputs", "solver", "threads", "time", "outputs time", "solve time", "peak memory",
              "accuracy"]
    return _rows(header, rows) + _source(path, cg_path)


def values_vs_cholesky() -> str:
    paths = [f"{RESULTS}/ustar_cpu-s23-values{tag}.json" for tag in ("-before", "", "-before-2threads", "-2threads")]
    rows = []
    for path in paths:
        report = load(path)
        for case in report["cases"]:
            if case["kind"] != "values_vs_chol":
                continue
            floor = case.get("floor")
            rows.append([f"{case['n']:,}", case["d"], case["threads"], f"{case['loadavg_before'][0]:.0f}",
                         f"`{report['environment'].get('code', '?')}`", f"{case['construct_best_cpu_s']:.3f} s",
                         f"{case['cholesky_torch_cpu_s']:.3f} s", f"{case['cholesky_scipy_cpu_s']:.3f} s",
                         f"{case['ratio_best_cpu']:.2f}×", f"{case['construct_best_cpu_s'] / case['cholesky_torch_cpu_s']:.2f}×",
                         f"{floor['floor_ratio']:.2f}× / {floor['floor_ratio_with_weights_and_rho']:.2f}×" if floor else "–",
                         f"{case['ratio_best_wall']:.2f}×"])
    header = ["F = \\|V\\|", "d", "threads", "load", "code", "values build (CPU)", "torch Cholesky (CPU)",
              "scipy potrf (CPU)", "ratio to the faster (CPU)", "ratio to torch's (CPU)", "floor (CPU)",
              "ratio to the faster (wall)"]
    return _rows(header, rows) + _source(*paths)


def incremental() -> str:
    paths = sorted((str(p.relative_to(ROOT)) for p in (ROOT / RESULTS).glob("incremental_*.json")),
                   key=lambda path: (load(path)["setting"]["facts_before"], path))
    rows = []
    for path in paths:
        run = load(path)
        setting = run["setting"]
        solver = "cg" if "cg" in Path(path).stem else "cholesky"
        # CPU seconds of the one thread where recorded (the work done, whatever else loads the shared machine)
        cpu = run.get("cpu_seconds")
        s, clock, prefix = (cpu, "CPU", "cpu_") if cpu else (run["seconds"], "wall", "")
        versus = run.get(f"{prefix}speedup_vs_construct_cholesky")
        limit = run.get("multiply_adds", {}).get("speedup_at_equal_rate")
        at_floor = run.get("cpu_speedup_at_floor")  # the add's unavoidable products alone, timed in the same run
        rows.append([f"{setting['facts_before']:,}", setting["facts_added"], setting["dim"], solver,
                     f"{s['add']:.2f} s {clock}", f"{s['rebuild_factbuilder']:.2f} s {clock}",
                     f"{run[f'{prefix}speedup_vs_rebuild_factbuilder']:.2f}×", f"{versus:.2f}×" if versus else "–",
                     f"{at_floor:.2f}×" if at_floor else "–", f"{limit:.1f}×" if limit else "–",
                     f"{run['environment']['load_average_1min']:.0f}"])
    header = ["facts", "added", "d", "solver", "add", "fresh FactBuilder", "vs fresh FactBuilder",
              "vs construct(cholesky)", "add at its floor", "multiply-add ratio", "load"]
    return _rows(header, rows) + _source(*paths)


def gd_batch() -> str:
    paths = [f"{RESULTS}/gd_batch.json", f"{RESULTS}/gpu_suite-NVIDIA_H200.json"]
    rows = []
    for path, where in zip(paths, ("CPU, 1 thread", "H200")):
        run = load(path)
        for r in (run["rows"] if "rows" in run else run["gd_batch"]["rows"]):
            rows.append([where, r["method"], f"{r['batched']['seconds']:.1f} s", f"{r['one_at_a_time']['seconds']:.1f} s",
                         f"{r['every_seed']['seconds']:.1f} s", f"{r['speedup']:.2f}×",
                         f"{r['speedup_vs_every_seed']:.2f}×"])
    header = ["device", "method", "batched", "serial search", "every seed one at a time", "vs serial",
              "vs every seed"]
    return _rows(header, rows) + _source(*paths)


def cg_precond() -> str:
    """CG on the gadget Gram: Jacobi against the deflation of the constant vector and of the keys' span, on CPU,
    and the 2^18 x 1,024 GPU solve projected from them."""
    path, spectrum_path = f"{RESULTS}/cg_precond-cpu.json", f"{RESULTS}/cg_precond-spectrum-cpu.json"
    data = load(path)
    spectrum = _rows(["F", "d", "F/(d+1)", "top eigenvalues", "(d+1)-th, (d+2)-th", "median", "min",
                      "condition (without the d+1 top)", "Ritz on [K, 1]: top, median", "Ritz on the gate span: median"],
                     [[f"{r['F']:,}", r["d"], f"{r['facts_per_key_column']:.0f}",
                       ", ".join(f"{v:.1f}" for v in r["top"][:3]),
                       f"{r['eigenvalue_d_plus_1']:.2f}, {r['eigenvalue_d_plus_2']:.2f}", f"{r['quantiles']['0.5']:.2f}",
                       f"{r['min']:.3f}", f"{r['condition']:.0f} ({r['condition_without_keys_span']:.0f})",
                       f"{r['ritz_keys_span']['top'][0]:.1f}, {r['ritz_keys_span']['top'][1]:.1f}; "
                       f"{r['ritz_keys_span']['median']:.2f}", f"{r['ritz_gate_span']['median']:.2f}"]
                      for r in load(spectrum_path)["spectrum"]])
    jacobi = {(r["F"], r["d"]): r for r in data["solve"] if r["preconditioner"] == "jacobi"}
    rows = []
    for r in data["solve"]:
        base = jacobi.get((r["F"], r["d"]))
        ratio = f"{base['iteration_equivalents'] / r['iteration_equivalents']:.2f}×" if base else "–"
        rows.append([f"{r['F']:,}", f"{r['d']:,}", f"{r['facts_per_key_column']:.0f}", r["m"], r["preconditioner"]
                     + (" (auto)" if r["preconditioner"] == r["auto_picks"] else ""), r["iterations"],
                     f"{r['setup_columns'] / r['m']:.1f}", ratio, f"{r['residual']:.1e}", f"{r['solve_cpu_s']:.1f} s",
                     f"{r['setup_cpu_s']:.2f} s" if "setup_cpu_s" in r else "–"])
    text = (spectrum + f"\n\nOne thread, load {data['loadavg_before'][0]:.1f}, tol {data['tol']:g}, unit Gaussian keys, "
            "width multiplier 1.5, m Gaussian right-hand sides.\n\n"
            + _rows(["F", "d", "F/(d+1)", "m", "preconditioner", "iterations", "setup (iterations)",
                     "fewer products than Jacobi", "residual", "solve CPU", "setup CPU"], rows))
    if data["construct"]:
        text += "\n\n" + _rows(["construct F", "d", "preconditioner", "m", "accuracy", "min margin", "iterations",
                                 "residual", "CPU"],
                                [[f"{r['F']:,}", r["d"], r["preconditioner"], r["m"], f"{r['accuracy']:.3f}",
                                  f"{r['min_margin']:.3g}", r["cg_iterations"], f"{r['residual']:.1e}",
                                  f"{r['cpu_s']:.1f} s"] for r in data["construct"]])
    g = data.get("gpu_projection")
    if g:
        b = g["h200_build_session24"]
        text += (f"\n\nProjected, not measured: F = 2^18, d = 1,024 on an H200 ({g['basis']} {g['ratio']:.2f}): "
                 f"{g['iterations']} "
                 f"iterations x {g['seconds_per_iteration']:.2f} s + setup {g['setup_s']:.1f} s = solve "
                 f"{g['solve_s']:.0f} s (measured with Jacobi: {b['solve_s']:.1f} s in {b['jacobi_iterations']} iterations, "
                 f"s24 run 2), build {g['total_s']:.0f} s with run 3's other phases ({b['other_phases_s']:.1f} s; run 2's "
                 f"whole build {b['total_s']:.1f} s; target 45 s)"
                 + ("; over the rows where auto deflates the keys (ratios "
                    + " to ".join(f"{p['ratio']:.2f}" for p in g["range_over_auto_keys_rows"]) + "): solve "
                    + " to ".join(f"{p['solve_s']:.0f} s" for p in g["range_over_auto_keys_rows"]) + ", build "
                    + " to ".join(f"{p['total_s']:.0f} s" for p in g["range_over_auto_keys_rows"])
                    if g["range_over_auto_keys_rows"] else "") + ".")
    gpu_path = f"{RESULTS}/cg_precond-NVIDIA_H200.json"
    gpu = load(gpu_path)["solve"]
    jacobi_gpu = next(r for r in gpu if r["preconditioner"] == "jacobi")
    text += ("\n\nMeasured on one H200 (session 28, F = 2^18, d = 1,024, m = 79, the solve alone):\n\n"
             + _rows(["preconditioner", "iterations", "setup (iterations)", "residual", "setup", "solve",
                      "solve vs Jacobi"],
                     [[r["preconditioner"] + (" (auto)" if r["preconditioner"] == r["auto_picks"] else ""),
                       r["iterations"], f"{r['setup_columns'] / r['m']:.1f}", f"{r['residual']:.1e}",
                       f"{r['setup_wall_s']:.1f} s" if "setup_wall_s" in r else "–", f"{r['solve_wall_s']:.1f} s",
                       f"{jacobi_gpu['solve_wall_s'] / r['solve_wall_s']:.2f}×"] for r in gpu]))
    return text + _source(spectrum_path, path, gpu_path)


def gd_stop() -> str:
    path = f"{RESULTS}/gd_stop.json"
    run = load(path)
    rows = [[r["noise"], f"{r['rows_decoded']:.3f}", f"{r['rows_inside_radius']:.4f}", _ms(r["full_seconds"]),
             f"{r['radius_seconds'] * 1000:.3f} ms", f"{r['speedup']:.2f}×"] for r in run["rows"]]
    header = ["noise", "rows decoded", "rows inside their radius", "all F × \\|V\\| logits", "radius test", "speedup"]
    setting = run["setting"]
    return (_rows(header, rows) + f"\n\nF = {setting['facts']:,} facts, {setting['values']:,} values, d = {setting['d']}, "
            f"{run['threads']} thread." + _source(path))


H200_RUN = f"{RESULTS}/gpu_suite-NVIDIA_H200-construct-ustar-scale.json"
# The lent runs since session 24, in order (each a device_check.sh call; the GPU it ran on is in its file name).
LENT_RUNS = {"s24 run 1": f"{RESULTS}/gpu_suite-NVIDIA_H200-s24-run1.json",
             "s24 run 2": f"{RESULTS}/gpu_suite-NVIDIA_H200-s24-run2.json",
             "s24 run 3": f"{RESULTS}/gpu_suite-NVIDIA_H200-s24-run3.json",
             "s28 run 1": f"{RESULTS}/gpu_suite-NVIDIA_H200-s28-run1.json",
             "s28 run 2": f"{RESULTS}/gpu_suite-NVIDIA_H200-s28-run2.json",
             "s31 run 1": f"{RESULTS}/gpu_suite-NVIDIA_H200-s31-run1.json",
             "s31 scale": f"{RESULTS}/gpu_suite-NVIDIA_H200-s31-scale.json"}
# The README's GPU rows: the latest run of the construct section and of the scale section
LATEST_RUN = LENT_RUNS["s31 run 1"]
LATEST_SCALE_RUN = LENT_RUNS["s31 scale"]


def _gpu_of(path: str) -> str:
    return load(path)["environment"]["gpu"].replace("NVIDIA ", "")


def gpu_builds() -> str:
    """The values and the default build at F = |V| = 4,096, d = 128: session 21's run, then each lent run since."""
    old = load(H200_RUN)["construct"]
    rows = [["s21", _gpu_of(H200_RUN), "values, m 96 given", f"{old['values_cholesky'][0]['kernels_s'] * 1e3:.1f} ms", "–",
             "–", f"{old['values_cholesky'][0]['cholesky_s'] * 1e3:.2f} ms",
             f"{old['values_cholesky'][0]['kernels_over_cholesky']:.1f}×"],
            ["s21", _gpu_of(H200_RUN), "default (U*)", f"{old['default']['seconds'] * 1e3:.1f} ms "
             f"(U* {old['default']['phases_ms']['outputs']:.1f} ms)", "–", "–",
             f"{old['default']['limit_s'] * 1e3:.2f} ms", f"{old['default']['seconds_over_limit']:.0f}×"]]
    for label, path in LENT_RUNS.items():
        construct = load(path).get("construct", {})
        for name, build in (("values, m searched", construct.get("values")), ("default (U*)", construct.get("default"))):
            if build is None:
                continue
            cuda = build["profile"]["cuda"]
            u_star = f" (U* {build['phases_ms']['outputs']:.1f} ms)" if name.startswith("default") else ""
            rows.append([label, _gpu_of(path), name, f"{build['seconds'] * 1e3:.1f} ms{u_star}",
                         f"{cuda['kernel_launches']:,}", f"{cuda['stream_syncs']} / {build['profile']['host_syncs']}",
                         f"{build['limit_s'] * 1e3:.2f} ms", f"{build['seconds_over_limit']:.1f}×"])
    header = ["run", "GPU", "build (d = 128, F = \\|V\\| = 4,096)", "time (backend auto)", "CUDA launches",
              "stream / host syncs", "one Cholesky of the Gram", "time / Cholesky"]
    return _rows(header, rows) + _source(H200_RUN, *LENT_RUNS.values())


def gpu_ustar() -> str:
    runs = {"s21 first run": H200_RUN,
            "s21 sync-free corral steps": f"{RESULTS}/gpu_suite-NVIDIA_H200-construct-ustar-syncfree.json", **LENT_RUNS}
    rows = []
    for label, path in runs.items():
        for r in load(path).get("ustar", {}).get("rows", []):
            if r.get("error") or (label.startswith("s24") and r["method"] == "dense" and r["n"] < 16384):
                continue
            cuda = r.get("cuda", {})
            rows.append([label, _gpu_of(path), f"{r['n']:,}", r["d"], r["method"], r["backend"],
                         _ms(r["seconds"]) if r["seconds"] < 1 else f"{r['seconds']:.2f} s", f"{r['rho']:.4f}",
                         r["passes"], f"{cuda['kernel_launches']:,}" if cuda else "–",
                         cuda.get("stream_syncs", "–"), r.get("host_syncs", "–"),
                         f"{r['peak_gpu_bytes'] / 2**30:.2f} GiB"])
    header = ["run", "GPU", "\\|V\\|", "d", "method", "backend", "time", "ρ", "streaming passes", "CUDA launches",
              "stream syncs", "host syncs", "peak GPU memory"]
    return _rows(header, rows) + _source(*runs.values())


def gpu_star_topk() -> str:
    """star_topk's CUDA kernel against its torch twin (GEMMs + torch.topk) at U*'s pass widths, each lent run."""
    rows = []
    for label, path in LENT_RUNS.items():
        for r in load(path).get("kernels", []):
            if r["kernel"] != "star_topk":
                continue
            rows.append([label, _gpu_of(path), f"{r['nv']:,}", r["d"], r["k"], f"{r.get('rows', r['nv']):,}",
                         f"{r['kernel_ms']:.2f} ms", f"{r['torch_ms']:.2f} ms", f"{r['speedup']:.2f}×",
                         f"{r['limit_ms']:.2f} ms"])
    header = ["run", "GPU", "\\|V\\|", "d", "k", "rows", "kernel", "twin", "kernel speedup", "GEMM-rate limit"]
    return _rows(header, rows) + _source(*LENT_RUNS.values())


def gpu_scale() -> str:
    """The 2^18 x 1,024 values build: session 21's run, then each lent run with a scale section."""
    runs = {"s21": H200_RUN, **{label: path for label, path in LENT_RUNS.items() if "scale" in load(path)}}
    scales = {label: load(path)["scale"] for label, path in runs.items()}
    last_label, last = list(scales.items())[-1]
    limits = {name.split(" ")[0]: seconds for name, seconds in last["limits_s"].items()}
    rows = [[phase] + [f"{scale['phases_s'][phase]:.1f} s" for scale in scales.values()]
            + [f"{limits[phase]:.1f} s" if phase in limits else "–",
               next((name.split("(", 1)[1].rstrip(")") for name in last["limits_s"] if name.startswith(phase)), "–")]
            for phase in ("outputs", "m_search", "solve", "verify")]
    rows.append(["total"] + [f"{scale['seconds']:.1f} s" for scale in scales.values()] + ["–", "–"])
    rows.append(["cg iterations"] + [str(scale["cg_iterations"]) for scale in scales.values()] + ["–", "–"])
    refusal = last["refusal"]
    return (f"d = {last['d']:,}, F = \\|V\\| = {last['F']:,}, outputs = values, on an {_gpu_of(runs[last_label])}: "
            f"accuracy {last['accuracy']:.3f} in every run, m = {last['m']} ({last['m_search']}), {last['solver']}, "
            f"peak GPU memory {last['peak_gpu_bytes'] / 2**30:.1f} GiB ({last_label}).\n\n"
            + _rows(["phase", *scales, "physical limit", "limit measured as"], rows)
            + f"\n\nThe memory guard's estimate for F = {refusal['F']:,} at d = {refusal['d']:,}: "
            f"{refusal['estimate_bytes'] / 2**30:.1f} GiB ({refusal['estimate']}); {refusal['note']}."
            + _source(*runs.values()))


# --- attention (seed 002) --------------------------------------------------------------------------------

def construction2_f1() -> str:
    path = f"{RESULTS}/attention/construction2_f1.json"
    cells = load(path)["cells"]
    widths = sorted({c["d_model"] for c in cells})
    f1 = {(c["m"], c["d_model"]): c["f1"] for c in cells}
    rows = [[m] + [f"{f1[m, w]:.3f}" if (m, w) in f1 else "–" for w in widths] for m in sorted({c["m"] for c in cells})]
    return _rows(["m"] + [f"d_model = {w}" for w in widths], rows) + _source(path)


def attention_kernel_cpu() -> str:
    path = f"{RESULTS}/attention/bench_cpu.json"
    rows = [[r["kernel"].replace("max_heads ", ""), _shape(r), f"{r['kernel_ms']:.1f} ms", f"{r['torch_ms']:.1f} ms",
             f"{r['speedup']:.2f}×", f"{r['twin_per_head_scores_bytes'] / 2**20:.0f} MiB",
             f"{r['kernel_packed_keys_bytes'] / 2**20:.0f} MiB"] for r in load(path)["attention"]]
    header = ["output", "shape", "kernel", "torch twin", "speedup", "twin's per-head scores", "kernel's packed keys"]
    return _rows(header, rows) + _source(path)


def _budget_points(path: str) -> str:
    points = load(path)["summary"]["points"]
    degree = ["r"] if "degree" in points[0] else []
    rows = [[p["m"], p["d_model"]] + [p[k] for k in ("degree",) if degree] + [p["key_budget"],
             f"{p['key_budget_lower']}–{p['key_budget_upper']}", p["best_heads"],
             "–".join(str(h) for h in sorted(set(p["heads_range"] or ["–"])))] for p in points]
    return _rows(["m", "d_model"] + degree + ["D_K*", "interval", "h*",
                                              "head counts not significantly worse (App. A.2)"], rows)


def rgr_budget() -> str:
    path = f"{RESULTS}/experiments/rgr-budget/summary.json"
    fits, seed = load(path)["summary"]["fits"], load(path)["summary"]["seed_fits"]
    dk, heads = fits["key_budget"], fits["heads"]
    fit_line = (f"\n\nFits: D_K* ≈ {dk['slope']:.2f} m log2(m) / d_model (R² {dk['r2']:.3f}, {dk['points']} points; "
                f"seed {seed['key_budget_slope']}, R² {seed['key_budget_r2']}); h* ≈ {heads['slope']:.2f} m / d_model "
                f"{heads['intercept']:+.2f} (R² {heads['r2']:.3f}; seed {seed['heads_slope']}, {seed['heads_intercept']}, "
                f"R² {seed['heads_r2']}).")
    return _budget_points(path) + fit_line + _source(path)


def rgr_regular() -> str:
    path = f"{RESULTS}/experiments/rgr-regular/summary.json"
    summary = load(path)["summary"]
    fit = summary["fit"]
    return (_budget_points(path) + f"\n\nFit: D_K* ≈ {fit['slope']:.2f} x (R² {fit['r2']:.3f}; seed "
            f"{summary['seed_fit']['slope']})." + _source(path))


def rgr_softmax() -> str:
    path = f"{RESULTS}/experiments-seed/rgr-softmax/summary.json"
    rows = [[p["m"], p["d_model"], p["aggregation"], p["key_budget"] or "–", p["best_heads"] or "–",
             p["single_head_budget"] or "never", p["multi_head_budget"] or "never"]
            for p in load(path)["summary"]["panels"]]
    header = ["m", "d_model", "model", "D_K*", "h*", "smallest D_K where one head's F1 interval clears 0.99",
              "where several heads' does"]
    return _rows(header, rows) + _source(path)


def rgr_diagonal() -> str:
    path = f"{RESULTS}/experiments/rgr-diagonal/summary.json"
    return _budget_points(path) + _source(path)


# --- real models -----------------------------------------------------------------------------------------

def hf_insert() -> str:
    paths = sorted(str(p.relative_to(ROOT)) for p in (ROOT / RESULTS / "hf").glob("insert_detector_*.json"))
    runs = sorted((load(p) for p in paths), key=lambda r: (r["report"]["num_facts"], -r["report"]["layer"]))
    rows = []
    for run in runs:
        report, scores = run["report"], run["scores"]
        config = run["config"]
        threshold = "per unit (adaptive)" if config.get("adaptive_threshold") else f"{config['threshold']}"
        rows.append([f"{report['num_facts']:,}", report["layer"], threshold, f"{report['hidden_added']:,}",
                     f"{scores['efficacy']:.3f} (min margin {report['min_margin']:.1f})", f"{scores['paraphrase']:.3f}",
                     f"{scores['neighborhood']:.3f}", f"{scores['perplexity_ratio']:.4f}", f"{scores['kl_mean']:.1e}",
                     f"{run['insert_seconds']:.0f} s"])
    header = ["facts", "layer", "threshold", "units added", "efficacy", "paraphrase", "neighborhood", "ppl ratio", "KL",
              "insert time"]
    return _rows(header, rows) + _source(*paths)


REAL_LM = f"{RESULTS}/experiments/real-lm-editing/cells/"


@lru_cache(maxsize=None)
def _real_lm_summary() -> dict:
    """The summary of every committed real-lm-editing cell (read from the cells, so helpers landing cells never
    leave a stale summary behind the table)."""
    from factkernels.experiments import engine
    from factkernels.experiments.real_lm_editing import NAME
    from factkernels.experiments.real_lm_editing_report import summarize

    return summarize(list(engine.load_cells(ROOT / RESULTS / "experiments", NAME).values()))


def real_lm_editing(kind: str = "known") -> str:
    from factkernels.experiments.real_lm_editing_report import markdown_table

    return markdown_table(_real_lm_summary(), kind=kind) + _source(REAL_LM)


def _real_lm_headline() -> list:
    """The README row: ours at the most known facts edited at once on the test draws, beside the best other method."""
    from factkernels.editing import method_names
    from factkernels.experiments.real_lm_editing_report import draws_text, headline_rows, row_size

    ours, best, unedited = headline_rows(_real_lm_summary())
    mean = lambda row, k: row["metrics"][k]["mean"]  # noqa: E731
    before = f" (unedited {mean(unedited, 'paraphrase_score'):.2f})" if unedited else ""
    exact = f" (exact {mean(ours, 'efficacy_exact'):.3f})" if "efficacy_exact" in ours["metrics"] else ""
    text = (f"efficacy {mean(ours, 'efficacy_score'):.3f}{exact}, paraphrase {mean(ours, 'paraphrase_score'):.2f}{before}, "
            "neighbourhood "
            f"{mean(ours, 'neighbourhood_score'):.2f}, harmonic mean {ours['hmean']:.2f}")
    if "kl_mean" in ours["metrics"]:  # locality on held-out text beside the prompt scores
        text += (f"; held-out text: KL {mean(ours, 'kl_mean'):.1e}, perplexity ×{mean(ours, 'perplexity_ratio'):.3f}")
    summary = _real_lm_summary()

    def not_run(size: tuple) -> str:
        run = {r["method"] for r in summary["rows"] if row_size(r) == size and r["split"] == "test"}
        missing = [m for m in method_names(real_lm=True) if m not in run]
        return f" ({', '.join(missing)} not run yet)" if missing else ""

    if best:
        text += f"; best other method run at this size: {best['method']}, {best['hmean']:.2f}" + not_run(row_size(ours))
    else:  # no other method at ours' largest size: the largest size where one ran, so the README still compares
        text += "; no other method run at this size yet"
        where_ours = (ours["model"], "known", "test")
        known = [c for c in summary["comparison"] if (c["model"], c["kind"], c["split"]) == where_ours]
        if known:
            c = known[-1]  # sizes ascending
            size = (c["n"], c["all_draws_at_once"])
            cases = next(r for r in summary["rows"] if r["method"] == "ours" and row_size(r) == size
                         and r["settings"] == c["ours_settings"])["metrics"]["num_cases"]["mean"]
            where = " (every test draw at once)" if c["all_draws_at_once"] else " a draw"
            text += (f"; at {cases:,.0f} facts{where}: ours {c['ours_hmean']:.2f}, best other method "
                     f"{c['best_other']} {c['best_other_hmean']:.2f}" + not_run(size))
    count = draws_text(ours).removesuffix(" at once")
    draws = f"{count} test draw{'' if count == '1' else 's'}" + (" at once" if row_size(ours)[1] else "")
    return [f"{mean(ours, 'num_cases'):,.0f} known facts edited at once into SmolLM2-135M, CounterFact scores "
            f"(ours, {draws})", text, _link(REAL_LM)]


# --- capacity ---------------------------------------------------------------------------------------------

SCALING = f"{RESULTS}/experiments-seed/scaling/summary.json"


def _ratio(value) -> str:
    return f"{value:.1f}×" if value is not None else "–"


def scaling() -> str:
    summary = load(SCALING)["summary"]
    parameters = {(r["d"], r["facts"], r["method"]): r["parameters"] for r in summary["rows"]}
    rows = []
    for r in summary["ratios"]:
        cost = [parameters.get((r["d"], r["facts"], method)) for method in ("ours", "ntk", "gd")]
        rows.append([r["d"], f"{r['facts']:,}", r["alpha"]] + [f"{c:,}" if c else "–" for c in cost]
                    + [_ratio(r["ntk_over_ours"]), _ratio(r["ours_over_gd"]), _ratio(r["ours_cheapest_over_gd"])])
    header = ["d", "F", "α = F/d²", "ours (multiplier 1.5)", "NTK", "GD", "NTK / ours", "ours / GD",
              "ours at its cheapest / GD"]
    return (_rows(header, rows) + "\n\nParameters of the smallest MLP storing every fact of all 3 seeds (– : not run, "
            "or no size up to the search's cap stores them)." + _source(SCALING))


def _runs(experiment: str) -> list[tuple[str, str]]:
    """(folder, path) of each committed run of ``experiment``, smallest run first."""
    paths = [(folder, f"{RESULTS}/{folder}/{experiment}/summary.json") for folder in RUN_FOLDERS]
    return [(folder, path) for folder, path in paths if (ROOT / path).exists()]


def _setting(summary: dict) -> str:
    rows = summary["rows"]
    return ", ".join(sorted({f"d={r['d']} F={r['facts']}" for r in rows}))


def rho_fits() -> str:
    rows = []
    for folder, path in _runs("rho-vs-cost"):
        summary = load(path)["summary"]
        for method, fit in summary["fits"].items():
            coherence = summary["coherence_fits"][method]
            rows.append([folder, _setting(summary), method, fit["points"], f"{fit['r2']:.3f}", f"{fit['slope']:.2f}",
                         f"{coherence['r2']:.3f}"])
    header = ["run", "setting", "method", "families", "R² of log cost on log ρ", "slope (bound: −2)",
              "R² on log coherence"]
    return _rows(header, rows) + _source(*(path for _, path in _runs("rho-vs-cost")))


def whitening_gains() -> str:
    rows = [[folder, _setting(load(path)["summary"]), family, f"{gain:.2f}×"]
            for folder, path in _runs("whitening") for family, gain in load(path)["summary"]["gains"].items()]
    header = ["run", "setting", "values", "cost unwhitened / cost at the strongest whitening α"]
    return _rows(header, rows) + _source(*(path for _, path in _runs("whitening")))


def hybrid_costs() -> str:
    methods = ("ours", "gd+jl", "bin+gd", "gd+gd", "gd")
    rows = []
    for folder, path in _runs("hybrids"):
        for point in load(path)["summary"]["points"]:
            rows.append([folder, point["d"], f"{point['facts']:,}"] + [f"{point['cost'][m]:,}" for m in methods]
                        + [f"{point['ours_over'][m]:.1f}×" for m in methods[1:]])
    header = ["run", "d", "F"] + [f"{m} parameters" for m in methods] + [f"ours / {m}" for m in methods[1:]]
    return _rows(header, rows) + _source(*(path for _, path in _runs("hybrids")))


def method_costs() -> str:
    rows, methods = [], ("nongated", "ntk", "gd", "hebbian_raw", "hebbian_ridge", "hebbian_data_dependent")
    for folder, path in _runs("method-costs"):
        for point, ratios in load(path)["summary"]["cost_over_ours"].items():
            rows.append([folder, point] + [f"{ratios[m]:.3g}×" if ratios.get(m) is not None else "does not store"
                                           for m in methods])
    header = ["run", "point"] + [f"{m} / ours" for m in methods]
    two_hot = [[folder, r["d"], f"{r['facts']:,}", f"{r['parameters']:,}", f"{r['bits']:,.0f}",
                f"{r['parameters_per_bit']:.1f}"]
               for folder, path in _runs("method-costs") for r in load(path)["summary"]["two_hot"]]
    return (_rows(header, rows) + "\n\nTwo-hot keys (Construction 4.1):\n\n"
            + _rows(["run", "d", "F = d(d−1)", "parameters", "bits of the map (log2 F!)", "parameters per bit"], two_hot)
            + _source(*(path for _, path in _runs("method-costs"))))


def ntk_ustar() -> str:
    rows = []
    for folder, path in _runs("ntk-ustar"):
        for r in load(path)["summary"]["rows"]:
            best = r["best_min_accuracy"]
            rows.append([folder, r["family"], f"{r['rho']:.3f}"]
                        + [f"{r[k]:,}" if r[k] else f"none (best {best[k]:.3f})" for k in ("ntk", "ntk_u*")]
                        + [f"{r['ntk_over_ntk_u*']:.2f}" if r["ntk_over_ntk_u*"] else "–"])
    header = ["run", "values", "ρ", "NTK on V", "NTK on U*", "NTK / NTK-U*"]
    return (_rows(header, rows) + "\n\nParameters of the smallest NTK MLP storing every fact of all seeds (none: "
            "no width up to the search's cap does; best: the worst seed's accuracy at the best width)."
            + _source(*(path for _, path in _runs("ntk-ustar"))))


# --- transformers, the LM and editing (seed 000 section 5) --------------------------------------------------

def ssfr_w_vs_f() -> str:
    path = f"{RESULTS}/experiments-seed/ssfr/summary.json"
    summary = load(path)["summary"]
    strict = {r["num_facts"]: r for r in summary["scaling_all_tuples"]}
    rows = []
    for r in summary["scaling"]:
        other = strict.get(r["num_facts"], {})
        rows.append([f"{r['num_facts']:,}", r["dim"], r["size"], f"{r['parameters']:,}", f"{r['accuracy']:.3f}",
                     f"{other['parameters']:,}" if other.get("parameters") else "–"])
    header = ["F", "d", "m", "W (scored on J, as the seed)", "fact-adaptive accuracy on J",
              "W (scored on training + held-out junk tuples)"]
    return (_rows(header, rows) + f"\n\nLog-log slope of W against F: {summary['loglog_slope_W_vs_F']:.2f}."
            + _source(path))


def ssfr_headline() -> str:
    rows, paths = [], []
    for folder, path in _runs("ssfr"):
        paths.append(path)
        summary = load(path)["summary"]
        for key, norm in (("headline", summary["output_norm"]), ("headline_without_output_norm", False)):
            for block, cell in summary.get(key, {}).items():
                runs = cell["runs"]
                rows.append([folder, block.replace("_", " "), "yes" if norm else "no", cell["m"],
                             f"{cell['fact_adaptive_accuracy']:.3f}",
                             ", ".join(f"{r['fact_adaptive_accuracy']:.3f}" for r in runs),
                             ", ".join(f"{r['train_accuracy']:.3f}" for r in runs),
                             ", ".join(f"{r['steps']:,}" for r in runs)])
    header = ["run", "block", "final RMSNorm", "m", "fact-adaptive accuracy (best run)", "per run",
              "training accuracy per run", "steps per run"]
    return _rows(header, rows) + _source(*paths)


def usability_correlations() -> str:
    rows, paths = [], []
    for folder, path in _runs("usability"):
        paths.append(path)
        summary = load(path)["summary"]
        rows.append([folder, len(summary["rows"]), "yes" if summary["output_norm"] else "no",
                     {"train": "J", "all": "J + held-out tuples"}.get(summary["usability_split"], summary["usability_split"]),
                     f"{summary['spearman_usability_vs_lipschitz']:+.2f}", f"{summary['spearman_usability_vs_capacity']:+.2f}"])
    header = ["run", "(κ, α) points", "final RMSNorm", "usability scored on", "Spearman(usability, Lipschitz)",
              "Spearman(usability, capacity)"]
    return _rows(header, rows) + _source(*paths)


def _lm_label(run: dict) -> str:
    label = run["expert"]
    if run["mixer_input"] != "normed":
        label += f", router on the {run['mixer_input']} output"
    if run["pool"]:
        label += f", trained with {run['pool']} swapped-in experts"
    return label


def lm_swap() -> str:
    paths = [f"{RESULTS}/{folder}/lm-facts/summary.json" for folder in ("experiments", "experiments-seed")]
    rows = []
    for path in paths:
        for run in load(path)["summary"]["runs"]:
            own, swapped = run["train_facts"], run["swapped"]
            rows.append([f"{run['facts']:,}", _lm_label(run), f"{own['value_accuracy']:.3f}",
                         f"{run['new_fact_accuracy']:.3f}",
                         f"{own['ce_nonfact']:.3f} → {swapped['ce_nonfact']:.3f} ({run['nonfact_ce_rise']:+.0%})",
                         (f"{own['ce_nonvalue']:.3f} → {swapped['ce_nonvalue']:.3f} ({run['nonvalue_ce_rise']:+.0%})"
                          if "ce_nonvalue" in own else "–"),
                         f"{own['router_fact_word']:.2f}"])
    header = ["facts", "fact expert", "own facts", "new facts after the swap", "template-word CE",
              "words + book CE", "router weight on the expert at words"]
    return _rows(header, rows) + _source(*paths)


def lm_w_vs_f() -> str:
    rows, paths = [], []
    for folder, path in _runs("lm-facts"):
        paths.append(path)
        for r in load(path)["summary"]["scaling"]:
            swap = r.get("swap") or {}
            rows.append([folder, f"{r['num_facts']:,}", r["dim"], r["size"], f"{r['parameters']:,}", f"{r['accuracy']:.3f}"]
                        + ([f"{swap['new_fact_accuracy']:.3f}", f"{swap['nonfact_ce_rise']:+.0%}",
                            f"{swap['nonvalue_ce_rise']:+.0%}"] if swap else ["–", "–", "–"]))
    header = ["run", "F", "d", "expert width", "W (expert parameters)", "LM recall of its facts",
              "new facts after the swap", "template-word CE rise", "words + book CE rise"]
    return (_rows(header, rows) + "\n\nThe smallest GD expert through which the LM recalls > 99 % of its facts, and "
            "Fig. 9b as the seed drew it: that LM with its expert swapped for one of the same width storing new facts."
            + _source(*paths))


def editing_scores() -> str:
    paths = [f"{RESULTS}/{folder}/editing/summary.json" for folder in ("experiments", "experiments-seed")]
    methods = ("mlp_swap", "memit", "alphaedit", "rome")
    rows = []
    for path in paths:
        for r in load(path)["summary"]["table"]:
            rows.append([r["expert"], r["hidden"], r["altered"], r["preserved"]]
                        + [f"{r[m]['harmonic']:.3f}" for m in methods])
    header = ["expert", "h", "altered", "preserved", "MLP swap", "MEMIT", "AlphaEdit", "ROME"]
    return (_rows(header, rows) + "\n\nScores are harmonic means of efficacy, specificity and paraphrase "
            "(App. A.3.4), each editor at the best point of the seed's grid." + _source(*paths))


# --- README headline ------------------------------------------------------------------------------------

def _span(values: list) -> str:
    values = [v for v in values if v is not None]
    return f"{min(values):.0f}–{max(values):.0f}×"


def headline() -> str:
    cpu = f"{RESULTS}/cpu.json"
    big = f"{RESULTS}/construct_cg_32768.json"
    hf = f"{RESULTS}/hf/insert_speed/subject_L10_n960_cpu_w2_quiet30.json"
    hf_gpu = f"{RESULTS}/hf/insert_speed/subject_L10_n960_cuda_s31.json"
    hf_partner_path = f"{RESULTS}/hf/insert_speed/subject_L10_n960_cpu_s32.json"
    hf_partner = load(hf_partner_path)
    budget = f"{RESULTS}/experiments/rgr-budget/summary.json"
    construct = next(r for r in load(cpu)["construct"] if r["F"] == 4096)
    gpu_run = LATEST_SCALE_RUN
    scale, default = load(gpu_run)["scale"], load(LATEST_RUN)["construct"]["default"]
    report = load(big)["construct_json"]["report"]
    insert = load(hf)
    ratios = load(SCALING)["summary"]["ratios"]
    fit = load(budget)["summary"]["fits"]["key_budget"]
    rows = [
        [f"build and verify F = \\|V\\| = {construct['F']:,} facts, d = {construct['d']} (values, Cholesky, 2-core CPU)",
         f"{_ms(construct['kernels_s'])} (pure torch {_ms(construct['torch_s'])})", _link(cpu)],
        [f"default build (margin-optimal outputs U*) F = \\|V\\| = {default['F']:,}, d = {default['d']} on one H200",
         f"{default['seconds'] * 1e3:.1f} ms (U* {default['phases_ms']['outputs']:.1f} ms), accuracy "
         f"{default['accuracy']:.3f}", _link(LATEST_RUN)],
        [f"largest build on one H200: F = \\|V\\| = {scale['F']:,}, d = {scale['d']:,} (values, {scale['solver']})",
         f"{scale['seconds']:.0f} s, {scale['peak_gpu_bytes'] / 2**30:.1f} GiB, accuracy {scale['accuracy']:.3f}",
         _link(gpu_run)],
        [f"F = \\|V\\| = {report['num_facts']:,}, d = {report['d_in']}, default outputs, CG, one CPU thread",
         f"{report['timings']['total'] / 60:.1f} min, {load(big)['usr_bin_time']['max_rss_bytes'] / 2**30:.2f} GiB, "
         f"accuracy {report['accuracy']:.3f}", _link(big)],
        ["NTK MLPs / ours, ours / GD-trained MLPs, in parameters (Fig. 2b, seed grid)",
         f"{_span([r['ntk_over_ours'] for r in ratios])}, {_span([r['ours_over_gd'] for r in ratios])}", _link(SCALING)],
        [f"{insert['facts']:,} fact requests ({insert['subjects']} subjects, {insert['contexts']:,} contexts) "
         f"inserted into SmolLM2-135M with subject keys (2-core CPU, {insert['workers']} workers)",
         f"{insert['seconds']['wall'] / 60:.1f} min, efficacy {insert['efficacy']:.4f}", _link(hf)],
        [f"the same {load(hf_gpu)['facts']:,} requests on one {load(hf_gpu)['environment']['gpu'].replace('NVIDIA ', '')}",
         f"{load(hf_gpu)['seconds']['wall']:.1f} s, efficacy {load(hf_gpu)['efficacy']:.4f}", _link(hf_gpu)],
        [f"the same {hf_partner['facts']:,} requests with the pairwise partner filter (the default since session 32), "
         f"{hf_partner['threads']} CPU thread on the shared 2-core machine",
         f"{hf_partner['seconds']['wall'] / 60:.1f} min ({hf_partner['seconds']['cpu']:,.0f} CPU s), efficacy "
         f"{hf_partner['efficacy']:.4f}, {len(hf_partner['uncertified'])} contexts uncertified",
         _link(hf_partner_path)],
        _real_lm_headline(),
        ["minimal key budget of max-over-heads attention (seed 002)",
         f"D_K* ≈ {fit['slope']:.2f} m log2(m) / d_model (R² {fit['r2']:.3f})", _link(budget)],
    ]
    return _rows(["what", "measured", "JSON"], rows)


# --- layout --------------------------------------------------------------------------------------------------

def _first_sentence(docstring: str, limit: int = 120) -> str:
    text = " ".join(docstring.split("\n\n")[0].split()).replace("``", "`")
    for end in re.finditer(r"[.!?]\s+(?=[A-Z])", text):  # a sentence ends here unless after "App." or "Fig."
        if not re.search(r"\b(?:Alg|App|Sec|Fig|Eq|Thm|Prop|Tab|al)\.$", text[:end.start() + 1]):
            text = text[:end.start() + 1]
            break
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " …"
    return text.replace("|", "\\|")


def module_map() -> str:
    """Every module of the package with the first sentence of its docstring (no sizes: any edit would stale them)."""
    package = ROOT / "factkernels"
    rows = []
    for path in sorted(package.rglob("*.py"), key=lambda p: (len(p.relative_to(package).parts) > 1, str(p))):
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        rows.append([f"`{path.relative_to(ROOT)}`", _first_sentence(docstring)])
    return (_rows(["module", "what it holds (its docstring)"], rows)
            + "\n\nGenerated from the package itself: a module that is added, moved or renamed makes this table stale.")


# --- claims of each area ---------------------------------------------------------------------------------

def claims_counts() -> str:
    from collections import Counter

    from factkernels.experiments.claims import claim_rows, latest_rows
    from factkernels.experiments.engine import VERDICTS

    folders = [ROOT / RESULTS / folder for folder in RUN_FOLDERS]
    rows = claim_rows(folders)
    every, largest = Counter(r["verdict"] for r in rows), Counter(r["verdict"] for r in latest_rows(rows))
    table = [[verdict, largest.get(verdict, 0), every.get(verdict, 0)] for verdict in VERDICTS]
    table.append(["all", sum(largest.values()), sum(every.values())])
    return (_rows(["verdict", "claims (each by its largest run)", "rows (every run of every claim)"], table)
            + _source(*(f"{RESULTS}/{folder}" for folder in RUN_FOLDERS)))


def claims_of(*experiments: str) -> Callable[[], str]:
    """The claims the named experiments test, per committed run: paper's number and our verdict."""
    def table() -> str:
        from factkernels.experiments.engine import Finding

        rows, paths = [], []
        for name in experiments:
            for folder in RUN_FOLDERS:
                path = f"{RESULTS}/{folder}/{name}/summary.json"
                if not (ROOT / path).exists():
                    continue
                run = load(path)
                paths.append(path)
                findings = run["summary"]["claims"]
                for claim in run["claims_tested"]:
                    finding = findings.get(claim["id"], {})
                    rows.append([f"`{claim['id']}`", folder, claim["where"], claim["value"].replace("|", "\\|"),
                                 Finding(**finding).verdict_text if finding else "not run"])
        header = ["claim", "run", "where", "paper's number", "verdict"]
        return (_rows(header, rows) + "\n\nOurs, the setting that ran and the reason of each verdict: "
                f"[CLAIMS.md]({REPO_LINK}benchmarks/results/CLAIMS.md)." + _source(*paths))
    return table


TABLES: dict[str, Callable[[], str]] = {
    "cpu-construct": cpu_construct,
    "cpu-kernels": cpu_kernels,
    "gpu-kernels": gpu_kernels,
    "gpu-largest-f": gpu_largest_f,
    "gpu-builds": gpu_builds,
    "gpu-ustar": gpu_ustar,
    "gpu-scale": gpu_scale,
    "gpu-star-topk": gpu_star_topk,
    "ustar-scale": ustar_scale,
    "construct-scale": construct_default,
    "values-vs-cholesky": values_vs_cholesky,
    "incremental": incremental,
    "gd-batch": gd_batch,
    "scaling": scaling,
    "rho-fits": rho_fits,
    "whitening-gains": whitening_gains,
    "hybrid-costs": hybrid_costs,
    "method-costs": method_costs,
    "ntk-ustar": ntk_ustar,
    "headline": headline,
    "module-map": module_map,
    "ssfr-w-vs-f": ssfr_w_vs_f,
    "ssfr-headline": ssfr_headline,
    "usability-correlations": usability_correlations,
    "lm-swap": lm_swap,
    "lm-w-vs-f": lm_w_vs_f,
    "editing-scores": editing_scores,
    "gd-stop": gd_stop,
    "cg-precond": cg_precond,
    "attention-kernel-cpu": attention_kernel_cpu,
    "construction2-f1": construction2_f1,
    "rgr-budget": rgr_budget,
    "rgr-diagonal": rgr_diagonal,
    "rgr-regular": rgr_regular,
    "rgr-softmax": rgr_softmax,
    "hf-insert": hf_insert,
    "real-lm-editing": real_lm_editing,
    "real-lm-editing-new": lambda: real_lm_editing("new"),
    "claims-counts": claims_counts,
    "claims-capacity": claims_of("rho-vs-cost", "whitening", "scaling", "hybrids", "ntk-ustar", "method-costs"),
    "claims-attention": claims_of("rgr-budget", "rgr-diagonal", "rgr-regular", "rgr-softmax", "rgr-value",
                                  "rgr-block"),
    "claims-transformer": claims_of("ssfr", "usability", "lm-facts", "editing"),
}


def pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def render(text: str, page: Path) -> str:
    """``text`` of ``page`` with every marked table regenerated; an unknown table name raises KeyError naming it."""
    way_up = "../" * (len(page.resolve().relative_to(ROOT).parts) - 1)

    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise KeyError(f"no generator for <!-- table:{name} --> (known: {', '.join(TABLES)})")
        return match[1] + TABLES[name]().replace(REPO_LINK, way_up) + "\n" + match[4]
    return MARKED.sub(fill, text)


def stale_pages() -> list[str]:
    """Pages whose committed tables differ from what the JSON gives (repository-relative paths)."""
    return [str(page.relative_to(ROOT)) for page in pages() if render(page.read_text(), page) != page.read_text()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming the pages that are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for page in stale:
            print(f"{page}: tables differ from benchmarks/results/ (run python benchmarks/make_docs.py)")
        return 1 if stale else 0
    for page in pages():
        text = page.read_text()
        new = render(text, page)
        if new != text:
            page.write_text(new)
            print(f"rewrote the tables of {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
