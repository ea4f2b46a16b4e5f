#!/usr/bin/env bash
# The demo command from README.md: installs what is missing, builds the GPT example and the tools
# (zerotk-config, zerotk-plan, zerotk-ckpt: README's other commands), trains the example with
# ZeRO stage 2 on 4 in-process ranks, and plots the csv_monitor files to out/gpt_monitor/monitor.png.
# Extra arguments go to the example (e.g. --stage 0 --precision fp16, --config ds_config.json).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
scripts/install-deps.sh
t0=$(date +%s)
if [[ ! -x build/default/examples/02_gpt/zerotk_example_02_gpt ]]; then
  # Measured 2026-12-06 on a clean clone: 335 s for set-up and build on 2 cores (the compiled engine set,
  # the example over AnyEngine, the tools).
  echo "demo: first build of the compiled engines, the GPT example and the tools: about 5 minutes on 2 cores; progress below"
fi
cmake --preset default >/dev/null
with_progress "demo build" cmake --build --preset default --target zerotk_example_02_gpt zerotk-config zerotk-plan zerotk-ckpt
t1=$(date +%s)
echo "demo: set-up and build took $(( t1 - t0 )) s; training (5-25 s on 2 cores):"
rm -rf out/gpt_monitor
build/default/examples/02_gpt/zerotk_example_02_gpt --csv out/gpt_monitor "$@"
echo "demo: training took $(( $(date +%s) - t1 )) s"
scripts/plot_monitor.sh out/gpt_monitor out/gpt_monitor/monitor.png
