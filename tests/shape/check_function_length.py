#!/usr/bin/env python3
"""Fails when a function body in the named folders of include/zerotk is longer than the limit.

A body is found by its braces: a '{' whose statement ends in ')' (plus const, noexcept, override,
a trailing return type or a requires-clause) and is not an if/for/while/switch/catch or a lambda.
Comments, strings and character literals are blanked first, so braces inside them do not count.
Lambdas and nested blocks count towards the function that contains them.

  check_function_length.py <repo root> <limit> <folder or header under include/zerotk>...
"""
import os
import re
import sys

QUALIFIERS = r"(\s*(const|noexcept(\([^()]*\))?|override|final|mutable|&&?|->\s*[\w:<>,\s*&]+|requires\b[^{;]*))*"
ENDS_IN_CALL = re.compile(r"\)" + QUALIFIERS + r"$")
CONTROL = re.compile(r"^(else\s+)?(if|for|while|switch|catch|do)\b")
LAMBDA = re.compile(r"\]\s*(\([^()]*(\([^()]*\)[^()]*)*\))?\s*(mutable\s*)?(noexcept\s*)?(->\s*[\w:<>,\s*&]+)?$")
NAME = re.compile(r"([~\w:]+|operator\s*\S+)\s*\([^()]*(\([^()]*\)[^()]*)*\)[^(){};]*$")


def blank(src):
    """src with comments, strings and character literals replaced by blanks (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j))
            i = j
        elif src[i] == '"' and i > 0 and src[i - 1] == "R":
            m = re.match(r'"([^(]*)\(', src[i:])
            close = ")" + m.group(1) + '"'
            j = src.find(close, i) + len(close)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
        elif src[i] in "\"'":
            q, j = src[i], i + 1
            while j < n and src[j] != q:
                j += 2 if src[j] == "\\" else 1
            out.append(q + q)
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def function_lengths(path):
    """[(lines, first line, name)] of the outermost function bodies in `path`."""
    s = blank(open(path, encoding="utf-8").read())
    found, stack = [], []
    for i, ch in enumerate(s):
        if ch == "{":
            head = re.split(r"[;{}]", re.sub(r"\s+", " ", s[max(0, i - 600):i]))[-1].strip()
            is_function = bool(ENDS_IN_CALL.search(head)) and not CONTROL.match(head) and not LAMBDA.search(head)
            m = NAME.search(head)
            stack.append((i, is_function and m is not None, m.group(1) if m else ""))
        elif ch == "}" and stack:
            start, is_function, name = stack.pop()
            if is_function and not any(f for _, f, _ in stack):
                first = s.count("\n", 0, start) + 1
                found.append((s.count("\n", start, i) + 1, first, name))
    return found


def main(root, limit, targets):
    base = os.path.join(root, "include", "zerotk")
    paths = []
    for t in targets:
        p = os.path.join(base, t)
        if os.path.isdir(p):
            for d, _, fs in os.walk(p):
                paths += [os.path.join(d, f) for f in sorted(fs) if f.endswith((".hpp", ".cuh"))]
        elif os.path.isfile(p):
            paths.append(p)
        else:
            sys.exit(f"check_function_length: no {t} under include/zerotk")
    longest, over = (0, "", ""), []
    for p in paths:
        rel = os.path.relpath(p, root)
        for lines, first, name in function_lengths(p):
            if lines > longest[0]:
                longest = (lines, f"{rel}:{first}", name)
            if lines > limit:
                over.append(f"{rel}:{first}: {name} is {lines} lines (limit {limit})")
    for o in over:
        print(o)
    print(f"check_function_length: {len(paths)} files, longest function {longest[2]} ({longest[1]}) "
          f"{longest[0]} lines, limit {limit}")
    return 1 if over else 0


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
