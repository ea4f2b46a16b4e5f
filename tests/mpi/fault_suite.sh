#!/usr/bin/env bash
# The MPI fault suite: runs every case of zerotk_mpi_faults under `mpiexec -np 2` (np 4 on a grid) and checks that
# each ends with a zerotk error naming the ranks and the operation, within the timeout: never a
# hang (a hard limit kills the run), never a silent abort, never exit status 0.
#
#   ZEROTK_COMM_TIMEOUT_MS=3000 tests/mpi/fault_suite.sh build/default/tests/mpi/zerotk_mpi_faults [mpiexec [args...]]
#
# CTest registers it as mpi.faults (label mpi). As root or on few cores, set the OMPI_* variables
# that tests/mpi/CMakeLists.txt sets for the MPI tests.
set -uo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 ZEROTK_MPI_FAULTS_BINARY [MPIEXEC [MPIEXEC_ARGS...]]" >&2
  exit 2
fi
bin=$1
shift
mpiexec_cmd=("${@:-mpiexec}")
timeout_ms=${ZEROTK_COMM_TIMEOUT_MS:-3000}
export ZEROTK_COMM_TIMEOUT_MS=$timeout_ms
# A case that waits for the timeout may take: the timeout, the peers' answers (<= 2 s), the abort.
slow_limit_s=$(( timeout_ms / 1000 + 12 ))
fast_limit_s=12
hard_limit_s=$(( slow_limit_s + 30 ))  # beyond this the case hangs: kill it

failures=0
np=2  # processes per case (a case on a grid sets it)
# check <case> <limit_s> <required text>...: every text must appear in the output.
check() {
  local name=$1 limit=$2
  shift 2
  local out start end rc elapsed missing=()
  start=$(date +%s%N)
  out=$(timeout --kill-after=5 "$hard_limit_s" "${mpiexec_cmd[@]}" -np "$np" "$bin" "$name" 2>&1)
  rc=$?
  end=$(date +%s%N)
  elapsed=$(( (end - start) / 1000000 ))
  for text in "$@"; do
    grep -qF -- "$text" <<<"$out" || missing+=("$text")
  done
  local verdict=PASS why=""
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    verdict=FAIL why="hung (killed after ${hard_limit_s} s)"
  elif [[ $rc -eq 0 ]]; then
    verdict=FAIL why="exit status 0: the fault went unnoticed"
  elif [[ ${#missing[@]} -gt 0 ]]; then
    verdict=FAIL why="missing in the output: $(printf '[%s] ' "${missing[@]}")"
  elif (( elapsed > limit * 1000 )); then
    verdict=FAIL why="took ${elapsed} ms (limit ${limit} s)"
  fi
  printf '%s %-13s %6d ms  exit %d  %s\n' "$verdict" "$name" "$elapsed" "$rc" "$why"
  if [[ $verdict == FAIL ]]; then
    failures=$((failures + 1))
    sed 's/^/    | /' <<<"$out"
  fi
}

t=$timeout_ms
ar="all_reduce(count 1000, fp32, sum)"
check count "$fast_limit_s" "zerotk comm error" "mismatched collective #0 on world" \
  "rank 0: $ar" "rank 1: all_reduce(count 999, fp32, sum)"
check dtype "$fast_limit_s" "zerotk comm error" "mismatched collective #0 on world" \
  "rank 0: $ar" "rank 1: all_reduce(count 1000, fp64, sum)"
check op "$fast_limit_s" "zerotk comm error" "mismatched collective #0 on world" \
  "rank 0: $ar" "rank 1: all_reduce(count 1000, fp32, max)"
check root "$fast_limit_s" "zerotk comm error" "mismatched collective #0 on world" \
  "rank 0: broadcast(count 1000, fp32, root 0)" "rank 1: broadcast(count 1000, fp32, root 1)"
check kind "$fast_limit_s" "zerotk comm error" "mismatched collective #0 on world" \
  "all_reduce(count 2000, fp32, sum)" "all_gather(count 1000, fp32)"
check order "$fast_limit_s" "zerotk comm error" "mismatched collective #0 on world" \
  "$ar" "broadcast(count 1000, fp32, root 0)"
check caught "$slow_limit_s" "rank 1 caught: injected failure on rank 1" \
  "timed out after $t ms in $ar #0 on world: rank 1 has not called it" \
  "its MpiSession is finalizing" "zerotk: rank 0 of 2 aborts the MPI job"
check absent "$slow_limit_s" \
  "timed out after $t ms in $ar #0 on world: rank 1 has not called it" \
  "rank 1: not called (last call on this communicator: none, then it destroyed the communicator; it left: its MpiSession is finalizing"
check stopped "$slow_limit_s" \
  "timed out after $t ms in $ar #0 on world: rank 1 does not answer (stopped, dead, or busy outside zerotk)" \
  "zerotk: rank 0 of 2 aborts the MPI job"
# On a grid (4 processes, tensor 2 x data 2) a stopped rank is named by its world rank, and its group by role.
np=4
check grid_stopped "$slow_limit_s" \
  "timed out after $t ms in $ar #0 on world/tensor[data 1, pipeline 0]: rank 1 (world 3) does not answer" \
  "zerotk: rank 2 of 4 aborts the MPI job"
np=2
check escape "$fast_limit_s" \
  "zerotk: rank 1 of 2 aborts the MPI job: it is leaving with an exception in flight"
check dropped "$fast_limit_s" "aborts the MPI job: an operation failed, its Work was destroyed without wait()" \
  "mismatched collective #0 on world"
check raw_truncate "$fast_limit_s" "zerotk comm error" "MPI_Iallreduce failed: MPI_ERR_TRUNCATE"

if [[ $failures -gt 0 ]]; then
  echo "fault suite: $failures case(s) failed"
  exit 1
fi
echo "fault suite: every case ended with a zerotk error within its limit"
