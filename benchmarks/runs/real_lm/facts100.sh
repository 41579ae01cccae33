#!/usr/bin/env bash
# real-lm-editing at 100 facts (cells of the seed grid): ours with target keys (layers 29, 20) and subject
# keys (layers 5, 10), and each editor at its best grid point of the 10-fact quick grid (MEMIT λ = 150 at the
# published and at the 100-step residual step, AlphaEdit lr 0.5 / 100 steps / tol 10, ROME published).
# Resumable: finished cells are kept.
set -euo pipefail
source "$(dirname "$0")/common.sh"
run 100 --only method=ours --only layer=29 --only position=null
run 100 --only method=memit --only 'hparams={"mom2_weight": 150.0}'
run 100 --only method=ours --only layer=5 --only position=subject
run 100 --only method=alphaedit --only 'hparams={"lr": 0.5, "nullspace_threshold": 10.0, "steps": 100}'
run 100 --only method=rome --only hparams=null
run 100 --only method=ours --only layer=20 --only position=null
run 100 --only method=ours --only layer=10 --only position=subject
run 100 --only method=memit --only 'hparams={"steps": 100, "mom2_weight": 150.0}'
