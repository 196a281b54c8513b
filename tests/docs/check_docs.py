#!/usr/bin/env python3
"""Checks the documents against the binaries and sources they describe.

    check_docs.py --logitd PATH --logitctl PATH --root REPO_ROOT

1. Flags: every flag `logitd --help` lists has a row in the flag table of
   docs/OPERATIONS.md, every flag named there is one logitd has, and so is
   every flag in the server flag table of README.md.
2. Commands: every `logitctl ... COMMAND` in README.md's code (fenced blocks
   and inline code) names a command `logitctl help` lists; for a
   sub-command (`weights register`) only the first word is checked.
3. Python API: every public method of logitd.Client (read with ast, not
   imported, from client/python/src/logitd/client.py and the modules of its
   mixins) has a row in the API table of client/python/README.md, whose
   signature gives the same parameters, in the same order, with the same defaults; so does the
   constructor (a row for `Client(`). Aliases assigned in the class body
   (`register_weight = register_weights`) need no row.

4. Paths: every source path docs/ARCHITECTURE.md names in inline code
   (`call/verify.cc`, `reference/candidate_check.h`: a folder, a file with
   a source extension) is the end of a file of the repository, so that the
   map of the code cannot name a file that moved or went.

Exit 0 when the documents agree, 1 naming every disagreement, 2 for a usage
error or a binary that cannot be run. Standard library only.
"""

import argparse
import ast
import os
import re
import subprocess
import sys

# A flag entry of `logitd --help`: "  --NAME  (default: VALUE)".
HELP_FLAG = re.compile(r"^  --([a-z0-9_]+)  \(default: ", re.MULTILINE)
# Fewer flags than this means the --help format changed and the parse broke.
MIN_LOGITD_FLAGS = 20
# Fewer commands than this means the usage text changed and the parse broke.
MIN_LOGITCTL_COMMANDS = 8


class Problems:
    """Problems found, grouped by check, printed at the end."""

    def __init__(self):
        self.items = []

    def add(self, check, message):
        self.items.append((check, message))


# -- markdown helpers -------------------------------------------------------------------------


def split_row(line):
    """The cells of a markdown table row, without the outer pipes.

    Pipes inside inline code (`a|b`) do not split cells.
    """
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|"):
        line = line[:-1]
    cells, cell, in_code = [], [], False
    for ch in line:
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append("".join(cell).strip())
            cell = []
        else:
            cell.append(ch)
    cells.append("".join(cell).strip())
    return cells


def table_after_header(text, header_cells):
    """Rows (lists of cells) of the first table whose header row has these cells.

    Returns None when there is no such table.
    """
    lines = text.splitlines()
    want = [c.lower() for c in header_cells]
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            continue
        if [c.lower() for c in split_row(line)] != want:
            continue
        rows = []
        for row in lines[i + 2 :]:  # past the header and its |---| line
            if not row.lstrip().startswith("|"):
                break
            rows.append(split_row(row))
        return rows
    return None


def code_fences(text):
    """The contents of the fenced code blocks of a markdown text, and the text left outside them."""
    blocks, outside, current, fence = [], [], None, None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            m = re.match(r"^(`{3,}|~{3,})", stripped)
            if m:
                current, fence = [], m.group(1)
            else:
                outside.append(line)
        elif stripped.startswith(fence):
            blocks.append("\n".join(current))
            current = None
        else:
            current.append(line)
    if current is not None:
        blocks.append("\n".join(current))
    return blocks, "\n".join(outside)


def inline_code(text):
    """The inline code spans (`...`) of markdown text outside fenced blocks.

    A span may run over a line break, as in a wrapped paragraph; it is
    returned on one line.
    """
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]


