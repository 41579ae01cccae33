#!/bin/bash
# The F = 2^18, d = 1,024 CG solve (m = 79, the scale section's build) on a lent GPU with the keys' span deflated and
# with Jacobi (benchmarks/cg_precond.py), once device_check.sh has installed the package in the same call:
#   OUT=/some/folder bash benchmarks/runs/gpu/cg_precond.sh
# Expected on an H200: Jacobi ~70 s (session 24: 94 iterations at 0.71 s); deflated ~35-60 s (CPU iteration ratio
# 0.48-0.7 at F/(d+1) = 126-252, plus a setup of ~6.5 iterations, timed once more alone: ~5 s); ~3 minutes in all.
# The deflated row runs first and each row is written to the JSON as it ends: a call cut short keeps it.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="${OUT:?set OUT to the folder for the logs and the JSON}"
export PYTHONUNBUFFERED=1
cd "$ROOT"
gpu="$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))")"
python3 benchmarks/cg_precond.py --device cuda --solve 262144x1024 --m 79 --construct none \
  --preconditioners keys,jacobi --out "$OUT/cg_precond-$gpu.json" 2>&1 | tee "$OUT/cg_precond.log"
