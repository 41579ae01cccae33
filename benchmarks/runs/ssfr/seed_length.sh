#!/bin/bash
# Sec. 5.1 / Fig. 3a at the seed's training length: d = 128, 4 seeds, GPT-2 block with its final RMSNorm, AdamW at
# lr 2e-4 on up to 4.8M sequences (18,750 steps of 256) or until every training sequence is right -- the seed
# grid's own settings, which seed_d128.sh shortens to 6,000 x 64 sequences at lr 1e-2 for a CPU core. Into
# experiments-seed-length (the cells' keys differ from the shortened run's: other steps, batch size and lr;
# the device is not in the key, so cells a CPU finished are kept by a GPU run and the other way round). The
# headline cells (seed modifications vs vanilla) first, then the W-vs-F searches F ascending. Each command
# gets at most CELL_SECONDS (default 300), so a lent GPU's time limit leaves every finished transformer of a
# headline cell, and every finished size of a search, behind in the cell's partial file; run it again to resume.
#   bash benchmarks/runs/ssfr/seed_length.sh [COPY_TO]             # on a GPU (DEVICE=cuda, the default)
#   DEVICE=cpu CELL_SECONDS=36000 bash benchmarks/runs/ssfr/seed_length.sh   # on a CPU: ~35 min per transformer
# With COPY_TO, the results are packed into COPY_TO/ssfr.tgz after every cell (a device machine returns only
# $OUT, at most 8 files); unpack with tar xzf ssfr.tgz -C benchmarks/results/experiments-seed-length.
# Bound a device call with CELL_SECONDS, not with timeout around this script: a killed script leaves its
# python running, holding the call open past its limit.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
COPY_TO="${1:-}"
RESULTS="$ROOT/benchmarks/results/experiments-seed-length"
cd /tmp
for only in "part=headline" "facts=256" "facts=512" "facts=1024" "facts=2048" "facts=4096" "facts=8192" \
            "facts=16384"; do
  timeout "${CELL_SECONDS:-300}" python -m factkernels experiment ssfr --scale seed --only "$only" \
    --device "${DEVICE:-cuda}" --out "$RESULTS" --resume --quiet
  echo "$only: exit $? at $(date +%T)"
  if [ -n "$COPY_TO" ]; then mkdir -p "$COPY_TO" && tar czf "$COPY_TO/ssfr.tgz" -C "$RESULTS" ssfr; fi
done
