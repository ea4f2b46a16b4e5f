#!/usr/bin/env bash
# Plots a csv_monitor directory (output_path/job_name) into one PNG: training loss, loss scale
# (log scale) and learning rate over training samples. Works on zerotk's and DeepSpeed's files.
#
#   scripts/plot_monitor.sh logs/zero3_nvme                 # writes logs/zero3_nvme/monitor.png
#   scripts/plot_monitor.sh logs/zero3_nvme run.png
#   scripts/plot_monitor.sh --gnuplot-script logs/zero3_nvme  # prints the gnuplot commands instead
#
# Needs gnuplot (Debian: gnuplot-nox). Panels whose CSV is missing (loss_scale without fp16) are
# left out. Header rows, including the extra ones a restarted job appends, are skipped.
# Axis ranges are set from the data, not left to gnuplot: its autoscale plus margins put a loss that
# ends near 0 on an axis from -0.5, a warm-up lr from -0.0005 and samples from -2000. A series with
# no negative value gets an axis that never goes below 0.
set -euo pipefail

script_only=0
if [[ ${1-} == --gnuplot-script ]]; then
  script_only=1
  shift
fi
if [[ $# -lt 1 || $# -gt 2 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 [--gnuplot-script] CSV_MONITOR_DIR [OUT.png]" >&2
  exit 2
fi
dir=$1
out=${2:-$dir/monitor.png}
if [[ $script_only == 0 ]]; then
  command -v gnuplot >/dev/null || { echo "$0: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
fi

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
if [[ $script_only == 0 ]]; then
  gnuplot -e "set terminal pngcairo" 2>/dev/null || terminal="png size 900,$((260 * ${#present[@]}))"
fi

# `set xrange [..]; set yrange [..]` for one CSV (columns samples,value; non-numeric rows skipped):
# the data's extent plus a margin (x: 2 %, y: 10 % of the span; of the value itself, or 1, for a
# flat series), the low end clamped at 0 where the data has no negative value. log=1: the y margin
# is taken on the log scale, and the range is left to gnuplot if a value is not positive.
ranges() {
  awk -F, -v log_y="$2" '
    function num(s) { return s ~ /^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$/ }
    function axis(name, lo, hi, frac, clamp,   pad) {
      pad = (hi - lo) * frac
      if (pad == 0) pad = (lo != 0 ? (lo < 0 ? -lo : lo) * frac : 1)
      lo -= pad; hi += pad
      if (clamp && lo < 0) lo = 0
      printf "set %srange [%.10g:%.10g]\n", name, lo, hi
    }
    { sub(/\r$/, "", $2) }
    num($1) && num($2) {
      x = $1 + 0; y = $2 + 0
      if (n++ == 0) { x0 = x1 = x; y0 = y1 = y }
      if (x < x0) x0 = x; if (x > x1) x1 = x
      if (y < y0) y0 = y; if (y > y1) y1 = y
    }
    END {
      if (n == 0) { print "set autoscale x"; print "set autoscale y"; exit }
      axis("x", x0, x1, 0.02, x0 >= 0)
      if (!log_y) axis("y", y0, y1, 0.1, y0 >= 0)
      else if (y0 <= 0) print "set autoscale y"
      else {
        pad = (y1 > y0 ? (log(y1) - log(y0)) * 0.1 : log(2))
        printf "set yrange [%.10g:%.10g]\n", exp(log(y0) - pad), exp(log(y1) + pad)
      }
    }' "$1"
}

# gnuplot string literals: escape backslashes and double quotes in paths.
q() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }

{
  echo "set terminal $terminal"
  echo "set output $(q "$out")"
  echo 'set termoption noenhanced'  # job names contain underscores
  echo 'set datafile separator ","'
  echo 'set grid'
  echo 'set key off'
  echo "set multiplot layout ${#present[@]},1 title $(q "$(basename "$dir")")"
  for p in "${present[@]}"; do
    IFS='|' read -r stem title ylabel logy <<<"$p"
    echo "set title $(q "$title")"
    echo "set xlabel 'samples'"
    echo "set ylabel $(q "$ylabel")"
    if [[ $logy == 1 ]]; then echo 'set logscale y 2'; else echo 'unset logscale y'; fi
    ranges "$dir/$stem.csv" "$logy"
    # Non-numeric rows (headers) are skipped by gnuplot's number parsing.
    echo "plot $(q "$dir/$stem.csv") using 1:2 with linespoints pointtype 7 pointsize 0.5"
  done
  echo 'unset multiplot'
} | if [[ $script_only == 1 ]]; then cat; else gnuplot; fi

[[ $script_only == 1 ]] || echo "$out"
