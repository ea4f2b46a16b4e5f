#!/usr/bin/env bash
# Tensor parallelism under MPI (one process per rank, issue 43): the GPT demo at tensor 2 x data 2 on
# 4 processes reaches the demo's accuracy (>= 0.99) and prints the same losses, gradient norms and
# held-out scores as on 4 thread ranks: every sum here adds two values (a tensor group of 2, a data
# group of 2), which is the same in any order. Registered as the CTest example.02_gpt_tp_mpi.
#
#   examples/02_gpt/tp_mpi_test.sh BIN MPIEXEC WORK_DIR [MPIEXEC_PREFLAGS...]
set -euo pipefail
bin=$1 mpiexec=$2 dir=$3
shift 3
source "$(dirname "$0")/proof_lib.sh"
rm -rf "$dir"
mkdir -p "$dir"
flags=(--tp 2 --csv "" --steps-per-print 25)
compared() { grep -E '^\[Rank 0\] step=|held-out' | sed 's/, samples\/s=.*//'; }
"$bin" --ranks 4 "${flags[@]}" > "$dir/threads.log"
"$mpiexec" -n 4 "$@" "$bin" --mpi "${flags[@]}" > "$dir/mpi.log"
grep -q "4 ranks (MPI), tensor 2 x data 2" "$dir/mpi.log" || fail "no MPI grid header" "$(cat "$dir/mpi.log")"
acc=$(accuracy "$(cat "$dir/mpi.log")")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.99) }' || fail "MPI tensor 2 x data 2: accuracy $acc < 0.99" "$(cat "$dir/mpi.log")"
n=$(compared < "$dir/mpi.log" | wc -l)
(( n == 13 )) || fail "expected 12 progress lines and the scores, got $n" "$(cat "$dir/mpi.log")"
diff <(compared < "$dir/threads.log") <(compared < "$dir/mpi.log") || fail "the MPI run differs from the thread run"
echo "PASS: under MPI, tensor 2 x data 2 reaches $acc and prints the thread run's losses, norms and scores"
