#!/bin/bash
# Fig. 2b's GD cells on a GPU (--device cuda), cheapest first: d = 64, F = 2,048 / 4,096 (also in gd_cpu.sh, for a
# CPU core) and d = 128, F = 2,048 ... 16,384, whose F x |V| logits per model and step put the larger ones out
# of a CPU's reach. Each cell gets at most CELL_SECONDS (default 240), so a lent GPU's time limit leaves every
# finished cell, and every finished size of a cut-off cell (its partial file), behind; run it again to resume.
#   bash benchmarks/runs/scaling/gd_gpu.sh [COPY_TO]
# With COPY_TO, the results are packed into COPY_TO/scaling.tgz after every cell (a device machine returns only
# $OUT, at most 8 files); unpack with tar xzf scaling.tgz -C benchmarks/results/experiments-seed.
# TOTAL_SECONDS (default: no bound) caps the whole script: each cell gets the smaller of CELL_SECONDS and what is
# left, and no cell starts with under 30 s left.
# Bound a device call with CELL_SECONDS, not with timeout around this script: a killed script leaves its
# python running, holding the call open past its limit.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
COPY_TO="${1:-}"
RESULTS="$ROOT/benchmarks/results/experiments-seed"
cd /tmp
begin=$SECONDS
for cell in "d=64 facts=2048" "d=128 facts=2048" "d=64 facts=4096" "d=128 facts=4096" "d=128 facts=8192" \
            "d=128 facts=16384"; do
  set -- $cell
  budget=${CELL_SECONDS:-240}
  if [ -n "${TOTAL_SECONDS:-}" ]; then
    left=$((TOTAL_SECONDS - (SECONDS - begin)))
    [ "$left" -lt 30 ] && { echo "$cell: not started, $left s left"; continue; }
    [ "$left" -lt "$budget" ] && budget=$left
  fi
  timeout "$budget" python3 -m factkernels experiment scaling --scale seed --only method=gd --only "$1" \
    --only "$2" --device cuda --out "$RESULTS" --resume --quiet
  echo "$cell: exit $? at $(date +%T)"
  if [ -n "$COPY_TO" ]; then mkdir -p "$COPY_TO" && tar czf "$COPY_TO/scaling.tgz" -C "$RESULTS" scaling; fi
done
