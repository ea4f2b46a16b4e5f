#!/usr/bin/env bash
# The test command from README.md: installs what is missing, builds (Release, host) and runs every
# test with CTest, including MPI tests and the package/compile-fail tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
start=$(date +%s)
cmake --workflow --preset default
echo "test.sh: configure + build + test took $(( $(date +%s) - start )) s"
