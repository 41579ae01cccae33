#!/bin/bash
# Fig. 9 swap at the seed's 4,096 facts (authors/books LM; fact experts: GD stopped once it stores, constructed,
# GD trained through the authors' schedule; GD with the router on the attention output; GD trained with 3
# swapped-in experts), at d = 64 and 5,000 steps of 128 sentences instead of the seed's d = 256 and 20,000 steps
# (one CPU core: about 45 min per cell, more for the converged GD experts: 0.5-0.8 s per Adam step). Resumable: finished cells are kept. Runs outside the checkout so
# the installed package (with its compiled kernels) is imported. The W-vs-F cells (w_vs_f_d64.sh) run with the
# same overrides, so either script's summary covers both.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
OMP_NUM_THREADS=1 python -m factkernels experiment lm-facts --scale seed --set dim=64 --set steps=5000 --set 'seeds=[0]' \
  --only part=null --out "$ROOT/benchmarks/results/experiments-seed" --threads 1 --resume --quiet
