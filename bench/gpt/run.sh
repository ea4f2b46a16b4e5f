#!/usr/bin/env bash
# Throughput of the GPT demo (examples/02_gpt) at ZeRO stages 0, 1, 2 on 2 and 4 thread ranks, and the
# fraction of wall time spent outside the model's own forward/backward (zerotk's overhead: scopes,
# bucketing, reductions not hidden, optimizer, all-gather), both measured inside the same run.
#
#   bench/gpt/run.sh [build-dir] [steps]       # prints a Markdown table for bench/RESULTS.md
set -euo pipefail
build=${1:-build/default}
steps=${2:-100}
bin=$build/examples/02_gpt/zerotk_example_02_gpt
[[ -x $bin ]] || { echo "build $bin first (cmake --build --preset default --target zerotk_example_02_gpt)" >&2; exit 1; }
echo "| stage | ranks | precision | tokens/s | outside model fwd/bwd | held-out accuracy |"
echo "|---|---|---|---|---|---|"
for ranks in 2 4; do
  for stage in 0 1 2; do
    out=$("$bin" --ranks "$ranks" --stage "$stage" --precision bf16 --steps "$steps" --csv "" --steps-per-print 1000000 2>&1)
    tps=$(sed -n 's/.*s: \([0-9]*\) tokens\/s.*/\1/p' <<<"$out")
    ovh=$(sed -n 's/.*forward\/backward: \([0-9.]*%\).*/\1/p' <<<"$out")
    acc=$(sed -n 's/.*held-out sequence accuracy \([0-9.]*\).*/\1/p' <<<"$out")
    echo "| $stage | $ranks | bf16 | $tps | $ovh | $acc |"
  done
done
