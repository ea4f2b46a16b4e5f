#!/usr/bin/env bash
# Offload<Nvme> end to end (CTest example.02_gpt_nvme): the demo at ZeRO stage 3 with the optimizer
# state in swap files under --nvme-path ends with the same loss at every step (csv_monitor's values,
# printed as Python's str(): every bit), the same final loss and the same held-out accuracy as with
# the state in pinned host memory (--offload-optimizer cpu): docs/offload.md promises bitwise
# equality; so does the run with the parameter shards on NVMe as well (--offload-param nvme), also with
# part of them kept in host memory (--max-in-cpu), and with the optimizer state in pinned memory
# (--offload-optimizer cpu --offload-param nvme) or not offloaded (--offload-param nvme alone). The same
# through --config (the printed DeepSpeed JSON). The memory line's formula equals
# the ledger, the disk holds 24 Psi/N, the swap files are gone afterwards, and what cannot run is
# refused with an error naming the flag (or the config key) and the value.
#   nvme_test.sh <zerotk_example_02_gpt> <work dir>
set -euo pipefail
bin=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir/swap"
trap 'rm -rf "$dir"' EXIT
source "$(dirname "$0")/proof_lib.sh"

common=(--ranks 2 --stage 3 --layers 2 --steps 20 --eval-size 50 --steps-per-print 10)
cpu=$("$bin" "${common[@]}" --offload-optimizer cpu --csv "$dir/csv/cpu" 2>&1 | tr '\r' '\n')
nvme_flags=(--offload-optimizer nvme --nvme-path "$dir/swap" --csv "$dir/csv/nvme")
nvme=$("$bin" "${common[@]}" "${nvme_flags[@]}" 2>&1 | tr '\r' '\n')
summary() { grep -E "step 20/20|held-out" <<<"$1" | sed 's/|.*it\/s//; s/ETA [0-9:]*//'; }
[[ -n "$(summary "$cpu")" ]] || fail "the cpu-offload run printed no summary" "$cpu"
[[ "$(summary "$cpu")" == "$(summary "$nvme")" ]] ||
  fail "nvme run differs from cpu offload" "--- cpu:" "$(summary "$cpu")" "--- nvme:" "$(summary "$nvme")"
loss=Train_Samples_train_loss.csv
[[ $(grep -c "^[0-9]*,[0-9]" "$dir/csv/cpu/$loss") -eq 20 ]] || fail "expected 20 losses in $dir/csv/cpu/$loss" "$(cat "$dir/csv/cpu/$loss")"
cmp -s "$dir/csv/cpu/$loss" "$dir/csv/nvme/$loss" ||
  fail "per-step losses differ" "$(diff "$dir/csv/cpu/$loss" "$dir/csv/nvme/$loss" | head -5)"
[[ -z "$(ls -A "$dir/swap")" ]] || fail "swap files left behind" "$(ls -l "$dir/swap")"

# The memory lines: model states equal the formula's last term; the disk holds two slots (24 Psi/N).
states=$(grep "model states (rank 0)" <<<"$nvme") || fail "no memory line" "$nvme"
measured=$(sed -E 's/.*model states \(rank 0\) ([0-9]+) B.*/\1/' <<<"$states")
formula=$(sed -E 's/.* = ([0-9]+) B$/\1/' <<<"$states")
grep -q "NVMe's second slot 12 Psi/N" <<<"$states" || fail "the formula line omits NVMe's second slot" "$states"
[[ "$measured" == "$formula" ]] || fail "model states $measured B, formula $formula B" "$states"
disk=$(grep -E "NVMe \(rank 0\)" <<<"$nvme") || fail "no NVMe memory line" "$nvme"
[[ "$(sed -E 's/.*: ([0-9]+) B on disk.*/\1/' <<<"$disk")" == "$(sed -E 's/.*24 Psi\/N = ([0-9]+) B.*/\1/' <<<"$disk")" ]] ||
  fail "disk bytes differ from 24 Psi/N" "$disk"

# Both offloads on NVMe (OffloadParams<Nvme>): the parameter shards in swap files too, same losses.
both=$("$bin" "${common[@]}" --offload-optimizer nvme --offload-param nvme --nvme-path "$dir/swap" --csv "$dir/csv/both" 2>&1 |
  tr '\r' '\n')
[[ "$(summary "$both")" == "$(summary "$cpu")" ]] ||
  fail "nvme parameter offload differs from cpu offload" "--- cpu:" "$(summary "$cpu")" "--- both:" "$(summary "$both")"
cmp -s "$dir/csv/cpu/$loss" "$dir/csv/both/$loss" ||
  fail "per-step losses with --offload-param nvme differ" "$(diff "$dir/csv/cpu/$loss" "$dir/csv/both/$loss" | head -5)"
