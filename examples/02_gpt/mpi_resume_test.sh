#!/usr/bin/env bash
# Checkpoints under MPI (one process per rank): the GPT demo saves on 2 processes after 3 steps;
# resumed on 2 processes it equals the uninterrupted 2-process run line for line (steps 4-6, scores);
# resumed on 4 processes it reshards and trains on. Registered as the CTest example.02_gpt_mpi_resume.
#
#   examples/02_gpt/mpi_resume_test.sh BIN MPIEXEC WORK_DIR [MPIEXEC_PREFLAGS...]
set -euo pipefail
bin=$1 mpiexec=$2 dir=$3
shift 3
rm -rf "$dir"
mkdir -p "$dir"
run() { local np=$1; shift; "$mpiexec" -n "$np" "$@" "$bin" --mpi --csv "" --eval-size 200 --steps-per-print 1 "${extra[@]}"; }
compared() { grep -E '^\[Rank 0\] step=[4-6],|held-out' | sed 's/, samples\/s=.*//'; }
extra=(--steps 6); run 2 > "$dir/straight.log"
extra=(--steps 3 --save "$dir/ckpt"); run 2 > "$dir/first.log"
extra=(--steps 6 --load "$dir/ckpt"); run 2 > "$dir/resumed.log"
extra=(--steps 4 --load "$dir/ckpt"); run 4 > "$dir/resharded.log"
n=$(compared < "$dir/resumed.log" | wc -l)
[[ $n -eq 4 ]] || { echo "FAIL: expected 4 lines to compare (steps 4-6 and the scores), got $n"; exit 1; }
diff <(compared < "$dir/straight.log") <(compared < "$dir/resumed.log") ||
  { echo "FAIL: the resumed MPI run differs from the uninterrupted one"; exit 1; }
grep -q "continuing after step 3 (saved on 2 ranks, resharded)" "$dir/resharded.log" || { echo "FAIL: no resharded resume on 4 processes"; exit 1; }
grep -q '^\[Rank 0\] step=4,' "$dir/resharded.log" || { echo "FAIL: the 4-process run did not reach step 4"; exit 1; }
echo "PASS: under MPI, resumed on 2 processes equals the uninterrupted run; resharded onto 4 processes it trains on"
