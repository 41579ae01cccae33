#!/bin/bash
# Fig. 2b, the GD MLP's cells of the seed grid that fit on a CPU, cheapest first: d = 64, F = 512, then d = 32,
# F = 1,024 (3 seeds, 20,000 Adam steps; up to an hour each on one core). The larger GD cells run on a GPU
# (gd_gpu.sh): one round of d = 64, F = 2,048 outlasts a session on one core, and a round is not resumable.
# d = 64, F = 1,024 is the hybrids run's GD cell (benchmarks/runs/hybrids/d64.sh; same cell key). Resumable: finished cells are kept, and a cut-off search keeps
# every size it finished in the cell's partial file. Runs outside the checkout so the installed package is imported.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
for cell in "d=64 facts=512" "d=32 facts=1024"; do
  set -- $cell
  OMP_NUM_THREADS=1 python -m factkernels experiment scaling --scale seed --only method=gd --only "$1" --only "$2" \
    --out "$ROOT/benchmarks/results/experiments-seed" --threads 1 --resume --quiet || exit 1
done