grep -qE "NVMe parameter shard \(rank 0; 2 Psi/N = [0-9]+ B\): [0-9]+ B on disk" <<<"$both" || fail "no NVMe parameter shard line" "$both"
states=$(grep "model states (rank 0)" <<<"$both") || fail "no memory line (--offload-param nvme)" "$both"
[[ "$(sed -E 's/.*model states \(rank 0\) ([0-9]+) B.*/\1/' <<<"$states")" == "$(sed -E 's/.* = ([0-9]+) B$/\1/' <<<"$states")" ]] ||
  fail "model states differ from the formula line (--offload-param nvme)" "$states"
disk=$(grep -E "NVMe \(rank 0\)" <<<"$both") || fail "no NVMe memory line (--offload-param nvme)" "$both"
[[ "$(sed -E 's/.*: ([0-9]+) B on disk.*/\1/' <<<"$disk")" == "$(sed -E 's/.*24 Psi\/N = ([0-9]+) B.*/\1/' <<<"$disk")" ]] ||
  fail "optimizer state disk bytes differ from 24 Psi/N (--offload-param nvme)" "$disk"
[[ -z "$(ls -A "$dir/swap")" ]] || fail "swap files left behind (--offload-param nvme)" "$(ls -l "$dir/swap")"

# The parameter shards on NVMe with the optimizer state in pinned host memory (Offload<Cpu>: the step
# runs on a copy of each sub-group first, so a failed shard write changes nothing): same losses; the
# memory line equals the ledger, without NVMe's second slot of the optimizer state.
cpunv_flags=(--offload-optimizer cpu --offload-param nvme --nvme-path "$dir/swap" --csv "$dir/csv/cpunv")
cpunv=$("$bin" "${common[@]}" "${cpunv_flags[@]}" 2>&1 | tr '\r' '\n')
cmp -s "$dir/csv/cpu/$loss" "$dir/csv/cpunv/$loss" ||
  fail "per-step losses with --offload-optimizer cpu --offload-param nvme differ" \
    "$(diff "$dir/csv/cpu/$loss" "$dir/csv/cpunv/$loss" | head -5)" "$cpunv"
[[ "$(summary "$cpunv")" == "$(summary "$cpu")" ]] || fail "cpu + nvme param offload differs" "$(summary "$cpunv")"
states=$(grep "model states (rank 0)" <<<"$cpunv") || fail "no memory line (cpu + nvme)" "$cpunv"
grep -q "NVMe's second slot" <<<"$states" && fail "the formula counts an optimizer swap file that is not there" "$states"
[[ "$(sed -E 's/.*model states \(rank 0\) ([0-9]+) B.*/\1/' <<<"$states")" == "$(sed -E 's/.* = ([0-9]+) B$/\1/' <<<"$states")" ]] ||
  fail "model states differ from the formula line (cpu + nvme)" "$states"
grep -q "writes its values to the shard before it steps" <<<"$cpunv" || fail "no line for the two-pass step" "$cpunv"
[[ -z "$(ls -A "$dir/swap")" ]] || fail "swap files left behind (cpu + nvme)" "$(ls -l "$dir/swap")"
# The same from the DeepSpeed config the flags stand for (--print-config prints it alone and exits).
"$bin" "${common[@]}" "${cpunv_flags[@]}" --print-config | sed "s#\"job_name\": \"cpunv\"#\"job_name\": \"cpunv_config\"#" >"$dir/cpunv.json"
conf=$("$bin" --ranks 2 --layers 2 --steps 20 --eval-size 50 --config "$dir/cpunv.json" 2>&1 | tr '\r' '\n')
cmp -s "$dir/csv/cpu/$loss" "$dir/csv/cpunv_config/$loss" || fail "per-step losses of the cpu + nvme --config run differ" "$conf"

# The parameter shards on NVMe with the optimizer state not offloaded (Offload<None>: it steps sub-group by
# sub-group, a copy of each first, as with cpu): same losses; the memory line equals the ledger.
nonenv=$("$bin" "${common[@]}" --offload-param nvme --nvme-path "$dir/swap" --csv "$dir/csv/nonenv" 2>&1 | tr '\r' '\n')
cmp -s "$dir/csv/cpu/$loss" "$dir/csv/nonenv/$loss" ||
  fail "per-step losses with --offload-param nvme alone differ" \
    "$(diff "$dir/csv/cpu/$loss" "$dir/csv/nonenv/$loss" | head -5)" "$nonenv"
[[ "$(summary "$nonenv")" == "$(summary "$cpu")" ]] || fail "nvme param offload alone differs" "$(summary "$nonenv")"
states=$(grep "model states (rank 0)" <<<"$nonenv") || fail "no memory line (none + nvme)" "$nonenv"
[[ "$(sed -E 's/.*model states \(rank 0\) ([0-9]+) B.*/\1/' <<<"$states")" == "$(sed -E 's/.* = ([0-9]+) B$/\1/' <<<"$states")" ]] ||
  fail "model states differ from the formula line (none + nvme)" "$states"
