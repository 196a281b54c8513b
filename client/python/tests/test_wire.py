"""The client's side of the wire contract, against a scripted in-process server.

No logitd binary is needed: a small Python servicer sends well-formed and
deliberately broken responses, and records what the client sent.
"""

from concurrent import futures

import grpc
import numpy as np
import pytest
import xxhash
from reference import rne_bf16_bits

import logitd
from logitd.v1 import logitd_pb2 as pb
from logitd.v1 import logitd_pb2_grpc as pb_grpc


class Scripted(pb_grpc.LogitdServicer):
    """Cast answers according to `self.mode`; RegisterWeight reassembles and checks the request."""

    def __init__(self):
        self.mode = "ok"
        self.metadata = None
        self.chunks = []

    def GetServerInfo(self, request, context):
        self.metadata = dict(context.invocation_metadata())
        return pb.ServerInfo(version="test", backend="cpu")

    def ListWeights(self, request, context):
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "weight budget exceeded")

    def RegisterWeight(self, request_iterator, context):
        header = None
        data = bytearray()
        self.chunks = []
        for req in request_iterator:
            if req.WhichOneof("part") == "header":
                header = req.header
            else:
                if req.chunk.offset != len(data) or req.chunk.name != "weight":
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad chunk")
                self.chunks.append(len(req.chunk.data))
                data += req.chunk.data
        spec = header.weight
        n = 2
        for d in spec.shape:
            n *= d
        if len(data) != n or xxhash.xxh3_64_intdigest(bytes(data)) != spec.xxh3:
            context.abort(grpc.StatusCode.DATA_LOSS, "digest")
        return pb.WeightInfo(handle="w-test", name=header.name, shape=spec.shape, xxh3=spec.xxh3, registrations=1)

    def Cast(self, request_iterator, context):
        header = None
        data = bytearray()
        for req in request_iterator:
            if req.WhichOneof("part") == "header":
                header = req.header
            else:
                data += req.chunk.data
        out = rne_bf16_bits(np.frombuffer(bytes(data), dtype="<f4")).tobytes()
        spec = pb.TensorSpec(
            name="output", dtype=pb.DTYPE_BF16, shape=header.input.shape, xxh3=xxhash.xxh3_64_intdigest(out)
        )
        mode = self.mode
        if mode == "chunk_first":
            yield pb.CastResponse(chunk=pb.TensorChunk(name="output", offset=0, data=out))
        if mode == "bad_digest":
            spec.xxh3 ^= 1
        yield pb.CastResponse(result=pb.CastResult(output=spec))
        if mode == "flipped_byte":
            out = bytes([out[0] ^ 0x01]) + out[1:]
        if mode == "truncated":
            out = out[:-2]
        if mode == "too_long":
            out = out + b"\0\0"
        if mode == "unknown_name":
            yield pb.CastResponse(chunk=pb.TensorChunk(name="other", offset=0, data=out))
            return
        half = len(out) // 2
        if mode == "gap":
            yield pb.CastResponse(chunk=pb.TensorChunk(name="output", offset=0, data=out[:half]))
            yield pb.CastResponse(chunk=pb.TensorChunk(name="output", offset=half + 2, data=out[half + 2 :]))
            return
        yield pb.CastResponse(chunk=pb.TensorChunk(name="output", offset=0, data=out[:half]))
        yield pb.CastResponse(chunk=pb.TensorChunk(name="output", offset=half, data=out[half:]))
        if mode == "second_result":
            yield pb.CastResponse(result=pb.CastResult(output=spec))


@pytest.fixture(scope="module")
def scripted():
    servicer = Scripted()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_LogitdServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, "127.0.0.1:%d" % port
    server.stop(grace=None)


def test_token_is_sent_as_bearer_metadata(scripted):
    servicer, address = scripted
    with logitd.Client(address, token="s3cret") as c:
        assert c.info().version == "test"
    assert servicer.metadata.get("authorization") == "Bearer s3cret"
    with logitd.Client(address) as c:
        c.info()
    assert "authorization" not in servicer.metadata


def test_request_chunks_and_digest(scripted):
    servicer, address = scripted
    w = np.arange(3000, dtype=np.float32).reshape(30, 100).astype(logitd.BF16)  # 6000 bytes
    with logitd.Client(address, chunk_bytes=1024) as c:
        info = c.register_weights(w, name="w")
    assert servicer.chunks == [1024] * 5 + [6000 - 5 * 1024]
    assert info.shape == (30, 100)
    assert info.xxh3 == xxhash.xxh3_64_intdigest(w.tobytes())


def test_good_response(scripted):
    servicer, address = scripted
    servicer.mode = "ok"
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    with logitd.Client(address) as c:
        out = c.cast_to_bf16(x)
    np.testing.assert_array_equal(out.view(np.uint16), rne_bf16_bits(x))


@pytest.mark.parametrize(
    "mode",
    ["bad_digest", "flipped_byte", "truncated", "too_long", "gap", "unknown_name", "chunk_first", "second_result"],
)
def test_corrupt_response_is_data_loss(scripted, mode):
    servicer, address = scripted
    servicer.mode = mode
    try:
        with logitd.Client(address) as c:
            with pytest.raises(logitd.DataLossError) as e:
                c.cast_to_bf16(np.linspace(-3, 3, 101, dtype=np.float32))
    finally:
        servicer.mode = "ok"
    assert e.value.code_name == "DATA_LOSS"


def test_server_status_maps_to_error_class(scripted):
    _, address = scripted
    with logitd.Client(address) as c:
        with pytest.raises(logitd.ResourceExhaustedError) as e:
            c.list_weights()
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.value.message == "weight budget exceeded"
    assert str(e.value) == "RESOURCE_EXHAUSTED: weight budget exceeded"


def test_unreachable_server_is_unavailable():
    with logitd.Client("127.0.0.1:1", timeout=10) as c:
        with pytest.raises(logitd.UnavailableError) as e:
            c.info()
    assert e.value.code_name == "UNAVAILABLE"


def test_client_arguments():
    with pytest.raises(logitd.InvalidArgumentError):
        logitd.Client("")
    with pytest.raises(logitd.InvalidArgumentError):
        logitd.Client("127.0.0.1:1", chunk_bytes=0)
    with pytest.raises(logitd.InvalidArgumentError):
        logitd.Client("127.0.0.1:1", timeout=0)
    with pytest.raises(logitd.InvalidArgumentError, match="both"):
        logitd.Client("127.0.0.1:1", tls={"cert": b"x"})
    with pytest.raises(logitd.InvalidArgumentError, match="unknown keys"):
        logitd.Client("127.0.0.1:1", tls={"root_cert": b"x"})
    with pytest.raises(logitd.InvalidArgumentError, match="not both"):
        logitd.Client("127.0.0.1:1", tls={"ca": b"x", "root_ca": b"x"})
    logitd.Client("127.0.0.1:1", tls=True).close()
    logitd.Client("dns:///localhost:1").close()
    logitd.Client("ipv4:127.0.0.1:1,127.0.0.1:2", lb_policy="round_robin").close()
    with pytest.raises(logitd.InvalidArgumentError, match="lb_policy"):
        logitd.Client("127.0.0.1:1", lb_policy="least_request")
