#!/usr/bin/env python3
"""The shape checks must catch what they are for: builds small trees in a temporary directory,
one clean and some with a violation each, runs both checks on them and asserts the verdicts."""
import os
import subprocess
import sys
import tempfile

HERE = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
DOC = """# layers
<!-- layer order -->
```
core/        the bottom
zero/        above core
  grads/     (a sub-folder: same layer)
engine.hpp   above zero
zero/top.hpp  a file named on a line of its own: above engine.hpp, unlike the rest of zero/
```
"""


def tree(files):
    root = tempfile.mkdtemp(prefix="zerotk_shape_")
    for rel, text in {"docs/architecture.md": DOC, **files}.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return root


def run(script, *args):
    p = subprocess.run([sys.executable, os.path.join(HERE, script), *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def body(n):
    return "inline int f(int x) {\n" + "  x += 1;\n" * (n - 2) + "  return x; }\n"


failures = []


def expect(what, got, want_rc, needle):
    rc, out = got
    if rc != want_rc or needle not in out:
        failures.append(f"{what}: exit {rc} (want {want_rc}), output lacks {needle!r}:\n{out}")


good = tree({"include/zerotk/core/a.hpp": "#pragma once\n",
             "include/zerotk/zero/grads/b.hpp": '#include "zerotk/core/a.hpp"\n#include "zerotk/zero/c.hpp"\n',
             "include/zerotk/zero/c.hpp": body(80),
             "include/zerotk/engine.hpp": '#include "zerotk/zero/c.hpp"\n'})
expect("clean tree, layers", run("check_layers.py", good), 0, "every include goes down or sideways")
expect("clean tree, 80-line function", run("check_function_length.py", good, "80", "zero"), 0, "80 lines")

up = tree({"include/zerotk/core/a.hpp": '#include "zerotk/zero/c.hpp"\n', "include/zerotk/zero/c.hpp": "\n"})
expect("core includes zero", run("check_layers.py", up), 1, "layer core/ includes zerotk/zero/c.hpp of layer zero/")
angled = tree({"include/zerotk/core/a.hpp": "#include <zerotk/zero/c.hpp>\n", "include/zerotk/zero/c.hpp": "\n"})
expect("core includes zero with angle brackets", run("check_layers.py", angled), 1,
       "layer core/ includes zerotk/zero/c.hpp of layer zero/")

unlisted = tree({"include/zerotk/parallel/x.hpp": "\n"})
expect("a folder missing from the order", run("check_layers.py", unlisted), 1, "not in docs/architecture.md")

own_line = tree({"include/zerotk/zero/top.hpp": '#include "zerotk/engine.hpp"\n', "include/zerotk/engine.hpp": "\n"})
expect("a file on its own line includes a layer below it", run("check_layers.py", own_line), 0,
       "every include goes down or sideways")
under = tree({"include/zerotk/zero/c.hpp": '#include "zerotk/zero/top.hpp"\n', "include/zerotk/zero/top.hpp": "\n"})
expect("a folder includes its own file listed higher", run("check_layers.py", under), 1,
       "layer zero/ includes zerotk/zero/top.hpp of layer zero/top.hpp")

long_fn = tree({"include/zerotk/zero/c.hpp": body(81)})
expect("81-line function", run("check_function_length.py", long_fn, "80", "zero"), 1, "f is 81 lines (limit 80)")

tricky = tree({"include/zerotk/zero/c.hpp":
               "struct S {\n  void g() const noexcept {\n    auto l = [&](int y) {\n" + "      y += 1;\n" * 79 +
               "    };\n    if (true) { }\n    const char* s = \"}}}\"; /* { */ (void)s; (void)l;\n  }\n};\n"})
expect("member function with a lambda, braces in strings and comments",
       run("check_function_length.py", tricky, "80", "zero"), 1, "g is 85 lines")

for f in failures:
    print("FAIL:", f)
print(f"test_checks: {8 - len(failures)} of 8 verdicts as expected")
sys.exit(1 if failures else 0)
