#!/usr/bin/env bash
# The delayed parameter update end to end (CTest example.02_gpt_dpu): the demo at ZeRO stage 2 with
# the optimizer state in pinned host memory (--offload-optimizer cpu), with and without
# --delayed-param-update. Every update lands one step late, so the per-step losses (csv_monitor's
# values, every bit) equal the immediate run's exactly up to the step whose forward first misses an
# update, and differ from there: step 4 (the warm-up's first update has lr 0), and with
# --delayed-param-update-start K step K + 2. The delayed run still trains, its memory line's formula (two more pinned buffers of
# 4 B x Psi/N) equals the ledger, and what cannot run is refused naming the flag and the value.
#   dpu_test.sh <zerotk_example_02_gpt> <work dir>
set -euo pipefail
bin=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
source "$(dirname "$0")/proof_lib.sh"

common=(--ranks 2 --stage 2 --layers 2 --steps 20 --eval-size 50 --steps-per-print 10 --offload-optimizer cpu)
run() { "$bin" "${common[@]}" "$@" 2>&1 | tr '\r' '\n'; }
now=$(run --csv "$dir/csv/now")
late=$(run --csv "$dir/csv/late" --delayed-param-update)
warm=$(run --csv "$dir/csv/warm" --delayed-param-update --delayed-param-update-start 5)
loss=Train_Samples_train_loss.csv
losses() { grep "^[0-9]*,[0-9]" "$dir/csv/$1/$loss" | cut -d, -f2; }
[[ $(losses now | grep -c .) -eq 20 ]] || fail "expected 20 losses in $dir/csv/now/$loss" "$now"
[[ $(losses late | grep -c .) -eq 20 ]] || fail "expected 20 losses in $dir/csv/late/$loss" "$late"
# same_until <run> <n>: losses 1..n equal the immediate run's, loss n + 1 differs.
same_until() {
  [[ "$(losses "$1" | head -n "$2")" == "$(losses now | head -n "$2")" ]] ||
    fail "$1: losses 1..$2 differ from the immediate run's" "$(paste -d' ' <(losses now) <(losses "$1") | head -n "$2")"
  [[ "$(losses "$1" | sed -n "$(($2 + 1))p")" != "$(losses now | sed -n "$(($2 + 1))p")" ]] ||
    fail "$1: loss $(($2 + 1)) equals the immediate run's: no update was delayed" "$(paste -d' ' <(losses now) <(losses "$1"))"
}
# The demo's WarmupLR starts at lr 0, so the first update changes nothing: with the delay, step 3's
# forward still sees the initial parameters (it would see update 2 at once).
same_until late 3
same_until warm 6  # steps 1-5 update at once; step 7's forward is the first to miss an update
first=$(losses late | head -n 1)
last=$(losses late | tail -n 1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }' || fail "the delayed run did not train: loss $first -> $last" "$late"
grep -q "held-out" <<<"$late" || fail "no evaluation printed" "$late"

states=$(grep "model states (rank 0)" <<<"$late") || fail "no memory line" "$late"
grep -q "delayed update buffers 2 x 4 B x Psi/N" <<<"$states" || fail "the formula line omits the delayed update's buffers" "$states"
[[ "$(sed -E 's/.*model states \(rank 0\) ([0-9]+) B.*/\1/' <<<"$states")" == "$(sed -E 's/.* = ([0-9]+) B$/\1/' <<<"$states")" ]] ||
  fail "model states differ from the formula line" "$states"

# The memory table says where each row lives: with --offload-optimizer cpu the master and m, v are in
# pinned host memory, and the pinned parts of the params and gradients rows are the step's staging,
# the size the line below the table gives (4 B x min(sub_group_size, Psi/N)).
row() { grep -E "^  $1 " <<<"$now" || fail "no row '$1' in the memory table" "$now"; }
[[ "$(row 'fp32 master')" == *"  pinned host" ]] || fail "the fp32 master row is not in pinned host memory" "$(row 'fp32 master')"
[[ "$(row 'optimizer state')" == *"  pinned host" ]] || fail "the optimizer state row is not in pinned host memory" "$now"
staging=$(sed -nE 's/^ *Psi\/N\) = ([0-9]+) B each.*/\1/p' <<<"$now")
[[ -n "$staging" ]] || fail "no staging line below the memory table" "$now"
[[ "$(row 'params \(working')" == *"compute (host) "*" + pinned host $staging" ]] || fail "params row: no pinned staging of $staging B" "$(row 'params \(working')"
[[ "$(row 'gradients')" == *"compute (host) "*" + pinned host $staging" ]] || fail "gradients row: no pinned staging of $staging B" "$(row gradients)"
grep -q "float compute copy: this model computes in float" <<<"$now" || fail "the float compute copy row is not explained" "$now"

refused "--delayed-param-update" "--offload-optimizer none" "add --offload-optimizer cpu" -- --stage 2 --delayed-param-update
refused "--delayed-param-update" "--offload-optimizer nvme" -- --stage 3 --offload-optimizer nvme --nvme-path "$dir" --delayed-param-update
refused "--delayed-param-update-start" "3" -- --stage 2 --offload-optimizer cpu --delayed-param-update-start 3
echo "PASS: delayed updates land one step late (losses equal up to step 3 and 6, then differ), training goes on, memory line exact, rows placed (staging $staging B pinned), refusals named"
