"""A logitd binary started for a pytest session and stopped at its end.

Used by this directory's conftest.py and by the wire-protocol conformance
suite (tests/conformance/conftest.py), which loads this file by its path. It
lives here so that the sdist, which carries these tests, keeps it; it imports
nothing of logitd, since the conformance suite does not install the client.
"""

import signal
import subprocess
import time

import pytest

START_TIMEOUT_S = 60


def _tail(log_path):
    try:
        return log_path.read_text(errors="replace")[-4000:]
    except OSError:
        return ""


class ServerProcess:
    """A server `start` started: its HOST:PORT, and its log for failure messages."""

    def __init__(self, proc, log, log_path, address):
        self.address = address
        self._proc = proc
        self._log = log
        self._log_path = log_path

    def log_text(self):
        """What the server has logged so far (warnings and errors: it runs with
        --log_level=warning)."""
        return self._log_path.read_text(errors="replace")

    def stop(self, timeout_s):
        """Sends SIGTERM; fails the test unless the server exits with status 0 within timeout_s."""
        self._proc.send_signal(signal.SIGTERM)
        try:
            rc = self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            self._log.close()
            pytest.fail("logitd did not stop within %d s of SIGTERM:\n%s" % (timeout_s, _tail(self._log_path)))
        self._log.close()
        assert rc == 0, "logitd exited with status %d after SIGTERM:\n%s" % (rc, _tail(self._log_path))


def start(binary, tmp, flags):
    """Starts `binary --backend=cpu` on a free loopback port with `flags` added, its log in `tmp`.

    Returns once the server has written its port (it serves from then on);
    fails the test when it exits first or takes longer than START_TIMEOUT_S.
    """
    port_file = tmp / "port"
    log_path = tmp / "logitd.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [
            binary,
            "--backend=cpu",
            "--address=127.0.0.1:0",
            "--port_file=%s" % port_file,
            "--log_level=warning",
        ]
        # A test that names no history keeps one in its own folder, not in the
        # machine's state directory (--history=auto).
        + ([] if any(f.startswith("--history=") for f in flags) else ["--history=%s" % (tmp / "history.sqlite3")])
        + list(flags),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.close()
            pytest.fail("%s exited with status %d before serving:\n%s" % (binary, proc.returncode, _tail(log_path)))
        try:
            text = port_file.read_text()
        except FileNotFoundError:
            text = ""
        if text.endswith("\n") and text.strip().isdigit():
            return ServerProcess(proc, log, log_path, "127.0.0.1:%d" % int(text))
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    log.close()
    pytest.fail("%s did not write %s within %d s:\n%s" % (binary, port_file, START_TIMEOUT_S, _tail(log_path)))
