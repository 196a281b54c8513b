"""Cast: the server's fp32 -> bf16 conversion, round to nearest even, bit for bit."""

import grpc
import numpy as np

from protocol import Tensor, check_output, expected_order, expect_error, names, read_stream, to_bf16_bits
from stubs import pb

SPECIAL = np.array(
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        256.0,
        257.0,  # tie: rounds down to even 256
        259.0,  # tie: rounds up to even 260
        258.0,
        32769.0,
        np.inf,
        -np.inf,
        np.finfo(np.float32).max,  # rounds up to infinity
        np.finfo(np.float32).tiny,
        np.float32(1e-40),  # subnormal
        -np.float32(3e-39),
    ],
    dtype=np.float32,
)


def test_cast_rounds_to_nearest_even(conn):
    """Every output is the RNE bf16 of its input: ties, infinities, overflow and subnormals included."""
    rng = np.random.default_rng(401)
    values = np.concatenate([SPECIAL, rng.integers(-(1 << 20), 1 << 20, size=5000).astype(np.float32)])
    values = values.reshape(5, -1)
    got = conn.cast(values)
    assert got.order == expected_order(["output"], False)
    spec = got.result.output
    assert (spec.name, spec.dtype, list(spec.shape)) == ("output", pb.DTYPE_BF16, list(values.shape))
    check_output(got, spec, False)
    bits = np.frombuffer(bytes(got.tensors["output"]), dtype="<u2").reshape(values.shape)
    np.testing.assert_array_equal(bits, to_bf16_bits(values))


def test_cast_keeps_nan(conn):
    """A NaN input gives a NaN output."""
    got = conn.cast(np.array([np.nan, -np.nan, 1.0], dtype=np.float32))
    bits = np.frombuffer(bytes(got.tensors["output"]), dtype="<u2")
    assert all((b & 0x7F80) == 0x7F80 and (b & 0x7F) != 0 for b in bits[:2]), [hex(b) for b in bits]
    assert bits[2] == 0x3F80


def test_cast_of_rank_1_and_rank_3(conn):
    """Cast takes any shape and returns the input's shape."""
    for shape in [(7,), (2, 3, 4)]:
        values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        got = conn.cast(values)
        assert list(got.result.output.shape) == list(shape)
        np.testing.assert_array_equal(check_output(got, got.result.output, False), values)


def test_cast_of_bf16_input_is_invalid_argument(conn):
    """The input must be FP32: BF16 is INVALID_ARGUMENT naming input."""
    t = Tensor("input", pb.DTYPE_BF16, np.ones(4))
    messages = [
        pb.CastRequest(header=pb.CastHeader(input=t.spec())),
        pb.CastRequest(chunk=pb.TensorChunk(name="input", data=t.data)),
    ]
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: read_stream(conn.cast_stream(messages)))
    assert names(message, "input"), message
