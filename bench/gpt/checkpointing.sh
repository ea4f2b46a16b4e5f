#!/usr/bin/env bash
# Activation checkpointing on the GPT demo (examples/02_gpt): the activation peak per rank (the
# ledger's `activations` category, which the blocks report through a Meter) and the step time of
# --checkpoint-activations all and every:2 against none, measured inside the same run. Issue 15 asks
# for all: activation bytes <= 1/5 of none and step time <= 1.35x. Each configuration runs `reps`
# times, interleaved, and the best throughput is kept.
#
#   bench/gpt/checkpointing.sh [build-dir] [steps] [reps] [layers...]   # prints a Markdown table
set -euo pipefail
build=${1:-build/default}
steps=${2:-60}
reps=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
layer_list=("${@:-8 12}")
read -r -a layer_list <<<"${layer_list[*]}"
bin=$build/examples/02_gpt/zerotk_example_02_gpt
[[ -x $bin ]] || { echo "build $bin first (cmake --build --preset default --target zerotk_example_02_gpt)" >&2; exit 1; }
declare -A tps peak
for ((r = 0; r < reps; r++)); do
  for layers in "${layer_list[@]}"; do
    for sel in none all every:2; do
      out=$("$bin" --ranks 2 --stage 2 --precision bf16 --layers "$layers" --steps "$steps" --csv "" \
        --steps-per-print 1000000 --eval-size 100 --checkpoint-activations "$sel" 2>&1)
      t=$(sed -n 's/.*s: \([0-9]*\) tokens\/s.*/\1/p' <<<"$out")
      k=$layers/$sel
      peak[$k]=$(sed -n 's/^activation peak per rank: \([0-9]*\) B.*/\1/p' <<<"$out")
      if [[ -z ${tps[$k]:-} || $t -gt ${tps[$k]} ]]; then tps[$k]=$t; fi
    done
  done
done
echo "| blocks | checkpointing | activation peak per rank (B) | vs none | tokens/s (best of $reps) | step time vs none |"
echo "|---|---|---|---|---|---|"
for layers in "${layer_list[@]}"; do
  for sel in none all every:2; do
    k=$layers/$sel
    mem=$(awk -v a="${peak[$k]}" -v b="${peak[$layers/none]}" 'BEGIN { printf "%.3f", a / b }')
    time=$(awk -v a="${tps[$layers/none]}" -v b="${tps[$k]}" 'BEGIN { printf "%.3fx", a / b }')
    echo "| $layers | $sel | ${peak[$k]} | $mem | ${tps[$k]} | $time |"
  done
done
