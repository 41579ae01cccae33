#!/bin/bash
# One call on a lent GPU machine (the device tool): build with the CUDA kernels (sm_90), then gpu_suite.py (the
# CUDA tests and every GPU benchmark). Everything lands in OUT, which the device tool brings back:
#   machine.txt (nvidia-smi, python, torch, nvcc)  build.log  suite.log  gpu_suite-<gpu>.json
#   OUT=/some/folder bash benchmarks/runs/gpu/device_check.sh
# SUITE_SECONDS (default 420) bounds the suite so that the call ends inside the device's 10-minute limit; the
# JSON keeps every section that finished before it. SUITE_ARGS go to gpu_suite.py (e.g. --only tests,kernels).
# First run (H200, 2026-11-26): build 19 s, CUDA tests 37 s, the whole suite 374 s (gd_batch 217 s of it).
# Second (H100, 2026-11-26, --only tests,kernels,attention): 34 CUDA tests in 40 s, done 74 s after the build began.
# Section times to expect on an H100 (session 24's estimates from the H200's 2026-11-26 runs and the rows added since):
#   tests ~45 s (40-52 s before) | kernels ~17 s (6 s, plus the star_topk races up to 65,536 x 256) | attention 2 s
#   construct ~10 s (3 s, plus the profiled values and default builds) | scale ~110 s (106 s on the H200)
#   ustar ~45 s (56 s in session 24's run 1 on an H200, with 65,536 x 256 backend kernels, 10 s, since dropped): five
#   4,096 x 128 rows ~3 s each (profiled), 16,384 x 128 active_set and dense ~2 s each, 65,536 x 256 auto (profiled
#   when under 5 s) and torch ~5-10 s each (--no-ustar-large drops them: ustar ~20 s)
# Session 24's run 1 (H200): tests 40 s, kernels 25 s, construct 4 s, ustar 56 s. So tests,kernels,construct,ustar
# ~120 s and with scale ~230 s, plus the build (~20 s) and the GEMM rate (~2 s).
# Keep --tests-timeout (SUITE_ARGS, the last one wins) well under SUITE_SECONDS: a hung test must not eat the call.
# Session 31 (H200): tests ~55 s (143 CUDA tests, the removed kernels' among them), kernels 21 s, construct 3 s,
# ustar 13 s (--no-ustar-large); the scale row alone (--only scale) 55 s.
# A 5-minute call: OUT=$OUT SUITE_SECONDS=260 SUITE_ARGS="--only tests,kernels,construct,ustar,scale --tests-timeout 90"
#   (~230 s of suite: scale runs last, so a run cut off loses only its row).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="${OUT:?set OUT to the folder for the logs and the JSON}"
export PYTHONUNBUFFERED=1
cd "$ROOT"
{ nvidia-smi; python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version; nproc; } >"$OUT/machine.txt" 2>&1
begin=$SECONDS
# --no-build-isolation --no-deps: the machine reaches no package index; its torch, pybind11 and
# scikit-build-core build and run the extension
FACTKERNELS_CUDA=ON CUDAARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  python3 -m pip install --no-build-isolation --no-deps -v . >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - begin)) s"
(cd /tmp && python3 -c "from factkernels import _ops; print(_ops.build_info())")
timeout "${SUITE_SECONDS:-420}" python3 benchmarks/gpu_suite.py --out "$OUT" --max-seconds 30 --tests-timeout 240 \
  ${SUITE_ARGS:-} 2>&1 \
  | tee "$OUT/suite.log"
echo "suite: exit ${PIPESTATUS[0]} after $((SECONDS - begin)) s"
