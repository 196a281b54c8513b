#!/usr/bin/env python3
"""Headless check of a `logitctl validate --report=DIR` page against its JSON.

    usage: scripts/check-report.py DIR/index.html REPORT.json

Opens the page the way a browser's parser would (html.parser, every tag
balanced), parses the document after the doctype as XML (so each inline SVG is
well formed), refuses any <script> or network reference, and checks that the
page's case rows agree with the JSON report (one row per case, with the
JSON's verdict) and, for a --compare run, that the verdict and every output
compared are on it. Prints what it found, one line per plot; exit 1
on any problem.
"""
import html
import html.parser
import json
import re
import sys
import xml.etree.ElementTree as ET

VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr"}


class Balance(html.parser.HTMLParser):
    """Every non-void element closed in order; collects text per element."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.problems, self.scripts = [], [], 0

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts += 1
        for name, value in attrs:
            if value and re.match(r"\s*(https?:)?//", value) and name in ("src", "href"):
                self.problems.append(f"<{tag} {name}={value!r}> reaches the network")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        self.stack.pop()


def text(e):
    return "".join(e.itertext()).strip()


def main(page_path, json_path):
    page = open(page_path, encoding="utf-8").read()
    report = json.load(open(json_path, encoding="utf-8"))
    problems = []

    parser = Balance()
    parser.feed(page)
    parser.close()
    problems += parser.problems
    if parser.stack:
        problems.append(f"unclosed at the end: {parser.stack}")
    if parser.scripts:
        problems.append(f"{parser.scripts} <script> element(s)")

    body = re.sub(r"^<!DOCTYPE[^>]*>", "", page.lstrip(), flags=re.I)
    try:
        root = ET.fromstring(body)
    except ET.ParseError as e:
        problems.append(f"not well-formed XML: {e}")
        root = None

    if root is not None:
        ns = "{http://www.w3.org/2000/svg}"
        svgs = [e for e in root.iter() if e.tag in ("svg", ns + "svg")]
        print(f"page: {len(page)} bytes, {len(svgs)} inline SVG plots")
        for svg in svgs:
            title = next((text(e) for e in svg.iter() if e.tag in ("title", ns + "title")), "")
            marks = sum(1 for e in svg.iter() if e.tag.replace(ns, "") in
                        ("circle", "rect", "path", "polyline", "line"))
            print(f"  plot: {title or '(untitled)'}: {marks} marks")
            if marks == 0:
                problems.append(f"plot '{title}' draws nothing")
        # Every case of the JSON is a row of the page's case table with its verdict.
        # Its first cell is "suite/case", its second the verdict's badge.
        rows = {}
        for tr in root.iter("tr"):
            cells = [text(td) for td in tr if td.tag in ("td", "th")]
            if len(cells) >= 2 and "/" in cells[0]:
                rows[cells[0]] = cells[1].lower()
        badge = {"passed": "pass", "failed": "fail", "not run": "skip"}
        for case in report["cases"]:
            key = f"{case['suite']}/{case['case']}"
            want = badge.get(case["verdict"].lower(), case["verdict"].lower())
            if key not in rows:
                problems.append(f"case {key} is not on the page")
            elif not rows[key].startswith(want):
                problems.append(f"case {key}: page says {rows[key]!r}, JSON {case['verdict']!r}")
        print(f"cases: {len(report['cases'])} in the JSON, all on the page with their verdicts"
              if not any(p.startswith("case") for p in problems) else "cases: mismatches")
    # With --compare: the verdict, the count of bitwise-equal outputs, every
    # output that differs and every case's bound fractions are on the page.
    if "compare" in report:
        c = report["compare"]
        plain = html.unescape(page)
        differ = [o["output"] for o in c["outputs"] if o["equal_fraction"] != 1]
        line = f"{c['verdict']}: {len(c['outputs']) - len(differ)} of {len(c['outputs'])} outputs"
        if line not in plain:
            problems.append(f"compare line {line!r} is not on the page")
        missing = [o for o in differ if o not in plain]
        missing += [b["case"] for b in c["cases"] if max(b["a_worst_bound_fraction"],
                    b["b_worst_bound_fraction"]) >= 0 and b["case"] not in plain]
        if missing:
            problems.append(f"{len(missing)} compare rows are not on the page, e.g. {missing[0]!r}")
        print(f"compare: {line} bitwise equal; {len(differ)} differing outputs on the page")
    for p in problems:
        print("PROBLEM:", html.unescape(p))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
