#!/usr/bin/env bash
# The libtorch GPT trained 120 steps at stage 2 on 2 thread ranks from a DeepSpeed config (the one
# the flags stand for, plus csv_monitor): the loss halves, and the monitor the config asks for works:
# DeepSpeed's csv files with one row per step at the right sample counts, the last train_loss row
# equal to the loss the run printed, the lr rows equal to the lr the step lines printed, the step
# lines every steps_per_print steps and the progress line.
#   monitor_test.sh <zerotk_example_04_libtorch_gpt> WORK_DIR
set -euo pipefail
exe=$1 dir=$2
steps=120 batch=64
fail() { echo "FAIL: $*"; [[ -n ${out:-} ]] && echo "$out"; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"
cat > "$dir/ds_config.json" <<JSON
{"train_batch_size": $batch, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "steps_per_print": 50,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": $steps, "warmup_num_steps": 30,
                                                    "warmup_type": "linear", "cos_min_ratio": 0.1}},
 "zero_optimization": {"stage": 2},
 "csv_monitor": {"enabled": true, "output_path": "$dir/logs", "job_name": "torch_gpt"}}
JSON
out=$("$exe" --ranks 2 --steps $steps --config "$dir/ds_config.json")
grep -q '^PASS (the loss halved)' <<<"$out" || fail "the loss did not halve"
csv=$dir/logs/torch_gpt
loss=$csv/Train_Samples_train_loss.csv lr=$csv/Train_Samples_lr.csv
[[ -f $loss && -f $lr ]] || fail "no csv files in $csv: $(ls "$csv" 2>&1)"
[[ $(head -1 "$loss" | tr -d '\r') == "step,train_loss" ]] || fail "train_loss header: $(head -1 "$loss")"
[[ $(head -1 "$lr" | tr -d '\r') == "step,lr" ]] || fail "lr header: $(head -1 "$lr")"
# train_loss rows at the samples before each step (0, 64, ...), lr rows after it (64, 128, ...).
[[ $(tail -n +2 "$loss" | cut -d, -f1 | tr '\n' ' ') == "$(seq 0 $batch $(( (steps - 1) * batch )) | tr '\n' ' ')" ]] ||
  fail "train_loss steps: $(tail -n +2 "$loss" | cut -d, -f1 | tr '\n' ' ')"
[[ $(tail -n +2 "$lr" | cut -d, -f1 | tr '\n' ' ') == "$(seq $batch $batch $(( steps * batch )) | tr '\n' ' ')" ]] ||
  fail "lr steps: $(tail -n +2 "$lr" | cut -d, -f1 | tr '\n' ' ')"
# The last train_loss row is the loss the run printed (to its 4 printed decimals).
printed=$(grep -o 'loss [0-9.]* -> [0-9.]*' <<<"$out" | awk '{print $4}')
last=$(tail -1 "$loss" | cut -d, -f2 | tr -d '\r')
[[ $(awk -v v="$last" 'BEGIN{printf "%.4f", v}') == "$printed" ]] || fail "last csv loss $last, printed $printed"
# Every steps_per_print step line, and its lr equal to the csv row after that step.
for s in 50 100; do
  line=$(grep "^\[Rank 0\] step=$s, skipped=0, lr=\[" <<<"$out") || fail "no step line at step $s"
  want=$(sed 's/.*lr=\[\([^]]*\)\].*/\1/' <<<"$line")
  got=$(grep "^$(( s * batch ))," "$lr" | cut -d, -f2 | tr -d '\r')
  [[ $got == "$want" ]] || fail "lr after step $s: csv $got, step line $want"
done
grep -q "step $steps/$steps" <<<"$out" || fail "no final progress line"
echo "PASS: the loss halved; csv_monitor files with $steps rows each, step lines and progress from the DeepSpeed config"
