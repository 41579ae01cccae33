#!/bin/bash
# Fig. 9a / App. A.3.3, the LM W-vs-F search at F = 256 ... 4,096 with one seed at d = 64 and 5,000 LM steps of
# 128 sentences per width tried (the seed: d = 256, 20,000 steps, 4 seeds). F ascending; a finished F is kept
# (Fig. 9b: every usable LM also gets its expert swapped for one storing new facts; a trial replayed from an
# older search that did not swap retrains the same seed's LM at the smallest usable width to swap it)
# (rerun to resume; an F cut off mid-search keeps every width it finished). Runs outside the checkout so the installed package
# (with its compiled kernels) is imported. Same overrides as lm_facts_4096.sh, so one summary covers both.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
OMP_NUM_THREADS=1 python -m factkernels experiment lm-facts --scale seed --set dim=64 --set steps=5000 \
  --set 'seeds=[0]' --only part=scaling --out "$ROOT/benchmarks/results/experiments-seed" --threads 1 --resume --quiet
