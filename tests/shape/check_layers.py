#!/usr/bin/env python3
"""Checks that no header of include/zerotk includes a layer above its own.

The order is the one docs/architecture.md writes down (the fenced block after the marker
"<!-- layer order -->"): each line that starts at column 0 names a layer, lowest first; a folder
("zero/") covers every header under it, a file ("engine.hpp", "pipeline/engine_hooks.hpp") itself,
and a file named on a line of its own belongs to that line, not to its folder's. An include may name the
same layer or one listed before it. Exit 1 with one line per violation, naming both files.

  check_layers.py <repo root>
"""
import os
import re
import sys


def layer_order(doc_path):
    text = open(doc_path, encoding="utf-8").read()
    marker = text.find("<!-- layer order -->")
    if marker < 0:
        sys.exit(f"{doc_path}: no '<!-- layer order -->' marker before the layer block")
    start = text.find("```", marker)
    end = text.find("```", start + 3)
    if start < 0 or end < 0:
        sys.exit(f"{doc_path}: no fenced block after the layer-order marker")
    order = []  # [set of names], lowest first
    for line in text[start + 3:end].splitlines()[1:]:
        if line and not line[0].isspace():
            names = re.split(r"\s{2,}", line.strip())[0]  # "a.hpp, b.hpp   what they are"
            order.append({n.strip() for n in names.split(",")})
    return order


def layer_of(rel, order):
    """The index in `order` of rel, a path under include/zerotk ('zero/layout.hpp', 'engine.hpp'):
    the line naming the file itself ('pipeline/engine_hooks.hpp') if one does, else its folder's."""
    for i, names in enumerate(order):
        if rel in names:
            return i
    head = rel.split("/")[0]
    key = head + "/" if "/" in rel else head
    for i, names in enumerate(order):
        if key in names:
            return i
    return None


def main(root):
    order = layer_order(os.path.join(root, "docs", "architecture.md"))
    name = [", ".join(sorted(n)) for n in order]
    base = os.path.join(root, "include", "zerotk")
    include = re.compile(r'^\s*#\s*include\s+["<]zerotk/([^">]+)[">]')  # "zerotk/..." or <zerotk/...>
    problems = []
    for dirpath, _, files in os.walk(base):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, base).replace(os.sep, "/")
            src = layer_of(rel, order)
            if src is None:
                problems.append(f"include/zerotk/{rel}: its layer is not in docs/architecture.md's layer order")
                continue
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                m = include.match(line)
                if not m:
                    continue
                dst = layer_of(m.group(1), order)
                if dst is None:
                    problems.append(f"include/zerotk/{rel}:{n}: includes zerotk/{m.group(1)}, whose layer is not listed")
                elif dst > src:
                    problems.append(f"include/zerotk/{rel}:{n}: layer {name[src]} includes zerotk/{m.group(1)} of layer "
                                    f"{name[dst]}, which docs/architecture.md lists above it")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) break the layer order")
        return 1
    print(f"check_layers: {len(order)} layers, every include goes down or sideways")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
