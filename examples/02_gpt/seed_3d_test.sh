#!/usr/bin/env bash
# The seeds' 3D config (issue 44): zerotk-config accepts examples/configs/seed_3d.json as written
# (pipeline 8 x tensor 4 x data 1 on 32 ranks, ZeRO-3 with the optimizer state offloaded to the CPU,
# 16 micro-batches of 4 a step), and the GPT demo, shrunk to fit this machine (6 blocks: 8 layers, one
# per stage), trains with that structure on 32 thread ranks (seed_3d_gpt.json: the same keys plus the
# demo's bf16, optimizer and schedule) to the demo's accuracy (>= 0.99).
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
echo "PASS: zerotk-config accepts the seed file as written; pipeline 8 x tensor 4 with ZeRO-3 and the optimizer offloaded trains the GPT to $acc on 32 thread ranks"
