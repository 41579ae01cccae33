#!/bin/bash
# pass 7: r = 16 with the head counts beside h = 64
cd "$(dirname "$0")/../../.."
OMP_NUM_THREADS=1 python -m factkernels rgr-search \
  rgr-regular --pairs 128:32 --degree 16 --heads 32,128 --out benchmarks/results/experiments --threads 1
