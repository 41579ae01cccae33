# Sourced by the real-lm-editing run scripts: run N [--only ...] runs cells of the seed grid with N facts,
# one thread, resumable (finished cells are kept).
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
run() { local n=$1; shift; factkernels experiment real-lm-editing --scale seed --out benchmarks/results/experiments \
          --resume --threads 1 --quiet --only "n_facts=$n" "$@"; }
