#!/usr/bin/env bash
# Stages 0, 1, 2 and 3 of the libtorch GPT on 2 thread ranks end with bit-identical parameters
# (the checksum of their bits after 30 steps), and so does stage 3 with every child recomputed in
# backward (--recompute, grads.checkpoint). With MPIEXEC: stages 0 and 3 on 2 MPI processes end
# with the same bits as stage 0 on 2 threads.
#   stages_test.sh <zerotk_example_04_libtorch_gpt> [MPIEXEC [MPIEXEC_PREFLAGS...]]
set -euo pipefail
exe=$1
shift
mpiexec=${1:-}
[[ $# -gt 0 ]] && shift
checksum() { grep -o 'parameter checksum [0-9a-f]*' | awk '{print $3}'; }
ref=""
thread_runs=("0" "1" "2" "3" "3 --recompute")
[[ -n $mpiexec ]] && thread_runs=("0")  # the reference; example.04_libtorch_gpt_stages runs them all
for run in "${thread_runs[@]}"; do
  read -r s more <<<"$run"
  # shellcheck disable=SC2086  # $more: the extra flag, if any
  out=$("$exe" --stage "$s" --ranks 2 --steps 30 $more)
  sum=$(checksum <<<"$out")
  [[ -n $sum ]] || { echo "FAIL: stage $run printed no checksum"; echo "$out"; exit 1; }
  echo "threads, stage $run: $sum"
  [[ -z $ref ]] && ref=$sum
  [[ $sum == "$ref" ]] || { echo "FAIL: stage $run differs from stage 0"; exit 1; }
done
if [[ -n $mpiexec ]]; then
  for s in 0 3; do
    out=$("$mpiexec" -n 2 "$@" "$exe" --mpi --stage "$s" --steps 30)
    sum=$(checksum <<<"$out")
    [[ -n $sum ]] || { echo "FAIL: MPI stage $s printed no checksum"; echo "$out"; exit 1; }
    echo "MPI 2 processes, stage $s: $sum"
    [[ $sum == "$ref" ]] || { echo "FAIL: MPI stage $s differs from the thread runs"; exit 1; }
  done
  echo "PASS: stages 0 and 3 under MPI bitwise identical to the thread run"
else
  echo "PASS: stages 0-3 (and stage 3 with --recompute) bitwise identical"
fi
