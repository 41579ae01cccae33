#!/usr/bin/env bash
# real-lm-editing at 1,000 facts (cells of the seed grid), cheapest first: ours with target keys at layer 29
# and 20, then MEMIT at its best 10/100-fact setting (λ = 150, published residual step), ROME (published) and
# AlphaEdit at its best 10/100-fact setting (lr 0.5, 100 steps, tol 10); then the rest of the grid at that
# residual step (MEMIT's four λ, AlphaEdit's other tolerances), which read its δ back from the step's shared file
# (partial/shared-*.safetensors) instead of training it again, and ours' other layers. One thread; about 12 h here.
# Resumable: finished cells are kept, and a cell stopped part-way keeps its finished chunks of requests
# (benchmarks/results/experiments/real-lm-editing/partial/).
set -euo pipefail
source "$(dirname "$0")/common.sh"
run 1000 --only method=ours --only layer=29 --only position=null
run 1000 --only method=ours --only layer=20 --only position=null
run 1000 --only method=memit --only 'hparams={"mom2_weight": 150.0}'
run 1000 --only method=rome --only hparams=null
run 1000 --only method=alphaedit --only 'hparams={"steps": 100, "lr": 0.5, "nullspace_threshold": 10.0}'
run 1000 --only method=memit --only 'hparams={"steps": 100}'
for lam in 1500.0 150.0 1.0; do run 1000 --only method=memit --only "hparams={\"steps\": 100, \"mom2_weight\": $lam}"; done
run 1000 --only method=alphaedit --only 'hparams={"steps": 100, "lr": 0.5}'
run 1000 --only method=alphaedit --only 'hparams={"steps": 100, "lr": 0.5, "nullspace_threshold": 1.0}'
for layer in 25 15 10 5; do run 1000 --only method=ours --only layer=$layer --only position=null; done
for layer in 10 5; do run 1000 --only method=ours --only layer=$layer --only position=subject; done
