#!/usr/bin/env bash
# Stages 0, 1, 2 and 3 of the libtorch GPT on 2 thread ranks end with bit-identical parameters
# (the checksum of their bits after 30 steps).
#   stages_test.sh <zerotk_example_04_libtorch_gpt>
set -euo pipefail
exe=$1
sums=()
for s in 0 1 2 3; do
  out=$("$exe" --stage "$s" --ranks 2 --steps 30)
  sum=$(grep -o 'parameter checksum [0-9a-f]*' <<<"$out" | awk '{print $3}')
  [[ -n $sum ]] || { echo "FAIL: stage $s printed no checksum"; echo "$out"; exit 1; }
  echo "stage $s: $sum"
  sums+=("$sum")
done
for s in 1 2 3; do
  [[ ${sums[$s]} == "${sums[0]}" ]] || { echo "FAIL: stage $s differs from stage 0"; exit 1; }
done
echo "PASS: stages 0-3 bitwise identical"
