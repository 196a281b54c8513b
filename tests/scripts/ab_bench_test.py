#!/usr/bin/env python3
"""scripts/ab-bench.py against the real logitd and logitctl, on the cpu backend.

    ab_bench_test.py LOGITD LOGITCTL ROOT

The same logitd as both builds, two rounds of two small shapes: every run is
in ab.tsv, each shape's row of the table has both builds' runs and a ratio; a
build that does not start fails the script with its name; the Mann-Whitney z
is right on samples worked by hand.
"""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile


def main(logitd, logitctl, root):
    script = os.path.join(root, "scripts", "ab-bench.py")
    spec = importlib.util.spec_from_file_location("ab_bench", script)
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    # Apart completely, 3 against 3: U = 9, mean 4.5, sd sqrt(9 * 7 / 12).
    z = ab.mann_whitney_z([5, 6, 7], [1, 2, 3])
    assert abs(z - 4.5 / (63 / 12) ** 0.5) < 1e-12, z
    assert ab.mann_whitney_z([1, 2, 3], [1, 2, 3]) == 0.0
    assert ab.mann_whitney_z([1, 2, 3], [5, 6, 7]) == -z

    out = tempfile.mkdtemp(prefix="ab-bench-test-")
    common = [sys.executable, script, "--logitctl=" + logitctl, "--backend=cpu", "--rounds=2",
              "--seconds=0.2", "--warmup=2", "--k=32", "--v=512", "--shapes=logits:4 cross-entropy:3"]
    run = subprocess.run(common + ["--new=" + logitd, "--old=" + logitd, "--out=" + out],
                         capture_output=True, text=True, timeout=600)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.returncode
    lines = open(os.path.join(out, "ab.tsv")).read().splitlines()
    assert len(lines) == 1 + 2 * 2 * 2, lines
    assert [l.split("\t")[1] for l in lines[1:]] == ["new"] * 2 + ["old"] * 4 + ["new"] * 2, lines
    for rpc, m in (("logits", 4), ("cross-entropy", 3)):
        row = re.search(r"^\| %s \| %d \| 2/2 \| ([\d.]+) .* \| ([\d.]+) \| [\d.]+ / [\d.]+ \| -?[\d.]+ \|$"
                        % (rpc, m), run.stdout, re.M)
        assert row and float(row.group(1)) > 0 and float(row.group(2)) > 0, (rpc, run.stdout)
    assert open(os.path.join(out, "summary.md")).read().strip() == run.stdout.strip()

    bad = subprocess.run(common + ["--new=" + logitd, "--old=/bin/false", "--rounds=1"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "the old logitd (/bin/false) did not start" in bad.stderr, bad
    bad = subprocess.run(common + ["--new=" + logitd, "--old=" + logitd, "--shapes=logits"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "expected RPC:M items" in bad.stderr, bad
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: ab_bench_test.py LOGITD LOGITCTL ROOT")
    sys.exit(main(*sys.argv[1:]))
