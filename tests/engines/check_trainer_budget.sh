#!/usr/bin/env bash
# Usage: check_trainer_budget.sh CXX INCLUDE_DIR TRAINER_OBJECT
# The compile-time budget of a trainer over AnyEngine, on measures that do not depend on the
# machine's load (times live in bench/compile): (1) zerotk/any_engine.hpp preprocesses to at most
# kLines lines (g++ -E -P, compiled runtime, today 84,181 with GCC 12's libstdc++: most of it the
# standard headers); (2) the trainer's object file (examples/05_any_engine) defines no engine code:
# no zerotk::BasicEngine<...> member (what Engine<...> names), no threads back end, no host reduction. Fails naming what it found.
set -euo pipefail
cxx=$1 inc=$2 obj=$3
kLines=92000
status=0
lines=$(echo '#include <zerotk/any_engine.hpp>' |
        "$cxx" -std=gnu++20 -I"$inc" -DZEROTK_HAS_OPENMP=1 -DZEROTK_COMPILED_RUNTIME=1 -E -P -x c++ - | wc -l)
echo "zerotk/any_engine.hpp: $lines preprocessed lines (budget $kLines)"
if (( lines > kLines )); then echo "FAIL: zerotk/any_engine.hpp grew past its budget"; status=1; fi
defined=$(nm -C "$obj" | grep -E ' [TtWw] ' || true)
for pattern in 'zerotk::BasicEngine<' 'zerotk::comm::detail::threads::' 'zerotk::comm::detail::reduce_rows' 'zerotk::engine::ErasedEngineOf<'; do
  n=$(grep -cF -- "$pattern" <<<"$defined" || true)
  echo "definitions of $pattern... in the trainer's object: $n"
  if (( n > 0 )); then echo "FAIL: the trainer's TU compiled $pattern code:"; grep -F -- "$pattern" <<<"$defined" | head -3; status=1; fi
done
text=$(size -A "$obj" | awk '/^\.text/ { t += $2 } END { print t }')
echo "the trainer's .text: $text bytes"
[[ $status -eq 0 ]] && echo "PASS: a trainer over AnyEngine compiles none of the engine or the runtime"
exit $status
