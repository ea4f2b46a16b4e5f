#!/usr/bin/env bash
# Installs the Debian 12 packages zerotk's build, tests, examples and benchmarks need.
# Idempotent and quick when everything is present. As root it runs apt-get; otherwise it prints the
# exact apt-get line and exits 1. CUDA/NCCL are not installed here (they come with the CUDA toolkit).
#
#   scripts/install-deps.sh            # build + test + demo packages
#   scripts/install-deps.sh --dev      # also python3-torch (golden fixtures, peer benchmarks)
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config libeigen3-dev doctest-dev libopenmpi-dev openmpi-bin
          nlohmann-json3-dev liburing-dev libxxhash-dev libbenchmark-dev libcli11-dev gnuplot-nox
          python3      # python3: read_safetensors.py, the independent check of the safetensors writer
          libtorch-dev   # libtorch 1.13 (CPU): the torch adapter's test (tests/interop)
          clang-19 libomp-19-dev)  # the `clang` preset; libomp: clang's OpenMP (without it OpenMP is off)
if [[ "${1:-}" == "--dev" ]]; then
  packages+=(python3-torch python3-numpy)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

line="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root:  apt-get update && $line" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
