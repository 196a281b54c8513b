"""Fixtures: a real logitd server (cpu backend), a client, per-test weights.

The server binary comes from $LOGITD_BIN. Modules marked needs_server are
skipped, with the reason, when it is unset or not an executable file.
"""

import os

import pytest
import server_process

import logitd

# Chunk size the test server streams responses with: the smallest it accepts,
# so that moderately sized results already arrive in several chunks.
SERVER_CHUNK_BYTES = 64 << 10


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
def started_server(tmp_path_factory):
    """Starts `logitd --backend=cpu` on a free loopback port; yields its ServerProcess; stops it with SIGTERM."""
    binary, reason = _binary()
    if binary is None:
        pytest.skip(reason)
    started = server_process.start(binary, tmp_path_factory.mktemp("logitd"), ["--chunk_bytes=%d" % SERVER_CHUNK_BYTES])
    yield started
    started.stop(timeout_s=40)


@pytest.fixture(scope="session")
def server(started_server):
    """The address of the session's server."""
    return started_server.address


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
