#!/usr/bin/env bash
# Activation checkpointing end to end (CTest example.02_gpt_checkpointing): the demo trained with every
# block checkpointed (inputs in pinned host memory) ends with the same loss and accuracy as without,
# reports its checkpointed blocks, and with "profile": true in the config's activation_checkpointing
# block prints the recompute time per block.
#   checkpointing_test.sh <zerotk_example_02_gpt> <work dir>
set -euo pipefail
bin=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
common=(--ranks 2 --layers 4 --steps 20 --csv "" --eval-size 50 --steps-per-print 10)
plain=$("$bin" "${common[@]}" --checkpoint-activations none 2>&1 | tr '\r' '\n')
ckpt=$("$bin" "${common[@]}" --checkpoint-activations all --cpu-checkpointing 2>&1 | tr '\r' '\n')
summary() { grep -E "step 20/20|held-out" <<<"$1" | sed 's/|.*it\/s//; s/ETA [0-9:]*//'; }
if [[ "$(summary "$plain")" != "$(summary "$ckpt")" || -z "$(summary "$plain")" ]]; then
  echo "FAIL: checkpointed run differs"; echo "--- none:"; summary "$plain"; echo "--- all:"; summary "$ckpt"; exit 1
fi
grep -q "4 of 4 blocks checkpointed" <<<"$ckpt" || { echo "FAIL: no checkpointed blocks reported"; echo "$ckpt"; exit 1; }
# The printed config (--print-config prints it alone and exits) with "profile": true added to its
# activation_checkpointing block.
"$bin" "${common[@]}" --checkpoint-activations all --cpu-checkpointing --print-config |
  sed 's/"activation_checkpointing": {"cpu_checkpointing": true}/"activation_checkpointing": {"cpu_checkpointing": true, "profile": true}/' >"$dir/ds.json"
grep -q '"profile": true' "$dir/ds.json" || { echo "FAIL: could not write the config"; cat "$dir/ds.json"; exit 1; }
prof=$("$bin" --ranks 2 --layers 4 --steps 20 --eval-size 50 --config "$dir/ds.json" --checkpoint-activations all 2>&1 | tr '\r' '\n')
grep -q "recompute ms per call: blocks.0 " <<<"$prof" || { echo "FAIL: no recompute profile"; echo "$prof"; exit 1; }
echo "PASS: same loss and accuracy with every block checkpointed; profile printed"
