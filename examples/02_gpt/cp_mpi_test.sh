#!/usr/bin/env bash
# Context parallelism under MPI (issue 59): context 2 x tensor 2 (p2p, then a2a) on
# 4 processes (oversubscribed), ZeRO-3, bf16, prints the thread run's losses, gradient norms and
# held-out scores line for line: the ring's sends and Ulysses' all-to-alls move the same rows in the
# same order on either back end. Registered as the CTest example.02_gpt_cp_mpi.
#
#   examples/02_gpt/cp_mpi_test.sh BIN MPIEXEC WORK_DIR [MPIEXEC_PREFLAGS...]
set -euo pipefail
bin=$1 mpiexec=$2 dir=$3
shift 3
source "$(dirname "$0")/proof_lib.sh"
rm -rf "$dir"
mkdir -p "$dir"
compared() { grep -E '^\[Rank 0\] step=|held-out' | sed 's/, samples\/s=.*//'; }
common=(--stage 3 --steps 40 --steps-per-print 10 --eval-size 100 --csv "")
# Data groups of 2 ranks, so that every sum of the engine's reductions adds two values on either
# back end (a 4-rank all-reduce may associate otherwise under MPI).
for mode in "--cp 2 --tp 2" "--cp 2 --cp-mode a2a --tp 2"; do
  read -r -a flags <<<"$mode"
  "$bin" --ranks 4 "${flags[@]}" "${common[@]}" > "$dir/threads.log" 2>&1 || fail "the thread run ($mode) failed" "$(cat "$dir/threads.log")"
  "$mpiexec" -n 4 "$@" "$bin" --mpi "${flags[@]}" "${common[@]}" > "$dir/mpi.log" 2>&1 || fail "the MPI run ($mode) failed" "$(cat "$dir/mpi.log")"
  grep -q "4 ranks (MPI)" "$dir/mpi.log" || fail "no MPI header ($mode)" "$(cat "$dir/mpi.log")"
  n=$(compared < "$dir/mpi.log" | wc -l)
  (( n == 5 )) || fail "$mode: expected 4 progress lines and the score, got $n" "$(cat "$dir/mpi.log")"
  diff <(compared < "$dir/threads.log") <(compared < "$dir/mpi.log") || fail "$mode: the MPI run differs from the thread run"
done
echo "PASS: under MPI, context 2 x tensor 2 (p2p, and a2a) at ZeRO-3 prints the thread runs' losses, norms and scores"
