"""Digest rules: every request tensor carries the xxh3-64 (seed 0) of its bytes,
in its spec or (a streamed tensor of a call announced with xxh3 0) in a
TensorDigest after its chunks; the server answers each output's digest in its
spec, or after the chunks when the request sets digest_last."""

import grpc
import numpy as np
import pytest

from protocol import (
    REQUEST_TENSOR_IDS,
    REQUEST_TENSORS,
    Tensor,
    check_output,
    chunks_of,
    expect_error,
    expected_order,
    names,
    read_stream,
    xxh3,
)
from stubs import pb


@pytest.mark.parametrize("rpc,tensor", REQUEST_TENSORS, ids=REQUEST_TENSOR_IDS)
def test_request_spec_without_digest_needs_one_after_the_chunks(conn, calls, rpc, tensor):
    """A request TensorSpec with xxh3 0: the digest follows the tensor's chunks as a TensorDigest.

    Sent, the call succeeds; not sent, it is DATA_LOSS naming the tensor and
    the xxh3. RegisterWeight's weight (whose handle is formed from its
    digest) must carry it in its spec: INVALID_ARGUMENT naming the field
    xxh3 and the tensor.
    """
    call = calls[rpc]
    digest = xxh3(call.tensors[tensor].data)
    if rpc == "RegisterWeight":
        message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call.run, conn, call.messages({tensor: 0}))
    else:
        call.run(conn, call.messages({tensor: 0}, after={tensor: digest}))
        message = expect_error(grpc.StatusCode.DATA_LOSS, call.run, conn, call.messages({tensor: 0}))
    assert names(message, "xxh3"), "the message does not name the field xxh3: %s" % message
    assert names(message, tensor), "the message does not name the tensor '%s': %s" % (tensor, message)


@pytest.mark.parametrize("rpc,tensor", REQUEST_TENSORS, ids=REQUEST_TENSOR_IDS)
def test_a_digest_after_the_chunks_that_does_not_match_or_is_not_asked_for(conn, calls, rpc, tensor):
    """A TensorDigest that does not match the bytes is DATA_LOSS naming the tensor; one for a
    tensor whose spec carried its digest is INVALID_ARGUMENT naming it."""
    call = calls[rpc]
    digest = xxh3(call.tensors[tensor].data)
    if rpc != "RegisterWeight":
        message = expect_error(
            grpc.StatusCode.DATA_LOSS, call.run, conn, call.messages({tensor: 0}, after={tensor: digest ^ 0x5A5A})
        )
        assert names(message, tensor), "the message does not name the tensor '%s': %s" % (tensor, message)
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call.run, conn, call.messages(after={tensor: digest}))
    assert names(message, tensor), "the message does not name the tensor '%s': %s" % (tensor, message)


@pytest.mark.parametrize("rpc,tensor", REQUEST_TENSORS, ids=REQUEST_TENSOR_IDS)
def test_request_with_wrong_digest_is_data_loss(conn, calls, rpc, tensor):
    """Bytes that do not match a non-zero announced xxh3 are DATA_LOSS naming the tensor."""
    call = calls[rpc]
    wrong = xxh3(call.tensors[tensor].data) ^ 0x5A5A
    message = expect_error(grpc.StatusCode.DATA_LOSS, call.run, conn, call.messages({tensor: wrong}))
    assert names(message, tensor), "the message does not name the tensor '%s': %s" % (tensor, message)


def test_logits_digest_last(conn, weights):
    """digest_last: Y's spec carries 0 and a TensorDigest of Y's bytes follows its last chunk."""
    rng = np.random.default_rng(602)
    w = rng.integers(-8, 9, size=(1000, 16))
    x = rng.integers(-8, 9, size=(20, 16))
    info = weights(w)
    got = conn.logits(info.handle, x, digest_last=True)
    assert got.order == expected_order(["y"], True)
    y = check_output(got, got.result.y, digest_last=True)
    np.testing.assert_array_equal(y, (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32))


def test_backward_digest_last(conn, weights):
    """With digest_last both dX and dW specs carry 0; both digests follow the last chunk of all, in output order."""
    rng = np.random.default_rng(603)
    w = rng.integers(-8, 9, size=(96, 24))
    info = weights(w)
    x, dy = rng.integers(-8, 9, size=(5, 24)), rng.integers(-8, 9, size=(5, 96))
    got = conn.backward(info.handle, dy, x, want_dx=True, want_dw=True, digest_last=True)
    assert got.order == expected_order(["dx", "dw"], True)
    check_output(got, got.result.dx, True)
    check_output(got, got.result.dw, True)


