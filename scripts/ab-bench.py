#!/usr/bin/env python3
"""An A/B of two logitd builds at the RPC level: is the new one as fast?

    scripts/ab-bench.py --new=NEW/logitd --old=OLD/logitd --logitctl=logitctl \\
        [--backend=cuda] [--rounds=17] [--seconds=2] [--warmup=20] [--k=4096] [--v=32768] \\
        [--shapes="cross-entropy:16 logprobs:16 cross-entropy:1024 logprobs:1024"] [--out=DIR]

Each round starts a fresh server of each build in turn (the order alternating
by round, so neither build always goes first on a warm machine), runs every
shape against it with the same logitctl (`logitctl bench --rpc=R --m=M --k=K
--v=V --warmup=W --duration=S --nobaseline --json`), and stops it. Then, per
shape: each build's median requests/s and its range, the ratio of the medians
(new/old), the median p50 latency, and the Mann-Whitney z of the two builds'
runs (|z| < 2: the builds' runs are not told apart at about the 5% level).

Writes DIR/ab.tsv (one line per run: round, build, rpc, m, requests/s, p50
ms) and prints the table as Markdown. Exits 1 when a server does not start or
a bench run fails, naming which and what it said. Build the old tree with
scripts/gpu-check/build-tree.sh.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time


def start_server(logitd, backend, tmp, build):
    port_file = os.path.join(tmp, "port-" + build)
    if os.path.exists(port_file):
        os.remove(port_file)
    log = open(os.path.join(tmp, "server-%s.log" % build), "w")
    server = subprocess.Popen(
        [logitd, "--backend=" + backend, "--address=127.0.0.1:0", "--port_file=" + port_file,
         "--history=none"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            server.wait()
            tail = open(log.name).read()[-2000:]
            sys.exit("ab-bench: the %s logitd (%s) did not start:\n%s" % (build, logitd, tail))
        time.sleep(0.05)
    return server, "127.0.0.1:" + open(port_file).read().strip()


def bench(args, address, rpc, m):
    cmd = [args.logitctl, "--server=" + address, "bench", "--rpc=" + rpc, "--m=%d" % m,
           "--k=%d" % args.k, "--v=%d" % args.v, "--warmup=%d" % args.warmup,
           "--duration=%g" % args.seconds, "--nobaseline", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds * 10 + 300)
    if run.returncode != 0:
        sys.exit("ab-bench: %s failed (exit %d):\n%s" % (" ".join(cmd), run.returncode,
                                                         run.stderr[-2000:]))
    phase = json.loads(run.stdout)["phases"][0]
    return phase["requests_per_s"], phase["latency_ms"]["p50"]


def mann_whitney_z(a, b):
    """z of the Mann-Whitney U of a against b (normal approximation, ties half)."""
    u = sum((x > y) + 0.5 * (x == y) for x in a for y in b)
    n1, n2 = len(a), len(b)
    sd = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12.0)
    return (u - n1 * n2 / 2.0) / sd if sd > 0 else 0.0


def summary(runs, shapes):
    lines = ["| call | M | runs | new req/s, median [range] | old req/s, median [range] | "
             "new/old | p50 ms new / old | z |",
             "|---|---|---|---|---|---|---|---|"]
    for rpc, m in shapes:
        new = [r for r in runs if r[1] == "new" and r[2] == rpc and r[3] == m]
        old = [r for r in runs if r[1] == "old" and r[2] == rpc and r[3] == m]
        if not new or not old:
            continue
        nr, orr = [r[4] for r in new], [r[4] for r in old]
        lines.append("| %s | %d | %d/%d | %.1f [%.1f-%.1f] | %.1f [%.1f-%.1f] | %.3f | %.3f / %.3f | %.2f |" % (
            rpc, m, len(nr), len(orr), statistics.median(nr), min(nr), max(nr),
            statistics.median(orr), min(orr), max(orr), statistics.median(nr) / statistics.median(orr),
            statistics.median(r[5] for r in new), statistics.median(r[5] for r in old),
            mann_whitney_z(nr, orr)))
    return "\n".join(lines)


def parse_shapes(text):
    shapes = []
    for item in text.split():
        rpc, _, m = item.partition(":")
        if not rpc or not m.isdigit() or int(m) <= 0:
            sys.exit("ab-bench: --shapes: expected RPC:M items (e.g. logprobs:16), got '%s'" % item)
        shapes.append((rpc, int(m)))
    return shapes


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new", required=True, help="the logitd under test")
    p.add_argument("--old", required=True, help="the logitd to compare against")
    p.add_argument("--logitctl", required=True, help="the one logitctl both are measured with")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--rounds", type=int, default=17)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--v", type=int, default=32768)
    p.add_argument("--shapes", default="cross-entropy:16 logprobs:16 cross-entropy:1024 logprobs:1024")
    p.add_argument("--out", default="")
    args = p.parse_args()
    shapes = parse_shapes(args.shapes)
    if args.rounds < 1 or args.seconds <= 0:
        sys.exit("ab-bench: --rounds must be >= 1 and --seconds > 0")
    for path in (args.new, args.old, args.logitctl):
        if not os.access(path, os.X_OK):
            sys.exit("ab-bench: %s is not an executable file" % path)
    out = args.out or tempfile.mkdtemp(prefix="ab-bench-")
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ab-bench-run-")
    runs = []
    with open(os.path.join(out, "ab.tsv"), "w") as tsv:
        tsv.write("round\tbuild\trpc\tm\trequests_per_s\tp50_ms\n")
        for rnd in range(args.rounds):
            order = ("new", "old") if rnd % 2 == 0 else ("old", "new")
            for build in order:
                server, address = start_server(getattr(args, build), args.backend, tmp, build)
                try:
                    for rpc, m in shapes:
                        rps, p50 = bench(args, address, rpc, m)
                        runs.append((rnd, build, rpc, m, rps, p50))
                        tsv.write("%d\t%s\t%s\t%d\t%.2f\t%.4f\n" % (rnd, build, rpc, m, rps, p50))
                        tsv.flush()
                finally:
                    server.terminate()
                    server.wait(timeout=60)
            print("ab-bench: round %d of %d done" % (rnd + 1, args.rounds), file=sys.stderr)
    table = summary(runs, shapes)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
