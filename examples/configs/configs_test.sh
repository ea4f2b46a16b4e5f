#!/usr/bin/env bash
# The sample configs in examples/configs/ (CTest example.configs): each passes zerotk-config on 4
# ranks (hf_auto.json with the flags that fill its "auto" values, as a Hugging Face Trainer would;
# zero3_tp2.json splits the model across 2 tensor ranks, so its batch counts 2 data ranks)
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
  "zero3_tp2.json||tensor 2 x data 2, ZeRO stage 3, bf16"
  "topology.json||ZeRO stage 2, bf16"
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

# The example fills hf_auto.json's "auto" values itself from its flags, as the HF Trainer does, and
# says on stderr what each became and which flag decided it.
out=$("$bin" --config "$here/hf_auto.json" --ranks 4 --steps 5 --batch 32 --lr 2e-3 --eval-size 50 --csv "" 2>&1 | tr '\r' '\n') ||
  fail "the example did not train with hf_auto.json as it is" "$out"
for want in '/train_micro_batch_size_per_gpu: "auto" resolved to 8 (engine); from --batch 32 / (4 data ranks x --gas 1)' \
            '/optimizer/params/lr: "auto" resolved to 0.002 (engine); from --lr 0.002' \
            '/scheduler/params/total_num_steps: "auto" resolved to 5 (engine); from --steps 5' \
            '/bf16/enabled: "auto" resolved to true' \
            '/zero_optimization/reduce_bucket_size: "auto" resolved to 4096 (hidden size squared); from --d-model 64' \
            "4 ranks (threads), ZeRO stage 2, bf16, batch 32 = 8 micro x 1 accumulation x 4 ranks" "step 5/5"; do
  grep -qF -- "$want" <<<"$out" || fail "hf_auto.json through the example: no '$want'" "$out"
done
# --print-config prints it resolved, on stdout alone: JSON zerotk-config takes, without "auto".
"$bin" --config "$here/hf_auto.json" --ranks 4 --print-config > "$dir/printed.json" 2> "$dir/printed.notes" ||
  fail "--print-config failed on hf_auto.json" "$(cat "$dir/printed.notes")"
grep -q '"auto"' "$dir/printed.json" && fail "--print-config left an \"auto\" value" "$(cat "$dir/printed.json")"
"$zc" "$dir/printed.json" --world 4 > /dev/null 2>&1 || fail "zerotk-config refused what --print-config printed" "$(cat "$dir/printed.json")"
# A batch the ranks do not divide is said in flags, not as an unresolvable "auto".
out=$("$bin" --config "$here/hf_auto.json" --ranks 3 --steps 1 2>&1) && fail "--ranks 3 with --batch 64 trained" "$out"
grep -qF "use --batch 63 or 66" <<<"$out" || fail "the batch error does not name the flag" "$out"
echo "PASS: $n sample configs pass zerotk-config and train the example for 5 steps; the example resolves hf_auto.json itself"
