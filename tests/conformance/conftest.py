"""Fixtures of the logitd wire-protocol conformance suite.

The server under test is, in this order of preference:

- `--server HOST:PORT` (a pytest option), or $LOGITD_CONFORMANCE_SERVER: a
  running server, used as it is;
- $LOGITD_BIN: a logitd binary the suite starts itself on a free loopback
  port with the cpu backend, a temporary --weights_dir (so that LoadWeight
  can be exercised), a temporary --history file and --allow_shm, and stops
  with SIGTERM at the end.

$LOGITD_CONFORMANCE_TOKEN, when set, is sent as `authorization: Bearer
TOKEN` on every call (for a server started with --auth_tokens).

Tests marked `large` move more than 2 GiB and are deselected unless a `-m`
expression is given (`-m large`, or `-m "large or not large"` for all).
"""

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import grpc
import numpy as np
import pytest

from protocol import SMALL_K, SMALL_V, Connection, small_calls

STOP_TIMEOUT_S = 45


def pytest_addoption(parser):
    group = parser.getgroup("logitd conformance")
    group.addoption(
        "--server",
        metavar="HOST:PORT",
        default=None,
        help="a running logitd server to test (default: $LOGITD_CONFORMANCE_SERVER, " "else start $LOGITD_BIN)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "large: moves more than 2 GiB in one call (several GiB of memory on both ends); "
        "deselected unless -m selects it",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("markexpr"):
        return
    kept, deselected = [], []
    for item in items:
        (deselected if "large" in item.keywords else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@dataclass
class ServerUnderTest:
    address: str
    # The server's --weights_dir when the suite started the server, else None.
    weights_dir: Optional[str]


def _token_flags(tmp):
    """With $LOGITD_CONFORMANCE_TOKEN set, the server the suite starts accepts that token only."""
    token = os.environ.get("LOGITD_CONFORMANCE_TOKEN")
    if not token:
        return []
    tokens = tmp / "tokens"
    tokens.write_text("%s conformance\n" % token)
    return ["--auth_tokens=%s" % tokens]


def _server_process():
    """The server launcher the Python client's tests use too, loaded from its file.

    Loaded only to start a binary: a run against a running server needs
    nothing outside this directory.
    """
    path = Path(__file__).resolve().parents[2] / "client" / "python" / "tests" / "server_process.py"
    spec = importlib.util.spec_from_file_location("logitd_server_process", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def server_under_test(request, tmp_path_factory):
    """The server the suite runs against (see the module docstring)."""
    address = request.config.getoption("--server") or os.environ.get("LOGITD_CONFORMANCE_SERVER")
    if address:
        yield ServerUnderTest(address=address, weights_dir=None)
        return
    binary = os.environ.get("LOGITD_BIN", "")
    if not binary:
        pytest.skip(
            "no server to test: pass --server HOST:PORT, set LOGITD_CONFORMANCE_SERVER, "
            "or set LOGITD_BIN to a logitd binary for the suite to start"
        )
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.fail("LOGITD_BIN=%s is not an executable file" % binary)
    tmp = tmp_path_factory.mktemp("logitd")
    weights_dir = tmp / "weights"
    weights_dir.mkdir()
    flags = ["--weights_dir=%s" % weights_dir, "--allow_shm", "--history=%s" % (tmp / "history.sqlite3")]
    server = _server_process().start(binary, tmp, flags + _token_flags(tmp))
    yield ServerUnderTest(address=server.address, weights_dir=str(weights_dir))
    server.stop(STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def address(server_under_test):
    """HOST:PORT of the server under test."""
    return server_under_test.address


@pytest.fixture(scope="session")
def weights_dir(server_under_test):
    """The server's --weights_dir when the suite started it; LoadWeight tests skip otherwise."""
    if server_under_test.weights_dir is None:
        pytest.skip(
            "LoadWeight reads files from the server's --weights_dir, which the suite can only "
            "write into when it starts the server itself (LOGITD_BIN)"
        )
    return server_under_test.weights_dir


@pytest.fixture(scope="session")
def token():
    """The bearer token from $LOGITD_CONFORMANCE_TOKEN, or None."""
    return os.environ.get("LOGITD_CONFORMANCE_TOKEN") or None


@pytest.fixture(scope="session")
def conn(address, token):
    """A default-options channel to the server under test."""
    c = Connection(address, token)
    yield c
    c.close()


@pytest.fixture(scope="session")
def server_info(conn):
    """GetServerInfo as the session starts: backend, limits, chunk size."""
    return conn.info()


@pytest.fixture
def weights(conn):
    """Registers weights for one test and releases each registration afterwards.

    Call it with weight values [V, K] (and optionally a name); it returns the
    WeightInfo.
    """
    handles = []

    def register(w, name="conformance", **kwargs):
        info = conn.register_weight(w, name=name, **kwargs)
        handles.append(info.handle)
        return info

    yield register
    for handle in handles:
        try:
            conn.release(handle)
        except grpc.RpcError as e:
            # The test released it itself.
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise


@pytest.fixture
def calls(weights):
    """small_calls() against a weight of their shape registered for the test."""
    info = weights(np.random.default_rng(601).integers(-8, 9, size=(SMALL_V, SMALL_K)))
    return small_calls(info.handle)
