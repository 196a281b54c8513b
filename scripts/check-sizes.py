#!/usr/bin/env python3
"""Holds the product code to its size rules: no file over 700 lines and no
function over 80, in core/, reference/, wire/, server/ and client/ (tests,
benchmarks and generated code aside).

    scripts/check-sizes.py [--root DIR] [--list]

C++ and CUDA functions are measured by Universal Ctags (their first line to
their closing brace), Python functions by the ast module. What is over a
limit today is listed below with its size: it may shrink, never grow, and
its entry goes once it is within the limit (an entry that is no longer
needed fails the check too, so that the list stays true). --list prints
every file and function over a limit, with its size, whatever the list.

Exit 0 when the rules hold, 1 naming each breach, 2 when ctags is missing.
"""

import argparse
import ast
import os
import shutil
import subprocess
import sys

FILE_LIMIT = 700
FUNCTION_LIMIT = 80
FOLDERS = ("core", "reference", "wire", "server", "client")
EXTENSIONS = (".cc", ".h", ".cu", ".cuh", ".py")
# Folders of tests inside the product folders.
SKIP = ("client/python/tests/",)

# Over a limit today: "path" (lines) or "path:function" (lines).
ALLOWED = {}


def product_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = []
        for base, _, files in os.walk(root):
            for f in files:
                out.append(os.path.relpath(os.path.join(base, f), root))
    return sorted(f for f in out
                  if f.startswith(tuple(d + "/" for d in FOLDERS)) and f.endswith(EXTENSIONS)
                  and not f.startswith(SKIP))


def line_count(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def cpp_functions(root, files):
    """(path:name, lines) of every C++/CUDA function ctags finds."""
    sources = [f for f in files if not f.endswith(".py")]
    if not sources:
        return []
    out = subprocess.run(
        ["ctags", "--languages=C++", "--langmap=C++:+.cu.cuh", "--kinds-C++=f", "--fields=+ne", "-x",
         "-D__launch_bounds__(x)=",
         "--_xformat=%{end} %{line} %{input} %{name}", "-L", "-"],
        input="\n".join(sources), capture_output=True, text=True, cwd=root, check=True).stdout
    found = []
    for row in out.splitlines():
        parts = row.split(" ", 3)
        if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        found.append(("%s:%s" % (parts[2], parts[3]), int(parts[0]) - int(parts[1]) + 1))
    return found


def python_functions(root, files):
    found = []
    for f in files:
        if not f.endswith(".py"):
            continue
        with open(os.path.join(root, f), encoding="utf-8") as src:
            tree = ast.parse(src.read(), f)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(("%s:%s" % (f, node.name), node.end_lineno - node.lineno + 1))
    return found


def measure(root):
    files = product_files(root)
    sizes = [(f, line_count(os.path.join(root, f)), FILE_LIMIT) for f in files]
    sizes += [(n, lines, FUNCTION_LIMIT) for n, lines in cpp_functions(root, files)]
    sizes += [(n, lines, FUNCTION_LIMIT) for n, lines in python_functions(root, files)]
    return sizes


def breaches(sizes, allowed):
    problems = []
    seen = set()
    for name, lines, limit in sizes:
        if lines <= limit:
            continue
        seen.add(name)
        kind = "function" if ":" in name else "file"
        if name not in allowed:
            problems.append("%s: %s of %d lines, over the %d-line limit" % (name, kind, lines, limit))
        elif lines > allowed[name]:
            problems.append("%s: grew to %d lines (listed at %d; the limit is %d)" %
                            (name, lines, allowed[name], limit))
    for name in sorted(set(allowed) - seen):
        problems.append("%s: within its limit now; remove it from ALLOWED in scripts/check-sizes.py" % name)
    return problems


def self_test():
    sizes = [("a.cc", 701, FILE_LIMIT), ("b.cc", 700, FILE_LIMIT), ("c.cc", 750, FILE_LIMIT),
             ("c.cc:F", 81, FUNCTION_LIMIT), ("d.py:g", 90, FUNCTION_LIMIT)]
    got = breaches(sizes, {"c.cc": 740, "d.py:g": 95, "e.cc": 800})
    assert got == ["a.cc: file of 701 lines, over the 700-line limit",
                   "c.cc: grew to 750 lines (listed at 740; the limit is 700)",
                   "c.cc:F: function of 81 lines, over the 80-line limit",
                   "e.cc: within its limit now; remove it from ALLOWED in scripts/check-sizes.py"], got


def main():
    ap = argparse.ArgumentParser(description="Holds the product code to its size rules.")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--list", action="store_true", help="print every file and function over a limit")
    ap.add_argument("--self-test", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.self_test:
        self_test()
        print("check-sizes: self-test passed")
        return 0
    if shutil.which("ctags") is None:
        print("check-sizes: needs Universal Ctags (Debian: universal-ctags; scripts/bootstrap.sh "
              "installs it)", file=sys.stderr)
        return 2
    root = os.path.abspath(args.root)
    sizes = measure(root)
    if args.list:
        for name, lines, limit in sorted(sizes, key=lambda s: -s[1]):
            if lines > limit:
                print("%5d  %s" % (lines, name))
        return 0
    problems = breaches(sizes, ALLOWED)
    if problems:
        print("check-sizes: %d breach(es) of the size rules (files <= %d lines, functions <= %d):" %
              (len(problems), FILE_LIMIT, FUNCTION_LIMIT))
        for p in problems:
            print("  " + p)
        return 1
    but = ", but the %d listed" % len(ALLOWED) if ALLOWED else ""
    print("check-sizes: every product file within %d lines and function within %d%s" %
          (FILE_LIMIT, FUNCTION_LIMIT, but))
    return 0


if __name__ == "__main__":
    sys.exit(main())
