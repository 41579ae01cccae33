#!/usr/bin/env bash
# real-lm-editing at 1,000 facts (cells of the seed grid), cheapest first: ours with target keys at layer 29,
# then MEMIT at its best 10/100-fact setting (λ = 150, published residual step). One thread; about 2.5 h here.
# Resumable: finished cells are kept.
set -euo pipefail
cd "$(dirname "$0")/../../.."
run() { factkernels experiment real-lm-editing --scale seed --out benchmarks/results/experiments --resume --threads 1 \
          --quiet --only n_facts=1000 "$@"; }
run --only method=ours --only layer=29 --only position=null
run --only method=memit --only 'hparams={"mom2_weight": 150.0}'
