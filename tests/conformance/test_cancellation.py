"""Cancelling a call mid-upload or mid-download returns everything it held.

The server reports the request memory its calls hold (requests_in_flight,
request_bytes_in_flight); after a cancelled call both must come back to 0 and
the server must go on serving. These tests assume that no other client uses
the server while they run.
"""

import time

import grpc
import numpy as np

from protocol import HeldStream, Tensor, check_output, chunks_of
from stubs import pb

IDLE_TIMEOUT_S = 30


def wait_for(conn, predicate, what):
    """Polls GetServerInfo until predicate(info) holds; fails after IDLE_TIMEOUT_S."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        info = conn.info()
        if predicate(info):
            return info
        if time.monotonic() > deadline:
            raise AssertionError(
                "%s not seen within %d s: requests_in_flight=%d request_bytes_in_flight=%d"
                % (what, IDLE_TIMEOUT_S, info.requests_in_flight, info.request_bytes_in_flight)
            )
        time.sleep(0.05)


def idle(info):
    return info.requests_in_flight == 0 and info.request_bytes_in_flight == 0


def check_still_serves(conn, handle, w):
    """A normal Logits call succeeds exactly after the cancellation."""
    x = np.resize(np.arange(-3, 4), (2, w.shape[1]))
    got = conn.logits(handle, x)
    want = (x.astype(np.float64) @ w.T).astype(np.float32)
    np.testing.assert_array_equal(check_output(got, got.result.y, False), want)


def test_cancel_mid_upload_returns_request_memory(conn, weights):
    """A call cancelled after sending part of X holds nothing afterwards."""
    wait_for(conn, idle, "an idle server before the test")
    rng = np.random.default_rng(801)
    k = 2048
    w = rng.integers(-8, 9, size=(8, k))
    info = weights(w)
    x = Tensor("x", pb.DTYPE_BF16, rng.integers(-8, 9, size=(1024, k)))  # 4 MiB in 16 chunks
    parts = chunks_of(x, 256 << 10)
    header = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=info.handle, x=x.spec()))
    held = HeldStream([header] + [pb.LogitsRequest(chunk=c) for c in parts[:4]])
    call = conn.stub.Logits(iter(held), **conn.kw())
    try:
        assert held.sent.wait(IDLE_TIMEOUT_S), "the request messages were not sent"
        admitted = wait_for(conn, lambda i: i.requests_in_flight >= 1, "the call admitted")
        assert admitted.request_bytes_in_flight >= len(x.data) + 1024 * 8 * 4, "X and Y are not reserved"
        call.cancel()
    finally:
        held.release()
    try:
        list(call)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.CANCELLED, e.details()
    else:
        raise AssertionError("the cancelled call succeeded")
    wait_for(conn, idle, "requests_in_flight and request_bytes_in_flight back to 0")
    check_still_serves(conn, info.handle, w)


def test_cancel_mid_download_returns_request_memory(conn, weights, server_info):
    """A call cancelled after receiving some of Y's chunks holds nothing afterwards."""
    wait_for(conn, idle, "an idle server before the test")
    rng = np.random.default_rng(802)
    k, v = 8, 16384
    w = rng.integers(-8, 9, size=(v, k))
    info = weights(w)
    m = (16 * server_info.chunk_bytes) // (4 * v)  # Y of 16 chunks
    x = Tensor("x", pb.DTYPE_BF16, rng.integers(-8, 9, size=(m, k)))
    header = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=info.handle, x=x.spec()))
    call = conn.stub.Logits(iter([header] + [pb.LogitsRequest(chunk=c) for c in chunks_of(x)]), **conn.kw())
    received = []
    for message in call:
        received.append(message.WhichOneof("part"))
        if received.count("chunk") == 2:
            break
    assert received == ["result", "chunk", "chunk"], received
    call.cancel()
    try:
        list(call)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.CANCELLED, e.details()
    wait_for(conn, idle, "requests_in_flight and request_bytes_in_flight back to 0")
    check_still_serves(conn, info.handle, w)
