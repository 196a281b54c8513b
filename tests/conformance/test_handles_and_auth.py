"""Weight handles the server does not hold, and bearer-token authentication."""

import grpc
import pytest

from protocol import Connection, expect_error, read_stream, small_calls
from stubs import pb

UNKNOWN = "w-00000000c0ffee00-16x8"


def unknown_handle_calls(conn):
    """Every call that names a weight handle, made with `UNKNOWN`."""
    calls = small_calls(UNKNOWN)
    return {
        "Logits": lambda: calls["Logits"].run(conn, calls["Logits"].messages()),
        "Backward": lambda: calls["Backward"].run(conn, calls["Backward"].messages()),
        "CrossEntropy": lambda: calls["CrossEntropy"].run(conn, calls["CrossEntropy"].messages()),
        "LogProbs": lambda: calls["LogProbs"].run(conn, calls["LogProbs"].messages()),
        "FetchGradient": lambda: conn.fetch_gradient(UNKNOWN),
        "ZeroGradient": lambda: conn.zero_gradient(UNKNOWN),
        "ReleaseWeight": lambda: conn.release(UNKNOWN),
        "ReleaseWeight-force": lambda: conn.release(UNKNOWN, force=True),
    }


@pytest.mark.parametrize("rpc", list(unknown_handle_calls(None)))
def test_unknown_handle_is_not_found(conn, rpc):
    """A handle the server does not hold (released, another tenant's, before a restart) is NOT_FOUND naming it."""
    message = expect_error(grpc.StatusCode.NOT_FOUND, unknown_handle_calls(conn)[rpc])
    assert UNKNOWN in message, message


@pytest.mark.parametrize("rpc", ["Logits", "FetchGradient", "ZeroGradient", "ReleaseWeight"])
def test_empty_handle_is_invalid_argument(conn, rpc):
    """An empty weight handle is INVALID_ARGUMENT naming the field."""
    calls = small_calls("")
    fn = {
        "Logits": lambda: calls["Logits"].run(conn, calls["Logits"].messages()),
        "FetchGradient": lambda: read_stream(conn.stub.FetchGradient(pb.FetchGradientRequest(), **conn.kw())),
        "ZeroGradient": lambda: conn.zero_gradient(""),
        "ReleaseWeight": lambda: conn.release(""),
    }[rpc]
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, fn)
    assert "handle" in message, message


@pytest.fixture
def required_token(token):
    if token is None:
        pytest.skip("no LOGITD_CONFORMANCE_TOKEN: the server under test is used without authentication")
    return token


def test_call_without_token_is_unauthenticated(address, required_token):
    """With --auth_tokens, a call without authorization metadata is UNAUTHENTICATED."""
    anonymous = Connection(address)
    try:
        expect_error(grpc.StatusCode.UNAUTHENTICATED, anonymous.info)
    finally:
        anonymous.close()


def test_call_with_unknown_token_is_unauthenticated(address, required_token):
    """A bearer token the server does not know is UNAUTHENTICATED."""
    stranger = Connection(address, required_token + "-not-a-token")
    try:
        expect_error(grpc.StatusCode.UNAUTHENTICATED, stranger.info)
    finally:
        stranger.close()
