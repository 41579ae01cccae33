#!/bin/bash
# Fig. 2c at d = 64, F = 1,024 (the seed grid's second point), 3 seeds, GD 20,000 steps: the cheap methods
# first (ours is shared with method-costs, then Bin+GD and GD+JL), then GD+GD and the GD MLP (hours each on
# one CPU core). Resumable: finished cells are kept; the GD searches also keep each finished size.
# Runs outside the checkout so the installed package (with its compiled kernels) is imported.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
for method in bin+gd gd+jl gd+gd gd; do
  OMP_NUM_THREADS=1 python -m factkernels experiment hybrids --scale seed --only d=64 --only "method=$method" \
    --out "$ROOT/benchmarks/results/experiments-seed" --threads 1 --resume --quiet || exit 1
done
