#!/usr/bin/env bash
# The seeds' 3D config (issue 44): zerotk-config accepts examples/configs/seed_3d.json as written
# (pipeline 8 x tensor 4 x data 1 on 32 ranks, ZeRO-3 with the optimizer state offloaded to the CPU,
# 16 micro-batches of 4 a step), and the GPT demo, shrunk to fit this machine (6 blocks: 8 layers, one
# per stage), trains with that structure on 32 thread ranks (seed_3d_gpt.json: the same keys plus the
# demo's bf16, optimizer and schedule) to the demo's accuracy (>= 0.99). Then the same structure with a
# data group of 2 (issue 57 item 19): pipeline 2 x tensor 2 x data 2 on 8 thread ranks, ZeRO-3 with the
# optimizer state offloaded, 20 steps: the memory table partitions rank 0's stage shard over the 2 data
# ranks (fp32 master 4 B and Adam's moments 8 B per owned element: 4 x padded / 2 and 8 x padded / 2),
# both rows live in pinned host memory, and rank 0's model states equal the printed formula.
# Registered as the CTest example.02_gpt_seed_3d.
#
#   examples/02_gpt/seed_3d_test.sh BIN ZEROTK_CONFIG CONFIGS_DIR
set -euo pipefail
bin=$1 zc=$2 configs=$3
source "$(dirname "$0")/proof_lib.sh"
notes=$("$zc" "$configs/seed_3d.json" --world 32 2>&1 >/dev/null) || fail "zerotk-config refused the seed file" "$notes"
grep -q "is usable on 32 ranks: Stage<3>.*Offload<Cpu>.*train_batch_size 64 = micro batch 4 x accumulation 16 x data 1 (world 32 / (tensor 4 x pipeline 8)" <<<"$notes" ||
  fail "zerotk-config's summary of the seed file" "$notes"
out=$("$bin" --ranks 32 --config "$configs/seed_3d_gpt.json" --layers 6 --steps-per-print 100 --csv "" 2>&1 | tr '\r' '\n') ||
  fail "the example did not train with the seeds' structure" "$out"
grep -q "32 ranks (threads), tensor 4 x pipeline 8 (1f1b, 16 micro-batches a step) x data 1, ZeRO stage 3" <<<"$out" || fail "no 3D header" "$out"
acc=$(accuracy "$out")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.99) }' || fail "the seeds' structure: accuracy $acc < 0.99" "$out"
# Data 2: the partition and the pinned-host rows.
out=$("$bin" --ranks 8 --pp 2 --tp 2 --gas 4 --stage 3 --offload-optimizer cpu --steps 20 --steps-per-print 10 --eval-size 50 \
        --csv "" 2>&1 | tr '\r' '\n') || fail "pipeline 2 x tensor 2 x data 2 with ZeRO-3 + offload did not train" "$out"
grep -q "8 ranks (threads), tensor 2 x pipeline 2 (1f1b, 4 micro-batches a step) x data 2, ZeRO stage 3" <<<"$out" ||
  fail "no data-2 3D header" "$out"
padded=$(sed -n 's/.*parameters on rank 0, .*, \([0-9]*\) with bucket padding; N = 2,.*/\1/p' <<<"$(tr '\n' ' ' <<<"$out")")
[[ -n "$padded" ]] || fail "no padded parameter count with N = 2 in the memory table" "$out"
row() { grep -E "^  $1 " <<<"$out"; }  # the memory table's row
master=$(row "fp32 master") moments=$(row "optimizer state \(m, v\)")
[[ $(awk '{ print $3 }' <<<"$master") == $(( 4 * padded / 2 )) ]] || fail "fp32 master is not 4 B x $padded / 2" "$master"
[[ $(awk '{ print $5 }' <<<"$moments") == $(( 8 * padded / 2 )) ]] || fail "Adam's moments are not 8 B x $padded / 2" "$moments"
[[ $master == *"pinned host" && $moments == *"pinned host" ]] || fail "the offloaded rows are not in pinned host memory" "$master
$moments"
states=$(grep "model states (rank 0)" <<<"$out") || fail "no model-states line" "$out"
[[ "$(sed -E 's/.*model states \(rank 0\) ([0-9]+) B.*/\1/' <<<"$states")" == "$(sed -E 's/.* = ([0-9]+) B$/\1/' <<<"$states")" ]] ||
  fail "data 2: rank 0's model states differ from the formula" "$states"

echo "PASS: zerotk-config accepts the seed file as written; pipeline 8 x tensor 4 with ZeRO-3 and the optimizer offloaded trains the GPT to $acc on 32 thread ranks;" \
     "at data 2 (pp 2 x tp 2, 8 ranks) the offloaded state is partitioned over the data ranks in pinned host memory"
