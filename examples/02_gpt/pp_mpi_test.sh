#!/usr/bin/env bash
# 3D under MPI (issue 44): the GPT demo at pipeline 2 x tensor 2 x data 2 on 8 processes (oversubscribed)
# reaches the demo's accuracy (>= 0.99) and prints the same losses, gradient norms and held-out scores
# as on 8 thread ranks: every sum adds two values (tensor and data groups of 2) and the stages pass
# activations unchanged, the same in any order. Registered as the CTest example.02_gpt_pp_mpi.
#
#   examples/02_gpt/pp_mpi_test.sh BIN MPIEXEC WORK_DIR [MPIEXEC_PREFLAGS...]
set -euo pipefail
bin=$1 mpiexec=$2 dir=$3
shift 3
source "$(dirname "$0")/proof_lib.sh"
rm -rf "$dir"
mkdir -p "$dir"
flags=(--pp 2 --tp 2 --gas 4 --stage 3 --csv "" --steps-per-print 25)
compared() { grep -E '^\[Rank 0\] step=|held-out' | sed 's/, samples\/s=.*//'; }
"$bin" --ranks 8 "${flags[@]}" > "$dir/threads.log"
"$mpiexec" -n 8 "$@" "$bin" --mpi "${flags[@]}" > "$dir/mpi.log"
grep -q "8 ranks (MPI), tensor 2 x pipeline 2 (1f1b, 4 micro-batches a step) x data 2, ZeRO stage 3" "$dir/mpi.log" ||
  fail "no MPI 3D header" "$(cat "$dir/mpi.log")"
acc=$(accuracy "$(cat "$dir/mpi.log")")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.99) }' || fail "MPI 3D: accuracy $acc < 0.99" "$(cat "$dir/mpi.log")"
n=$(compared < "$dir/mpi.log" | wc -l)
(( n == 13 )) || fail "expected 12 progress lines and the scores, got $n" "$(cat "$dir/mpi.log")"
diff <(compared < "$dir/threads.log") <(compared < "$dir/mpi.log") || fail "the MPI run differs from the thread run"
echo "PASS: under MPI, pipeline 2 x tensor 2 x data 2 at ZeRO-3 reaches $acc and prints the thread run's losses, norms and scores"
