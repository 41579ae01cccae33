#!/bin/bash
# The last base-grid pair, (512, 16) (m / d_model = 32): h within 2x of 32, 3 seeds, the seed's 80,000-step
# cut-off (minutes per cell on one core). Pass 2 finished only two of its cells (h = 32, D_K 288 and 352, both
# below 0.99). Resumable: finished cells are kept; rerun to go on. Summarize with share_cells_and_summarize.sh. Runs outside the
# checkout so the installed package (with its compiled kernels) is imported.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd /tmp
OMP_NUM_THREADS=1 python -m factkernels rgr-search \
  rgr-budget --pairs 512:16 --heads 16,32,64 --heads-window 2 --out "$ROOT/benchmarks/results/experiments" --threads 1