def test_cast_digest_last(conn):
    """Cast with digest_last: the output's digest follows its chunks."""
    values = np.arange(-256, 257, dtype=np.float32)
    got = conn.cast(values, digest_last=True)
    assert got.order == expected_order(["output"], True)
    np.testing.assert_array_equal(check_output(got, got.result.output, True), values)


def test_cross_entropy_digest_last(conn, weights):
    """CrossEntropy with digest_last: one digest per streamed output, after all chunks."""
    rng = np.random.default_rng(604)
    info = weights(rng.integers(-2, 3, size=(32, 8)))
    got = conn.cross_entropy(
        info.handle,
        rng.integers(-2, 3, size=(4, 8)),
        rng.integers(0, 32, size=4),
        want_lse=True,
        want_dx=True,
        want_dw=True,
        digest_last=True,
    )
    assert got.order == expected_order(["loss", "lse", "dx", "dw"], True)
    for spec in (got.result.loss, got.result.lse, got.result.dx, got.result.dw):
        check_output(got, spec, True)


def test_fetch_gradient_digest_last(conn, weights):
    """FetchGradient with digest_last: dW's digest follows its chunks."""
    rng = np.random.default_rng(605)
    w = rng.integers(-8, 9, size=(40, 8))
    info = weights(w)
    x, dy = rng.integers(-8, 9, size=(3, 8)), rng.integers(-8, 9, size=(3, 40))
    conn.backward(info.handle, dy, x, want_dw=True, accumulate_dw=True)
    got = conn.fetch_gradient(info.handle, digest_last=True)
    assert got.order == expected_order(["dw"], True)
    dw = check_output(got, got.result.dw, True)
    np.testing.assert_array_equal(dw, (dy.T.astype(np.float64) @ x).astype(np.float32))


def test_digest_is_xxh3_64_seed_0_of_little_endian_bytes(conn):
    """A known digest: fp32 [1.0, 2.0] cast to bf16 is the bytes 80 3f 00 40.

    Their xxh3-64 with seed 0 is d73f38204880d085.
    """
    got = conn.cast(np.array([1.0, 2.0], dtype=np.float32))
    assert got.result.output.dtype == pb.DTYPE_BF16
    assert bytes(got.tensors["output"]) == bytes.fromhex("803f0040")
    assert got.result.output.xxh3 == 0xD73F38204880D085


def _pipelined_logits(conn, handle, xt, digest=None, chunk_bytes=1000):
    """A Logits call with pipeline set: what came back before the status, and the status."""
    first = pb.LogitsRequest(
        header=pb.LogitsHeader(weight_handle=handle, x=xt.spec(digest), digest_last=True, pipeline=True)
    )
    messages = [first] + [pb.LogitsRequest(chunk=c) for c in chunks_of(xt, chunk_bytes)]
    return _parts_and_status(conn.logits_stream(messages))


def test_logits_pipeline_gives_the_bits_of_the_whole_call(conn, weights):
    """pipeline: the same Y bit for bit, its digest after its chunks (as digest_last)."""
    rng = np.random.default_rng(606)
    w = rng.standard_normal((96, 200))
    x = rng.standard_normal((777, 200))
    info = weights(w)
    whole = conn.logits(info.handle, x, chunk_bytes=1000, digest_last=True)
    blocks = conn.logits(info.handle, x, chunk_bytes=1000, digest_last=True, pipeline=True)
    assert blocks.order == expected_order(["y"], True)
    y = check_output(blocks, blocks.result.y, digest_last=True)
    np.testing.assert_array_equal(y.view(np.uint32), check_output(whole, whole.result.y, True).view(np.uint32))


def test_logits_pipeline_with_damaged_x_sends_no_digest(conn, weights):
    """pipeline with a wrong X digest: DATA_LOSS, and Y's digest never sent, whatever chunks went out.

    A server may stream Y's first rows before X's last chunk arrives; the
    digest that lets a client accept Y comes only after X matched its own.
    """
    rng = np.random.default_rng(607)
    info = weights(rng.standard_normal((96, 200)))
    xt = Tensor("x", pb.DTYPE_BF16, rng.standard_normal((777, 200)))
    parts, code = _pipelined_logits(conn, info.handle, xt, digest=xxh3(xt.data) ^ 0x5A5A)
    assert code == grpc.StatusCode.DATA_LOSS
    assert "digest" not in parts
    parts, code = _pipelined_logits(conn, info.handle, xt)
    assert code == grpc.StatusCode.OK
    assert parts[0] == "result" and parts[-1] == "digest"


