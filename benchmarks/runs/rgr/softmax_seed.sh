#!/bin/bash
# Sec. 7.1 / Fig. 5 at the seed's settings: the softmax model's bracketing D_K search on the four panels
# (m, d_model) of the grid, h = 1, 2, 4, 8, 16, 3 seeds, the seed's 80,000-step cut-off (the quick grid: 20,000
# steps, m = 64 only), into experiments-seed/rgr-softmax beside the max model's cells of the same pairs, shared
# from the seed-scale rgr-budget run. The new m = 128 panels first. Resumable: finished cells are kept.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="$ROOT/benchmarks/results/experiments-seed"
python "$ROOT/benchmarks/runs/rgr/share_cells.py" "$ROOT/benchmarks/results/experiments" rgr-softmax \
  128:32,128:16,64:16,64:32 "$OUT" || exit 1
cd /tmp
OMP_NUM_THREADS=1 python -m factkernels rgr-search rgr-softmax \
  --pairs 128:32,128:16,64:16,64:32 --aggregation softmax-sum --heads 1,2,4,8,16 --out "$OUT" --threads 1
