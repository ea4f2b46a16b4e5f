#!/usr/bin/env bash
# Gradient compression end to end (CTest example.02_gpt_topk), issue 16's proof: the demo at ZeRO
# stage 0 in fp32 with --compress topk:0.01 --huffman (top-k 1% of each bucket with error feedback,
# Huffman-coded) reaches the accuracy target (>= 0.99 held-out sequences) and rank 0 sends >= 10x
# fewer bytes over the whole run than the same run uncompressed, both counted by the communicator
# (StepReport::comm_wire_bytes summed). Also: the run's own uncompressed count agrees with the dense
# run within 1%, and what cannot run is refused naming the flag.
#   topk_test.sh <zerotk_example_02_gpt>
set -euo pipefail
bin=$1
fail() { echo "FAIL: $1"; shift; for x in "$@"; do echo "$x"; done; exit 1; }

common=(--ranks 4 --stage 0 --precision fp32 --csv "")
dense=$("$bin" "${common[@]}" 2>&1 | tr '\r' '\n')
topk=$("$bin" "${common[@]}" --compress topk:0.01 --huffman 2>&1 | tr '\r' '\n')
field() { sed -n "s/^communication (rank 0, whole run): \([0-9]*\) B sent; \([0-9]*\) B without.*/\\$2/p" <<<"$1"; }
accuracy() { sed -n 's/.*held-out sequence accuracy \([0-9.]*\).*/\1/p' <<<"$1"; }
dense_sent=$(field "$dense" 1)
sent=$(field "$topk" 1)
uncompressed=$(field "$topk" 2)
[[ -n "$dense_sent" && -n "$sent" && -n "$uncompressed" ]] || fail "no communication line" "$dense" "$topk"
acc=$(accuracy "$topk")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.99) }' || fail "top-k 1% accuracy $acc < 0.99" "$topk"
awk -v d="$dense_sent" -v s="$sent" 'BEGIN { exit !(d >= 10 * s) }' ||
  fail "the dense run sent $dense_sent B, top-k 1% $sent B: less than 10x" "$topk"
awk -v d="$dense_sent" -v u="$uncompressed" 'BEGIN { r = u / d; exit !(r > 0.99 && r < 1.01) }' ||
  fail "top-k's uncompressed count $uncompressed B is not the dense run's $dense_sent B within 1%"

out=$("$bin" --stage 2 --compress topk:0.01 2>&1) && fail "stage 2 was accepted" "$out"
grep -q "at --compress topk:0.01: gradient compression replaces ZeRO stage 0.*(got --stage 2)" <<<"$out" ||
  fail "stage 2 refusal" "$out"
out=$("$bin" --stage 0 --compress topk:2 2>&1) && fail "ratio 2 was accepted" "$out"
grep -q "at --compress: must be none, topk:RATIO.*(got topk:2)" <<<"$out" || fail "ratio refusal" "$out"
out=$("$bin" --stage 0 --precision fp32 --huffman 2>&1) && fail "--huffman alone was accepted" "$out"
grep -q "at --huffman: " <<<"$out" || fail "--huffman refusal" "$out"

echo "PASS: top-k 1% + Huffman accuracy $acc; rank 0 sent $sent B against the dense run's $dense_sent B" \
  "($(awk -v d="$dense_sent" -v s="$sent" 'BEGIN { printf "%.2f", d / s }')x fewer)"