grep -q "writes its values to the shard before it steps" <<<"$nonenv" || fail "no line for the two-pass step (none + nvme)" "$nonenv"
[[ -z "$(ls -A "$dir/swap")" ]] || fail "swap files left behind (none + nvme)" "$(ls -l "$dir/swap")"

# Part of the parameter shard kept in host memory instead of the file (--max-in-cpu; about half of this model's
# Psi/N): the same losses; the memory line adds the kept blocks and still equals the ledger.
kept=$("$bin" "${common[@]}" --offload-optimizer nvme --offload-param nvme --max-in-cpu 30000 --nvme-path "$dir/swap" \
  --csv "$dir/csv/kept" 2>&1 | tr '\r' '\n')
cmp -s "$dir/csv/cpu/$loss" "$dir/csv/kept/$loss" ||
  fail "per-step losses with --max-in-cpu differ" "$(diff "$dir/csv/cpu/$loss" "$dir/csv/kept/$loss" | head -5)"
states=$(grep "model states (rank 0)" <<<"$kept") || fail "no memory line (--max-in-cpu)" "$kept"
grep -qE "its blocks kept in host memory \(max_in_cpu, two copies\) [1-9][0-9]* B" <<<"$states" ||
  fail "the memory line shows no kept blocks (--max-in-cpu 30000)" "$states"
[[ "$(sed -E 's/.*model states \(rank 0\) ([0-9]+) B.*/\1/' <<<"$states")" == "$(sed -E 's/.* = ([0-9]+) B$/\1/' <<<"$states")" ]] ||
  fail "model states differ from the formula line (--max-in-cpu)" "$states"
[[ -z "$(ls -A "$dir/swap")" ]] || fail "swap files left behind (--max-in-cpu)" "$(ls -l "$dir/swap")"

# The same run from the DeepSpeed config the flags stand for (its csv_monitor directory moved).
"$bin" "${common[@]}" "${nvme_flags[@]}" --print-config | sed "s#\"job_name\": \"nvme\"#\"job_name\": \"config\"#" >"$dir/ds.json"
grep -q '"nvme_path": ' "$dir/ds.json" || fail "the printed config has no nvme_path" "$(cat "$dir/ds.json")"
conf=$("$bin" --ranks 2 --layers 2 --steps 20 --eval-size 50 --config "$dir/ds.json" 2>&1 | tr '\r' '\n')
[[ "$(summary "$conf")" == "$(summary "$cpu")" ]] || fail "the --config run differs" "$(summary "$conf")"
cmp -s "$dir/csv/cpu/$loss" "$dir/csv/config/$loss" || fail "per-step losses of the --config run differ"

# Refusals: each exits non-zero and names the flag (or the config key) and the value.
refused "--offload-optimizer" "nvme" "--nvme-path DIR" -- --stage 3 --offload-optimizer nvme
refused "--nvme-path" "$dir/no_such_dir" "does not exist" -- --stage 3 --offload-optimizer nvme --nvme-path "$dir/no_such_dir"
touch "$dir/a_file"
refused "--nvme-path" "$dir/a_file" "not a directory" -- --stage 3 --offload-optimizer nvme --nvme-path "$dir/a_file"
refused "--offload-param" "nvme" "--nvme-path DIR" -- --stage 3 --offload-optimizer cpu --offload-param nvme
refused "--delayed-param-update" "--offload-param nvme" -- --stage 3 --offload-optimizer cpu --offload-param nvme \
  --nvme-path "$dir/swap" --delayed-param-update
refused "--nvme-path" "--offload-optimizer cpu" -- --stage 3 --offload-optimizer cpu --nvme-path "$dir/swap"
refused "--max-in-cpu 5" "--offload-param none" -- --stage 3 --max-in-cpu 5
sed "s#\"nvme_path\": \"[^\"]*\"#\"nvme_path\": \"$dir/gone\"#" "$dir/ds.json" >"$dir/gone.json"
refused "$dir/gone.json: /zero_optimization/offload_optimizer/nvme_path" "$dir/gone" -- --config "$dir/gone.json"
if [[ $(id -u) -ne 0 ]]; then  # root writes anywhere: the check is then the swap file's creation
  mkdir -p "$dir/ro" && chmod 500 "$dir/ro"
  refused "--nvme-path" "$dir/ro" "not writable" -- --stage 3 --offload-optimizer nvme --nvme-path "$dir/ro"
fi
echo "PASS: Offload<Nvme> (alone and with OffloadParams<Nvme>), and Offload<Cpu> or Offload<None> with OffloadParams<Nvme>, give the cpu-offload run's losses (every step, bitwise) and accuracy, by flags and by --config; memory formula exact; refusals name their flag"
