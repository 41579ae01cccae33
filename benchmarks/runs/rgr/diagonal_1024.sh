#!/bin/bash
# the lambda = 8 diagonal beyond m = 512: (1024, 128), 3 seeds, heads around m/d_model = 8 (seed 002 Fig. 4)
cd "$(dirname "$0")/../../.."
OMP_NUM_THREADS=1 python -m factkernels rgr-search \
  rgr-diagonal --pairs 1024:128 --heads 2,4,8,16 --seeds 0,1,2 --out benchmarks/results/experiments --threads 1
