#!/bin/bash
# Sec. 5.1 / Fig. 3a at the seed's d = 128 with its 4 seeds and F = 256 ... 16,384, GPT-2 block with its final
# RMSNorm: fact-adaptive accuracy (seed modifications, vanilla) and the smallest usable MLP per F. Training:
# lr 1e-2, up to 6,000 steps of 64 sequences, stopping once every training sequence is right (the seed: lr 2e-4,
# 4.8M sequences). Cells run in grid order: headline, then the W-vs-F searches, F ascending, each F scored first
# on the seed's J (training junk tuples), then on training + held-out junk tuples; resumable: finished cells are
# kept, and a search cut off mid-way keeps every size it finished. A size the search on the other criterion
# trained is rescored, not trained again (the transformers are the same; only the scored sequences differ).
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
OMP_NUM_THREADS=1 python -m factkernels experiment ssfr --scale seed --set steps=6000 --set batch_size=64 \
  --set 'lrs=[0.01]' --out "$ROOT/benchmarks/results/experiments-seed" --threads 1 --resume --quiet
