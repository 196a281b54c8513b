"""Malformed request streams: each is refused with its status, and the message
names the tensor involved. Every request-streaming RPC reads its stream the
same way, so each case runs on each (RPC, tensor) pair."""

import grpc
import numpy as np
import pytest

from protocol import REQUEST_TENSOR_IDS, REQUEST_TENSORS, Tensor, chunk, chunks_of, expect_error, names
from stubs import pb

RPCS = ["RegisterWeight", "Logits", "Backward", "Cast", "CrossEntropy", "LogProbs"]


def broken(call, tensor, pieces):
    """The call's messages with `tensor`'s chunks replaced by `pieces` (offset, bytes)."""
    messages = [call.header()]
    for t in call.tensors.values():
        if t.name != tensor:
            messages += [call.chunk(c) for c in chunks_of(t)]
    messages += [call.chunk(chunk(tensor, offset, data)) for offset, data in pieces]
    return messages


def half(data):
    """An even split point inside the tensor's bytes."""
    return (len(data) // 2) & ~3


# Each case: the pieces of the tensor's bytes `b` sent as (offset, data).
CHUNK_CASES = {
    "gap": lambda b: [(0, b[: half(b)]), (half(b) + 2, b[half(b) + 2 :])],
    "overlap": lambda b: [(0, b[: half(b)]), (half(b) - 2, b[half(b) - 2 :])],
    "duplicate": lambda b: [(0, b[: half(b)]), (0, b[: half(b)]), (half(b), b[half(b) :])],
    "out-of-range": lambda b: [(0, b), (len(b), b"\0\0")],
    "past-the-end": lambda b: [(0, b + b"\0\0")],
}


@pytest.mark.parametrize("case", list(CHUNK_CASES))
@pytest.mark.parametrize("rpc,tensor", REQUEST_TENSORS, ids=REQUEST_TENSOR_IDS)
def test_chunk_out_of_order_is_invalid_argument(conn, calls, rpc, tensor, case):
    """A chunk that leaves a gap, overlaps, repeats or runs past the tensor's end is INVALID_ARGUMENT."""
    call = calls[rpc]
    pieces = CHUNK_CASES[case](call.tensors[tensor].data)
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call.run, conn, broken(call, tensor, pieces))
    assert names(message, tensor), "the message does not name the tensor '%s': %s" % (tensor, message)


@pytest.mark.parametrize("rpc,tensor", REQUEST_TENSORS, ids=REQUEST_TENSOR_IDS)
def test_missing_last_chunk_is_data_loss(conn, calls, rpc, tensor):
    """A stream that ends before a tensor is complete is DATA_LOSS (truncated)."""
    call = calls[rpc]
    data = call.tensors[tensor].data
    message = expect_error(grpc.StatusCode.DATA_LOSS, call.run, conn, broken(call, tensor, [(0, data[: half(data)])]))
    assert names(message, tensor), "the message does not name the tensor '%s': %s" % (tensor, message)


@pytest.mark.parametrize("rpc", RPCS)
def test_tensor_never_sent_is_data_loss(conn, calls, rpc):
    """A stream that ends with a whole tensor missing is DATA_LOSS naming that tensor."""
    call = calls[rpc]
    tensor = list(call.tensors)[-1]
    message = expect_error(grpc.StatusCode.DATA_LOSS, call.run, conn, broken(call, tensor, []))
    assert names(message, tensor), "the message does not name the tensor '%s': %s" % (tensor, message)


@pytest.mark.parametrize("rpc", RPCS)
def test_chunk_for_unknown_tensor_is_invalid_argument(conn, calls, rpc):
    """A chunk naming a tensor the header did not announce is INVALID_ARGUMENT naming it."""
    call = calls[rpc]
    messages = call.messages()
    messages.insert(1, call.chunk(chunk("not_announced", 0, b"\0\0\0\0")))
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call.run, conn, messages)
    assert "not_announced" in message, message


