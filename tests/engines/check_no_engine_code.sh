#!/usr/bin/env bash
# Usage: check_no_engine_code.sh OBJECT
# The compiled engine set's deterministic budget: in OBJECT (test_compiled_set.cpp's object file),
# the set's engine types are only referenced (their members are linked from zerotk::engines), even
# though the file spells them with the policies in another order, while the control (the same
# templates with a bucket 2 bytes larger) was compiled there. Fails naming what it found.
set -euo pipefail
obj=$1
syms=$(nm -C "$obj")
# The demangled canonical pack (engine/resolve.hpp) of stage 2, AdamW, bf16: its bucketer is the
# default (1e9 bytes) in the set's type, 1e9 + 2 in the control.
pack='zerotk::BasicEngine<zerotk::engine::Policies<zerotk::Partitioner<zerotk::Stage<2>, zerotk::when::every_micro_step>, zerotk::Optimizer<zerotk::AdamW>, zerotk::Precision<zerotk::bf16>, zerotk::Bucketer<zerotk::Bytes<'
compiled="${pack}1000000000ul> >"
local_="${pack}1000000002ul> >"
steps() { grep -F -- "::step(double)" <<<"$syms" | grep -E -- "$1" | grep -F -- "$2" || true; }
status=0
if [[ -z $(steps ' U ' "$compiled") ]]; then
  echo "FAIL: the set's engine is not an undefined reference in $obj: $compiled, ...>>::step"; status=1
fi
if [[ -n $(steps ' [TtWw] ' "$compiled") ]]; then
  echo "FAIL: the set's engine was compiled into $obj: $compiled, ...>>::step"; status=1
fi
if [[ -z $(steps ' [TtWw] ' "$local_") ]]; then
  echo "FAIL: the control engine was not compiled into $obj (did the check lose its control?)"; status=1
fi
defined=$(grep -E -- " [TtWw] zerotk::BasicEngine<" <<<"$syms" | grep -cF -- "::step(double)" || true)
echo "BasicEngine<...>::step definitions in the object: $defined (4 expected: the controls of stages 0-3)"
if [[ $defined -ne 4 ]]; then echo "FAIL: expected 4 engine step() definitions, found $defined"; status=1; fi
[[ $status -eq 0 ]] && echo "PASS: the compiled set's engine types are linked, not compiled, in the trainer's TU"
exit $status
