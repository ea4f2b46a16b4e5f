#!/usr/bin/env python3
"""Re-runs the build's compile commands of chosen files with -fsyntax-only -Werror: the compiler
parses and instantiates everything (GCC and clang alike), it only emits nothing. Two CTests use it:
clang.syntax (tests/clang/CMakeLists.txt: the GCC build's commands given to clang, so headers that
only GCC accepts fail: the compiled set's families that CTest clang.unit does not build with clang
in full, make_engine.cpp over every family, a trainer over AnyEngine, the GPT example and
typed-engine tests) and bench.syntax (bench/CMakeLists.txt: the build's own compiler over the
benchmarks, which the default preset leaves out of the default target). A file the build compiles
inside a unity batch is checked alone, with its batch's command.

  check_syntax.py <c++ compiler> <compile_commands.json> <source root> <file> ...

Each <file> is a path under the source root; exit 1 naming every file the compiler rejects, with its
first errors."""
import json
import os
import shlex
import subprocess
import sys
import time

# GCC's own warning switches clang does not know (-Werror would turn "unknown warning" into an error).
GCC_ONLY = {"-Wno-restrict", "-Wno-maybe-uninitialized", "-Winvalid-pch"}


def syntax_args(command, compiler):
    args = shlex.split(command)
    out = [compiler]
    is_clang = "clang" in os.path.basename(compiler)
    skip = False
    for i, a in enumerate(args[1:], 1):
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-include"):
            # the precompiled header (-include .../cmake_pch.hxx) is the build's: the file includes its own headers
            skip = True
            continue
        if a in ("-c", "-MD", "-Winvalid-pch") or (is_clang and a in GCC_ONLY):
            continue
        out.append(a)
    return out + ["-fsyntax-only", "-Werror"]


def unity_entry(entries, path):
    """The command of a file compiled inside a unity batch (CMake's UNITY_BUILD: the database lists
    only Unity/unity_<n>_<lang>.<ext>, which #includes the file by its absolute path), with the file
    itself compiled in the batch's place: same flags, one file."""
    for batch, e in entries.items():
        if "/Unity/unity_" not in batch:
            continue
        try:
            with open(batch, encoding="utf-8") as f:
                included = [line.split('"')[1] for line in f if line.startswith("#include \"")]
        except OSError:
            continue
        if any(os.path.realpath(i) == path for i in included):
            return dict(e, file=path, command=e["command"].replace(e["file"], path))
    return None


def main():
    compiler, db, root = sys.argv[1], sys.argv[2], sys.argv[3]
    files = [f for f in sys.argv[4:] if f]  # CTest passes an empty argument for a target this build lacks
    if not files:
        print("FAIL: no files to compile")
        return 1
    entries = {os.path.realpath(e["file"]): e for e in json.load(open(db, encoding="utf-8"))}
    failed = []
    for rel in files:
        path = os.path.realpath(os.path.join(root, rel))
        e = entries.get(path) or unity_entry(entries, path)
        if e is None:
            failed.append(f"{rel}: not in {db} (is its target built in this configuration?)")
            continue
        t0 = time.monotonic()
        p = subprocess.run(syntax_args(e["command"], compiler), cwd=e["directory"], capture_output=True, text=True)
        took = time.monotonic() - t0
        if p.returncode != 0:
            first = "\n".join((p.stdout + p.stderr).splitlines()[:25])
            failed.append(f"{rel}: {os.path.basename(compiler)} rejects it ({took:.1f} s):\n{first}")
        else:
            print(f"ok {rel} ({took:.1f} s)")
    for f in failed:
        print("FAIL:", f)
    print(f"{len(files) - len(failed)} of {len(files)} files compile with {os.path.basename(compiler)} -fsyntax-only -Werror")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
