#!/bin/bash
# pass 1: the base grid pairs in priority order, heads within 2x of m/d_model (h = 1 only where m/d_model <= 4)
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
PY=python
OUT=benchmarks/results/experiments
run() { $PY -m factkernels rgr-search --out $OUT --seeds 3 --heads-window 2 "$@"; }
run --pairs 64:16,128:32,64:32,64:64,128:64 --heads 1,2,4,8,16,32,64
run --pairs 128:16,256:32,256:64,512:64,512:32,256:16 --heads 2,4,8,16,32,64
run --pairs 128:16,256:32,512:64 --heads 1
echo PASS1 DONE
