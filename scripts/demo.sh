#!/usr/bin/env bash
# The demo command from README.md: installs what is missing, builds the GPT example, trains it with
# ZeRO stage 2 on 4 in-process ranks, and plots the csv_monitor files to out/gpt_monitor/monitor.png.
# Extra arguments go to the example (e.g. --stage 0 --precision fp16, --config ds_config.json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
t0=$(date +%s)
cmake --preset default >/dev/null
cmake --build --preset default --target zerotk_example_02_gpt
t1=$(date +%s)
echo "demo: set-up and build took $(( t1 - t0 )) s"
rm -rf out/gpt_monitor
build/default/examples/02_gpt/zerotk_example_02_gpt --csv out/gpt_monitor "$@"
echo "demo: training took $(( $(date +%s) - t1 )) s"
scripts/plot_monitor.sh out/gpt_monitor out/gpt_monitor/monitor.png
