#!/usr/bin/env bash
# Tensor parallelism end to end (issue 43): the GPT demo with its blocks split Megatron-style.
#  - tensor 2 x data 2 (4 thread ranks) at ZeRO-2 reaches the demo's accuracy (>= 0.99); with
#    sequence parallel at ZeRO-3 too;
#  - a checkpoint saved at tensor 2 x data 2 loads at tensor 1 x data 4 and tensor 4 x data 1; saved
#    again there without training, each exports (zerotk-ckpt export) the same tensor bytes as the
#    original, and training goes on from it; exported per tensor rank (--tp 2, --tp 4), the tensor 2
#    checkpoint's recorded splits and the tensor 1 re-save cut by --split rules give the same bytes;
#  - refusals name the flags: heads the tensor size does not divide, --sequence-parallel without --tp,
#    --tp against a config's tensor size.
# Registered as the CTest example.02_gpt_tp.
#
#   examples/02_gpt/tp_test.sh BIN ZEROTK_CKPT WORK_DIR
set -euo pipefail
bin=$1 ckpt=$2 dir=$3
source "$(dirname "$0")/proof_lib.sh"
rm -rf "$dir"
mkdir -p "$dir"

out=$("$bin" --ranks 4 --tp 2 --csv "")
grep -q "4 ranks (threads), tensor 2 x data 2, ZeRO stage 2" <<<"$out" || fail "no grid in the header" "$out"
grep -q "N = 2, the" <<<"$out" || fail "the memory table does not partition over the 2 data ranks" "$out"
acc=$(accuracy "$out")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.99) }' || fail "tensor 2 x data 2: accuracy $acc < 0.99" "$out"
out_sp=$("$bin" --ranks 4 --tp 2 --sequence-parallel --stage 3 --csv "")
grep -q "tensor 2 (sequence parallel) x data 2, ZeRO stage 3" <<<"$out_sp" || fail "no sequence-parallel header" "$out_sp"
acc_sp=$(accuracy "$out_sp")
awk -v a="$acc_sp" 'BEGIN { exit !(a >= 0.99) }' || fail "sequence parallel, stage 3: accuracy $acc_sp < 0.99" "$out_sp"

# The data section of a safetensors file: everything after its 8-byte length and JSON header (the
# metadata says which world saved it, so the headers differ).
data_of() {
  local n
  n=$(od -An -t u8 -N 8 "$1" | tr -d ' ')
  tail -c +$(( 8 + n + 1 )) "$1"
}
common=(--csv "" --eval-size 200 --steps-per-print 1)
"$bin" --ranks 4 --tp 2 "${common[@]}" --steps 3 --save "$dir/tp2" > "$dir/tp2.log"
"$ckpt" export "$dir/tp2" --out "$dir/tp2.safetensors" > /dev/null
inspected=$("$ckpt" inspect "$dir/tp2")
grep -q "blocks.0.attn.qkv.weight .*\[96, 64\].*tensor shard 1 of 2 of \[192, 64\] split by rows in 3 fused parts" <<<"$inspected" ||
  fail "zerotk-ckpt inspect does not show the qkv shards" "$inspected"
for grid in "--tp 1" "--tp 4"; do
  name=${grid// /}
  # shellcheck disable=SC2086
  "$bin" --ranks 4 $grid "${common[@]}" --steps 3 --load "$dir/tp2" --save "$dir/$name" > "$dir/$name.log"
  grep -q "continuing after step 3 (saved on 4 ranks, resharded)" "$dir/$name.log" || fail "$grid: no resharded load" "$(cat "$dir/$name.log")"
  "$ckpt" export "$dir/$name" --out "$dir/$name.safetensors" > /dev/null
  cmp -s <(data_of "$dir/tp2.safetensors") <(data_of "$dir/$name.safetensors") ||
    fail "$grid: the re-saved checkpoint exports other tensor bytes than the tensor 2 one"
  # shellcheck disable=SC2086
  "$bin" --ranks 4 $grid "${common[@]}" --steps 5 --load "$dir/$name" > "$dir/$name.more.log"
  grep -q '^\[Rank 0\] step=5,' "$dir/$name.more.log" || fail "$grid: training did not go on to step 5" "$(cat "$dir/$name.more.log")"
done

# Per tensor rank (zerotk-ckpt export --tp K, the inference hand-off): the tensor 2 checkpoint's own
# splits and the tensor 1 re-save cut by the GPT example's --split rules give the same files' bytes.
rules=(--split 'blocks.*.attn.qkv.*=rows:3' --split 'blocks.*.mlp.fc.*=rows' --split 'blocks.*.attn.proj.weight=cols'
       --split 'blocks.*.mlp.proj.weight=cols')
for K in 2 4; do
  "$ckpt" export "$dir/tp2" --out "$dir/from2.safetensors" --tp "$K" > /dev/null
  "$ckpt" export "$dir/--tp1" --out "$dir/from1.safetensors" --tp "$K" "${rules[@]}" > /dev/null
  for (( k = 0; k < K; k++ )); do
    f2="$dir/from2-tp$k-of-$K.safetensors" f1="$dir/from1-tp$k-of-$K.safetensors"
    [[ -s $f2 && -s $f1 ]] || fail "export --tp $K wrote no file for tensor rank $k"
    cmp -s <(data_of "$f2") <(data_of "$f1") || fail "export --tp $K: rank $k's file differs between the recorded splits and the --split rules"
  done
done
if out=$("$ckpt" export "$dir/--tp1" --out "$dir/none.safetensors" --tp 2 2>&1); then fail "a tensor 1 checkpoint exported at --tp 2 without --split" "$out"; fi
grep -q "records no tensor splits" <<<"$out" || fail "the refusal does not say the splits are missing" "$out"

refused "--heads 3" "--tp 2" -- --tp 2 --heads 3 --d-model 48
refused "--sequence-parallel" "needs a tensor size above 1" -- --sequence-parallel
"$bin" --print-config --ranks 4 --tp 2 > "$dir/tp2.json"
grep -q '"tensor_model_parallel_size": 2' "$dir/tp2.json" || fail "--print-config lacks the tensor size" "$(cat "$dir/tp2.json")"
"$bin" --print-config --ranks 2 > "$dir/tp1.json"
# The file's tensor size decides: --config with it trains at tensor 2 without --tp.
out_cfg=$("$bin" --ranks 4 --config "$dir/tp2.json" --steps 2 --csv "")
grep -q "tensor 2 x data 2" <<<"$out_cfg" || fail "--config did not take the file's tensor size" "$out_cfg"
refused "--tp 3" "--ranks 2" -- --tp 3
refused "--tp 2" "tensor size 1" -- --tp 2 --config "$dir/tp1.json"

echo "PASS: tensor 2 x data 2 reaches $acc (ZeRO-2) and $acc_sp (sequence parallel, ZeRO-3); a tensor 2 checkpoint" \
  "loads at tensor 1 x data 4 and tensor 4 x data 1, exports the same tensors from each (whole, and per tensor rank at 2 and 4), and trains on; refusals name the flags"
