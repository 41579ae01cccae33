#!/usr/bin/env bash
# real-lm-editing at 1,000 facts (cells of the seed grid), cheapest first: ours with target keys at layer 29,
# then MEMIT at its best 10/100-fact setting (λ = 150, published residual step), then ROME (published).
# One thread; about 4 h here.
# Resumable: finished cells are kept.
set -euo pipefail
source "$(dirname "$0")/common.sh"
run 1000 --only method=ours --only layer=29 --only position=null
run 1000 --only method=memit --only 'hparams={"mom2_weight": 150.0}'
run 1000 --only method=rome --only hparams=null
