"""No hidden quadratic allocations on the default build path (issue 13, part 2).

A build with the default outputs (margin-optimal U*, active-set solver for this many values) and
the matrix-free CG solver runs in a fresh process; its peak resident memory above the inputs must
stay below one dense float32 F x F matrix. CG is capped at a few iterations: every iteration
allocates the same, and the test is about memory, not storage (other tests cover that).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# The children's common start: F, d from argv, a random fact set, status() and the high-water mark reset.
PRELUDE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    import factkernels
    from factkernels.embeddings import random_fact_set

    F, d = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    K, V, f = random_fact_set(F, F, d, seed=0)

    def status(key):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    base = status("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark (VmHWM)
    """
)

CHILD = PRELUDE + textwrap.dedent(
    """
    mlp = factkernels.construct(K, V, f, solver="cg", cg_max_iter=2, verify="report", progress=False)
    print(json.dumps({"growth": status("VmHWM:") - base, "outputs": mlp.report.outputs}))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_default_cg_build_has_no_quadratic_allocation(tmp_path):
    F, d = 8192, 32
    proc = subprocess.run([sys.executable, "-c", CHILD, str(F), str(d)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outputs"] == "margin_optimal"
    assert 0 < result["growth"] < F * F * 4, result  # one float32 F x F matrix is 256 MiB


ESTIMATE_CHILD = PRELUDE + textwrap.dedent(
    """
    backend = sys.argv[3]
    mlp = factkernels.construct(K, V, f, outputs="values", solver="cg", cg_max_iter=2, verify="report",
                                backend=backend, progress=False)
    r = mlp.report
    print(json.dumps({"peak": status("VmHWM:") - base + (K.numel() + V.numel()) * 4, "m": r.m,
                      "width": r.gadget_width}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_estimate_bounds_the_measured_peak_of_a_cg_build(tmp_path, backend):
    """memory.estimate_build (the guard's model) is at least the peak of a cg values build measured in a fresh
    process (VmHWM above the inputs, plus the inputs), with the CPU kernels and with the blocked torch twins."""
    from factkernels.memory import estimate_build

    F, d = 2048, 32
    proc = subprocess.run([sys.executable, "-c", ESTIMATE_CHILD, str(F), str(d), backend], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    est = estimate_build(F, F, d, d, m=result["m"], gadget_width=result["width"], solver="cg", outputs="values",
                         cpu_kernels=backend == "auto")
    assert est.total >= result["peak"] > 0, (est.total, result, str(est))
