"""Registers, stack and spills of each CUDA corral_solve variant, as ptxas reports them (no GPU needed).

    python benchmarks/corral_ptxas.py                 # sm_90, nvcc from PATH
    python benchmarks/corral_ptxas.py --arch sm_80

Compiles csrc/cuda/corral_solve.cu once with ``nvcc -O3 -Xptxas -v`` and writes, per kernel instantiation (a
variant of ``_ops.CORRAL_SOLVE_CUDA_VARIANTS``), the registers a thread, the stack frame and the spill stores and
loads in bytes, to benchmarks/results/corral_ptxas-<arch>.json. Each variant's shared memory a block is set by the
source (corral_solve.cu: shared_bytes), not by ptxas.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

from factkernels import _ops
from factkernels.environment import code_version

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
ENTRY = re.compile(r"Compiling entry function '(\S*corral_solve_kernelILi(\d+)E\S*)'")
PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGS = re.compile(r"Used (\d+) registers")


def ptxas_report(arch: str) -> tuple[str, dict]:
    """nvcc's version line and, per variant name, its kernel's registers, stack frame and spills."""
    names = {bits: name for name, bits in _ops.CORRAL_SOLVE_CUDA_VARIANTS.items()}
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(["nvcc", "-std=c++17", "-O3", f"--gpu-architecture={arch}", "-Xptxas", "-v",
                              "-I", str(ROOT / "csrc"), "-c", str(ROOT / "csrc/cuda/corral_solve.cu"),
                              "-o", str(Path(tmp) / "corral_solve.o")], capture_output=True, text=True, check=True)
    version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    kernels, current = {}, None
    for line in run.stderr.splitlines():
        if (m := ENTRY.search(line)):
            current = names[int(m.group(2))]
            kernels[current] = {}
        elif current and not kernels[current].get("stack_bytes") and (m := PROPS.search(line)):
            kernels[current].update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                                    spill_load_bytes=int(m.group(3)))
        elif current and (m := REGS.search(line)):
            kernels[current]["registers"] = int(m.group(1))
            current = None
    release = [line for line in version.splitlines() if "release" in line]
    return (release or version.strip().splitlines())[-1].strip(), kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    nvcc, kernels = ptxas_report(args.arch)
    report = {"arch": args.arch, "nvcc": nvcc, "code": code_version(), "kernels": kernels,
              "command": f"python benchmarks/corral_ptxas.py --arch {args.arch}"}
    out = RESULTS / f"corral_ptxas-{args.arch}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(kernels, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
