#!/bin/bash
# Fig. 9 swap at wider LMs than our d = 64 (the seed's d is 256): does the rise of template-word CE after the swap
# shrink as d grows? At the quick F = 256 (1,500 steps), d = 128 and d = 256, each with the seed's GD expert and
# the router on the normed or the attention output (a few minutes per cell on one core). Each setting writes its
# own folder under benchmarks/results/lm-width/. Resumable: finished cells are kept.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="$ROOT/benchmarks/results/lm-width"
cd /tmp
for d in 128 256; do
  OMP_NUM_THREADS=1 python -m factkernels experiment lm-facts --scale quick --set dim=$d --only part=null \
    --only expert=gd --only pool=0 --out "$OUT/f256-d$d" --threads 1 --resume --quiet
done
