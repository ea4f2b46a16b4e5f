#!/usr/bin/env bash
# Every program README.md runs from the build tree (build/default/...) exists in this build once
# scripts/demo.sh or scripts/test.sh has run, and the tools answer --help; every scripts/*.sh it
# names is there and executable. A README command that names something nothing builds fails here.
#   check_readme_commands.sh <README.md> <build dir standing for build/default> <source dir>
set -euo pipefail
readme=$1 build=$2 src=$3
fail=0

mapfile -t programs < <(grep -o 'build/default/[A-Za-z0-9_./-]*[A-Za-z0-9_]' "$readme" | sort -u)
mapfile -t scripts < <(grep -o 'scripts/[A-Za-z0-9_-]*\.sh' "$readme" | sort -u)
if [[ ${#programs[@]} -eq 0 || ${#scripts[@]} -eq 0 ]]; then
  echo "FAIL: found ${#programs[@]} build/default/ programs and ${#scripts[@]} scripts in $readme; the pattern no longer matches"
  exit 1
fi

for p in "${programs[@]}"; do
  file=$build/${p#build/default/}
  if [[ ! -f $file || ! -x $file ]]; then
    echo "FAIL: README.md runs $p, which this build does not have (scripts/demo.sh and scripts/test.sh must build it)"
    fail=1
    continue
  fi
  if [[ $p == build/default/tools/* ]]; then
    if ! help=$("$file" --help 2>&1) || ! grep -qi usage <<<"$help"; then
      echo "FAIL: $p --help did not exit 0 with a usage text:"
      echo "$help"
      fail=1
      continue
    fi
  fi
  echo "ok: $p"
done

for s in "${scripts[@]}"; do
  if [[ ! -x $src/$s ]]; then
    echo "FAIL: README.md names $s, which is missing or not executable"
    fail=1
  else
    echo "ok: $s"
  fi
done
exit $fail
