#!/bin/bash
# Fig. 2b, the GD MLP's cells of the seed grid on a CPU, cheapest first: d = 64, F = 512, d = 32, F = 1,024,
# then d = 64, F = 2,048, d = 128, F = 2,048 and d = 64, F = 4,096 (3 seeds, 20,000 Adam steps). From
# F·|V| = 2^19 logits per model the search trains one model at a time (capacity.SERIAL_LOGITS): a failing
# size costs one seed's 20,000 steps, not three seeds' and the sizes ahead, and each finished size is kept.
# d = 64, F = 1,024 is the hybrids run's GD cell (benchmarks/runs/hybrids/seed_d64.sh; same cell key); the rest of
# the grid runs on a GPU (gd_gpu.sh). Resumable: finished cells are kept, and a cut-off search keeps every size
# it finished in the cell's partial file. Runs outside the checkout so the installed package is imported.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
for cell in "d=64 facts=512" "d=32 facts=1024" "d=64 facts=2048" "d=128 facts=2048" "d=64 facts=4096"; do
  set -- $cell
  OMP_NUM_THREADS=1 python -m factkernels experiment scaling --scale seed --only method=gd --only "$1" --only "$2" \
    --out "$ROOT/benchmarks/results/experiments-seed" --threads 1 --resume --quiet || exit 1
done
