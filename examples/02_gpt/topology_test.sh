#!/usr/bin/env bash
# Topology-aware collectives, ZeRO++'s qwZ / qgZ and slow ranks end to end (issue 46): the GPT demo on
# 4 thread ranks placed as 2 simulated nodes x 2 (--topology 2 --ranks-per-node 2).
#  - ZeRO stages 0-3 on the hierarchical data group reach the demo's accuracy (>= 0.99), each
#    printing the bytes it sent inside and across the nodes;
#  - stage 3 with qwZ and qgZ (--quantized-weights --quantized-gradients) reaches it too, its
#    gathers int8 and its reduce-scatters int4 (no plain fallback), with >= 2x fewer bytes across
#    nodes than plain stage 3 (bf16: forward + backward gathers at 1 B instead of 2, gradients at
#    0.5 B instead of 2: 6 / 2.5 = 2.4x; the 3-4x of ZeRO++ needs hpZ as well, bench/RESULTS.md);
#  - --slow-rank 1:2: the slow-rank detector (window 20, count 3) names rank 1, and no other, in
#    the progress lines from step 60 on, with a factor in [1.4, 2.6] (measured in thread CPU time,
#    which the other threads sharing the 2 cores still disturb: 1.7-1.9 here; at 1:1.3 the factor
#    read 1.13-1.33, too near the detector's 1.1 to assert on a loaded machine); nobody before;
#  - refusals name the flags.
# Registered as the CTest example.02_gpt_topology.
#
#   examples/02_gpt/topology_test.sh BIN WORK_DIR
set -euo pipefail
bin=$1 dir=$2
source "$(dirname "$0")/proof_lib.sh"
rm -rf "$dir"
mkdir -p "$dir"

topo=(--ranks 4 --topology 2 --ranks-per-node 2 --csv "")
# link_bytes OUTPUT 1|2: bytes rank 0 sent inside its node, or across nodes, from the "links" line.
link_bytes() { sed -n "s/^links (rank 0, whole run; data group 2 nodes x 2 ranks): \([0-9]*\) B inside the node, \([0-9]*\) B across nodes$/\\$2/p" <<<"$1"; }
accs=""
for stage in 0 1 2 3; do
  out=$("$bin" "${topo[@]}" --stage "$stage")
  across=$(link_bytes "$out" 2)
  [[ -n "$across" && "$across" -gt 0 ]] || fail "stage $stage: no links line for 2 nodes x 2 ranks" "$out"
  acc=$(accuracy "$out")
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.99) }' || fail "stage $stage on 2 nodes x 2: accuracy $acc < 0.99" "$out"
  accs+="$acc "
  if (( stage == 3 )); then plain_across=$across; fi
done

out=$("$bin" "${topo[@]}" --stage 3 --quantized-weights --quantized-gradients)
acc_q=$(accuracy "$out")
awk -v a="$acc_q" 'BEGIN { exit !(a >= 0.99) }' || fail "stage 3 with qwZ + qgZ: accuracy $acc_q < 0.99" "$out"
grep -qE "^ZeRO\+\+ qwZ \(rank 0, whole run\): [1-9][0-9]* B of int8 parameter gathers" <<<"$out" || fail "no qwZ gathers" "$out"
grep -qE "^ZeRO\+\+ qgZ \(rank 0, whole run\): [1-9][0-9]* B of int4 gradient reduce-scatters in [1-9][0-9]* calls \(0 fell back" <<<"$out" ||
  fail "no qgZ reduce-scatters, or some fell back to plain ones" "$out"
q_across=$(link_bytes "$out" 2)
[[ -n "$q_across" ]] || fail "qwZ + qgZ: no links line" "$out"
awk -v p="$plain_across" -v q="$q_across" 'BEGIN { exit !(p >= 2 * q) }' ||
  fail "plain stage 3 sent $plain_across B across nodes, qwZ + qgZ $q_across B: less than 2x fewer" "$out"
q_ratio=$(awk -v p="$plain_across" -v q="$q_across" 'BEGIN { printf "%.2f", p / q }')

# The straggler: window 20 x count 3 flags it at step 60; lines every 20 steps.
out=$("$bin" "${topo[@]}" --steps 100 --steps-per-print 20 --slow-rank 1:2)
for step in 20 40; do
  line=$(grep "^\[Rank 0\] step=$step," <<<"$out") || fail "no progress line at step $step" "$out"
  ! grep -q "slow_ranks" <<<"$line" || fail "a rank flagged before window x count steps" "$line"
done
for step in 60 80 100; do
  line=$(grep "^\[Rank 0\] step=$step," <<<"$out") || fail "no progress line at step $step" "$out"
  factor=$(sed -n 's/.*slow_ranks=\[1 ([^)]*) \([0-9.]*\)x other\]$/\1/p' <<<"$line")
  [[ -n "$factor" ]] || fail "step $step: rank 1 (alone, in phase other) is not named slow" "$line"
  awk -v f="$factor" 'BEGIN { exit !(f >= 1.4 && f <= 2.6) }' || fail "step $step: rank 1's factor $factor is not near 2" "$line"
done

refused "--ranks-per-node 3" "--ranks 2" -- --topology 2 --ranks-per-node 3
refused "--ranks-per-node 2" "--topology 1" -- --ranks-per-node 2
refused "--quantized-weights" "--stage 2" -- --quantized-weights
refused "--quantized-gradients" "--stage 1" -- --quantized-gradients --stage 1
refused "--slow-rank 2:1.3" "--ranks 2" -- --slow-rank 2:1.3
refused "--slow-rank" "1:0.5" -- --slow-rank 1:0.5
refused "--slow-rank" "rank1" -- --slow-rank rank1
refused "--topology" "3" -- --topology 3
"$bin" --print-config --ranks 2 > "$dir/flat.json"
refused "--topology" "$dir/flat.json" -- --topology 2 --config "$dir/flat.json"
refused "--slow-rank 1:1.3" "slow_node" -- --slow-rank 1:1.3 --config "$dir/flat.json"

echo "PASS: on 2 simulated nodes x 2 ranks, ZeRO stages 0-3 reach ${accs% } and stage 3 with qwZ + qgZ $acc_q," \
  "sending ${q_ratio}x fewer bytes across nodes than plain stage 3; --slow-rank 1:2 is reported naming rank 1" \
  "(factor $factor) from step 60; refusals name the flags"
