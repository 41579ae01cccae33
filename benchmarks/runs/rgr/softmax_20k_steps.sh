#!/bin/bash
# pass 6 (load ~16 on 2 cores: cells take minutes): the softmax model, 20,000-step cut-off (the seed: 80,000),
# (64, 16) with h in {1, 4}, then (64, 32) with h in {1, 2}.
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
PY=python
OUT=benchmarks/results/experiments
search() { $PY -m factkernels rgr-search "$@" --out $OUT --threads 1; }
search rgr-softmax --pairs 64:16 --aggregation softmax-sum --heads 1,4 --max-steps 20000
search rgr-softmax --pairs 64:32 --aggregation softmax-sum --heads 1,2 --max-steps 20000
echo PASS6 DONE
