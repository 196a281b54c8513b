"""Backward (G = bf16(dY) once; dX = G.W; dW = G^T.X), FetchGradient and ZeroGradient."""

import grpc
import numpy as np
import pytest

from protocol import Tensor, as_bf16, check_output, chunks_of, expected_order, expect_error, names, read_stream
from stubs import pb


def gradients(dy, x, w):
    """Exact dX and dW in float64 of the backward contract: G = bf16(dY)."""
    g = as_bf16(np.asarray(dy, np.float32)).astype(np.float64)
    return g @ np.asarray(w, np.float64), g.T @ np.asarray(x, np.float64)


@pytest.mark.parametrize(
    "dx_dtype,dw_dtype",
    [
        (pb.DTYPE_UNSPECIFIED, pb.DTYPE_UNSPECIFIED),
        (pb.DTYPE_FP32, pb.DTYPE_BF16),
        (pb.DTYPE_BF16, pb.DTYPE_FP32),
    ],
    ids=["defaults", "fp32-dx-bf16-dw", "bf16-dx-fp32-dw"],
)
def test_backward_exact(conn, weights, dx_dtype, dw_dtype):
    """dX and dW of integer operands equal the exact sums, rounded once where bf16 is asked for."""
    rng = np.random.default_rng(301)
    m, v, k = 9, 130, 40
    w = rng.integers(-8, 9, size=(v, k))
    x = rng.integers(-8, 9, size=(m, k))
    dy = rng.integers(-300, 301, size=(m, v)).astype(np.float32)  # not all exact in bf16
    info = weights(w)
    got = conn.backward(info.handle, dy, x, want_dx=True, want_dw=True, dx_dtype=dx_dtype, dw_dtype=dw_dtype)
    assert got.order == expected_order(["dx", "dw"], False)
    dx_spec, dw_spec = got.result.dx, got.result.dw
    want_dx_dtype = pb.DTYPE_BF16 if dx_dtype == pb.DTYPE_UNSPECIFIED else dx_dtype
    want_dw_dtype = pb.DTYPE_FP32 if dw_dtype == pb.DTYPE_UNSPECIFIED else dw_dtype
    assert (dx_spec.name, dx_spec.dtype, list(dx_spec.shape)) == ("dx", want_dx_dtype, [m, k])
    assert (dw_spec.name, dw_spec.dtype, list(dw_spec.shape)) == ("dw", want_dw_dtype, [v, k])
    dx, dw = gradients(dy, x, w)
    dx, dw = dx.astype(np.float32), dw.astype(np.float32)
    if want_dx_dtype == pb.DTYPE_BF16:
        dx = as_bf16(dx)
    if want_dw_dtype == pb.DTYPE_BF16:
        dw = as_bf16(dw)
    np.testing.assert_array_equal(check_output(got, dx_spec, False), dx)
    np.testing.assert_array_equal(check_output(got, dw_spec, False), dw)


def test_backward_bf16_dy_and_single_output(conn, weights):
    """dY may be BF16; asking for dX only streams dX only."""
    rng = np.random.default_rng(302)
    w = rng.integers(-8, 9, size=(64, 16))
    x = rng.integers(-8, 9, size=(5, 16))
    dy = rng.integers(-8, 9, size=(5, 64))
    info = weights(w)
    got = conn.backward(info.handle, dy, x, dy_dtype=pb.DTYPE_BF16, want_dx=True, dx_dtype=pb.DTYPE_FP32)
    assert got.order == expected_order(["dx"], False)
    assert not got.result.HasField("dw")
    np.testing.assert_array_equal(check_output(got, got.result.dx, False), gradients(dy, x, w)[0].astype(np.float32))


