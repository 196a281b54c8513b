"""Logits: Y = alpha * X . W^T, fp32 accumulation, fp32 or bf16 out.

Integer-valued operands keep every product and sum exact in fp32, so the
results are compared bit for bit with a float64 reference.
"""

import grpc
import numpy as np
import pytest

from protocol import Tensor, as_bf16, check_output, chunks_of, expected_order, expect_error, names, read_stream
from stubs import pb


def reference(x, w, alpha=1.0):
    return (alpha * (np.asarray(x, np.float64) @ np.asarray(w, np.float64).T)).astype(np.float32)


@pytest.mark.parametrize("m,v,k", [(1, 1, 1), (3, 17, 5), (16, 1000, 64), (33, 4099, 129)])
def test_logits_fp32_exact(conn, weights, server_info, m, v, k):
    """FP32 logits of integer operands equal the exact sums; the response is result then Y's chunks."""
    rng = np.random.default_rng(m * 7 + v)
    w = rng.integers(-8, 9, size=(v, k))
    x = rng.integers(-8, 9, size=(m, k))
    info = weights(w)
    got = conn.logits(info.handle, x)
    assert got.order == expected_order(["y"], False)
    spec = got.result.y
    assert spec.name == "y" and spec.dtype == pb.DTYPE_FP32 and list(spec.shape) == [m, v]
    y = check_output(got, spec, digest_last=False)
    np.testing.assert_array_equal(y, reference(x, w))
    sizes = got.chunk_sizes["y"]
    assert all(s == server_info.chunk_bytes for s in sizes[:-1]), "chunks other than the last are not chunk_bytes"
    assert 0 < sizes[-1] <= server_info.chunk_bytes


def test_logits_bf16_out_is_rounded_once_to_nearest_even(conn, weights):
    """out_dtype BF16: the fp32 sum rounded to bf16 once, nearest even."""
    rng = np.random.default_rng(201)
    w = rng.integers(-8, 9, size=(300, 96))
    x = rng.integers(-8, 9, size=(7, 96))
    info = weights(w)
    got = conn.logits(info.handle, x, out_dtype=pb.DTYPE_BF16)
    spec = got.result.y
    assert spec.dtype == pb.DTYPE_BF16 and list(spec.shape) == [7, 300]
    y = check_output(got, spec, digest_last=False)
    exact = reference(x, w)
    assert np.any(np.abs(exact) > 256), "the data must exercise rounding"
    np.testing.assert_array_equal(y, as_bf16(exact))


@pytest.mark.parametrize("alpha,effective", [(0.0, 1.0), (0.5, 0.5), (-2.0, -2.0)])
def test_logits_alpha_scales_the_product(conn, weights, alpha, effective):
    """alpha scales the product; 0 means 1."""
    rng = np.random.default_rng(202)
    w = rng.integers(-8, 9, size=(50, 20))
    x = rng.integers(-8, 9, size=(5, 20))
    info = weights(w)
    got = conn.logits(info.handle, x, alpha=alpha)
    np.testing.assert_array_equal(check_output(got, got.result.y, False), reference(x, w, effective))


@pytest.mark.parametrize("chunk_bytes,m", [(1, 2), (6, 5), (4096, 300), (4 << 20, 1027)])
def test_request_chunk_sizes_are_the_clients_choice(conn, weights, chunk_bytes, m):
    """X may be sent in chunks of any size up to 4 MiB, odd sizes included."""
    rng = np.random.default_rng(203)
    w = rng.integers(-8, 9, size=(8, 2048))
    x = rng.integers(-8, 9, size=(m, 2048))  # 1027 rows: 4 MiB + 12 KiB of bf16
    info = weights(w)
    got = conn.logits(info.handle, x, chunk_bytes=chunk_bytes)
    np.testing.assert_array_equal(check_output(got, got.result.y, False), reference(x, w))


