#!/usr/bin/env python3
"""scripts/gpu-check/rpc_targets.py on what logitctl bench really writes.

    rpc_targets_test.py LOGITD LOGITCTL ROOT

Starts `logitd --backend=cpu`, runs small versions of the rpc step's rows
under the names rpc_targets.py reads (the same flags but the shapes), and
checks that every target line comes out with a figure: a change to the bench's
JSON that the script no longer reads fails here, not on a GPU machine.
"""

import os
import re
import subprocess
import sys
import tempfile
import time


def main(logitd, logitctl, root):
    tmp = tempfile.mkdtemp(prefix="rpc-targets-")
    port_file = os.path.join(tmp, "port")
    server = subprocess.Popen(
        [
            logitd,
            "--backend=cpu",
            "--address=127.0.0.1:0",
            "--port_file=" + port_file,
            "--log_level=warning",
            "--history=" + os.path.join(tmp, "history.sqlite3"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.monotonic() > deadline or server.poll() is not None:
                sys.exit("logitd did not start")
            time.sleep(0.1)
        address = "127.0.0.1:" + open(port_file).read().strip()
        lp = ["--rpc=logprobs", "--k=32", "--v=512", "--top_k=2", "--lse", "--baseline=false", "--m=600",
              "--requests=2"]
        logits = ["--rpc=logits", "--k=32", "--v=512", "--requests=2"]
        rows = {
            "lp_m8192_c1": lp,
            "lp_m8192_c1_whole": lp + ["--nopipeline"],
            "lp_m8192_c1_connections_2": lp + ["--connections=2"],
            "m8192_grpc": logits + ["--m=600"],
            "m8192_grpc_whole": logits + ["--m=600", "--nopipeline"],
            "m8192_grpc_connections_2": logits + ["--m=600", "--connections=2", "--baseline=false"],
            "m1024_c1": logits + ["--m=100"],
            "m1024_c4": logits + ["--m=100", "--concurrency=4", "--channels=4"],
        }
        for name, args in rows.items():
            with open(os.path.join(tmp, "rpc_%s.json" % name), "w") as f:
                subprocess.run([logitctl, "--server=" + address, "bench"] + args + ["--json"], stdout=f,
                               stderr=subprocess.DEVNULL, check=True, timeout=120)
    finally:
        server.terminate()
        server.wait(timeout=30)
    script = os.path.join(root, "scripts", "gpu-check", "rpc_targets.py")
    text = subprocess.run([sys.executable, script, tmp], capture_output=True, text=True, check=True).stdout
    print(text)
    wanted = [
        r"kernel alone [\d.]+ ms a call",
        r"gRPC, row blocks, of the kernel's rate +[\d.]+ +target 0\.60: (met|not met)",
        r"gRPC, whole call, of the kernel's rate +[\d.]+ ",
        r"gRPC, 2 connections, of the kernel's rate +[\d.]+ ",
        r"Logits M=8192, 1 client, row blocks, of the Probe +[\d.]+ +target 0\.90",
        r"Logits M=8192, 1 client, whole call, of the Probe +[\d.]+ ",
        r"Logits M=1024, 1 client, row blocks, of the Probe +[\d.]+ +target 0\.85",
        r"Logits M=1024, 4 clients, row blocks, of the Probe +[\d.]+ ",
        r"1 GiB Logits over 2 connections, times one +[\d.]+ +target 2\.00",
    ]
    missing = [w for w in wanted if not re.search(w, text)]
    # Rows it was not given stay out rather than show a made-up figure.
    if "16 clients" in text or "shared memory" in text:
        missing.append("no line for rows without files")
    if missing:
        sys.exit("rpc_targets.py printed no line matching: %s" % "; ".join(missing))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: rpc_targets_test.py LOGITD LOGITCTL ROOT")
    sys.exit(main(*sys.argv[1:]))
