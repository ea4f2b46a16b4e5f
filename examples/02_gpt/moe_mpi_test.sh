#!/usr/bin/env bash
# Mixture of experts under MPI (issue 58): 4 experts top-2 at expert parallel 2 x tensor 2 x pipeline 2
# on 8 processes (oversubscribed), ZeRO-3, bf16 (the demo's), prints the thread run's losses, gradient norms, held-out
# scores and expert loads line for line: the dispatcher's all-to-all moves the same rows in the same
# order on either back end, and every sum adds two values. Registered as the CTest example.02_gpt_moe_mpi.
#
#   examples/02_gpt/moe_mpi_test.sh BIN MPIEXEC WORK_DIR [MPIEXEC_PREFLAGS...]
set -euo pipefail
bin=$1 mpiexec=$2 dir=$3
shift 3
source "$(dirname "$0")/proof_lib.sh"
rm -rf "$dir"
mkdir -p "$dir"
flags=(--experts 4 --top-k 2 --ep 2 --tp 2 --pp 2 --gas 4 --stage 3 --steps 60 --steps-per-print 20 --eval-size 100 --csv "")
compared() { grep -E '^\[Rank 0\] step=|held-out|^experts \(' | sed 's/, samples\/s=.*//'; }
"$bin" --ranks 8 "${flags[@]}" > "$dir/threads.log" 2>&1 || fail "the thread run failed" "$(cat "$dir/threads.log")"
"$mpiexec" -n 8 "$@" "$bin" --mpi "${flags[@]}" > "$dir/mpi.log" 2>&1 || fail "the MPI run failed" "$(cat "$dir/mpi.log")"
grep -q "8 ranks (MPI), tensor 2 x pipeline 2 (1f1b, 4 micro-batches a step) x data 2; experts over expert parallel 2, ZeRO stage 3, bf16" "$dir/mpi.log" ||
  fail "no MPI expert-parallel header" "$(cat "$dir/mpi.log")"
n=$(compared < "$dir/mpi.log" | wc -l)
(( n == 5 )) || fail "expected 3 progress lines, the scores and the experts' load, got $n" "$(cat "$dir/mpi.log")"
diff <(compared < "$dir/threads.log") <(compared < "$dir/mpi.log") || fail "the MPI run differs from the thread run"
echo "PASS: under MPI, expert parallel 2 x tensor 2 x pipeline 2 at ZeRO-3 prints the thread run's losses, norms, scores and expert loads"
