#!/bin/bash
# the lambda = 8 diagonal at (4096, 512), 3 seeds (seed 002 Fig. 4); resumable: finished cells are kept
cd "$(dirname "$0")/../../.."
OMP_NUM_THREADS=1 python -m factkernels rgr-search \
  rgr-diagonal --pairs 4096:512 --heads 1,2,4,8 --seeds 0,1,2 --out benchmarks/results/experiments --threads 1
