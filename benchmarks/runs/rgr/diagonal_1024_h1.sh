#!/bin/bash
# the lambda = 8 diagonal at (1024, 128) with h = 1: diagonal_1024.sh began at h = 2, which won, so h* = 2 was an
# upper bound until one head is searched too. Runs outside the checkout so the installed package is imported.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
OMP_NUM_THREADS=1 python -m factkernels rgr-search rgr-diagonal --pairs 1024:128 --heads 1 --seeds 0,1,2 \
  --out "$ROOT/benchmarks/results/experiments" --threads 1