def _parts_and_status(responses):
    """The parts a response stream carried before its status, and the status."""
    parts = []
    code = grpc.StatusCode.OK
    try:
        for message in responses:
            parts.append(message.WhichOneof("part"))
    except grpc.RpcError as e:
        code = e.code()
    return parts, code


def _rows_messages(request, header, xt, tt, x_first, chunk_bytes=1000):
    """A header, then the chunks of X and of the targets in the order asked (a server takes either)."""
    x_chunks = [request(chunk=c) for c in chunks_of(xt, chunk_bytes)]
    t_chunks = [request(chunk=c) for c in chunks_of(tt, chunk_bytes)]
    return [request(header=header)] + (x_chunks + t_chunks if x_first else t_chunks + x_chunks)


def _logprobs_messages(handle, xt, tt, x_first, pipeline, x_digest=None):
    """A LogProbs call asking logprob and lse."""
    header = pb.LogProbsHeader(
        weight_handle=handle, x=xt.spec(x_digest), targets=tt.spec(), want_lse=True, digest_last=True,
        pipeline=pipeline,
    )
    return _rows_messages(pb.LogProbsRequest, header, xt, tt, x_first)


def _cross_entropy_messages(handle, xt, tt, x_first, pipeline, x_digest=None):
    """A CrossEntropy call asking per-token loss, lse and an fp32 dX."""
    header = pb.CrossEntropyHeader(
        weight_handle=handle, x=xt.spec(x_digest), targets=tt.spec(), reduction=pb.REDUCTION_NONE,
        want_lse=True, want_dx=True, dx_dtype=pb.DTYPE_FP32, digest_last=True, pipeline=pipeline,
    )
    return _rows_messages(pb.CrossEntropyRequest, header, xt, tt, x_first)


def _check_row_blocks(stream, messages_of, outputs, xt, tt):
    """In row blocks, with X first or the targets first: every output bit for bit the whole call's,
    the digests after the chunks; with a wrong X digest, DATA_LOSS and no digest at all."""
    whole = read_stream(stream(messages_of(xt, tt, True, False)))
    expected = {n: check_output(whole, getattr(whole.result, n), True).view(np.uint32) for n in outputs}
    for x_first in (True, False):
        blocks = read_stream(stream(messages_of(xt, tt, x_first, True)))
        assert blocks.order == expected_order(list(outputs), True)
        for n in outputs:
            got = check_output(blocks, getattr(blocks.result, n), True)
            np.testing.assert_array_equal(got.view(np.uint32), expected[n])
    parts, code = _parts_and_status(stream(messages_of(xt, tt, False, True, x_digest=xxh3(xt.data) ^ 0x5A5A)))
    assert code == grpc.StatusCode.DATA_LOSS
    assert "digest" not in parts


def test_logprobs_pipeline_gives_the_bits_of_the_whole_call(conn, weights):
    """LogProbs with pipeline: logprob and lse bit for bit the whole call's, their digests after
    their chunks, whichever of X and the targets is sent first; a damaged X sends no digest."""
    rng = np.random.default_rng(608)
    info = weights(rng.standard_normal((96, 200)))
    xt = Tensor("x", pb.DTYPE_BF16, rng.standard_normal((777, 200)))
    tt = Tensor("targets", pb.DTYPE_INT32, rng.integers(0, 96, size=777))
    _check_row_blocks(
        conn.logprobs_stream,
        lambda *a, **kw: _logprobs_messages(info.handle, *a, **kw),
        ("logprob", "lse"),
        xt,
        tt,
    )


def test_cross_entropy_pipeline_gives_the_bits_of_the_whole_call(conn, weights):
    """CrossEntropy with pipeline (no dW): loss, lse and dX bit for bit the whole call's, digests last,
    whichever of X and the targets is sent first; a damaged X sends no digest."""
    rng = np.random.default_rng(610)
    info = weights(rng.standard_normal((96, 200)))
    xt = Tensor("x", pb.DTYPE_BF16, rng.standard_normal((600, 200)))
    tt = Tensor("targets", pb.DTYPE_INT64, rng.integers(0, 96, size=600))
    _check_row_blocks(
        conn.cross_entropy_stream,
        lambda *a, **kw: _cross_entropy_messages(info.handle, *a, **kw),
        ("loss", "lse", "dx"),
        xt,
        tt,
    )
