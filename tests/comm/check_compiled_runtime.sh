#!/usr/bin/env bash
# Usage: check_compiled_runtime.sh OBJECT...
# The compiled runtime's promise (docs/comm.md, "Compiled runtime"): an object compiled with
# ZEROTK_COMPILED_RUNTIME=1 from a TU that runs run_threads + all_reduce (runtime_user.cpp) defines
# none of the threads back end's code: no zerotk::comm::detail::reduce_rows instantiation and no
# function, vtable or typeinfo of zerotk::comm::detail::threads; it only references them (they are
# linked from zerotk::runtime). Instantiations of std templates over the engine's types (a
# shared_ptr<Group>'s destructor) are not engine code and do not count. Fails naming what it found.
# NM overrides the nm to use.
set -euo pipefail
nm=${NM:-nm}
if [[ $# -eq 0 ]]; then echo "usage: $0 OBJECT..." >&2; exit 2; fi
# A symbol is the engine's when its demangled name starts in those namespaces: after an optional
# "vtable for " (or typeinfo, thunk, guard variable) and an optional return type (function templates).
engine='^((vtable|typeinfo|typeinfo name|VTT|construction vtable|guard variable) for |(non-)?virtual thunk to )?([^(<]* )?zerotk::comm::detail::(threads::|reduce_rows)'
status=0
for obj in "$@"; do
  syms=$("$nm" -C "$obj")
  # "ADDRESS TYPE NAME" for definitions, "U NAME" (after spaces) for references
  defined=$(sed -nE 's/^[0-9a-fA-F]+ [A-Za-z] //p' <<<"$syms" | grep -E -- "$engine" || true)
  referenced=$(sed -nE 's/^ +U //p' <<<"$syms" | grep -cE -- '^zerotk::comm::' || true)
  if [[ -n $defined ]]; then
    echo "FAIL: $obj defines threads back-end code that zerotk::runtime should provide:"
    sed 's/^/  /' <<<"$defined" | head -40
    status=1
  fi
  if [[ $referenced -eq 0 ]]; then
    echo "FAIL: $obj references nothing in zerotk::comm: is it the run_threads TU, built with ZEROTK_COMPILED_RUNTIME=1?"
    status=1
  fi
  echo "$obj: $(grep -c . <<<"${defined:-}" || true) engine definitions, $referenced undefined references into zerotk::comm"
done
[[ $status -eq 0 ]] && echo "PASS: the threads back end is linked from zerotk::runtime, not compiled in the trainer's TU"
exit $status
