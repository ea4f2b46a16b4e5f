#!/usr/bin/env bash
# Before/after throughput of the GPT demo (examples/02_gpt) for a change: two builds of the demo run
# the same configurations in turn (A B A B ...), so drifting machine load hits both alike, and the
# median tokens/s of each and their ratio B/A are printed as a Markdown table (>1: B is faster).
# The held-out accuracy of each side is printed too: a refactor that keeps the numerics trains the
# same model.
#
#   bench/gpt/compare.sh <demo binary A> <demo binary B> [steps] [reps]
#   e.g. git worktree add ../before <commit> && cmake --preset default -S ../before -B ../before/build/default \
#        && cmake --build ../before/build/default --target zerotk_example_02_gpt
#        bench/gpt/compare.sh ../before/build/default/examples/02_gpt/zerotk_example_02_gpt \
#                             build/default/examples/02_gpt/zerotk_example_02_gpt
set -euo pipefail
a=${1:?binary A}
b=${2:?binary B}
steps=${3:-100}
reps=${4:-5}
for bin in "$a" "$b"; do [[ -x $bin ]] || { echo "not an executable: $bin" >&2; exit 1; }; done

run() {  # binary ranks stage -> "tokens/s accuracy"
  local out
  out=$("$1" --ranks "$2" --stage "$3" --precision bf16 --steps "$steps" --csv "" --steps-per-print 1000000 2>&1) || {
    echo "failed: $1 --ranks $2 --stage $3" >&2; echo "$out" >&2; exit 1; }
  echo "$(sed -n 's/.*s: \([0-9]*\) tokens\/s.*/\1/p' <<<"$out") $(sed -n 's/.*held-out sequence accuracy \([0-9.]*\).*/\1/p' <<<"$out")"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

configs=("2 2" "2 3" "4 2" "4 3")
declare -A ta tb acca accb
for ((r = 0; r < reps; r++)); do
  for c in "${configs[@]}"; do
    read -r ranks stage <<<"$c"
    read -r t acc <<<"$(run "$a" "$ranks" "$stage")"; ta[$c]+="$t "; acca[$c]=$acc
    read -r t acc <<<"$(run "$b" "$ranks" "$stage")"; tb[$c]+="$t "; accb[$c]=$acc
  done
done
echo "| ranks | stage | A tokens/s (median of $reps) | B tokens/s | B / A | accuracy A | accuracy B |"
echo "|---|---|---|---|---|---|---|"
for c in "${configs[@]}"; do
  read -r ranks stage <<<"$c"
  ma=$(tr ' ' '\n' <<<"${ta[$c]}" | grep . | median)
  mb=$(tr ' ' '\n' <<<"${tb[$c]}" | grep . | median)
  ratio=$(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.3f", b / a }')
  echo "| $ranks | $stage | $ma | $mb | $ratio | ${acca[$c]} | ${accb[$c]} |"
done
