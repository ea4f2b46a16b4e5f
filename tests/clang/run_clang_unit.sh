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
# Release at -O0, the library and the tests alike (ZEROTK_TEST_OPTIMIZATION): this run checks that
# clang accepts the code and that what it builds passes, not its speed, and clang's warnings do not
# depend on the optimization level. Measured here (2 cores): the build takes 217 CPU-s against 385 at
# -O1 (test_any_engine.cpp 22 s against 47 s); the suites run 64 s one by one against 13 s (the threads
# communicator's 64 MiB cases dominate), so CTest runs them two at a time.
"$cmake_" -S "$src" -B "$work" -G "$generator" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG" \
  -DZEROTK_TEST_OPTIMIZATION=-O0 -DCMAKE_CXX_COMPILER="$cxx" \
  "-DCMAKE_PREFIX_PATH=$prefix" "-DZEROTK_ENGINES=${families//,/;}" -DZEROTK_BUILD_EXAMPLES=OFF \
  -DZEROTK_BUILD_BENCH=OFF -DZEROTK_BUILD_TOOLS=OFF -DZEROTK_WITH_TORCH=OFF -DZEROTK_CUDA=OFF \
  >"$work.configure.log" 2>&1 || { cat "$work.configure.log"; echo "FAIL: configuring with $cxx"; exit 1; }
targets=()
for s in "$@"; do targets+=("zerotk_test_$s"); done
echo "clang.unit: building ${targets[*]} with $cxx"
"$cmake_" --build "$work" -j2 --target "${targets[@]}"
regex="^($(IFS='|'; echo "$*"))\$"
"$ctest_" --test-dir "$work" -R "$regex" -j2 --output-on-failure --no-tests=error
echo "PASS: the suites $* built with $cxx and passed ($(( $(date +%s) - start )) s)"
