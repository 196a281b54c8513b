"""Same-host shared memory: RegisterShm, ReleaseShm and the shm fields of Logits and Backward.

They need a server started with --allow_shm, on this host, as this user.
Whether it is is asked of the server: the first RegisterShm's status says
(FAILED_PRECONDITION: no --allow_shm; NOT_FOUND: it cannot see this host's
objects; PERMISSION_DENIED: another user), and the tests skip with it.
"""

import itertools
import os
from multiprocessing import shared_memory

import grpc
import numpy as np
import pytest

from protocol import Tensor, expect_error, names, raw_bytes, xxh3
from stubs import pb

_names = itertools.count()

SKIP_REASONS = {
    grpc.StatusCode.FAILED_PRECONDITION: "the server runs without --allow_shm",
    grpc.StatusCode.NOT_FOUND: "the server cannot see this host's shared-memory objects (another host or container)",
    grpc.StatusCode.PERMISSION_DENIED: "the server runs as another user than this client",
}


@pytest.fixture
def shm(conn):
    """Creates and registers shared-memory objects; releases and unlinks them afterwards.

    make(size) returns (SharedMemory, ShmRegion), or skips the test when the
    server cannot use this host's shared memory.
    """
    created, handles = [], []

    def make(size):
        obj = shared_memory.SharedMemory(
            create=True, size=size, name="logitd-conformance-%d-%d" % (os.getpid(), next(_names))
        )
        created.append(obj)
        try:
            region = conn.stub.RegisterShm(pb.RegisterShmRequest(name="/" + obj.name, bytes=size), **conn.kw())
        except grpc.RpcError as e:
            if e.code() in SKIP_REASONS:
                pytest.skip("%s: RegisterShm answered %s: %s" % (SKIP_REASONS[e.code()], e.code().name, e.details()))
            raise
        handles.append(region.handle)
        return obj, region

    yield make
    for handle in handles:
        try:
            conn.stub.ReleaseShm(pb.ReleaseShmRequest(handle=handle), **conn.kw())
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
    for obj in created:
        obj.close()
        obj.unlink()


def logits_call(conn, header):
    """A Logits call of one header message; returns the response messages' parts and the result."""
    parts, result = [], None
    for message in conn.logits_stream([pb.LogitsRequest(header=header)]):
        parts.append(message.WhichOneof("part"))
        if message.HasField("result"):
            result = message.result
    return parts, result


def test_register_shm_reports_the_region(conn, shm):
    """RegisterShm answers a handle, the name and the size."""
    obj, region = shm(8192)
    assert region.handle
    assert region.name == "/" + obj.name and region.bytes == 8192


def test_logits_through_shared_memory(conn, shm, weights):
    """X is read from the region and Y written into it; only the header and the result travel."""
    rng = np.random.default_rng(1001)
    m, v, k = 6, 40, 16
    w, x = rng.integers(-8, 9, size=(v, k)), rng.integers(-8, 9, size=(m, k))
    info = weights(w)
    xt = Tensor("x", pb.DTYPE_BF16, x)
    y_offset, y_bytes = 1024, m * v * 4
    obj, region = shm(y_offset + y_bytes)
    obj.buf[: len(xt.data)] = xt.data
    header = pb.LogitsHeader(
        weight_handle=info.handle,
        x=xt.spec(),
        x_shm=pb.ShmRef(region=region.handle, offset=0, bytes=len(xt.data)),
        y_shm=pb.ShmRef(region=region.handle, offset=y_offset, bytes=y_bytes),
    )
    parts, result = logits_call(conn, header)
    assert parts == ["result"], "chunks were streamed although Y went to shared memory: %s" % parts
    assert result.y_shm.region == region.handle and result.y_shm.offset == y_offset and result.y_shm.bytes == y_bytes
    y_data = bytes(obj.buf[y_offset : y_offset + y_bytes])
    assert result.y.xxh3 == xxh3(y_data), "Y's spec digest does not match the bytes in the region"
    y = np.frombuffer(y_data, dtype="<f4").reshape(m, v)
    np.testing.assert_array_equal(y, (x.astype(np.float64) @ w.T).astype(np.float32))


def test_skip_digest_output(conn, shm, weights):
    """skip_digest on Y's slot: the spec carries xxh3 0 and the result's ShmRef says skip_digest."""
    rng = np.random.default_rng(1002)
    w, x = rng.integers(-8, 9, size=(8, 4)), rng.integers(-8, 9, size=(2, 4))
    info = weights(w)
    xt = Tensor("x", pb.DTYPE_BF16, x)
    obj, region = shm(4096)
    header = pb.LogitsHeader(
        weight_handle=info.handle,
        x=xt.spec(),
        y_shm=pb.ShmRef(region=region.handle, offset=0, bytes=2 * 8 * 4, skip_digest=True),
    )
    request = [pb.LogitsRequest(header=header), pb.LogitsRequest(chunk=pb.TensorChunk(name="x", data=xt.data))]
    result = [r.result for r in conn.logits_stream(request) if r.HasField("result")][0]
    assert result.y.xxh3 == 0 and result.y_shm.skip_digest
    y = np.frombuffer(bytes(obj.buf[: 2 * 8 * 4]), dtype="<f4").reshape(2, 8)
    np.testing.assert_array_equal(y, (x.astype(np.float64) @ w.T).astype(np.float32))


