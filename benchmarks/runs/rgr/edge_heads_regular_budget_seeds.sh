#!/bin/bash
# pass 4 (replaces pass 3, same steps, r-regular before the extra seeds): after pass 2's (512, 16) search,
# the head counts where h* sat at the edge of the tried set, r-regular graphs, 10 seeds near every
# base-grid estimate, the softmax model.
cd "$(dirname "$0")/../../.."
while kill -0 31264 2>/dev/null; do sleep 10; done   # pass 2's (512, 16) search
export OMP_NUM_THREADS=1
PY=python
OUT=benchmarks/results/experiments
search() { $PY -m factkernels rgr-search "$@" --out $OUT --threads 1; }
search rgr-budget --pairs 256:16 --heads 64
search rgr-budget --pairs 256:32,512:64 --heads 2
search rgr-budget --pairs 256:64 --heads 1
for r in 1 2 4 8 16; do
  search rgr-regular --pairs 128:32 --degree $r --heads 1,2,4,8,16,32,64,128 --heads-window 2
done
search rgr-budget --pairs 64:16,64:32,64:64,128:16,128:32,128:64,256:32,256:64,512:64,512:32,256:16 --add-seeds 3,4,5,6,7,8,9
search rgr-softmax --pairs 64:16,64:32 --aggregation softmax-sum --heads 1,2,4,8 --heads-window 2
echo PASS4 DONE
