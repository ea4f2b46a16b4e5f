#!/usr/bin/env bash
# The sample configs in examples/configs/ (CTest example.configs): each passes zerotk-config on 4
# ranks (hf_auto.json with the flags that fill its "auto" values, as a Hugging Face Trainer would)
# and trains the GPT example for 5 steps through --config on 4 thread ranks, with the stage,
# precision and optimizer the config names in the example's header line.
#   configs_test.sh <zerotk-config> <zerotk_example_02_gpt> <work dir>
set -euo pipefail
zc=$1 bin=$2 dir=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dir" && mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $1"; shift; for x in "$@"; do echo "$x"; done; exit 1; }

# config | zerotk-config flags | what the example's header must say
cases=(
  "zero2_bf16.json||ZeRO stage 2, bf16"
  "zero3_offload.json||ZeRO stage 3, bf16"
  "onebit_adam.json||ZeRO stage 0, fp32"
  "hf_auto.json|--hidden 64 --precision bf16 --micro-batch 16 --grad-accum 1 --lr 3e-3 --total-steps 300 --warmup-steps 30|ZeRO stage 2, bf16"
)
n=0
for c in "${cases[@]}"; do
  IFS='|' read -r file flags header <<<"$c"
  # shellcheck disable=SC2086  # flags are words
  "$zc" "$here/$file" --world 4 $flags > "$dir/$file" 2> "$dir/$file.notes" ||
    fail "zerotk-config refused $file" "$(cat "$dir/$file.notes")"
  grep -q "is usable on 4 ranks" "$dir/$file.notes" || fail "zerotk-config did not find $file usable" "$(cat "$dir/$file.notes")"
  out=$("$bin" --config "$dir/$file" --ranks 4 --steps 5 --eval-size 50 --csv "" 2>&1 | tr '\r' '\n') ||
    fail "the example did not train with $file" "$out"
  grep -qF "4 ranks (threads), $header, batch 64" <<<"$out" || fail "$file: the header does not say '$header'" "$out"
  grep -q "step 5/5" <<<"$out" || fail "$file: training did not reach step 5" "$out"
  n=$((n + 1))
done
grep -q "OneBitAdam" "$dir/onebit_adam.json" || fail "the resolved 1-bit Adam config lost its optimizer" "$(cat "$dir/onebit_adam.json")"
grep -q '"auto"' "$dir/hf_auto.json" && fail "zerotk-config left an \"auto\" value" "$(cat "$dir/hf_auto.json")"
echo "PASS: $n sample configs pass zerotk-config and train the example for 5 steps"
