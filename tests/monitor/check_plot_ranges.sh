#!/usr/bin/env bash
# The plot script's axis ranges (scripts/plot_monitor.sh --gnuplot-script; no gnuplot needed): a
# series with no negative value never gets an axis below 0, every point lies inside its axes, and a
# series that does go negative keeps its margin below.
#   check_plot_ranges.sh <plot_monitor.sh> <golden csv dir> <scratch dir>
set -euo pipefail
script=$1 golden=$2 work=$3
rm -rf "$work"
mkdir -p "$work/near_zero" "$work/negative"
fail=0

# A demo-like run: loss falling to 0.01, lr warming up from 0, samples from 0 (autoscale gave
# axes from -0.5, -0.0005 and -2000 here).
printf 'step,train_loss\r\n0,2.3\r\n2000,0.9\r\n4000,0.05\r\n20000,0.01\r\n' >"$work/near_zero/Train_Samples_train_loss.csv"
printf 'step,lr\r\n0,0\r\n2000,0.0005\r\n4000,0.001\r\n20000,0.001\r\n' >"$work/near_zero/Train_Samples_lr.csv"
printf 'step,loss_scale\r\n0,65536\r\n20000,32768\r\n' >"$work/near_zero/Train_Samples_loss_scale.csv"
# Not a monitor series, but the rule must depend on the data, not the panel.
printf 'step,train_loss\r\n0,-1\r\n10,1\r\n' >"$work/negative/Train_Samples_train_loss.csv"

# Prints "<panel> <axis> <lo> <hi> <data min> <data max>" for each panel of a directory.
ranges() {
  "$script" --gnuplot-script "$1" | awk '
    /^set title/ { title = $0; sub(/^set title "/, "", title); sub(/"$/, "", title) }
    /^set [xy]range \[/ {
      axis = substr($0, 5, 1); r = $0; sub(/^set [xy]range \[/, "", r); sub(/\]$/, "", r)
      split(r, b, ":"); lo[axis] = b[1]; hi[axis] = b[2]
    }
    /^plot/ {
      file = $0; sub(/^plot "/, "", file); sub(/" using.*/, "", file)
      n = 0
      while ((getline line < file) > 0) {
        sub(/\r$/, "", line); split(line, f, ",")
        if (f[1] !~ /^[-+0-9.eE]+$/ || f[2] !~ /^[-+0-9.eE]+$/) continue
        if (n++ == 0) { x0 = x1 = f[1] + 0; y0 = y1 = f[2] + 0 }
        if (f[1] + 0 < x0) x0 = f[1] + 0; if (f[1] + 0 > x1) x1 = f[1] + 0
        if (f[2] + 0 < y0) y0 = f[2] + 0; if (f[2] + 0 > y1) y1 = f[2] + 0
      }
      close(file)
      gsub(/ /, "_", title)
      print title, "x", lo["x"], hi["x"], x0, x1
      print title, "y", lo["y"], hi["y"], y0, y1
    }'
}

check() {  # <what> <awk condition on lo hi min max> <line>
  read -r panel axis lo hi min max <<<"$3"
  if ! awk -v lo="$lo" -v hi="$hi" -v min="$min" -v max="$max" "BEGIN { exit !($2) }"; then
    echo "FAIL: $1: $panel $axis axis [$lo:$hi], data [$min:$max]"
    fail=1
  fi
}

for d in "$golden" "$work/near_zero"; do
  lines=$(ranges "$d")
  [[ $(wc -l <<<"$lines") -ge 4 ]] || { echo "FAIL: no ranges for $d:"; "$script" --gnuplot-script "$d"; exit 1; }
  while read -r line; do
    check "points inside the axes ($d)" 'lo + 0 <= min + 0 && hi + 0 >= max + 0' "$line"
    check "axis of a non-negative series starts at or above 0 ($d)" 'min + 0 < 0 || lo + 0 >= 0' "$line"
  done <<<"$lines"
done

near=$(ranges "$work/near_zero")
check "loss near 0: its axis starts at 0" 'lo + 0 == 0' "$(grep '^training_loss y' <<<"$near")"
check "lr warm-up from 0: its axis starts at 0" 'lo + 0 == 0' "$(grep '^learning_rate y' <<<"$near")"
check "samples from 0: the axis starts at 0" 'lo + 0 == 0' "$(grep '^learning_rate x' <<<"$near")"
check "loss scale (log axis) stays positive" 'lo + 0 > 0' "$(grep '^loss_scale y' <<<"$near")"
check "a negative series keeps a margin below" 'lo + 0 < min + 0' "$(ranges "$work/negative" | grep '^training_loss y')"

[[ $fail == 0 ]] && echo "plot ranges: all axes hold their data, none below 0 for a non-negative series"
exit $fail
