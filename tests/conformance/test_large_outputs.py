"""Outputs larger than one message, received through a channel without options.

A client that sets no channel options accepts messages of at most 4 MiB.
Every message the server sends must fit under that, so each response chunk
carries at most ServerInfo.chunk_bytes of data plus its framing, below 4 MiB.
"""

import grpc
import numpy as np
import pytest
import xxhash

from protocol import DEFAULT_RECEIVE_LIMIT, Tensor, check_output, chunks_of, expected_order, read_stream
from stubs import pb


def receive_or_explain(fn, server_info):
    """Runs fn; a RESOURCE_EXHAUSTED from the client's receive limit fails with the reason."""
    try:
        return fn()
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (e.details() or ""):
            pytest.fail(
                "a response message exceeded the %d-byte receive limit of a client without channel "
                "options (%s); the server streams chunks of %d bytes, and each chunk message adds "
                "its framing to that" % (DEFAULT_RECEIVE_LIMIT, e.details(), server_info.chunk_bytes)
            )
        raise


@pytest.mark.parametrize("digest_last", [False, True], ids=["digest-first", "digest-last"])
def test_logits_64_mib_output(conn, weights, server_info, digest_last):
    """A Logits call with a 64 MiB FP32 output completes through a default channel, exactly."""
    rng = np.random.default_rng(901)
    m, v, k = 1024, 16384, 16
    w = rng.integers(-8, 9, size=(v, k))
    x = rng.integers(-8, 9, size=(m, k))
    info = weights(w)
    got = receive_or_explain(lambda: conn.logits(info.handle, x, digest_last=digest_last), server_info)
    assert got.order == expected_order(["y"], digest_last)
    assert list(got.result.y.shape) == [m, v]
    y = check_output(got, got.result.y, digest_last)
    assert y.nbytes == 64 << 20
    np.testing.assert_array_equal(y, (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32))
    assert len(got.chunk_sizes["y"]) >= (64 << 20) // server_info.chunk_bytes


@pytest.mark.large
def test_logits_output_over_2_gib(conn, weights, server_info):
    """A Logits call whose FP32 output exceeds 2 GiB streams it whole and exactly.

    Each chunk is checked against the exact sums as it arrives and the digest
    is computed incrementally, so the client never holds the output.
    """
    m, v, k = 16400, 32768, 16
    y_bytes = m * v * 4
    assert y_bytes > 2 << 30
    x_bytes = m * k * 2
    if server_info.max_request_bytes < x_bytes + y_bytes:
        pytest.skip(
            "the server's max_request_bytes (%d) is below this call's %d bytes"
            % (server_info.max_request_bytes, x_bytes + y_bytes)
        )
    if server_info.request_memory_bytes and server_info.request_memory_bytes < x_bytes + y_bytes:
        pytest.skip(
            "the server's request_memory_bytes (%d) is below this call's %d bytes"
            % (server_info.request_memory_bytes, x_bytes + y_bytes)
        )
    rng = np.random.default_rng(902)
    w = rng.integers(-8, 9, size=(v, k)).astype(np.float64)
    x = rng.integers(-8, 9, size=(m, k)).astype(np.float64)
    info = weights(w)
    xt = Tensor("x", pb.DTYPE_BF16, x)
    header = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=info.handle, x=xt.spec()))
    call = conn.logits_stream([header] + [pb.LogitsRequest(chunk=c) for c in chunks_of(xt, 1 << 20)])
    digest = xxhash.xxh3_64()
    mismatches = []

    def check_chunk(c):
        digest.update(c.data)
        assert len(c.data) % 4 == 0 and c.offset % 4 == 0
        first, count = c.offset // 4, len(c.data) // 4
        r0, r1 = first // v, (first + count - 1) // v + 1
        want = (x[r0:r1] @ w.T).astype(np.float32).ravel()[first - r0 * v : first - r0 * v + count]
        if not np.array_equal(np.frombuffer(c.data, dtype="<f4"), want) and len(mismatches) < 5:
            mismatches.append(c.offset)

    got = receive_or_explain(lambda: read_stream(call, on_chunk=check_chunk), server_info)
    assert got.order == expected_order(["y"], False)
    assert sum(got.chunk_sizes["y"]) == y_bytes
    assert not mismatches, "Y differs from the exact sums in the chunks at offsets %s" % mismatches
    assert got.result.y.xxh3 == digest.intdigest(), "Y's spec digest does not match the bytes"


def _every_call_output(conn, weights, server_info, scale):
    """Backward, FetchGradient, CrossEntropy (dW fp32) and Cast (bf16) outputs of scale * 64 MiB, each received
    whole through a default channel and matching its digest."""
    rng = np.random.default_rng(903 + scale)
    v, k, m = 65536 * scale, 256, 4
    w = rng.integers(-4, 5, size=(v, k), dtype=np.int8)
    x = rng.integers(-4, 5, size=(m, k))
    dy = rng.integers(-4, 5, size=(m, v))
    info = weights(w)
    want = scale * (64 << 20)

    got = receive_or_explain(lambda: conn.backward(info.handle, dy, x, want_dw=True), server_info)
    assert check_output(got, got.result.dw, False).nbytes == want

    receive_or_explain(lambda: conn.backward(info.handle, dy, x, want_dw=True, accumulate_dw=True), server_info)
    got = receive_or_explain(lambda: conn.fetch_gradient(info.handle), server_info)
    assert got.result.accumulated_calls == 1
    assert check_output(got, got.result.dw, False).nbytes == want

    targets = rng.integers(0, v, size=(m,))
    got = receive_or_explain(lambda: conn.cross_entropy(info.handle, x, targets, want_dw=True), server_info)
    assert check_output(got, got.result.dw, False).nbytes == want

    values = rng.integers(-1000, 1001, size=(8192 * scale, 4096), dtype=np.int16).astype(np.float32)
    got = receive_or_explain(lambda: conn.cast(values), server_info)
    assert check_output(got, got.result.output, False).size * 2 == want  # bf16, decoded to float32


def test_every_call_64_mib_output(conn, weights, server_info):
    """Every other tensor call's 64 MiB output completes through a default channel."""
    _every_call_output(conn, weights, server_info, 1)


@pytest.mark.large
def test_every_call_1_gib_output(conn, weights, server_info):
    """Every tensor call's 1 GiB output completes through a default channel (Logits: over 2 GiB above)."""
    _every_call_output(conn, weights, server_info, 16)
