#!/usr/bin/env bash
# Topology-aware collectives under MPI (issue 46): the GPT demo on 4 processes declared as 2 nodes x 2
# ranks (--topology 2 --ranks-per-node 2; one machine here, so MPI's own detection would find one
# node), at stage 3 with qwZ and qgZ, prints the same losses, gradient norms, bytes per link level
# and ZeRO++ byte counts as on 4 thread ranks placed the same way: every hierarchical sum adds two
# values per level (2 ranks in a node, 2 nodes), which is the same in any order, and the quantized
# exchanges move the same bytes. example.02_gpt_topology shows the thread run reaching the accuracy;
# this run is shorter. Registered as the CTest example.02_gpt_topology_mpi.
#
#   examples/02_gpt/topology_mpi_test.sh BIN MPIEXEC WORK_DIR [MPIEXEC_PREFLAGS...]
set -euo pipefail
bin=$1 mpiexec=$2 dir=$3
shift 3
source "$(dirname "$0")/proof_lib.sh"
rm -rf "$dir"
mkdir -p "$dir"
flags=(--topology 2 --ranks-per-node 2 --stage 3 --quantized-weights --quantized-gradients --steps 60 --steps-per-print 10
       --eval-size 200 --csv "")
compared() { grep -E '^\[Rank 0\] step=|held-out|^links |^ZeRO\+\+ ' | sed 's/, samples\/s=.*//'; }
"$bin" --ranks 4 "${flags[@]}" > "$dir/threads.log"
"$mpiexec" -n 4 "$@" "$bin" --mpi "${flags[@]}" > "$dir/mpi.log"
grep -q "4 ranks (MPI)" "$dir/mpi.log" || fail "no MPI header" "$(cat "$dir/mpi.log")"
grep -q "^links (rank 0, whole run; data group 2 nodes x 2 ranks)" "$dir/mpi.log" || fail "no 2 x 2 links line" "$(cat "$dir/mpi.log")"
n=$(compared < "$dir/mpi.log" | wc -l)
(( n == 10 )) || fail "expected 6 progress lines, the scores, the links line and 2 ZeRO++ lines, got $n" "$(cat "$dir/mpi.log")"
diff <(compared < "$dir/threads.log") <(compared < "$dir/mpi.log") || fail "the MPI run differs from the thread run"
echo "PASS: under MPI, 2 declared nodes x 2 ranks at stage 3 with qwZ + qgZ print the thread run's losses, norms," \
  "scores and bytes per link level"