def section(text, heading):
    """The part of a markdown text under a heading line (e.g. "## Flags"), up to the
    next heading of the same or a higher level; None when the heading is missing."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == heading:
            out = []
            for nxt in lines[i + 1 :]:
                m = re.match(r"^(#+) ", nxt)
                if m and len(m.group(1)) <= level:
                    break
                out.append(nxt)
            return "\n".join(out)
    return None


# -- check 1: logitd's flags --------------------------------------------------------------------


def parse_logitd_help(text):
    """Flag names of `logitd --help`, in the order printed."""
    return HELP_FLAG.findall(text)


def flags_in_cell(cell):
    """Flag names written as `--NAME` (possibly `--NAME=VALUE`) in a table cell."""
    return re.findall(r"`--([a-z0-9_]+)", cell)


def documented_flags(text, heading, where, problems, check):
    """Flags of the first table headed `| flag | default | meaning |` under a heading of text."""
    part = section(text, heading)
    rows = None if part is None else table_after_header(part, ["flag", "default", "meaning"])
    if rows is None:
        problems.add(
            check, "%s: no flag table (a table headed | flag | default | meaning | under '%s')" % (where, heading)
        )
        return set()
    names = set()
    for row in rows:
        if row and row[0].startswith("`--"):
            names.update(flags_in_cell(row[0]))
    if not names:
        problems.add(check, "%s: the flag table has no rows starting with | `--NAME`" % where)
    return names


def check_logitd_flags(help_text, operations_md, readme_md, problems):
    check = "logitd flags"
    flags = parse_logitd_help(help_text)
    if len(flags) < MIN_LOGITD_FLAGS:
        problems.add(
            check,
            "`logitd --help` gave %d flags (lines '  --NAME  (default: ...)'), fewer than %d: "
            "its format changed and this check no longer reads it" % (len(flags), MIN_LOGITD_FLAGS),
        )
        return
    have = set(flags)
    table = documented_flags(operations_md, "## Flags", "docs/OPERATIONS.md", problems, check)
    if table:
        for name in flags:
            if name not in table:
                problems.add(check, "--%s: listed by `logitd --help`, missing from docs/OPERATIONS.md's flag table" % name)
        for name in sorted(table - have):
            problems.add(check, "--%s: in docs/OPERATIONS.md's flag table, but `logitd --help` does not list it" % name)
    readme_table = documented_flags(readme_md, "## Running the server", "README.md", problems, check)
    for name in sorted(readme_table - have):
        problems.add(check, "--%s: in README.md's server flag table, but `logitd --help` does not list it" % name)


# -- check 2: logitctl's commands ----------------------------------------------------------------


def parse_logitctl_commands(usage):
    """Command words of logitctl's usage text: the lines indented by two spaces under 'commands:'."""
    commands, in_commands = [], False
    for line in usage.splitlines():
        if line.strip() == "commands:":
            in_commands = True
            continue
        if not in_commands:
            continue
        if line and not line.startswith(" "):
            break  # the next section ("common flags:")
        m = re.match(r"^  ([a-z][a-z0-9-]*)(\s|$)", line)
        if m and m.group(1) not in commands:
            commands.append(m.group(1))
    return commands


def is_logitctl_word(word):
    """`logitctl`, or a path to it (build/ci/client/logitctl/logitctl), possibly quoted."""
    word = word.strip("\"'")
    return word == "logitctl" or word.endswith("/logitctl")


def logitctl_commands_used(code):
    """(command, the line it is on) for each `logitctl [--flags] COMMAND` in a piece of code.

    Words after the program that start with `-` or `[-` are global flags and
    are skipped; the first other word is the command. A word that is not a
    lowercase command word (a placeholder such as COMMAND, `...`, a pipe) ends
    the search; `a|b|c` is the alternatives a, b and c.
    """
    used = []
    for line in code.splitlines():
        words = line.split()
        for i, word in enumerate(words):
            if not is_logitctl_word(word):
                continue
            for nxt in words[i + 1 :]:
                if nxt.startswith("-") or nxt.startswith("[-"):
                    continue
                alternatives = nxt.rstrip(",.;:)`").split("|")
                if all(re.match(r"^[a-z][a-z0-9_-]*$", a) for a in alternatives):
                    used.extend((a, line.strip()) for a in alternatives)
                break
    return used


def check_logitctl_commands(usage, readme_md, problems):
    check = "logitctl commands"
    commands = parse_logitctl_commands(usage)
    if len(commands) < MIN_LOGITCTL_COMMANDS:
        problems.add(
            check,
            "`logitctl help` gave %d commands (two-space-indented words under 'commands:'), fewer "
            "than %d: its format changed and this check no longer reads it" % (len(commands), MIN_LOGITCTL_COMMANDS),
        )
        return
    blocks, outside = code_fences(readme_md)
    pieces = blocks + inline_code(outside)
    seen = set()
    for piece in pieces:
        for command, line in logitctl_commands_used(piece):
            if command in commands or (command, line) in seen:
                continue
            seen.add((command, line))
            problems.add(
                check,
                "README.md uses `logitctl %s`, which `logitctl help` does not list (commands: %s), in: %s"
                % (command, ", ".join(commands), line),
            )


# -- check 3: the Python client's API table ---------------------------------------------------------


