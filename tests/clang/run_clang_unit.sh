#!/usr/bin/env bash
# Usage: run_clang_unit.sh CLANGXX SOURCE_DIR WORK_DIR FAMILIES SUITE...
# The second compiler running tests, not only parsing them: configures this source tree with clang
# (Release, -Werror as every test target has it) into WORK_DIR, with the compiled engine set cut to
# FAMILIES (comma-separated, e.g. adamw_bf16,adamw_fp16) and no examples, benchmarks, tools,
# libtorch or CUDA, builds the named CTest suites (their targets zerotk_test_<suite>) and runs them.
# Later runs rebuild only what changed.
set -euo pipefail
cxx=$1 src=$2 work=$3 families=$4
shift 4
start=$(date +%s)
# CTest passes the outer build's tools (ZEROTK_CMAKE, ZEROTK_CTEST, ZEROTK_GENERATOR, ZEROTK_PREFIX_PATH).
cmake_=${ZEROTK_CMAKE:-cmake}
ctest_=${ZEROTK_CTEST:-ctest}
generator=${ZEROTK_GENERATOR:-Ninja}
prefix=${ZEROTK_PREFIX_PATH:-}
# Release at -O1: the test targets add -O1 anyway; the library's two families compile in half the time.
"$cmake_" -S "$src" -B "$work" -G "$generator" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
  -DCMAKE_CXX_COMPILER="$cxx" \
  "-DCMAKE_PREFIX_PATH=$prefix" "-DZEROTK_ENGINES=${families//,/;}" -DZEROTK_BUILD_EXAMPLES=OFF \
  -DZEROTK_BUILD_BENCH=OFF -DZEROTK_BUILD_TOOLS=OFF -DZEROTK_WITH_TORCH=OFF -DZEROTK_CUDA=OFF \
  >"$work.configure.log" 2>&1 || { cat "$work.configure.log"; echo "FAIL: configuring with $cxx"; exit 1; }
targets=()
for s in "$@"; do targets+=("zerotk_test_$s"); done
echo "clang.unit: building ${targets[*]} with $cxx"
"$cmake_" --build "$work" -j2 --target "${targets[@]}"
regex="^($(IFS='|'; echo "$*"))\$"
"$ctest_" --test-dir "$work" -R "$regex" --output-on-failure --no-tests=error
echo "PASS: the suites $* built with $cxx and passed ($(( $(date +%s) - start )) s)"
