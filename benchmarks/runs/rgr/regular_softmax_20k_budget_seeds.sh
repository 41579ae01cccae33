#!/bin/bash
# pass 5 (replaces the rest of pass 4 under a machine load of ~15): r = 8 with h = 16, r = 16 without h = 1,
# the softmax model with a 20,000-step cut-off (the seed: 80,000), then 10 seeds near the base-grid estimates
# (pairs with the widest intervals first) until the deadline.
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
PY=python
OUT=benchmarks/results/experiments
search() { $PY -m factkernels rgr-search "$@" --out $OUT --threads 1; }
search rgr-regular --pairs 128:32 --degree 8 --heads 16
search rgr-regular --pairs 128:32 --degree 16 --heads 32,64,128
search rgr-softmax --pairs 64:16,64:32 --aggregation softmax-sum --heads 1,2,4 --heads-window 2 --max-steps 20000
for pair in 256:16 512:32 128:16 64:16 256:32 512:64 128:32 256:64 128:64 64:32 64:64; do
  search rgr-budget --pairs $pair --add-seeds 3,4,5,6,7,8,9
done
echo PASS5 DONE
