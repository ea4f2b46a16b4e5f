#!/usr/bin/env bash
# bench/compile/run.sh [ROUNDS]: what zerotk costs a trainer's translation unit, in CPU seconds
# (user + sys, /usr/bin/time; wall time on a shared machine stretches 2-3x), peak memory and emitted
# text, the contenders interleaved in rounds so that load swings hit all of them alike; medians,
# and each one's median ratio to the Eigen trainer TU of the same round. Then where the time goes
# (GCC's -ftime-report phases) and the preprocessed size of the headers a trainer includes.
#
#   bench/compile/run.sh 3          # about 5 minutes on 2 cores; prints a markdown table
#
# Contenders (all at -O2, the flags the default preset gives a user's TU plus OpenMP):
#   any            examples/05_any_engine/main.cpp: the trainer over AnyEngine (links zerotk::engines)
#   typed+set      typed_trainer.cpp over one engine type of the compiled set (extern template)
#   typed          the same file header-only: the whole engine instantiated in the TU
#   umbrella       umbrella_only.cpp: #include <zerotk/zerotk.hpp>, no engine
#   eigen          eigen_mlp.cpp: an Eigen MLP trainer (the everyday reference)
#   torch          torch_mlp.cpp: a libtorch trainer (when libtorch's headers are installed)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
cxx=${CXX:-g++}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
base=(-std=gnu++20 -O2 -Iinclude -fopenmp -DZEROTK_HAS_OPENMP=1)
set_macros=()
for f in ADAMW_FP32 ADAMW_BF16 ADAMW_FP16 OFFLOAD_CPU OFFLOAD_NVME LION ONEBIT COMPRESSION; do
  set_macros+=(-DZEROTK_ENGINES_$f=1)
done
declare -A cmd
# What linking zerotk::engines gives a TU: the set's families and the compiled runtime (docs/comm.md).
set_macros+=(-DZEROTK_COMPILED_RUNTIME=1)
cmd[any]="${base[*]} ${set_macros[*]} -Iexamples/05_any_engine -c examples/05_any_engine/main.cpp"
cmd[typed+set]="${base[*]} ${set_macros[*]} -c bench/compile/typed_trainer.cpp"
cmd[typed]="${base[*]} -c bench/compile/typed_trainer.cpp"
cmd[umbrella]="${base[*]} -c bench/compile/umbrella_only.cpp"
cmd[eigen]="${base[*]} -I/usr/include/eigen3 -c bench/compile/eigen_mlp.cpp"
names=(any typed+set typed umbrella eigen)
if [[ -f /usr/include/torch/csrc/api/include/torch/torch.h ]]; then
  cmd[torch]="-std=gnu++17 -O2 -I/usr/include/torch/csrc/api/include -c bench/compile/torch_mlp.cpp"
  names+=(torch)
fi

declare -A cpu mem text
for ((r = 1; r <= rounds; ++r)); do
  for n in "${names[@]}"; do
    # shellcheck disable=SC2086
    /usr/bin/time -f '%U %S %M' -o "$out/time" $cxx ${cmd[$n]} -o "$out/$n.o"
    read -r u s m < "$out/time"
    cpu[$n]+="$(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.2f", u + s }') "
    mem[$n]=$m
    text[$n]=$(size -A "$out/$n.o" | awk '/^\.text/ { t += $2 } END { print t }')
  done
  echo "round $r of $rounds done" >&2
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
ratio_median() {  # the median over rounds of (n's CPU / eigen's CPU) in the same round
  paste <(tr ' ' '\n' <<<"${cpu[$1]}" | grep -v '^$') <(tr ' ' '\n' <<<"${cpu[eigen]}" | grep -v '^$') |
    awk '{ printf "%.2f ", $1 / $2 }' | median
}

echo "compiler: $($cxx --version | head -1); flags: ${base[*]}; $rounds rounds; $(nproc) cores"
echo
echo "| TU | CPU s (median) | rounds | x Eigen TU (median of per-round ratios) | peak MB | .text KB |"
echo "|---|---|---|---|---|---|"
for n in "${names[@]}"; do
  printf '| %s | %s | %s| %s | %d | %d |\n' "$n" "$(median <<<"${cpu[$n]}")" "${cpu[$n]}" "$(ratio_median "$n")" \
    "$((mem[$n] / 1024))" "$((text[$n] / 1024))"
done

echo
echo "Where the time goes (GCC -ftime-report, one run each: CPU seconds, user + sys, of its phases):"
for n in any typed+set typed; do
  # shellcheck disable=SC2086
  $cxx ${cmd[$n]} -o "$out/$n.o" -ftime-report 2> "$out/report" || true
  # " phase parsing   :   1.23 ( 10%)   0.20 ( 30%)   1.45 ( 12%)  123M ( 20%)": usr, sys, wall, memory
  phases=$(grep -E '^ phase (parsing|lang. deferred|opt and generate|template instantiation)' "$out/report" |
           awk -F: '{ name = $1; sub(/^ phase /, "", name); sub(/ +$/, "", name); split($2, a, " ");
                      printf "%s %.2f s; ", name, a[1] + a[4] }')
  echo "- $n: $phases"
done

echo
echo "Preprocessed lines (g++ -E, no line markers) of what a trainer includes:"
for h in zerotk/any_engine.hpp zerotk/engine.hpp zerotk/engines.hpp zerotk/zerotk.hpp zerotk/comm/threads.hpp; do
  n=$(echo "#include <$h>" | $cxx -std=gnu++20 -Iinclude -DZEROTK_HAS_OPENMP=1 -E -P -x c++ - | wc -l)
  echo "- $h: $n"
done
