#!/bin/bash
# pass 9 (after pass 8): seeds 3-9 for the r-regular configurations near each r's D_K* estimates (10 seeds
# there, as App. A.2 asks where time allows). Runs outside the checkout so the installed package is imported.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
for r in 1 2 4 8 16; do
  OMP_NUM_THREADS=1 python -m factkernels rgr-search rgr-regular --pairs 128:32 --degree "$r" --add-seeds 3,4,5,6,7,8,9 \
    --out "$ROOT/benchmarks/results/experiments" --threads 1 || exit 1
done
