"""CrossEntropy: fused loss, lse, dX and dW over Y = X . W^T.

The problems are built so that every token's logits are equal (W's first
column is constant, X is zero outside its first column): the softmax is then
exactly 1/V with V a power of two, and the cast gradient G = bf16(dL/dz *
scale) is exact, so dX and dW are exact sums. Loss and lse involve a
logarithm and are compared to 1e-6 relative.
"""

import math

import grpc
import numpy as np
import pytest

from protocol import Tensor, check_output, chunks_of, expected_order, expect_error, read_stream
from stubs import pb

V, K = 8, 4
IGNORE = -100


def problem(rng, m):
    w = np.concatenate([np.full((V, 1), 2.0), rng.integers(-4, 5, size=(V, K - 1))], axis=1)
    x = np.zeros((m, K))
    x[:, 0] = rng.integers(-3, 4, size=m)
    return w, x


def reference(w, x, targets, scale):
    """Per-token loss and lse, dX and dW of the uniform-softmax problem, in float64."""
    y = x @ w.T
    lse = y[:, 0] + math.log(V)
    counted = targets != IGNORE
    loss = np.where(counted, math.log(V), 0.0)
    g = np.full((len(targets), V), 1.0 / V)
    g[np.arange(len(targets))[counted], targets[counted]] -= 1.0
    g[~counted] = 0.0
    g *= scale
    return loss, lse, g @ w, g.T @ x


@pytest.mark.parametrize(
    "reduction,targets_dtype",
    [(pb.REDUCTION_NONE, pb.DTYPE_INT64), (pb.REDUCTION_SUM, pb.DTYPE_INT32), (pb.REDUCTION_MEAN, pb.DTYPE_INT64)],
    ids=["none-int64", "sum-int32", "mean-int64"],
)
def test_cross_entropy_loss_and_exact_gradients(conn, weights, reduction, targets_dtype):
    """Loss, lse, dX and dW of each reduction; the gradients bit for bit."""
    rng = np.random.default_rng(501)
    m = 4
    w, x = problem(rng, m)
    targets = rng.integers(0, V, size=m)
    info = weights(w)
    got = conn.cross_entropy(
        info.handle,
        x,
        targets,
        targets_dtype=targets_dtype,
        reduction=reduction,
        want_lse=True,
        want_dx=True,
        want_dw=True,
        dx_dtype=pb.DTYPE_FP32,
    )
    assert got.order == expected_order(["loss", "lse", "dx", "dw"], False)
    result = got.result
    assert result.counted_tokens == m
    scale = 1.0 / m if reduction == pb.REDUCTION_MEAN else 1.0
    loss, lse, dx, dw = reference(w, x, targets, scale)
    got_loss = check_output(got, result.loss, False)
    if reduction == pb.REDUCTION_NONE:
        assert list(result.loss.shape) == [m]
        np.testing.assert_allclose(got_loss, loss, rtol=1e-6)
    else:
        assert list(result.loss.shape) == [1]
        want = loss.sum() if reduction == pb.REDUCTION_SUM else loss.mean()
        np.testing.assert_allclose(got_loss, [want], rtol=1e-6)
    np.testing.assert_allclose(check_output(got, result.lse, False), lse, rtol=1e-6)
    assert (result.dx.dtype, list(result.dx.shape)) == (pb.DTYPE_FP32, [m, K])
    np.testing.assert_array_equal(check_output(got, result.dx, False), dx.astype(np.float32))
    assert (result.dw.dtype, list(result.dw.shape)) == (pb.DTYPE_FP32, [V, K])
    np.testing.assert_array_equal(check_output(got, result.dw, False), dw.astype(np.float32))


def test_ignored_tokens_count_nothing(conn, weights):
    """Tokens whose target is ignore_index have no loss and no gradient and are not counted."""
    rng = np.random.default_rng(502)
    w, x = problem(rng, 5)
    targets = np.array([3, IGNORE, 0, 7, IGNORE])
    info = weights(w)
    got = conn.cross_entropy(info.handle, x, targets, reduction=pb.REDUCTION_NONE, want_dx=True)
    assert got.order == expected_order(["loss", "dx"], False)
    assert got.result.counted_tokens == 3
    loss, _, dx, _ = reference(w, x, targets, 1.0)
    np.testing.assert_allclose(check_output(got, got.result.loss, False), loss, rtol=1e-6)
    assert got.result.dx.dtype == pb.DTYPE_BF16, "dx_dtype unspecified means BF16"
    np.testing.assert_array_equal(check_output(got, got.result.dx, False), dx.astype(np.float32))


def test_custom_ignore_index(conn, weights):
    """ignore_index set explicitly replaces the default -100."""
    rng = np.random.default_rng(503)
    w, x = problem(rng, 3)
    info = weights(w)
    got = conn.cross_entropy(info.handle, x, np.array([1, 5, 2]), ignore_index=5, reduction=pb.REDUCTION_SUM)
    assert got.result.counted_tokens == 2
    np.testing.assert_allclose(check_output(got, got.result.loss, False), [2 * math.log(V)], rtol=1e-6)


def test_accumulated_dw_goes_to_the_gradient_buffer(conn, weights):
    """accumulate_dw adds dW into the buffer FetchGradient reads, and streams nothing for it."""
    rng = np.random.default_rng(504)
    w, x = problem(rng, 4)
    targets = rng.integers(0, V, size=4)
    info = weights(w)
    got = conn.cross_entropy(info.handle, x, targets, reduction=pb.REDUCTION_SUM, want_dw=True, accumulate_dw=True)
    assert got.order == expected_order(["loss"], False)
    fetched = conn.fetch_gradient(info.handle)
    assert fetched.result.accumulated_calls == 1
    np.testing.assert_array_equal(
        check_output(fetched, fetched.result.dw, False), reference(w, x, targets, 1.0)[3].astype(np.float32)
    )


@pytest.mark.parametrize("bad", [V, -1])
def test_target_out_of_range_is_invalid_argument(conn, weights, bad):
    """A target outside [0, V) that is not ignore_index is INVALID_ARGUMENT naming the element."""
    rng = np.random.default_rng(505)
    w, x = problem(rng, 3)
    info = weights(w)
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, conn.cross_entropy, info.handle, x, np.array([0, bad, 1]))
    assert "targets[1]" in message, message


def test_targets_of_wrong_length_are_invalid_argument(conn, weights):
    """targets must be [M]: another length is INVALID_ARGUMENT naming targets."""
    rng = np.random.default_rng(506)
    w, x = problem(rng, 3)
    info = weights(w)
    xt, tt = Tensor("x", pb.DTYPE_BF16, x), Tensor("targets", pb.DTYPE_INT64, np.array([0, 1]))
    first = pb.CrossEntropyRequest(
        header=pb.CrossEntropyHeader(weight_handle=info.handle, x=xt.spec(), targets=tt.spec())
    )
    body = [pb.CrossEntropyRequest(chunk=c) for c in chunks_of(xt) + chunks_of(tt)]
    message = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, lambda: read_stream(conn.cross_entropy_stream([first] + body))
    )
    assert "targets" in message, message


def test_negative_z_loss_is_invalid_argument(conn, weights):
    """z_loss must be finite and >= 0: INVALID_ARGUMENT naming z_loss."""
    rng = np.random.default_rng(507)
    w, x = problem(rng, 2)
    info = weights(w)
    message = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, conn.cross_entropy, info.handle, x, np.array([0, 1]), z_loss=-1.0
    )
    assert "z_loss" in message, message
