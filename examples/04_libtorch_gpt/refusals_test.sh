#!/usr/bin/env bash
# The libtorch example refuses what it would otherwise drop (issue 57 item 15): an unknown flag is an
# error naming it (it used to start a 300-step run without it), --help prints the flags and trains
# nothing, and a DeepSpeed config that asks for tensor or pipeline parallelism is refused by the
# engine (this trainer builds no grid; it used to train plain data parallel with a doubled batch).
#   refusals_test.sh <zerotk_example_04_libtorch_gpt> <work dir>
set -euo pipefail
exe=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $1"; echo "$2"; exit 1; }
if out=$("$exe" --stages 3 2>&1); then fail "--stages 3 (a misspelt flag) ran" "$out"; fi
grep -q -- "--stages" <<<"$out" && grep -q "unknown flag" <<<"$out" || fail "the error does not name --stages" "$out"
if out=$("$exe" --steps 2>&1); then fail "--steps without a value ran" "$out"; fi
grep -q "needs a value" <<<"$out" || fail "no 'needs a value' for --steps" "$out"
out=$("$exe" --help 2>&1) || fail "--help failed" "$out"
grep -q -- "--stage 0|1|2|3" <<<"$out" && grep -q -- "--config FILE" <<<"$out" || fail "--help does not list the flags" "$out"
grep -q "loss\|PASS" <<<"$out" && fail "--help trained" "$out"
cat > "$dir/tp2.json" <<'JSON'
{"train_batch_size": 64, "tensor_model_parallel_size": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}, "zero_optimization": {"stage": 2}}
JSON
if out=$("$exe" --ranks 2 --steps 3 --config "$dir/tp2.json" 2>&1); then fail "a tensor-parallel config trained without a grid" "$out"; fi
grep -q "/tensor_model_parallel_size" <<<"$out" && grep -q "a plain communicator" <<<"$out" ||
  fail "the refusal does not name tensor_model_parallel_size and the plain communicator" "$out"
echo "PASS: unknown flags and a flag without its value are refused naming them; --help lists the flags; a tensor-parallel config is refused without a grid"
