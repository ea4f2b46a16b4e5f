#!/usr/bin/env bash
# Usage: check_no_engine_code.sh OBJECT
# The compiled engine set's deterministic budget: in OBJECT (test_compiled_set.cpp's object file),
# the set's engine types are only referenced (their members are linked from zerotk::engines), while
# the same policies spelled in another order were compiled there. Fails naming what it found.
set -euo pipefail
obj=$1
syms=$(nm -C "$obj")
# (the demangled names spell the Partitioner's defaulted reduction point)
compiled='zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>, zerotk::when::every_micro_step>, zerotk::Optimizer<zerotk::AdamW>, zerotk::Precision<zerotk::bf16> >::step(double)'
local_='zerotk::Engine<zerotk::Precision<zerotk::bf16>, zerotk::Optimizer<zerotk::AdamW>, zerotk::Partitioner<zerotk::Stage<2>, zerotk::when::every_micro_step> >::step(double)'
status=0
if ! grep -F -- " U $compiled" <<<"$syms" >/dev/null; then
  echo "FAIL: the set's engine is not an undefined reference in $obj: $compiled"; status=1
fi
if grep -E -- " [TtWw] " <<<"$syms" | grep -F -- "$compiled" >/dev/null; then
  echo "FAIL: the set's engine was compiled into $obj: $compiled"; status=1
fi
if ! grep -E -- " [TtWw] " <<<"$syms" | grep -F -- "$local_" >/dev/null; then
  echo "FAIL: the locally spelled engine was not compiled into $obj (did the check lose its control?)"; status=1
fi
defined=$(grep -E -- " [TtWw] zerotk::Engine<" <<<"$syms" | grep -cF -- "::step(double)" || true)
echo "Engine<...>::step definitions in the object: $defined (4 expected: the locally spelled types)"
if [[ $defined -ne 4 ]]; then echo "FAIL: expected 4 engine step() definitions, found $defined"; status=1; fi
[[ $status -eq 0 ]] && echo "PASS: the compiled set's engine types are linked, not compiled, in the trainer's TU"
exit $status
