#!/bin/bash
# pass 2 (after pass 1): h = 1 where pass 1 left it out, the lambda = 32 point, r-regular graphs,
# the softmax model, the larger diagonal points.
cd "$(dirname "$0")/../../.."
while kill -0 $(cat benchmarks/runs/rgr/budget_base_grid.pid) 2>/dev/null; do sleep 10; done
export OMP_NUM_THREADS=1
PY=python
OUT=benchmarks/results/experiments
search() { $PY -m factkernels rgr-search "$@" --out $OUT --threads 1; }
search rgr-budget --pairs 128:16,256:32,512:64 --heads 1
search rgr-budget --pairs 512:16 --heads 8,16,32,64 --heads-window 2
for r in 1 2 4 8 16; do
  search rgr-regular --pairs 128:32 --degree $r --heads 1,2,4,8,16,32,64,128 --heads-window 2
done
search rgr-softmax --pairs 64:16,64:32 --aggregation softmax-sum --heads 1,2,4,8 --heads-window 2
search rgr-diagonal --pairs 1024:128 --heads 4,8,16 --heads-window 2
echo PASS2 DONE
