#!/bin/bash
# Fig. 2b, the NTK MLP's cells of the seed grid that the first seed-scale pass left out, on a CPU: d = 64,
# F = 4,096 (alpha = 1, the point that says whether NTK's cost diverges at d = 64), then d = 128, F = 2,048 ...
# 16,384. The width search doubles up to h = 131,072; the NTK builder forms W_up in blocks of hidden units
# (baselines/ntk.py), so a trial at F = 8,192, h = 32,768 peaks at 0.7 GB. The five cells took 4.5, 2.6, 6.3,
# 11.7 and 37 min of 2 threads (2026-11-26). Resumable (finished cells are kept); runs outside the checkout so the
# installed package is imported.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
for cell in "d=64 facts=4096" "d=128 facts=2048" "d=128 facts=4096" "d=128 facts=8192" "d=128 facts=16384"; do
  set -- $cell
  python -m factkernels experiment scaling --scale seed --only method=ntk --only "$1" --only "$2" \
    --out "$ROOT/benchmarks/results/experiments-seed" --threads 2 --resume --quiet || exit 1
  echo "$cell: done at $(date +%T)"
done
