"""GetServerInfo, and the logitd-timing trailer every call ends with."""

import re

import grpc
import numpy as np

from protocol import parse_timing
from stubs import pb

# key=integer pairs, comma-separated (keys a client does not know are ignored).
TIMING_FORMAT = re.compile(r"^[a-z0-9_]+=-?[0-9]+(,[a-z0-9_]+=-?[0-9]+)*$")


def check_timing(trailer, required):
    assert "logitd-timing" in trailer, "no logitd-timing trailer: %r" % (trailer,)
    value = trailer["logitd-timing"]
    assert TIMING_FORMAT.match(value), "logitd-timing %r is not comma-separated key=integer pairs" % value
    timing = parse_timing(value)
    for key in required:
        assert key in timing, "logitd-timing %r lacks %s" % (value, key)
    assert all(v >= 0 for v in timing.values()), "logitd-timing %r has a negative time" % value


def test_server_info_describes_backend_and_limits(conn):
    """ServerInfo names what serves and states the limits a client must respect."""
    info = conn.info()
    assert info.version, "ServerInfo.version is empty"
    assert info.backend in ("cpu", "cuda"), "ServerInfo.backend %r is neither cpu nor cuda" % info.backend
    if info.backend == "cuda":
        assert info.compute_capability, "a cuda backend reports its compute capability"
        assert info.split_k in ("off", "fp32", "any"), "split_k %r" % info.split_k
    assert info.algo_choices in ("fixed", "kept", "per_process"), "algo_choices %r" % info.algo_choices
    assert bool(info.algo_cache_path) == (info.algo_choices == "kept"), (
        "algo_cache_path %r with algo_choices %r" % (info.algo_cache_path, info.algo_choices)
    )
    assert info.chunk_bytes > 0, "ServerInfo.chunk_bytes is 0"
    assert info.max_request_bytes > 0, "ServerInfo.max_request_bytes is 0"
    assert info.weight_bytes_in_use <= info.weight_budget_bytes
    assert info.request_bytes_in_flight <= info.request_bytes_high_water
    if info.max_concurrent_requests:
        assert info.requests_in_flight <= info.max_concurrent_requests


def test_timing_trailer_on_unary_call(conn):
    """A unary call ends with a logitd-timing trailer that has total_us."""
    _, call = conn.stub.GetServerInfo.with_call(pb.GetServerInfoRequest(), **conn.kw())
    check_timing(dict(call.trailing_metadata()), ["total_us"])


def test_timing_trailer_on_tensor_call(conn, weights):
    """A Logits call's trailer has receive_us, compute_us, send_us and total_us."""
    rng = np.random.default_rng(1)
    w = weights(rng.integers(-3, 4, size=(64, 32)))
    got = conn.logits(w.handle, rng.integers(-3, 4, size=(4, 32)))
    check_timing(got.trailer, ["receive_us", "compute_us", "send_us", "total_us"])


def test_timing_trailer_on_failed_call(conn):
    """A call that fails still ends with the logitd-timing trailer."""
    try:
        conn.zero_gradient("w-0000000000000000-1x1")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e.details()
        check_timing(dict(e.trailing_metadata() or ()), ["total_us"])
    else:
        raise AssertionError("ZeroGradient of an unknown handle succeeded")