def test_request_tensor_name_is_the_clients_choice(conn, weights):
    """Chunks refer to the name in X's spec, whatever the client called it."""
    rng = np.random.default_rng(204)
    w = rng.integers(-8, 9, size=(12, 8))
    x = rng.integers(-8, 9, size=(3, 8))
    info = weights(w)
    t = Tensor("activations", pb.DTYPE_BF16, x)
    first = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=info.handle, x=t.spec()))
    got = read_stream(conn.logits_stream([first] + [pb.LogitsRequest(chunk=c) for c in chunks_of(t, 10)]))
    np.testing.assert_array_equal(check_output(got, got.result.y, False), reference(x, w))


def test_empty_chunk_is_invalid_argument(conn, weights):
    """Every chunk carries at least one byte: an empty one, even at the right offset, is INVALID_ARGUMENT naming
    the tensor."""
    rng = np.random.default_rng(205)
    w = rng.integers(-8, 9, size=(12, 8))
    x = rng.integers(-8, 9, size=(3, 8))
    info = weights(w)
    t = Tensor("x", pb.DTYPE_BF16, x)
    first = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=info.handle, x=t.spec()))
    body = [pb.TensorChunk(name="x", offset=0, data=b"")] + chunks_of(t)
    with pytest.raises(grpc.RpcError) as e:
        read_stream(conn.logits_stream([first] + [pb.LogitsRequest(chunk=c) for c in body]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert names(e.value.details(), "x") and "empty chunk" in e.value.details(), e.value.details()


def test_k_mismatch_is_invalid_argument(conn, weights):
    """X's K must equal the weight's: INVALID_ARGUMENT naming x and both sizes."""
    info = weights(np.ones((10, 6)))
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, conn.logits, info.handle, np.ones((2, 5)))
    assert names(message, "x") and "6" in message and "5" in message, message


def test_fp32_activations_are_invalid_argument(conn, weights):
    """X must be BF16: FP32 activations are INVALID_ARGUMENT naming x."""
    info = weights(np.ones((10, 6)))
    t = Tensor("x", pb.DTYPE_FP32, np.ones((2, 6)))
    first = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=info.handle, x=t.spec()))
    message = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: read_stream(conn.logits_stream([first] + [pb.LogitsRequest(chunk=c) for c in chunks_of(t)])),
    )
    assert names(message, "x"), message


@pytest.mark.parametrize("out_dtype", [pb.DTYPE_INT32, pb.DTYPE_INT64, 99])
def test_bad_out_dtype_is_invalid_argument(conn, weights, out_dtype):
    """out_dtype other than FP32, BF16 or unspecified is INVALID_ARGUMENT naming out_dtype."""
    info = weights(np.ones((10, 6)))
    message = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, conn.logits, info.handle, np.ones((2, 6)), out_dtype=out_dtype
    )
    assert "out_dtype" in message, message


def test_zero_dimension_is_invalid_argument(conn, weights):
    """Every dimension is >= 1: a shape with 0 is INVALID_ARGUMENT naming x."""
    info = weights(np.ones((10, 6)))
    spec = pb.TensorSpec(name="x", dtype=pb.DTYPE_BF16, shape=[0, 6], xxh3=1)
    first = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=info.handle, x=spec))
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: read_stream(conn.logits_stream([first])))
    assert names(message, "x"), message


def test_call_over_max_request_bytes_is_resource_exhausted(conn, weights, server_info):
    """A call whose X plus Y exceed max_request_bytes is refused before any bytes are sent."""
    info = weights(np.ones((1 << 16, 1)))
    m = server_info.max_request_bytes // (4 << 16) + 1  # Y alone is over the limit
    spec = pb.TensorSpec(name="x", dtype=pb.DTYPE_BF16, shape=[m, 1], xxh3=1)
    first = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=info.handle, x=spec))
    message = expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: read_stream(conn.logits_stream([first])))
    assert "max_request_bytes" in message, message
