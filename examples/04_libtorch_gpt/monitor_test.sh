#!/usr/bin/env bash
# The libtorch GPT with the monitor from its DeepSpeed config (csv_monitor, steps_per_print): 20
# steps at stage 3 on 2 thread ranks write DeepSpeed's csv files, one row per step with the right
# sample counts, and the last train_loss row is the loss the run printed; the step lines and the
# progress line are printed.
#   monitor_test.sh <zerotk_example_04_libtorch_gpt> WORK_DIR
set -euo pipefail
exe=$1 dir=$2
fail() { echo "FAIL: $*"; [[ -n ${out:-} ]] && echo "$out"; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"
cat > "$dir/ds_config.json" <<JSON
{"train_batch_size": 64, "gradient_accumulation_steps": 1, "steps_per_print": 10,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
 "csv_monitor": {"enabled": true, "output_path": "$dir/logs", "job_name": "torch_gpt"}}
JSON
out=$("$exe" --ranks 2 --steps 20 --config "$dir/ds_config.json")
csv=$dir/logs/torch_gpt
for f in Train_Samples_train_loss.csv Train_Samples_lr.csv; do
  [[ -f $csv/$f ]] || fail "no $csv/$f"
done
loss=$csv/Train_Samples_train_loss.csv lr=$csv/Train_Samples_lr.csv
[[ $(head -1 "$loss" | tr -d '\r') == "step,train_loss" ]] || fail "train_loss header: $(head -1 "$loss")"
[[ $(head -1 "$lr" | tr -d '\r') == "step,lr" ]] || fail "lr header: $(head -1 "$lr")"
# train_loss rows at the samples before each step (0, 64, ..., 1216), lr rows after it (64 ... 1280).
want_loss=$(seq 0 64 1216 | tr '\n' ' ') want_lr=$(seq 64 64 1280 | tr '\n' ' ')
got_loss=$(tail -n +2 "$loss" | cut -d, -f1 | tr '\n' ' ') got_lr=$(tail -n +2 "$lr" | cut -d, -f1 | tr '\n' ' ')
[[ $got_loss == "$want_loss" ]] || fail "train_loss steps: $got_loss"
[[ $got_lr == "$want_lr" ]] || fail "lr steps: $got_lr"
[[ $(tail -n +2 "$lr" | cut -d, -f2 | tr -d '\r' | sort -u) == "0.003" ]] || fail "lr values: $(cut -d, -f2 "$lr" | sort -u)"
# The last train_loss row is the loss the run printed (to its 4 printed decimals).
printed=$(grep -o 'loss [0-9.]* -> [0-9.]*' <<<"$out" | awk '{print $4}')
last=$(tail -1 "$loss" | cut -d, -f2 | tr -d '\r')
[[ $(awk -v v="$last" 'BEGIN{printf "%.4f", v}') == "$printed" ]] || fail "last csv loss $last, printed $printed"
grep -q '^\[Rank 0\] step=10, skipped=0, lr=\[0.003\]' <<<"$out" || fail "no steps_per_print line at step 10"
grep -q '^\[Rank 0\] step=20,' <<<"$out" || fail "no steps_per_print line at step 20"
grep -q 'step 20/20' <<<"$out" || fail "no final progress line"
echo "PASS: csv_monitor files with 20 rows each, step lines and progress from the DeepSpeed config"
