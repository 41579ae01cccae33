#!/bin/bash
# share identical base-model cells into the experiments that compare against them, then summarize every cell present
cd "$(dirname "$0")/../../.."
PY=python
OUT=benchmarks/results/experiments
$PY benchmarks/runs/rgr/share_cells.py $OUT rgr-regular 128:32
$PY benchmarks/runs/rgr/share_cells.py $OUT rgr-softmax 64:16,64:32
$PY benchmarks/runs/rgr/share_cells.py $OUT rgr-diagonal 128:16,256:32,512:64
for e in rgr-budget rgr-regular rgr-softmax rgr-diagonal; do
  OMP_NUM_THREADS=1 $PY -c "from factkernels.experiments import engine; print(engine.summarize_dir('$e', '$OUT')[1])"
done