@pytest.mark.parametrize("rpc", RPCS)
def test_header_not_first_is_invalid_argument(conn, calls, rpc):
    """A stream that starts with a chunk instead of the header is INVALID_ARGUMENT."""
    call = calls[rpc]
    messages = call.messages()
    messages.insert(0, messages.pop(1))
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call.run, conn, messages)
    assert "header" in message, message


@pytest.mark.parametrize("rpc", RPCS)
def test_second_header_is_invalid_argument(conn, calls, rpc):
    """One call carries one header: a second one, even between chunks, is INVALID_ARGUMENT."""
    call = calls[rpc]
    messages = call.messages()
    messages.insert(2, call.header())
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call.run, conn, messages)
    assert "header" in message, message


@pytest.mark.parametrize("rpc", RPCS)
def test_empty_stream_is_invalid_argument(conn, calls, rpc):
    """A stream without any message is INVALID_ARGUMENT."""
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, calls[rpc].run, conn, [])


@pytest.mark.parametrize("rpc", ["Logits", "Backward", "Cast", "CrossEntropy", "LogProbs"])
@pytest.mark.parametrize("position", [0, 1, 2], ids=["first", "after-header", "after-chunk"])
def test_unparseable_message_is_invalid_argument(conn, calls, rpc, position):
    """A message that is not the RPC's request type is INVALID_ARGUMENT naming the type."""
    call = calls[rpc]
    raw = [m.SerializeToString() for m in call.messages()][:position] + [b"\xff\xff\xff"]
    method = conn.channel.stream_stream(
        "/logitd.v1.Logitd/" + rpc, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: list(method(iter(raw), **conn.kw())))
    assert "logitd.v1.%sRequest" % rpc in message, message


def test_request_tensor_names_must_differ(conn, calls):
    """Backward's dy and x share the chunk namespace: the same name for both is INVALID_ARGUMENT."""
    call = calls["Backward"]
    header = call.header()
    header.header.x.name = "dy"
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call.run, conn, [header])
    assert names(message, "dy"), message


def test_spec_without_name_is_invalid_argument(conn, calls):
    """A request TensorSpec needs a name (chunks refer to it): empty is INVALID_ARGUMENT."""
    call = calls["Logits"]
    header = call.header()
    header.header.x.name = ""
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call.run, conn, [header])
    assert "name" in message, message


def test_unspecified_dtype_is_invalid_argument(conn, calls):
    """DTYPE_UNSPECIFIED is no tensor dtype: INVALID_ARGUMENT naming the tensor."""
    call = calls["Cast"]
    header = call.header()
    header.header.input.dtype = pb.DTYPE_UNSPECIFIED
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call.run, conn, [header])
    assert names(message, "input"), message


@pytest.mark.parametrize("over", ["just-over", "twice"])
def test_request_message_over_the_limit(conn, weights, server_info, over):
    """A request message over ServerInfo.max_receive_message_bytes fails the call with INVALID_ARGUMENT naming
    the limit and the field to read; one over twice the limit is refused by gRPC itself with RESOURCE_EXHAUSTED."""
    limit = server_info.max_receive_message_bytes
    assert server_info.max_request_chunk_bytes >= 4 << 20
    assert limit > server_info.max_request_chunk_bytes
    k = 1024
    data_bytes = limit + 8192 if over == "just-over" else 2 * limit + 8192
    m = (data_bytes + 2 * k - 1) // (2 * k)
    info = weights(np.ones((8, k)))
    x = np.ones((m, k))
    t = Tensor("x", pb.DTYPE_BF16, x)
    first = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=info.handle, x=t.spec()))
    whole = pb.LogitsRequest(chunk=pb.TensorChunk(name="x", offset=0, data=t.data))
    if over == "just-over":
        message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: list(conn.logits_stream([first, whole])))
        assert "max_receive_message_bytes" in message and str(limit) in message, message
        assert "max_request_chunk_bytes" in message, message
    else:
        message = expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: list(conn.logits_stream([first, whole])))
        assert "larger than max" in message, message
