"""Bearer tokens, tenants and TLS against real logitd servers (cpu backend).

Each test starts its own server with the flags it needs. TLS certificates are
made with the openssl command-line tool; those tests are skipped without it.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from reference import int_tensor, to_bf16

import logitd

pytestmark = pytest.mark.needs_server

START_TIMEOUT_S = 60

TOKENS = """\
# tokens of the test server
tok-a team-a
tok-b team-b
tok-small small 4096
"""


@contextlib.contextmanager
def running_server(tmp_path, *args):
    """Starts `logitd --backend=cpu ARGS` on a free loopback port; yields (address, log path, pid)."""
    binary = os.environ.get("LOGITD_BIN", "")
    if not (binary and os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.skip("LOGITD_BIN is not set to a logitd binary")
    port_file = tmp_path / ("port-%d" % time.monotonic_ns())
    log_path = tmp_path / ("logitd-%d.log" % time.monotonic_ns())
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                "--backend=cpu",
                "--address=127.0.0.1:0",
                "--port_file=%s" % port_file,
                "--history=%s" % (tmp_path / ("history-%d.sqlite3" % time.monotonic_ns())),
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            port = None
            while time.monotonic() < deadline and port is None:
                if proc.poll() is not None:
                    pytest.fail("logitd exited with %d:\n%s" % (proc.returncode, log_path.read_text()))
                text = port_file.read_text() if port_file.exists() else ""
                if text.endswith("\n"):
                    port = int(text)
                else:
                    time.sleep(0.05)
            assert port is not None, "logitd did not start:\n" + log_path.read_text()
            yield "127.0.0.1:%d" % port, log_path, proc.pid
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def weight(seed, shape=(32, 32)):
    return to_bf16(int_tensor(np.random.default_rng(seed), shape))


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(TOKENS)
    path.chmod(0o600)
    return path


def test_missing_or_unknown_token_is_unauthenticated(tmp_path, tokens_file):
    with running_server(tmp_path, "--auth_tokens=%s" % tokens_file) as (address, _, _):
        with logitd.Client(address, timeout=30) as anon:
            with pytest.raises(logitd.UnauthenticatedError) as e:
                anon.info()
            assert e.value.code_name == "UNAUTHENTICATED"
            assert "Bearer" in e.value.message
            with pytest.raises(logitd.UnauthenticatedError):
                anon.list_weights()
        with logitd.Client(address, token="tok-wrong", timeout=30) as wrong:
            with pytest.raises(logitd.UnauthenticatedError) as e:
                wrong.register_weights(weight(1))
            assert "not known to this server" in e.value.message
        with logitd.Client(address, token="tok-a", timeout=30) as a:
            assert a.info().backend == "cpu"


def test_tenants_are_isolated_and_quota_enforced(tmp_path, tokens_file):
    with running_server(tmp_path, "--auth_tokens=%s" % tokens_file) as (address, _, _):
        a = logitd.Client(address, token="tok-a", timeout=60)
        b = logitd.Client(address, token="tok-b", timeout=60)
        small = logitd.Client(address, token="tok-small", timeout=60)
        w = weight(2)
        x = to_bf16(int_tensor(np.random.default_rng(3), (4, 32)))
        info = a.register_weights(w, name="a's head")
        with pytest.raises(logitd.NotFoundError):
            b.logits(x, info.handle)
        with pytest.raises(logitd.NotFoundError):
            b.fetch_gradient(info.handle)
        with pytest.raises(logitd.NotFoundError):
            b.release_weights(info.handle, force=True)
        assert [w.handle for w in a.list_weights()] == [info.handle]
        assert b.list_weights() == []
        y = a.logits(x, info.handle)
        assert y.shape == (4, 32)

        small.register_weights(weight(4))  # 2048 bytes
        small.register_weights(weight(5))  # 4096: the quota
        with pytest.raises(logitd.ResourceExhaustedError) as e:
            small.register_weights(weight(6))
        assert "tenant 'small' has a weight quota of 4096 bytes" in e.value.message
        assert small.info().backend == "cpu"  # still serving
        for c in (a, b, small):
            c.close()


def test_sighup_reloads_tokens(tmp_path, tokens_file):
    with running_server(tmp_path, "--auth_tokens=%s" % tokens_file) as (address, log, pid):
        fresh = logitd.Client(address, token="tok-new", timeout=30)
        with pytest.raises(logitd.UnauthenticatedError):
            fresh.info()
        tokens_file.write_text("tok-new team-a\n")
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 20
        while True:
            try:
                fresh.info()
                break
            except logitd.UnauthenticatedError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        with pytest.raises(logitd.UnauthenticatedError):
            logitd.Client(address, token="tok-a", timeout=30).info()
        fresh.close()


# ---------------------------------------------------------------------------
# TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, a client certificate, and another CA's client."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command-line tool is not installed")
    d = tmp_path_factory.mktemp("pki")
    (d / "ca.ext").write_text("basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n")
    (d / "server.ext").write_text(
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    (d / "client.ext").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run("req", "-new", *ec, "-keyout", ca + ".key", "-out", ca + ".csr", "-subj", "/CN=test " + ca)
        run("x509", "-req", "-in", ca + ".csr", "-signkey", ca + ".key", "-out", ca + ".pem", "-days", "2",
            "-extfile", "ca.ext")
    for name, ca, ext in (("server", "ca", "server"), ("client", "ca", "client"),
                          ("other-client", "other-ca", "client")):
        run("req", "-new", *ec, "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name)
        run("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key", "-CAcreateserial",
            "-out", name + ".pem", "-days", "2", "-extfile", ext + ".ext")
    return d


def test_tls_end_to_end_and_plaintext_refused(tmp_path, pki):
    args = ("--tls_cert=%s" % (pki / "server.pem"), "--tls_key=%s" % (pki / "server.key"))
    with running_server(tmp_path, *args) as (address, _, _):
        # Paths as str, as os.PathLike, and PEM contents all work.
        for tls in ({"ca": str(pki / "ca.pem")}, logitd.TLS(root_ca=pki / "ca.pem"),
                    {"root_ca": (pki / "ca.pem").read_bytes()}):
            with logitd.Client(address, tls=tls, timeout=30) as c:
                info = c.register_weights(weight(7))
                assert c.logits(to_bf16(np.ones((1, 32))), info.handle).shape == (1, 32)
                c.release_weights(info.handle)
        with logitd.Client(address, timeout=10) as plain:
            with pytest.raises(logitd.UnavailableError):
                plain.info()
        with logitd.Client(address, tls={"ca": str(pki / "other-ca.pem")}, timeout=10) as wrong_ca:
            with pytest.raises(logitd.UnavailableError):
                wrong_ca.info()


def test_mutual_tls_with_token(tmp_path, pki, tokens_file):
    args = (
        "--tls_cert=%s" % (pki / "server.pem"),
        "--tls_key=%s" % (pki / "server.key"),
        "--tls_client_ca=%s" % (pki / "ca.pem"),
        "--auth_tokens=%s" % tokens_file,
    )
    with running_server(tmp_path, *args) as (address, _, _):
        mine = {"ca": str(pki / "ca.pem"), "cert": str(pki / "client.pem"), "key": str(pki / "client.key")}
        with logitd.Client(address, token="tok-a", tls=mine, timeout=30) as c:
            assert c.list_weights() == []
        with logitd.Client(address, tls=mine, timeout=30) as no_token:
            with pytest.raises(logitd.UnauthenticatedError):
                no_token.info()
        intruder = dict(mine, cert=str(pki / "other-client.pem"), key=str(pki / "other-client.key"))
        with logitd.Client(address, token="tok-a", tls=intruder, timeout=10) as c:
            with pytest.raises(logitd.UnavailableError):
                c.info()
        with logitd.Client(address, token="tok-a", tls={"ca": str(pki / "ca.pem")}, timeout=10) as c:
            with pytest.raises(logitd.UnavailableError):
                c.info()


def test_tls_argument_errors(tmp_path):
    with pytest.raises(logitd.InvalidArgumentError):
        logitd.Client("127.0.0.1:1", tls={"ca": str(tmp_path / "missing.pem")})
    with pytest.raises(logitd.InvalidArgumentError):
        logitd.Client("127.0.0.1:1", tls={"cert": "-----BEGIN CERTIFICATE-----\n"})
    with pytest.raises(logitd.InvalidArgumentError):
        logitd.Client("127.0.0.1:1", tls={"bogus": 1})
