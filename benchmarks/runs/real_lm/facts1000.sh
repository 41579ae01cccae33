#!/usr/bin/env bash
# real-lm-editing at 1,000 facts (cells of the seed grid), cheapest first: ours with target keys at layer 29
# and 20, then MEMIT at its best 10/100-fact setting (λ = 150, published residual step), ROME (published) and
# AlphaEdit at its best 10/100-fact setting (lr 0.5, 100 steps, tol 10). One thread; about 9 h here.
# Resumable: finished cells are kept, and a cell stopped part-way keeps its finished chunks of requests
# (benchmarks/results/experiments/real-lm-editing/partial/).
set -euo pipefail
source "$(dirname "$0")/common.sh"
run 1000 --only method=ours --only layer=29 --only position=null
run 1000 --only method=ours --only layer=20 --only position=null
run 1000 --only method=memit --only 'hparams={"mom2_weight": 150.0}'
run 1000 --only method=rome --only hparams=null
run 1000 --only method=alphaedit --only 'hparams={"steps": 100, "lr": 0.5, "nullspace_tol": 10.0}'
