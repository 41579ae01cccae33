#!/bin/bash
# Fig. 4 editing at the seed's 4,096 facts with the paper's 24 parameters per fact (a GD expert of width
# 512 at d = 64), at d = 64 and 5,000 LM steps of 128 sentences instead of the seed's d = 256 and 20,000
# steps. The cell keeps its trained LM and each finished split in its partial files: rerun to resume.
# Runs outside the checkout so the installed package (with its compiled kernels) is imported.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
OMP_NUM_THREADS=1 python -m factkernels experiment editing --scale seed --set dim=64 --set steps=5000 \
  --set expert_hidden=512 --only expert_hidden=512 --out "$ROOT/benchmarks/results/experiments-seed" \
  --threads 1 --resume --quiet
