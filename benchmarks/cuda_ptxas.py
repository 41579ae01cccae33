"""Registers, stack and spills of a CUDA kernel's instantiations, as ptxas reports them (no GPU needed).

    python benchmarks/cuda_ptxas.py --kernel corral_solve                # sm_90, nvcc from PATH
    python benchmarks/cuda_ptxas.py --kernel corral_solve --arch sm_80

Compiles the kernel's source once with ``nvcc -O3 -Xptxas -v`` and writes, per kernel instantiation, the registers a
thread, the stack frame and the spill stores and loads in bytes, to benchmarks/results/<stem>-<arch>.json
(``KERNELS``). A block's shared memory is set by the source, not by ptxas (corral_solve.cu's shared_bytes).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

from factkernels.environment import code_version

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
ENTRY = re.compile(r"Compiling entry function '(\S+)'")
PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGS = re.compile(r"Used (\d+) registers")


def _corral_name(entry: str) -> str | None:
    return "corral_solve" if "corral_solve_kernel" in entry else None


# kernel: (source under csrc/, result file stem, the instantiation's name from its mangled entry or None)
KERNELS = {"corral_solve": ("cuda/corral_solve.cu", "corral_ptxas", _corral_name)}


def ptxas_report(kernel: str, arch: str) -> tuple[str, dict]:
    """nvcc's version line and, per instantiation of ``kernel``, its registers, stack frame and spills."""
    source, _, name_of = KERNELS[kernel]
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(["nvcc", "-std=c++17", "-O3", f"--gpu-architecture={arch}", "-Xptxas", "-v",
                              "-I", str(ROOT / "csrc"), "-c", str(ROOT / "csrc" / source),
                              "-o", str(Path(tmp) / "kernel.o")], capture_output=True, text=True, check=True)
    version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    kernels, current = {}, None
    for line in run.stderr.splitlines():
        if (m := ENTRY.search(line)):
            current = name_of(m.group(1))
            if current:
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
    ap.add_argument("--kernel", choices=sorted(KERNELS), required=True)
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    nvcc, kernels = ptxas_report(args.kernel, args.arch)
    report = {"arch": args.arch, "nvcc": nvcc, "code": code_version(), "kernels": kernels,
              "command": f"python benchmarks/cuda_ptxas.py --kernel {args.kernel} --arch {args.arch}"}
    out = RESULTS / f"{KERNELS[args.kernel][1]}-{args.arch}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(kernels, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
