#!/bin/bash
# Sec. 5.1 fact-adaptive accuracy at the seed's d = 128, F = 256 (both transformer variants), 1 seed,
# lr 1e-2 and 6,000 steps of 64 sequences (384k sequences), instead of the seed's 4 seeds at lr 2e-4 and
# 4.8M sequences (about 15 min per variant on one core). Resumable: finished cells are kept.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
OMP_NUM_THREADS=1 python -m factkernels experiment ssfr --scale seed --set steps=6000 --set batch_size=64 \
  --set 'lrs=[0.01]' --set 'seeds=[0]' --only part=headline \
  --out "$ROOT/benchmarks/results/experiments-seed" --threads 1 --resume --quiet
