"""lb_policy="round_robin" over three real servers, counted by each server's metrics."""

import os
import re
import signal
import socket
import subprocess
import time

import ml_dtypes
import numpy as np
import pytest

import logitd

pytestmark = pytest.mark.needs_server


def _wait_for(path, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("logitd exited with status %d before serving" % proc.returncode)
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = ""
        if text.endswith("\n") and text.strip().isdigit():
            return int(text)
        time.sleep(0.05)
    pytest.fail("logitd did not write %s within %d s" % (path, timeout))


def _scrape(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200"), head
    assert "text/plain; version=0.0.4" in head, head
    return body


def _casts(body):
    m = re.search(r'^logitd_requests_total\{code="OK",rpc="Cast"\} (\S+)$', body, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture
def servers(tmp_path):
    """Three cpu-backend servers with metrics; yields [(proc, grpc_port, metrics_port)]."""
    binary = os.environ["LOGITD_BIN"]
    out = []
    try:
        for i in range(3):
            port_file, metrics_file = tmp_path / ("port%d" % i), tmp_path / ("metrics%d" % i)
            proc = subprocess.Popen(
                [
                    binary,
                    "--backend=cpu",
                    "--cpu_threads=1",
                    "--address=127.0.0.1:0",
                    "--port_file=%s" % port_file,
                    "--metrics_address=127.0.0.1:0",
                    "--metrics_port_file=%s" % metrics_file,
                    "--log_level=warning",
                    "--history=%s" % (tmp_path / ("history%d.sqlite3" % i)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
            )
            out.append([proc, None, None])
            out[-1][1] = _wait_for(port_file, proc)
            out[-1][2] = int(metrics_file.read_text())
        yield out
    finally:
        for proc, _, _ in out:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _, _ in out:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _cast_is_exact(client, seed):
    x = np.random.default_rng(seed).integers(-8, 9, size=(3, 5)).astype(np.float32)
    y = client.cast_to_bf16(x)
    np.testing.assert_array_equal(np.asarray(y).view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_round_robin_reaches_every_server_and_survives_one_going(servers):
    target = "ipv4:" + ",".join("127.0.0.1:%d" % p for _, p, _ in servers)
    # A call picked for a server in the instant between its death and the
    # channel seeing its connection go fails with UNAVAILABLE (the request may
    # already be on the dead socket); a round-robin user retries it, and the
    # retry goes to a live server.
    retry = logitd.RetryPolicy(initial_backoff=0.01)
    with logitd.Client(target, timeout=30, lb_policy="round_robin", retry=retry) as c:
        # round_robin spreads calls over the connections that are ready; on a
        # loaded machine one may take a while, so calls go on until every
        # server has served one (each call lands on exactly one server).
        made = 0
        counts = [0, 0, 0]
        while not all(n > 0 for n in counts) and made < 300:
            _cast_is_exact(c, made)
            made += 1
            counts = [_casts(_scrape(m)) for _, _, m in servers]
        assert all(n > 0 for n in counts), counts
        assert sum(counts) == made
        # Once all are ready, 30 calls take turns (10 each while all stay ready).
        for i in range(30):
            _cast_is_exact(c, 1000 + i)
        before = counts
        counts = [_casts(_scrape(m)) for _, _, m in servers]
        spread = [n - b for n, b in zip(counts, before)]
        assert sum(spread) == 30 and min(spread) >= 5, (before, counts)
        assert c.retries == 0, "retries while all three served"

        servers[1][0].kill()
        servers[1][0].wait()
        for i in range(20):
            _cast_is_exact(c, 100 + i)
        # Only the calls caught in that instant were retried, not one call in three.
        assert c.retries <= 2, c.retries
        after = [_casts(_scrape(servers[i][2])) for i in (0, 2)]
        assert sum(after) - counts[0] - counts[2] == 20, (counts, after)
