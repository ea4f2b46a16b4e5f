#!/usr/bin/env bash
# --print-config end to end (CTest example.02_gpt_print_config): `--print-config > ds.json` writes the
# DeepSpeed JSON alone, a file Python's json module parses and --config accepts (printed back byte for
# byte), and exits 0 without training (no header, progress or score line; the --csv directory is not
# made). The same for --config's own file. What the old behaviour printed (the JSON, then the training
# log) is refused by --config, so the round trip can fail.
#   print_config_test.sh <zerotk_example_02_gpt> <python3> <work dir>
set -euo pipefail
bin=$1
python=$2
dir=$3
rm -rf "$dir" && mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
source "$(dirname "$0")/proof_lib.sh"
command -v "$python" >/dev/null || fail "python3 was not found when configuring ($python): the JSON was not checked"

# A config with nested blocks and a path that needs escaping in JSON.
flags=(--ranks 2 --stage 3 --offload-optimizer cpu --checkpoint-activations all --cpu-checkpointing
       --csv "$dir/csv/job \"quoted\"")
"$bin" "${flags[@]}" --print-config >"$dir/ds.json" 2>"$dir/stderr" || fail "--print-config failed" "$(cat "$dir/stderr")"
[[ ! -s "$dir/stderr" ]] || fail "--print-config wrote to stderr" "$(cat "$dir/stderr")"
[[ "$(head -c 1 "$dir/ds.json")" == "{" && "$(tail -n 1 "$dir/ds.json")" == "}" ]] ||
  fail "stdout is not the JSON alone" "$(cat "$dir/ds.json")"
grep -qE "^zerotk |step [0-9]+/|held-out|trained " "$dir/ds.json" && fail "--print-config trained" "$(cat "$dir/ds.json")"
[[ ! -e "$dir/csv" ]] || fail "--print-config made the csv_monitor directory: it trained" "$(ls -R "$dir/csv")"
"$python" -c 'import json, sys; c = json.load(open(sys.argv[1])); assert c["zero_optimization"]["stage"] == 3, c
assert c["csv_monitor"]["job_name"] == "job \"quoted\"", c' "$dir/ds.json" ||
  fail "python3's json module does not read the printed config as the flags' config" "$(cat "$dir/ds.json")"

# --config takes the file, and --print-config prints it back unchanged, without training.
"$bin" --ranks 2 --config "$dir/ds.json" --print-config >"$dir/again.json" 2>"$dir/stderr" ||
  fail "--config does not accept the printed config" "$(cat "$dir/stderr")"
cmp -s "$dir/ds.json" "$dir/again.json" || fail "--config --print-config differs" "$(diff "$dir/ds.json" "$dir/again.json")"
[[ ! -e "$dir/csv" ]] || fail "--config --print-config made the csv_monitor directory: it trained" "$(ls -R "$dir/csv")"

# The old behaviour's output: the JSON, then the run's log. --config must refuse it.
{ cat "$dir/ds.json"; echo "zerotk 0.1.0: 2 ranks (threads), ZeRO stage 3"; } >"$dir/with_log.json"
refused "with_log.json" -- --config "$dir/with_log.json" --print-config

# It is checked like a run: a flag the config reader refuses still fails, naming the flag.
out=$("$bin" --ranks 3 --print-config 2>&1) && fail "--ranks 3 --batch 64 was printed" "$out"
grep -qF -- "--batch 64: is not divisible by --ranks 3" <<<"$out" || fail "the refusal does not name the flags" "$out"
echo "PASS: --print-config > file writes the JSON alone (python3 and --config read it back) and exits without training"
