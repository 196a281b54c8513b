#!/usr/bin/env python3
"""Issue 32's targets read off one rpc step's JSON files (rpc_NAME.json in OUT_DIR).

    python3 scripts/gpu-check/rpc_targets.py OUT_DIR

Every figure is against the Probe, or the kernel, of the same run: the Probe's
phase of the same bench run, and the kernel's time a call is the server's
compute of the whole (unpipelined) LogProbs call. Rows whose files are missing
are left out; the exit status is 0 either way (it reports, it does not judge).
"""

import json
import os
import sys


def phases(out, name):
    """rpc_NAME.json's phases by rpc, or None when the run did not leave it."""
    path = os.path.join(out, "rpc_%s.json" % name)
    try:
        with open(path) as f:
            return {p["rpc"]: p for p in json.load(f)["phases"]}
    except (OSError, ValueError, KeyError):
        return None


def rate(out, name, rpc):
    p = phases(out, name)
    return None if p is None or rpc not in p else p[rpc]["requests_per_s"]


def against_probe(out, name):
    """A Logits row's calls/s over its Probe's, both from the same bench run."""
    p = phases(out, name)
    if p is None or "logits" not in p or "baseline" not in p or not p["baseline"]["requests_per_s"]:
        return None
    return p["logits"]["requests_per_s"] / p["baseline"]["requests_per_s"]


def mark(value, target):
    return "met" if value is not None and value >= target else "not met"


def main(out):
    lines = []

    def row(what, value, target, fmt):
        if value is None:
            return
        lines.append("  %-72s %6s   target %s: %s" % (what, fmt % value, fmt % target, mark(value, target)))

    # LogProbs 8192x4096x128256, one client, against the kernel's own rate:
    # the whole call's compute; without that row (RPC_BENCH_SET=in_place), the
    # least compute of the one-connection rows (a part over several
    # connections computes only its rows).
    lp_rows = ["lp_m8192_c1_whole", "lp_m8192_c1", "lp_m8192_c1_shm", "lp_m8192_c1_shm_in_place",
               "lp_m8192_c1_shm_in_place_digest_once"]
    computes = {}
    for name in lp_rows:
        p = phases(out, name)
        us = None if p is None or "logprobs" not in p else (p["logprobs"].get("server_avg") or {}).get("compute_us")
        if us:
            computes[name] = us
    kernel_us = computes.get("lp_m8192_c1_whole") or (min(computes.values()) if computes else None)
    if kernel_us:
        kernel_rate = 1e6 / kernel_us
        lines.append("  LogProbs M=8192, one client: kernel alone %.1f ms a call (%.1f calls/s)"
                     % (kernel_us / 1e3, kernel_rate))
        for name, what, target in [
            ("lp_m8192_c1", "gRPC, row blocks", 0.60),
            ("lp_m8192_c1_whole", "gRPC, whole call", 0.60),
            ("lp_m8192_c1_connections_2", "gRPC, 2 connections", 0.60),
            ("lp_m8192_c1_connections_4", "gRPC, 4 connections", 0.60),
            ("lp_m8192_c1_connections_8", "gRPC, 8 connections", 0.60),
            ("lp_m8192_c1_shm", "X in shared memory, copied", 0.85),
            ("lp_m8192_c1_shm_in_place", "X in shared memory, read in place", 0.85),
            ("lp_m8192_c1_shm_in_place_digest_once", "X in shared memory, in place, hashed once", 0.85),
        ]:
            r = rate(out, name, "logprobs")
            row("LogProbs M=8192, " + what + ", of the kernel's rate", None if r is None else r / kernel_rate,
                target, "%.2f")
    for name, what in [
        ("m8192_grpc", "Logits M=8192, 1 client, row blocks"),
        ("m8192_grpc_whole", "Logits M=8192, 1 client, whole call"),
    ]:
        row(what + ", of the Probe", against_probe(out, name), 0.9, "%.2f")
    for name, what in [
        ("m1024_c1", "Logits M=1024, 1 client, row blocks"),
        ("m1024_c1_whole", "Logits M=1024, 1 client, whole call"),
        ("m1024_c4", "Logits M=1024, 4 clients, row blocks"),
        ("m1024_c4_whole", "Logits M=1024, 4 clients, whole call"),
        ("m1024_c16", "Logits M=1024, 16 clients, row blocks"),
        ("m1024_c16_whole", "Logits M=1024, 16 clients, whole call"),
    ]:
        row(what + ", of the Probe", against_probe(out, name), 0.85, "%.2f")
    one = rate(out, "m8192_grpc", "logits")
    for n in (2, 4, 8):
        r = rate(out, "m8192_grpc_connections_%d" % n, "logits")
        if one and r is not None:
            row("1 GiB Logits over %d connections, times one" % n, r / one, 2.0, "%.2f")
    if not lines:
        print("rpc targets: no rpc_*.json of the rows they need in %s" % out)
        return 0
    print("rpc targets (issue 32), each against the Probe or kernel of this run:")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: rpc_targets.py OUT_DIR")
    sys.exit(main(sys.argv[1]))
