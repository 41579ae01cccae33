#!/bin/bash
# Fig. 3b/8a with GD cross-entropy MLPs as the seed trains them, on the seed's 8 x 8 (kappa, alpha) grid,
# at d = 32, F = 64 (GD width 4 F/d = 8, the seed's ratio), 2 seeds, lr 1e-2 and 1,500 steps of 64
# sequences, instead of the seed's d = 128, F = 1,024, 4 seeds, 5 learning rates and 4.8M sequences
# (about 30 s per cell on one core). Resumable: finished cells are kept.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
OMP_NUM_THREADS=1 python -m factkernels experiment usability --scale seed --set dim=32 --set facts=64 --set size=8 \
  --set steps=1500 --set batch_size=64 --set 'lrs=[0.01]' --set 'seeds=[0, 1]' \
  --out "$ROOT/benchmarks/results/experiments-seed" --threads 1 --resume --quiet
