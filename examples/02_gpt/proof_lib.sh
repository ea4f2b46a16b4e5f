# Shared by the example's end-to-end proofs (onebit_test.sh, topk_test.sh, nvme_test.sh, dpu_test.sh, ...):
# sourced, not run.
fail() { echo "FAIL: $1"; shift; for x in "$@"; do echo "$x"; done; exit 1; }
# field OUTPUT 1|2: bytes sent, or bytes without compression, from the "communication" line.
field() { sed -n "s/^communication (rank 0, whole run): \([0-9]*\) B sent; \([0-9]*\) B without.*/\\$2/p" <<<"$1"; }
accuracy() { sed -n 's/.*held-out sequence accuracy \([0-9.]*\).*/\1/p' <<<"$1"; }
# check_saving NAME DENSE_RUN_OUTPUT COMPRESSED_RUN_OUTPUT [SCALE]: accuracy >= 0.99, >= 10x fewer
# bytes sent than the dense run, and the compressed run's own uncompressed count within 1% of the
# dense run's. With SCALE the dense run was SCALE times shorter (per-step traffic is constant): its
# count times SCALE checks the compressed run's own uncompressed count, which then stands as the
# dense figure (it is exact; the extrapolation carries the one-off start-up traffic SCALE times).
# Sets acc, sent, dense_sent.
check_saving() {
  local name=$1 dense=$2 run=$3 scale=${4:-1} uncompressed
  dense_sent=$(field "$dense" 1)
  sent=$(field "$run" 1)
  uncompressed=$(field "$run" 2)
  [[ -n "$dense_sent" && -n "$sent" && -n "$uncompressed" ]] || fail "no communication line" "$dense" "$run"
  dense_sent=$(( dense_sent * scale ))
  acc=$(accuracy "$run")
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.99) }' || fail "$name accuracy $acc < 0.99" "$run"
  awk -v d="$dense_sent" -v u="$uncompressed" 'BEGIN { r = u / d; exit !(r > 0.99 && r < 1.01) }' ||
    fail "$name's uncompressed count $uncompressed B is not the uncompressed run's $dense_sent B within 1%"
  (( scale == 1 )) || dense_sent=$uncompressed
  awk -v d="$dense_sent" -v s="$sent" 'BEGIN { exit !(d >= 10 * s) }' ||
    fail "the uncompressed run sent $dense_sent B, $name $sent B: less than 10x" "$run"
}
ratio() { awk -v d="$dense_sent" -v s="$sent" 'BEGIN { printf "%.2f", d / s }'; }
# refused <expected text>... -- <args>: "$bin" with <args> (2 ranks, 2 steps) exits non-zero and its
# output holds every expected text (the flag or config key, and the value).
refused() {  # refused <expected text>... -- <args>
  local expect=()
  while [[ $1 != -- ]]; do expect+=("$1"); shift; done
  shift
  local out
  if out=$("$bin" --ranks 2 --steps 2 --csv "" "$@" 2>&1); then fail "ran, should be refused: $*" "$out"; fi
  for e in "${expect[@]}"; do grep -qF -- "$e" <<<"$out" || fail "'$*': the error lacks '$e'" "$out"; done
}
