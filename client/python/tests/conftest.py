"""Fixtures: a real logitd server (cpu backend), a client, per-test weights.

The server binary comes from $LOGITD_BIN. Modules marked needs_server are
skipped, with the reason, when it is unset or not an executable file.
"""

import os
import signal
import subprocess
import time

import pytest

import logitd

# Chunk size the test server streams responses with: the smallest it accepts,
# so that moderately sized results already arrive in several chunks.
SERVER_CHUNK_BYTES = 64 << 10
START_TIMEOUT_S = 60


def _binary():
    path = os.environ.get("LOGITD_BIN", "")
    if not path:
        return None, "LOGITD_BIN is not set: point it at a built logitd server binary to run these tests"
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return None, "LOGITD_BIN=%s is not an executable file" % path
    return path, None


def pytest_collection_modifyitems(config, items):
    _, reason = _binary()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "needs_server" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """Starts `logitd --backend=cpu` on a free loopback port; yields its address; stops it with SIGTERM."""
    binary, reason = _binary()
    if binary is None:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("logitd")
    port_file = tmp / "port"
    log_path = tmp / "logitd.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [
            binary,
            "--backend=cpu",
            "--address=127.0.0.1:0",
            "--port_file=%s" % port_file,
            "--chunk_bytes=%d" % SERVER_CHUNK_BYTES,
            "--log_level=warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )

    def log_tail():
        try:
            return log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    port = None
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.close()
            pytest.fail("logitd exited with status %d before serving:\n%s" % (proc.returncode, log_tail()))
        try:
            text = port_file.read_text()
        except FileNotFoundError:
            text = ""
        if text.endswith("\n") and text.strip().isdigit():
            port = int(text)
            break
        time.sleep(0.05)
    if port is None:
        proc.kill()
        proc.wait()
        log.close()
        pytest.fail("logitd did not write %s within %d s:\n%s" % (port_file, START_TIMEOUT_S, log_tail()))

    yield "127.0.0.1:%d" % port

    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        log.close()
        pytest.fail("logitd did not stop within 40 s of SIGTERM:\n%s" % log_tail())
    log.close()
    assert rc == 0, "logitd exited with status %d after SIGTERM:\n%s" % (rc, log_tail())


@pytest.fixture
def client(server):
    with logitd.Client(server, timeout=120) as c:
        yield c


@pytest.fixture
def weights(client):
    """Registers weights for one test and releases them afterwards (all registrations)."""
    handles = []

    def register(w, name="test"):
        info = client.register_weights(w, name=name)
        handles.append(info.handle)
        return info

    yield register
    for h in set(handles):
        try:
            client.release_weights(h, force=True)
        except logitd.NotFoundError:
            pass
