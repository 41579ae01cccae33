"""Race every kernel and the whole construction against pure torch, in one process.

    python benchmarks/bench.py                 # CPU (and CUDA when present), writes benchmarks/results/<device>.json
    python benchmarks/bench.py --quick         # smaller sizes, for a smoke run
    python benchmarks/bench.py --only construct,kernels,outputs,cg,attention
    python benchmarks/bench.py --only attention --out benchmarks/results/attention/bench_cpu.json

Construction is timed three ways with the same algorithm inputs:
  per_gadget   Alg. 3 verbatim: one gate, explicit M and least squares per gadget (pure torch)
  torch        the shared-gate algorithm with torch ops only (backend="torch"): best pure torch
  kernels      the shared-gate algorithm on the compiled kernels (backend="kernels")

Every row carries its physical reference, measured in the same run, and the ratio to it:
  construction     one Cholesky of the F x F Gram in the same dtype (``cholesky_s``, ``*_over_cholesky``)
  kernels          the FLOPs the shape needs at the float32 GEMM rate measured here
                   (``limit_ms``, ``kernel_over_limit``, ``torch_over_limit``)
  U*, cg           one |V| x |V| score pass / the CG iterations' products at that GEMM rate
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

import factkernels
from factkernels import _ops, embeddings, ustar
from factkernels.embeddings import random_fact_set
from factkernels.encoder import gadget_width

RESULTS = Path(__file__).resolve().parent / "results"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn: Callable[[], object], device: torch.device, repeats: int = 5, warmup: int = 1,
           min_seconds: float = 0.25, max_repeats: int = 200) -> float:
    """Fastest wall time in seconds of at least ``repeats`` calls, more (up to ``max_repeats``) until they
    add up to ``min_seconds``: on a shared machine noise only ever adds time, and a millisecond kernel
    timed 5 times is at the mercy of one preemption."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    while len(times) < repeats or (sum(times) < min_seconds and len(times) < max_repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def device_info(device: torch.device) -> dict:
    info = {"device": str(device), "python": platform.python_version(), "torch": torch.__version__,
            "factkernels": factkernels.__version__, "build": _ops.build_info(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "processor": platform.processor()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    else:
        try:
            model = [l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")]
            info["cpu"] = model[0].split(":", 1)[1].strip() if model else platform.processor()
        except OSError:
            info["cpu"] = platform.processor()
    return info


def gemm_rate(device: torch.device) -> float:
    """float32 FLOP/s of one square GEMM (8,192 on a GPU, 2,048 on a CPU), the rate the limits use."""
    n = 8192 if device.type == "cuda" else 2048
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device) for _ in range(2))
    seconds = timeit(lambda: a @ b, device, repeats=3)
    rate = 2 * n**3 / seconds
    print(f"float32 GEMM {n}^3: {seconds * 1e3:.2f} ms = {rate / 1e12:.2f} TFLOP/s", flush=True)
    return rate


def cholesky_seconds(num_facts: int, device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """Time of one Cholesky of a well-conditioned SPD (F, F) matrix: the floor of a dense values build."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(num_facts, num_facts // 2, generator=gen, dtype=dtype).to(device) / num_facts**0.5
    spd = a @ a.T + torch.eye(num_facts, dtype=dtype, device=device)
    seconds = timeit(lambda: torch.linalg.cholesky_ex(spd), device, repeats=3)
    print(f"one Cholesky F={num_facts}: {seconds * 1e3:.2f} ms", flush=True)
    return seconds


def with_limit(row: dict, seconds_key: str, limit_seconds: float, limit: str) -> dict:
    """Put the reference beside a time: ``limit`` (what it is), ``limit_s`` and ``<time>_over_limit``."""
    row.update(limit=limit, limit_s=limit_seconds)
    row[f"{seconds_key.removesuffix('_s')}_over_limit"] = row[seconds_key] / limit_seconds
    return row


def bench_construct(device: torch.device, sizes: list[tuple[int, int, int]], per_gadget_max_f: int) -> list[dict]:
    """outputs="values", dense solve, with one Cholesky of the same F beside each time (``*_over_cholesky``)."""
    rows = []
    for d, num_facts, m in sizes:
        K, V, f = (t.to(device) for t in random_fact_set(num_facts, num_facts, d, seed=0))
        row = {"d": d, "F": num_facts, "m": m, "outputs": "values", "solver": "cholesky",
               "cholesky_s": cholesky_seconds(num_facts, device)}
        # on a GPU the compiled path is "auto": the CUDA kernels that earn their place, cuBLAS twins for the rest
        fast = "kernels" if device.type == "cpu" else "auto"
        row["kernels_backend"] = fast
        for name, kwargs in [("kernels", {"backend": fast}), ("torch", {"backend": "torch"})]:
            mlp = None

            def run():
                nonlocal mlp
                mlp = factkernels.construct(K, V, f, m=m, outputs="values", solver="cholesky", progress=False, **kwargs)

            row[f"{name}_s"] = timeit(run, device, repeats=3)
            row[f"{name}_accuracy"] = mlp.report.accuracy
            row[f"{name}_residual"] = mlp.report.residual
            row[f"{name}_phases_ms"] = {k: round(v * 1e3, 2) for k, v in mlp.report.timings.items()}
        if num_facts <= per_gadget_max_f:
            mlp = None

            def run_faithful():
                nonlocal mlp
                mlp = factkernels.construct(K, V, f, m=m, outputs="values", solver="per_gadget", progress=False,
                                            backend="torch")

            row["per_gadget_s"] = timeit(run_faithful, device, repeats=1, warmup=0)
            row["per_gadget_accuracy"] = mlp.report.accuracy
            row["speedup_vs_per_gadget"] = row["per_gadget_s"] / row["kernels_s"]
        row["speedup_vs_torch"] = row["torch_s"] / row["kernels_s"]
        row["kernels_over_cholesky"] = row["kernels_s"] / row["cholesky_s"]
        row["torch_over_cholesky"] = row["torch_s"] / row["cholesky_s"]
        rows.append(row)
        print(f"construct d={d} F={num_facts} m={m}: kernels {row['kernels_s']*1e3:.1f} ms, torch "
              f"{row['torch_s']*1e3:.1f} ms, one Cholesky {row['cholesky_s']*1e3:.1f} ms (kernels "
              f"{row['kernels_over_cholesky']:.2f}x it)" +
              (f", per_gadget {row['per_gadget_s']:.2f} s" if "per_gadget_s" in row else ""), flush=True)
    return rows


def bench_kernels(device: torch.device, quick: bool, rate: float) -> list[dict]:
    """Every compiled kernel against its twin; ``rate``: the float32 GEMM FLOP/s of :func:`gemm_rate`."""
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    rows = []
    n_gram = [(1024, 24, 65), (4096, 48, 129)] if not quick else [(512, 16, 33)]
    for n, h, q in n_gram:
        s, p = r(n, h), r(n, q)
        rows.append(race("hadamard_gram", {"n": n, "h": h, "q": q}, device,
                         lambda: _ops.hadamard_gram(s, p, backend="kernels"),
                         lambda: _ops.hadamard_gram(s, p, backend="torch"), flops=2 * n * n * (h + q), rate=rate))
        w = r(h, q - 1)
        rows.append(race("gate_features", {"n": n, "k": q - 1, "h": h}, device,
                         lambda: _ops.gate_features(p[:, :-1], w, None, "silu", backend="kernels"),
                         lambda: _ops.gate_features(p[:, :-1], w, None, "silu", backend="torch"),
                         flops=2 * n * (q - 1) * h, rate=rate))
        m = 64 if n <= 1024 else 96
        y, coef = r(n, m), r(m, h, q)
        rows.append(race("gadget_rmatvec", {"n": n, "h": h, "q": q, "m": m}, device,
                         lambda: _ops.gadget_rmatvec(s, p, y, backend="kernels"),
                         lambda: _ops.gadget_rmatvec(s, p, y, backend="torch"), flops=2 * n * m * h * q, rate=rate))
        rows.append(race("gadget_matvec", {"n": n, "h": h, "q": q, "m": m}, device,
                         lambda: _ops.gadget_matvec(s, p, coef, backend="kernels"),
                         lambda: _ops.gadget_matvec(s, p, coef, backend="torch"), flops=2 * n * m * h * q,
                         rate=rate))
    forward_sizes = [(4096, 64, 1536, 24), (4096, 128, 4608, 48)] if not quick else [(512, 32, 384, 12)]
    for n, d, h, hg in forward_sizes:
        x, wg, wu, wd = r(n, d), r(hg, d), r(h, d) / d**0.5, r(d, h) / h**0.5
        bu, bd = r(h), r(d)
        for gate_rows in (hg, h):
            wg_full = wg if gate_rows == hg else wg.repeat(h // hg, 1)
            rows.append(race("gated_forward", {"n": n, "d": d, "h": h, "gate_rows": gate_rows}, device,
                             lambda: _ops.gated_forward(x, wg_full, None, wu, bu, wd, bd, "silu", backend="kernels"),
                             lambda: _ops.gated_forward(x, wg_full, None, wu, bu, wd, bd, "silu", backend="torch"),
                             flops=2 * n * d * (gate_rows + 2 * h), rate=rate))
    decode_sizes = [(4096, 4096, 64), (8192, 8192, 128)] if not quick else [(512, 512, 32)]
    if device.type == "cuda" and not quick:
        decode_sizes.append((65536, 65536, 256))
    for n, nv, d in decode_sizes:
        y, v = r(n, d), r(nv, d)
        t = torch.randint(nv, (n,), generator=gen).to(device)
        rows.append(race("decode", {"n": n, "nv": nv, "d": d}, device,
                         lambda: _ops.decode(y, v, t, backend="kernels"),
                         lambda: _ops.decode(y, v, t, backend="torch"), flops=2 * n * nv * d, rate=rate))
    # the GD loss on a step's logits: 3 models x F = |V| = 2,048 (quick: 512 x 256)
    for n, c in ([(6144, 2048)] if not quick else [(512, 256)]):
        logits, t = r(n, c) * 30, torch.randint(c, (n,), generator=gen).to(device)
        row = race("softmax_cross_entropy", {"n": n, "c": c}, device,
                   lambda: _ops.softmax_cross_entropy(logits, t, backend="kernels"),
                   lambda: _ops.softmax_cross_entropy(logits, t, backend="torch"), flops=5 * n * c, rate=rate)
        # memory-bound: its limit is a copy of the logits (read n x c, write the n x c softmax), timed here
        copy_ms = timeit(lambda: logits.clone(), device) * 1e3
        rows.append(row | {"limit": "one copy of the logits", "limit_ms": copy_ms,
                           "kernel_over_limit": row["kernel_ms"] / copy_ms, "torch_over_limit": row["torch_ms"] / copy_ms})
    # star scores, the constraint search of U* (margin_optimal_outputs): k = 8 lowest per value, all values
    for nv, d in ([(4096, 64), (16384, 128)] if not quick else [(512, 32)]):
        v = torch.nn.functional.normalize(r(nv, d), dim=1)
        rows.append(race("star_topk", {"nv": nv, "d": d, "k": 8}, device,
                         lambda: _ops.star_topk(v, 8, backend="kernels"),
                         lambda: _ops.star_topk(v, 8, backend="torch"), flops=2 * nv * nv * d, rate=rate))
    return rows


def bench_attention(device: torch.device, quick: bool, rate: float) -> list[dict]:
    """Fused max-over-heads scores + threshold (seed 002) against the torch twin, which forms (B, h, Lq, Lk).

    Shapes: the harness's evaluation of 2,000 test contexts of ell = 16 for 8 runs at once, and
    all-pairs evaluation of a construction (one context holding every item). ``*_bytes`` are the
    intermediate sizes implied by the shapes: the twin's per-head scores, the kernel's packed keys.
    """
    gen = torch.Generator().manual_seed(0)
    sizes = [(16_000, 8, 16, 16, 8), (1, 8, 2048, 2048, 64), (4, 32, 1024, 1024, 16)]
    if quick:
        sizes = [(2_000, 4, 16, 16, 8), (1, 4, 1024, 1024, 32)]
    rows = []
    for batch, h, lq, lk, dk in sizes:
        q = torch.randn(batch, h, lq, dk, generator=gen).to(device)
        k = torch.randn(batch, h, lk, dk, generator=gen).to(device)
        tau = torch.zeros(batch, device=device)
        shape = {"batch": batch, "h": h, "ell_q": lq, "ell_k": lk, "d_k": dk}
        item = q.element_size()
        memory = {"twin_per_head_scores_bytes": batch * h * lq * lk * item,
                  "kernel_packed_keys_bytes": batch * h * -(-lk // (64 // item)) * (64 // item) * dk * item,
                  "output_scores_bytes": batch * lq * lk * item}
        for mode, decision_only in (("scores+decision", False), ("decision_only", True)):
            rows.append(race(f"max_heads {mode}", shape, device,
                             lambda: _ops.max_head_scores(q, k, tau, decision_only=decision_only, backend="kernels"),
                             lambda: _ops.max_head_scores(q, k, tau, decision_only=decision_only, backend="torch"),
                             flops=2 * batch * h * lq * lk * dk, rate=rate)
                        | memory)
    return rows


def race(name: str, shape: dict, device: torch.device, kernel: Callable, twin: Callable, *, flops: float,
         rate: float) -> dict:
    """Kernel against twin, both beside the time ``flops`` take at the measured GEMM ``rate`` (FLOP/s).
    An op with no kernel on the device (``_ops.CPU_ONLY_KERNELS`` on a GPU) times its twin only."""
    limit = flops / rate
    t = timeit(twin, device)
    if device.type == "cuda" and name in _ops.CPU_ONLY_KERNELS:
        print(f"{name:<15} {json.dumps(shape):<48} (no CUDA kernel)  torch {t*1e3:8.2f} ms  GEMM-rate limit "
              f"{limit*1e3:8.3f} ms (torch {t/limit:6.2f}x it)", flush=True)
        return {"kernel": name, **shape, "kernel_ms": None, "torch_ms": t * 1e3, "speedup": None, "flops": flops,
                "limit": "FLOPs at the float32 GEMM rate", "limit_ms": limit * 1e3, "kernel_over_limit": None,
                "torch_over_limit": t / limit}
    k = timeit(kernel, device)
    print(f"{name:<15} {json.dumps(shape):<48} kernel {k*1e3:8.2f} ms  torch {t*1e3:8.2f} ms  x{t/k:5.2f}  "
          f"GEMM-rate limit {limit*1e3:8.3f} ms (kernel {k/limit:6.2f}x it)", flush=True)
    return {"kernel": name, **shape, "kernel_ms": k * 1e3, "torch_ms": t * 1e3, "speedup": t / k, "flops": flops,
            "limit": "FLOPs at the float32 GEMM rate", "limit_ms": limit * 1e3, "kernel_over_limit": k / limit,
            "torch_over_limit": t / limit}


def bench_outputs(device: torch.device, sizes: list[tuple[int, int]], rate: float) -> list[dict]:
    """U* of spherical values beside one |V| x |V| x d score pass at the GEMM ``rate`` (``score_passes``)."""
    rows = []
    for n, d in sizes:
        V = embeddings.spherical(n, d, generator=torch.Generator().manual_seed(0)).to(device)
        result = {}

        def run():
            result["U"], result["rho"] = ustar.margin_optimal_outputs(V)

        seconds = timeit(run, device, repeats=3)
        score_pass = 2 * n * n * d / rate
        rows.append({"n": n, "d": d, "seconds": seconds, "rho": float(result["rho"]),
                     "limit": "one |V| x |V| score pass at the float32 GEMM rate", "limit_s": score_pass,
                     "score_passes": seconds / score_pass})
        print(f"margin_optimal_outputs |V|={n} d={d}: {seconds*1e3:.1f} ms = {seconds / score_pass:.1f} score passes "
              f"(rho={float(result['rho']):.4f})", flush=True)
    return rows


def _status_kib(field: str) -> int:
    """A ``VmRSS``/``VmHWM``-style line of /proc/self/status, in KiB."""
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field + ":"))
    return int(line.split()[1])


def bench_cg_child(d: int, num_facts: int, m: int) -> None:
    """Runs in a fresh process; its peak RSS is reset after the imports and the fact set (Linux clear_refs 5),
    so the peak read after the construction is the CG construction's own, not the imports' high-water mark."""
    K, V, f = random_fact_set(num_facts, num_facts, d, seed=0)
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kib("VmRSS")
    start = time.perf_counter()
    mlp = factkernels.construct(K, V, f, m=m, outputs="values", solver="cg", progress=False)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    print(json.dumps({"d": d, "F": num_facts, "m": m, "seconds": seconds, "accuracy": mlp.report.accuracy,
                      "cg_iterations": mlp.report.cg_iterations, "residual": mlp.report.residual,
                      "peak_rss_bytes": peak * 1024, "rss_before_bytes": base * 1024,
                      "dense_gram_float64_bytes": num_facts * num_facts * 8}))


def bench_cg(sizes: list[tuple[int, int, int]], rate: float) -> list[dict]:
    """cg builds in a child process; limit: the iterations' two gadget products (4 F h̃ (d+1) m FLOPs each) at ``rate``."""
    rows = []
    for d, num_facts, m in sizes:
        out = subprocess.run([sys.executable, __file__, "--cg-child", f"{d},{num_facts},{m}"], capture_output=True,
                             text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["peak_growth_over_dense"] = (row["peak_rss_bytes"] - row["rss_before_bytes"]) / row["dense_gram_float64_bytes"]
        width = gadget_width(num_facts, d, 1.5)
        with_limit(row, "seconds", row["cg_iterations"] * 4 * num_facts * width * (d + 1) * m / rate,
                   "the CG iterations' gadget products at the float32 GEMM rate")
        rows.append(row)
        print(f"cg d={d} F={num_facts} m={m}: {row['seconds']:.1f} s, accuracy {row['accuracy']}, "
              f"{row['cg_iterations']} iterations, peak RSS growth {(row['peak_rss_bytes'] - row['rss_before_bytes'])/2**20:.0f} MiB "
              f"(F^2*8 = {row['dense_gram_float64_bytes']/2**20:.0f} MiB)", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="construct,kernels,outputs,cg")
    parser.add_argument("--per-gadget-max-f", type=int, default=1024,
                        help="time the faithful per_gadget construction up to this F (it is slow)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<device>.json)")
    parser.add_argument("--cg-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cg_child:
        bench_cg_child(*map(int, args.cg_child.split(",")))
        return
    device = torch.device(args.device)
    parts = set(args.only.split(","))
    report = {"environment": device_info(device), "quick": args.quick}
    rate = gemm_rate(device)
    report["gemm_float32_flops_per_s"] = rate
    if "kernels" in parts:
        report["kernels"] = bench_kernels(device, args.quick, rate)
    if "attention" in parts:
        report["attention"] = bench_attention(device, args.quick, rate)
    if "construct" in parts:
        sizes = [(64, 1024, 64), (128, 4096, 96)] if not args.quick else [(32, 256, 64)]
        report["construct"] = bench_construct(device, sizes, per_gadget_max_f=args.per_gadget_max_f)
    if "outputs" in parts:
        report["margin_optimal_outputs"] = bench_outputs(device, [(1024, 64)] if args.quick else [(1024, 64), (4096, 128)],
                                                         rate)
    if "cg" in parts and device.type == "cpu":
        report["cg"] = bench_cg([(64, 1024, 64)] if args.quick else [(128, 8192, 96)], rate)
    name = ("cuda-" + torch.cuda.get_device_name(device).replace(" ", "_")) if device.type == "cuda" else "cpu"
    out = Path(args.out) if args.out else RESULTS / f"{name}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
