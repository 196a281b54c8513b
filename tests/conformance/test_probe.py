"""Probe: request_bytes up, response_bytes down, no tensors and no compute."""

import grpc
import pytest

from protocol import DEFAULT_RECEIVE_LIMIT, expect_error


@pytest.mark.parametrize(
    "request_bytes,pieces,response_bytes,chunk_bytes",
    [(0, [], 0, 0), (10, [3, 0, 7], 1, 0), (100000, [100000], 250000, 65536), (5, [5], 1 << 20, 1 << 20)],
    ids=["empty", "odd-pieces", "chunked", "one-chunk"],
)
def test_probe_moves_the_announced_bytes(conn, server_info, request_bytes, pieces, response_bytes, chunk_bytes):
    """The response carries response_bytes in chunks of chunk_bytes (0: the server's), the last one shorter."""
    sizes = conn.probe(request_bytes, response_bytes, chunk_bytes, pieces)
    assert sum(sizes) == response_bytes
    size = chunk_bytes or server_info.chunk_bytes
    if sizes:
        assert all(s == size for s in sizes[:-1]) and 0 < sizes[-1] <= size, sizes


def test_probe_default_chunks_fit_default_receive_limit(conn, server_info):
    """chunk_bytes 0 means the server's chunk size, and each message fits a default client's 4 MiB limit."""
    sizes = conn.probe(0, 3 * server_info.chunk_bytes + 1)
    assert sizes[:3] == [server_info.chunk_bytes] * 3 and sizes[3:] == [1]
    assert server_info.chunk_bytes < DEFAULT_RECEIVE_LIMIT


def test_probe_request_shorter_than_announced_is_invalid_argument(conn):
    """A request stream carrying fewer bytes than request_bytes is INVALID_ARGUMENT."""
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, conn.probe, 100, 0, 0, [99])


def test_probe_request_longer_than_announced_is_invalid_argument(conn):
    """A request stream carrying more bytes than request_bytes is INVALID_ARGUMENT."""
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, conn.probe, 100, 0, 0, [60, 60])


def test_probe_chunk_over_servers_chunk_size_is_invalid_argument(conn, server_info):
    """chunk_bytes above the server's chunk size is INVALID_ARGUMENT naming chunk_bytes."""
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, conn.probe, 0, 1, server_info.chunk_bytes + 1)
    assert "chunk_bytes" in message


def test_probe_over_max_request_bytes_is_resource_exhausted(conn, server_info):
    """request_bytes plus response_bytes over max_request_bytes is RESOURCE_EXHAUSTED."""
    message = expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, conn.probe, 0, server_info.max_request_bytes + 1, 0, [])
    assert "max_request_bytes" in message