def _is_property(fn):
    for d in fn.decorator_list:
        if isinstance(d, ast.Name) and d.id in ("property", "cached_property"):
            return True
        if isinstance(d, ast.Attribute) and d.attr in ("setter", "getter", "deleter", "cached_property"):
            return True
    return False


def client_methods(source):
    """{name: ast function} of class Client's public methods, and its __init__ under 'Client'.

    `source` is the text of client.py and of the modules its mixins come
    from, one after the other: a method of a base class that is defined in
    them (the mixins `_VerifyCalls`, `_Spread`) counts as Client's, unless
    Client overrides it. Properties are left out (they are not calls), as
    are names assigned in the class body (aliases).
    """
    classes = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            classes[node.name] = node
    client = classes.get("Client")
    if client is None:
        return None
    methods = {}
    bases = [b.id for b in client.bases if isinstance(b, ast.Name)]
    for cls in [classes[b] for b in reversed(bases) if b in classes] + [client]:
        for item in cls.body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if item.name == "__init__":
                if cls is client:
                    methods["Client"] = item
            elif not item.name.startswith("_") and not _is_property(item):
                methods[item.name] = item
    return methods


def code_params(fn):
    """[(name, default source or None)] of a function, without self; *args as '*args'."""
    a = fn.args
    positional = list(a.posonlyargs) + list(a.args)
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [(p.arg, d) for p, d in zip(positional, defaults)]
    if params and params[0][0] in ("self", "cls"):
        params = params[1:]
    if a.vararg is not None:
        params.append(("*" + a.vararg.arg, None))
    params += [(p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg is not None:
        params.append(("**" + a.kwarg.arg, None))
    return [(name, None if d is None else ast.unparse(d)) for name, d in params]


def split_params(text):
    """The comma-separated parameters of a signature's parentheses, commas in brackets or strings kept."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def doc_params(signature):
    """[(name, default text or None)] of a documented signature's parameter list."""
    params = []
    for part in split_params(signature):
        name, eq, default = part.partition("=")
        if name.strip() == "*":
            continue  # keyword-only from here: a signature's marker, not a parameter
        params.append((name.strip(), default.strip() if eq else None))
    return params


def same_default(code_default, doc_default):
    if code_default is None or doc_default is None:
        return code_default == doc_default
    try:
        return ast.dump(ast.parse(code_default, mode="eval")) == ast.dump(ast.parse(doc_default, mode="eval"))
    except SyntaxError:
        return False


def documented_signatures(readme_md):
    """{name: parameter text} from the API table (| call | returns |): first cells `NAME(...)`."""
    rows = table_after_header(readme_md, ["call", "returns"])
    if rows is None:
        return None
    found = {}
    for row in rows:
        if not row:
            continue
        m = re.match(r"^`([A-Za-z_][A-Za-z0-9_.]*)\((.*)\)`", row[0])
        if m:
            found[m.group(1)] = m.group(2)
    return found


def compare_signature(name, fn, doc, problems, check):
    shown = "Client(...)" if name == "Client" else "Client.%s" % name
    want, got = code_params(fn), doc_params(doc)
    want_names, got_names = [n for n, _ in want], [n for n, _ in got]
    if want_names != got_names:
        problems.add(
            check,
            "%s: client/python/README.md gives the parameters (%s), client.py has (%s)"
            % (shown, ", ".join(got_names), ", ".join(want_names)),
        )
        return
    for (pname, want_default), (_, got_default) in zip(want, got):
        if not same_default(want_default, got_default):
            problems.add(
                check,
                "%s: parameter %s: client/python/README.md gives %s, client.py has %s"
                % (
                    shown,
                    pname,
                    "no default" if got_default is None else "default " + got_default,
                    "no default" if want_default is None else "default " + want_default,
                ),
            )


def check_python_api(client_source, readme_md, problems):
    check = "python API"
    methods = client_methods(client_source)
    if methods is None:
        problems.add(check, "client/python/src/logitd/client.py: no class Client")
        return
    if len(methods) < 5:
        problems.add(check, "client.py: only %d public methods found in class Client: the parse broke" % len(methods))
        return
    documented = documented_signatures(readme_md)
    if documented is None:
        problems.add(check, "client/python/README.md: no API table (a table headed | call | returns |)")
        return
    for name, fn in methods.items():
        if name not in documented:
            shown = "Client(...)" if name == "Client" else "Client.%s()" % name
            problems.add(
                check,
                "%s: no row `%s(...)` in the API table of client/python/README.md" % (shown, name),
            )
            continue
        compare_signature(name, fn, documented[name], problems, check)


# -- running the binaries ---------------------------------------------------------------------------


def run_for_text(argv):
    """stdout of a command that should exit 0; exits 2 naming it when it cannot run or fails."""
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        fail("cannot run %s: %s" % (" ".join(argv), e))
    if p.returncode != 0:
        fail("%s exited %d (expected 0); stderr:\n%s" % (" ".join(argv), p.returncode, p.stderr.strip()))
    return p.stdout


def fail(message):
    """Ends the run with status 2: the check could not be made."""
    print("check_docs: " + message, file=sys.stderr)
    sys.exit(2)


def read(root, path):
    try:
        with open(os.path.join(root, path), encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        fail("cannot read %s: %s" % (path, e.strerror))


# -- a check of the parsers on fixed texts (--self-test) -----------------------------------------------

SAMPLE_HELP = """logitd: Serves the language-model head's GEMMs over gRPC.
Usage: logitd [--address=HOST:PORT] [flags]

Network:
  --address  (default: 127.0.0.1:50051)
      HOST:PORT to listen on. PORT 0 picks a free port (see --port_file).
  --port_file  (default: none)
      Write the bound port there.

Backend:
  --split_k  (default: fp32)
      off, fp32 or any; mentions --not_a_flag  (default: x) only inside help.

--version prints the version and build; --helpfull lists every flag, the libraries' included.
"""

SAMPLE_USAGE = """logitctl: command-line client

usage: logitctl [common flags] COMMAND [args] [flags]

commands:
  info [--json]                      server info
  weights register FILE --tensor=NAME
                                     upload
  weights list                       list
  cross-entropy --x=FILE
  help                               this text

common flags:
  --server=HOST:PORT
"""


# A source path in inline code: folders and a file name with a source extension.
SOURCE_PATH = re.compile(r"^[A-Za-z0-9_./-]*/[A-Za-z0-9_.-]+\.(?:cc|h|cu|cuh|py|cmake|sh|proto)$")


def repository_files(root):
    out = []
    for base, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "deps", "out")]
        for f in files:
            out.append(os.path.relpath(os.path.join(base, f), root).replace(os.sep, "/"))
    return out


def check_source_paths(doc, where, files, problems):
    check = "paths"
    _, outside = code_fences(doc)
    for code in inline_code(outside):
        for word in code.split():
            word = word.strip(",;:()")
            if "::" in word or not SOURCE_PATH.match(word):
                continue
            if not any(f == word or f.endswith("/" + word) for f in files):
                problems.add(check, "%s names `%s`, which is no file of the repository" % (where, word))


def self_test():
    assert parse_logitd_help(SAMPLE_HELP) == ["address", "port_file", "split_k"], parse_logitd_help(SAMPLE_HELP)
    assert parse_logitctl_commands(SAMPLE_USAGE) == ["info", "weights", "cross-entropy", "help"]
    used = logitctl_commands_used(
        "logitctl --server=a:1 --lb=round_robin info  # both\n"
        "build/demo/client/logitctl/logitctl --server=HOST:PORT validate --baseline=g.json\n"
        "logitctl [common flags] COMMAND [args]\n"
        "cd client/logitctl/ && ls\n"
        "logitctl logits|cast|cross-entropy --shm\n"
        '"$bin/client/logitctl/logitctl" weights register m.safetensors'
    )
    assert [c for c, _ in used] == ["info", "validate", "logits", "cast", "cross-entropy", "weights"], used
    p = Problems()
    check_source_paths("see `call/verify.cc` and `gone/file.h`, `Backend::Run`, `a.h`", "DOC",
                       ["server/service/call/verify.cc", "core/a.h"], p)
    assert [m for _, m in p.items] == ["DOC names `gone/file.h`, which is no file of the repository"], p.items
    assert split_row("| `--a`, `--b` | `x|y` | z |") == ["`--a`, `--b`", "`x|y`", "z"]
    assert flags_in_cell("`--tls_cert`, `--tls_key`") == ["tls_cert", "tls_key"]
    blocks, outside = code_fences("a `logitctl info` b `logitctl\nvalidate [--x]`\n```sh\nlogitctl grad fetch\n```\nc")
    assert blocks == ["logitctl grad fetch"], blocks
    assert inline_code(outside) == ["logitctl info", "logitctl validate [--x]"], inline_code(outside)
    doc = "# T\n## A\na\n### A1\nb\n## B\nc\n"
    assert section(doc, "## A") == "a\n### A1\nb" and section(doc, "## C") is None
    ops = "## Flags\n| flag | default | meaning |\n|---|---|---|\n| `--address` | x | y |\n| `--gone` | x | y |\n"
    p = Problems()
    check_logitd_flags(SAMPLE_HELP.replace("  --address", "\n".join("  --f%d  (default: 0)" % i for i in range(20))
                                           + "\n  --address"), ops, "", p)
    messages = [m for _, m in p.items]
    assert any(m.startswith("--f0: listed by") for m in messages), messages
    assert any(m.startswith("--gone: in docs/OPERATIONS.md") for m in messages), messages
    assert any("README.md: no flag table" in m for m in messages), messages
    assert not any(m.startswith("--address") for m in messages), messages
    src = (
        "class Client:\n"
        "    def __init__(self, address, timeout=600, chunk_bytes=DEFAULT, *, lb='pick_first'): pass\n"
        "    def logits(self, x, out_dtype='fp32'): pass\n"
        "    alias = logits\n"
        "    def _private(self): pass\n"
        "    @property\n"
        "    def state(self): pass\n"
    )
    methods = client_methods(src)
    assert sorted(methods) == ["Client", "logits"], sorted(methods)
    assert code_params(methods["Client"]) == [
        ("address", None), ("timeout", "600"), ("chunk_bytes", "DEFAULT"), ("lb", "'pick_first'")
    ]
    table = (
        "| call | returns |\n|---|---|\n"
        '| `Client(address, timeout=600, chunk_bytes=DEFAULT, lb="pick_first")` | a client |\n'
        '| `logits(x, out_dtype="fp16")` | Y |\n'
    )
    p = Problems()
    check_python_api(src.replace("def logits", "def info(self): pass\n    def a(self): pass\n"
                                 "    def b(self): pass\n    def c(self): pass\n    def logits"), table, p)
    messages = [m for _, m in p.items]
    assert any("Client.logits: parameter out_dtype" in m for m in messages), messages
    assert any("Client.info()" in m for m in messages), messages
    assert not any("Client(...)" in m for m in messages), messages
    p = Problems()
    check_logitd_flags(SAMPLE_HELP, "## Flags\n| flag | default | meaning |\n|---|---|---|\n| `--address` | x | y |\n", "", p)
    assert [m for _, m in p.items][:1] and "fewer than" in p.items[0][1], p.items
    print("check_docs: self-test passed")


def main():
    ap = argparse.ArgumentParser(description="Checks the documents against the binaries and sources they describe.")
    ap.add_argument("--logitd", help="the logitd binary")
    ap.add_argument("--logitctl", help="the logitctl binary")
    ap.add_argument("--root", help="the repository's root")
    # For checking the parsers by hand: `logitd --help`'s text from a file instead of the binary.
    ap.add_argument("--logitd-help-text", help=argparse.SUPPRESS)
    ap.add_argument("--self-test", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return 0
    if not args.root or not (args.logitd or args.logitd_help_text) or not args.logitctl:
        ap.error("--logitd, --logitctl and --root are required")

    if args.logitd_help_text:
        help_text = read(".", args.logitd_help_text)
    else:
        help_text = run_for_text([args.logitd, "--help"])
    usage = run_for_text([args.logitctl, "help"])
    readme = read(args.root, "README.md")
    operations = read(args.root, os.path.join("docs", "OPERATIONS.md"))
    package = os.path.join("client", "python", "src", "logitd")
    client_py = "\n".join(read(args.root, os.path.join(package, f))
                          for f in ("client.py", "_verify_calls.py", "_spread.py", "_transport.py"))
    python_readme = read(args.root, os.path.join("client", "python", "README.md"))

    problems = Problems()
    check_logitd_flags(help_text, operations, readme, problems)
    check_logitctl_commands(usage, readme, problems)
    check_python_api(client_py, python_readme, problems)
    check_source_paths(read(args.root, os.path.join("docs", "ARCHITECTURE.md")), "docs/ARCHITECTURE.md",
                       repository_files(args.root), problems)

    if problems.items:
        print("check_docs: %d problem(s) where the documents and the code disagree:" % len(problems.items))
        for check, message in problems.items:
            print("  [%s] %s" % (check, message))
        return 1
    print("check_docs: the documents agree with logitd, logitctl and the Python client")
    return 0


if __name__ == "__main__":
    sys.exit(main())