def test_backward_through_shared_memory(conn, shm, weights):
    """dY and X read from a region, dX and dW written into it."""
    rng = np.random.default_rng(1003)
    m, v, k = 4, 24, 8
    w, x = rng.integers(-8, 9, size=(v, k)), rng.integers(-8, 9, size=(m, k))
    dy = rng.integers(-8, 9, size=(m, v)).astype(np.float32)
    info = weights(w)
    dyt, xt = Tensor("dy", pb.DTYPE_FP32, dy), Tensor("x", pb.DTYPE_BF16, x)
    layout = {"dy": (0, len(dyt.data)), "x": (1024, len(xt.data)), "dx": (2048, m * k * 4), "dw": (4096, v * k * 4)}
    obj, region = shm(8192)
    obj.buf[0 : len(dyt.data)] = dyt.data
    obj.buf[1024 : 1024 + len(xt.data)] = xt.data

    def ref(name):
        return pb.ShmRef(region=region.handle, offset=layout[name][0], bytes=layout[name][1])

    header = pb.BackwardHeader(
        weight_handle=info.handle,
        dy=dyt.spec(),
        x=xt.spec(),
        want_dx=True,
        want_dw=True,
        dx_dtype=pb.DTYPE_FP32,
        dy_shm=ref("dy"),
        x_shm=ref("x"),
        dx_shm=ref("dx"),
        dw_shm=ref("dw"),
    )
    responses = list(conn.backward_stream([pb.BackwardRequest(header=header)]))
    assert [r.WhichOneof("part") for r in responses] == ["result"]
    result = responses[0].result
    for name, spec, slot in (("dx", result.dx, result.dx_shm), ("dw", result.dw, result.dw_shm)):
        offset, size = layout[name]
        assert slot.offset == offset and slot.bytes == size
        assert spec.xxh3 == xxh3(bytes(obj.buf[offset : offset + size])), "%s: digest does not match the region" % name
    dx = np.frombuffer(bytes(obj.buf[2048 : 2048 + m * k * 4]), dtype="<f4").reshape(m, k)
    dw = np.frombuffer(bytes(obj.buf[4096 : 4096 + v * k * 4]), dtype="<f4").reshape(v, k)
    np.testing.assert_array_equal(dx, (dy.astype(np.float64) @ w).astype(np.float32))
    np.testing.assert_array_equal(dw, (dy.T.astype(np.float64) @ x).astype(np.float32))


def test_input_changed_after_its_spec_is_data_loss(conn, shm, weights):
    """X's bytes in the region are checked against its spec: a mismatch is DATA_LOSS naming x."""
    info = weights(np.ones((8, 4)))
    xt = Tensor("x", pb.DTYPE_BF16, np.ones((2, 4)))
    obj, region = shm(4096)
    obj.buf[: len(xt.data)] = raw_bytes(np.full((2, 4), 2.0), pb.DTYPE_BF16)
    header = pb.LogitsHeader(
        weight_handle=info.handle, x=xt.spec(), x_shm=pb.ShmRef(region=region.handle, bytes=len(xt.data))
    )
    message = expect_error(grpc.StatusCode.DATA_LOSS, logits_call, conn, header)
    assert names(message, "x"), message


def test_slice_outside_region_is_invalid_argument(conn, shm, weights):
    """A slice that does not lie inside its region is INVALID_ARGUMENT naming the tensor."""
    info = weights(np.ones((8, 4)))
    xt = Tensor("x", pb.DTYPE_BF16, np.ones((2, 4)))
    obj, region = shm(4096)
    header = pb.LogitsHeader(
        weight_handle=info.handle, x=xt.spec(), x_shm=pb.ShmRef(region=region.handle, offset=4090, bytes=len(xt.data))
    )
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, logits_call, conn, header)
    assert names(message, "x"), message


def test_misaligned_output_slice_is_invalid_argument(conn, shm, weights):
    """An output slot's offset must be a multiple of its element size."""
    info = weights(np.ones((8, 4)))
    xt = Tensor("x", pb.DTYPE_BF16, np.ones((2, 4)))
    obj, region = shm(4096)
    header = pb.LogitsHeader(
        weight_handle=info.handle, x=xt.spec(), y_shm=pb.ShmRef(region=region.handle, offset=2, bytes=64)
    )
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, logits_call, conn, header)
    assert names(message, "y"), message


def test_released_region_is_not_found(conn, shm, weights):
    """After ReleaseShm the handle is NOT_FOUND, for calls and for a second release."""
    info = weights(np.ones((8, 4)))
    obj, region = shm(4096)
    conn.stub.ReleaseShm(pb.ReleaseShmRequest(handle=region.handle), **conn.kw())
    xt = Tensor("x", pb.DTYPE_BF16, np.ones((2, 4)))
    header = pb.LogitsHeader(
        weight_handle=info.handle, x=xt.spec(), x_shm=pb.ShmRef(region=region.handle, bytes=len(xt.data))
    )
    message = expect_error(grpc.StatusCode.NOT_FOUND, logits_call, conn, header)
    assert region.handle in message
    expect_error(
        grpc.StatusCode.NOT_FOUND, conn.stub.ReleaseShm, pb.ReleaseShmRequest(handle=region.handle), **conn.kw()
    )


def test_register_shm_errors(conn, shm):
    """A size other than the object's and a bad name are INVALID_ARGUMENT; a missing object NOT_FOUND."""
    obj, _ = shm(4096)
    register = conn.stub.RegisterShm
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, register, pb.RegisterShmRequest(name="/" + obj.name, bytes=4000), **conn.kw()
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, register, pb.RegisterShmRequest(name=obj.name, bytes=4096), **conn.kw()
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, register, pb.RegisterShmRequest(name="/a/b", bytes=4096), **conn.kw()
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, register, pb.RegisterShmRequest(name="/" + obj.name, bytes=0), **conn.kw()
    )
    message = expect_error(
        grpc.StatusCode.NOT_FOUND,
        register,
        pb.RegisterShmRequest(name="/logitd-conformance-absent-%d" % os.getpid(), bytes=4096),
        **conn.kw()
    )
    assert "logitd-conformance-absent" in message
