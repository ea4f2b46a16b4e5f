#!/usr/bin/env bash
# The demo command from README.md: installs what is missing, builds, and runs the main example.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target zerotk_example_00_hello
build/default/examples/00_hello/zerotk_example_00_hello "$@"
