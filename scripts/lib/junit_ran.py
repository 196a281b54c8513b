"""Checks a pytest JUnit report: pytest exits 0 when every test was skipped,
so insist that tests ran, and that none was skipped for a reason that means
the suite did not reach what it tests.

    python3 scripts/lib/junit_ran.py TOOL REPORT [FORBIDDEN_SKIP_TEXT]

Exits non-zero with a message naming TOOL; prints the counts otherwise.
"""

import sys
import xml.etree.ElementTree as ET


def main(argv):
    tool, report = argv[1], argv[2]
    forbidden = argv[3] if len(argv) > 3 else None
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = sum(int(s.get("tests", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    if total - skipped <= 0:
        sys.exit("%s: every test was skipped (%d of %d): nothing was checked" % (tool, skipped, total))
    if forbidden:
        bad = [
            sk.get("message", "")
            for case in root.iter("testcase")
            for sk in case.findall("skipped")
            if forbidden in sk.get("message", "")
        ]
        if bad:
            sys.exit("%s: %d tests were skipped: %s" % (tool, len(bad), bad[0]))
    print("%s: %d tests ran, %d skipped" % (tool, total - skipped, skipped))


if __name__ == "__main__":
    main(sys.argv)
