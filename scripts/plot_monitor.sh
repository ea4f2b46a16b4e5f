#!/usr/bin/env bash
# Plots a csv_monitor directory (output_path/job_name) into one PNG: training loss, loss scale
# (log scale) and learning rate over training samples. Works on zerotk's and DeepSpeed's files.
#
#   scripts/plot_monitor.sh logs/zero3_nvme                 # writes logs/zero3_nvme/monitor.png
#   scripts/plot_monitor.sh logs/zero3_nvme run.png
#
# Needs gnuplot (Debian: gnuplot-nox). Panels whose CSV is missing (loss_scale without fp16) are
# left out. Header rows, including the extra ones a restarted job appends, are skipped.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 CSV_MONITOR_DIR [OUT.png]" >&2
  exit 2
fi
dir=$1
out=${2:-$dir/monitor.png}
command -v gnuplot >/dev/null || { echo "$0: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }

# file stem | panel title | y axis | log-scale y
panels=(
  "Train_Samples_train_loss|training loss|loss|0"
  "Train_Samples_loss_scale|loss scale|scale|1"
  "Train_Samples_lr|learning rate|lr|0"
)
present=()
for p in "${panels[@]}"; do
  [[ -s "$dir/${p%%|*}.csv" ]] && present+=("$p")
done
if [[ ${#present[@]} -eq 0 ]]; then
  echo "$0: no Train_Samples_{train_loss,loss_scale,lr}.csv in $dir" >&2
  exit 1
fi

terminal="pngcairo size 900,$((260 * ${#present[@]})) font ',10'"
gnuplot -e "set terminal pngcairo" 2>/dev/null || terminal="png size 900,$((260 * ${#present[@]}))"

# gnuplot string literals: escape backslashes and double quotes in paths.
q() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }

{
  echo "set terminal $terminal"
  echo "set output $(q "$out")"
  echo 'set termoption noenhanced'  # job names contain underscores
  echo 'set datafile separator ","'
  echo 'set offsets graph 0.02, graph 0.02, graph 0.1, graph 0.1'
  echo 'set grid'
  echo 'set key off'
  echo "set multiplot layout ${#present[@]},1 title $(q "$(basename "$dir")")"
  for p in "${present[@]}"; do
    IFS='|' read -r stem title ylabel logy <<<"$p"
    echo "set title $(q "$title")"
    echo "set xlabel 'samples'"
    echo "set ylabel $(q "$ylabel")"
    if [[ $logy == 1 ]]; then echo 'set logscale y 2'; else echo 'unset logscale y'; fi
    # Non-numeric rows (headers) are skipped by gnuplot's number parsing.
    echo "plot $(q "$dir/$stem.csv") using 1:2 with linespoints pointtype 7 pointsize 0.5"
  done
  echo 'unset multiplot'
} | gnuplot

echo "$out"