def test_backward_chunks_of_dy_and_x_may_interleave(conn, weights):
    """The request's tensors may be interleaved chunk by chunk, each in its own order."""
    rng = np.random.default_rng(303)
    w = rng.integers(-8, 9, size=(64, 32))
    x = rng.integers(-8, 9, size=(6, 32))
    dy = rng.integers(-8, 9, size=(6, 64)).astype(np.float32)
    info = weights(w)
    dyt, xt = Tensor("dy", pb.DTYPE_FP32, dy), Tensor("x", pb.DTYPE_BF16, x)
    first = pb.BackwardRequest(
        header=pb.BackwardHeader(weight_handle=info.handle, dy=dyt.spec(), x=xt.spec(), want_dx=True, want_dw=True)
    )
    a, b = chunks_of(dyt, 100), chunks_of(xt, 30)
    mixed = [c for pair in zip(a, b) for c in pair] + a[len(b) :] + b[len(a) :]
    got = read_stream(conn.backward_stream([first] + [pb.BackwardRequest(chunk=c) for c in mixed]))
    dx, dw = gradients(dy, x, w)
    np.testing.assert_array_equal(check_output(got, got.result.dx, False), as_bf16(dx.astype(np.float32)))
    np.testing.assert_array_equal(check_output(got, got.result.dw, False), dw.astype(np.float32))


def test_backward_without_any_gradient_is_invalid_argument(conn, weights):
    """Neither want_dx nor want_dw is INVALID_ARGUMENT naming them."""
    info = weights(np.ones((8, 4)))
    message = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, conn.backward, info.handle, np.ones((2, 8)), np.ones((2, 4))
    )
    assert "want_dx" in message, message


def test_backward_dy_shape_mismatch_is_invalid_argument(conn, weights):
    """dY's V must equal the weight's: INVALID_ARGUMENT naming dy."""
    info = weights(np.ones((8, 4)))
    message = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, conn.backward, info.handle, np.ones((2, 7)), np.ones((2, 4)), want_dx=True
    )
    assert names(message, "dy"), message


def test_accumulate_fetch_and_zero(conn, weights):
    """accumulate_dw adds dW into the server's fp32 buffer; FetchGradient reads it.

    zero_after_fetch and ZeroGradient clear it (values and call count).
    """
    rng = np.random.default_rng(304)
    v, k = 70, 24
    w = rng.integers(-8, 9, size=(v, k))
    info = weights(w)
    total = np.zeros((v, k))
    for step in range(2):
        x = rng.integers(-8, 9, size=(4, k))
        dy = rng.integers(-8, 9, size=(4, v)).astype(np.float32)
        got = conn.backward(info.handle, dy, x, want_dw=True, accumulate_dw=True)
        assert got.order == ["result"], "an accumulated dW is not streamed back"
        assert not got.result.HasField("dw")
        total += gradients(dy, x, w)[1]

    entry = next(e for e in conn.list_weights() if e.handle == info.handle)
    assert entry.has_gradient, "ListWeights does not report the gradient buffer"
    assert entry.bytes >= info.bytes + v * k * 4, "the fp32 gradient buffer is not counted in WeightInfo.bytes"

    fetched = conn.fetch_gradient(info.handle)
    assert fetched.order == expected_order(["dw"], False)
    assert fetched.result.accumulated_calls == 2
    spec = fetched.result.dw
    assert (spec.name, spec.dtype, list(spec.shape)) == ("dw", pb.DTYPE_FP32, [v, k])
    np.testing.assert_array_equal(check_output(fetched, spec, False), total.astype(np.float32))

    fetched = conn.fetch_gradient(info.handle, zero_after_fetch=True)
    np.testing.assert_array_equal(check_output(fetched, fetched.result.dw, False), total.astype(np.float32))
    fetched = conn.fetch_gradient(info.handle)
    assert fetched.result.accumulated_calls == 0
    assert not np.any(check_output(fetched, fetched.result.dw, False)), "zero_after_fetch left values"

    x = rng.integers(-8, 9, size=(4, k))
    dy = rng.integers(-8, 9, size=(4, v)).astype(np.float32)
    conn.backward(info.handle, dy, x, want_dw=True, accumulate_dw=True)
    conn.zero_gradient(info.handle)
    fetched = conn.fetch_gradient(info.handle)
    assert fetched.result.accumulated_calls == 0
    assert not np.any(check_output(fetched, fetched.result.dw, False)), "ZeroGradient left values"


def test_accumulate_with_bf16_dw_is_invalid_argument(conn, weights):
    """accumulate_dw adds into an fp32 buffer: dw_dtype BF16 is INVALID_ARGUMENT naming dw_dtype."""
    info = weights(np.ones((8, 4)))
    message = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        conn.backward,
        info.handle,
        np.ones((2, 8)),
        np.ones((2, 4)),
        want_dw=True,
        accumulate_dw=True,
        dw_dtype=pb.DTYPE_BF16,
    )
    assert "dw_dtype" in message, message
