"""Same-host shared memory (server --allow_shm) through the Python client."""

import os
import socket

import numpy as np
import pytest
from reference import bits, int_tensor, rne_bf16_bits, to_bf16
from test_auth import running_server

import logitd

pytestmark = pytest.mark.needs_server


def exact_logits(x, w):
    return x.astype(np.float64) @ w.astype(np.float64).T


def in_region(a, region):
    """True when the array is a view of the region's mapping (not a copy)."""
    return np.shares_memory(a, region.array(0, np.uint8, (region.nbytes,)))


def assert_same_bits(got, want):
    if want is None:
        assert got is None
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(bits(got), bits(want))


def test_logits_through_shared_memory_equal_the_streamed_ones(tmp_path):
    rng = np.random.default_rng(41)
    w = to_bf16(int_tensor(rng, (3000, 128)))
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            info = c.register_weights(w, name="shm head")
            handle = info.handle
            with c.register_shm(1 << 20) as region:
                assert region.handle and os.path.exists("/dev/shm" + region.name)
                for seed, m in ((1, 16), (2, 40)):
                    x = to_bf16(int_tensor(np.random.default_rng(seed), (m, 128)))
                    y = c.logits(x, handle, shm=region)
                    streamed = c.logits(x, handle)
                    assert y.dtype == np.float32 and y.shape == (m, 3000)
                    # Integer operands: the fp32 result is exact, and both paths give the same bits.
                    assert np.array_equal(y, exact_logits(x, w).astype(np.float32))
                    assert np.array_equal(y.view(np.uint32), streamed.view(np.uint32))
                yb = c.logits(x, handle, out_dtype="bf16", shm=region)
                assert yb.dtype == logitd.BF16
                assert np.array_equal(yb.view(np.uint16), c.logits(x, handle, out_dtype="bf16").view(np.uint16))
                # Without digests on either side: the same bits.
                unhashed = c.logits(x, handle, shm=region, verify=False)
                assert np.array_equal(unhashed.view(np.uint32), streamed.view(np.uint32))
                with pytest.raises(logitd.InvalidArgumentError, match="only with shm"):
                    c.logits(x, handle, verify=False)
                # Given the WeightInfo, Y's slot is sized from its V: the same bits.
                assert np.array_equal(c.logits(x, info, shm=region).view(np.uint32), streamed.view(np.uint32))
                # The result is a view of the region: the next call overwrites it.
                kept = y.copy()
                c.logits(to_bf16(int_tensor(np.random.default_rng(9), (40, 128))), handle, shm=region)
                assert not np.array_equal(y, kept)
                c.release_shm(region)
                assert region.handle is None
            assert not os.path.exists("/dev/shm" + region.name)


def test_bad_regions_are_refused_with_the_right_error(tmp_path):
    rng = np.random.default_rng(42)
    w = to_bf16(int_tensor(rng, (512, 64)))
    x = to_bf16(int_tensor(rng, (8, 64)))
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            info = c.register_weights(w)
            handle = info.handle
            with logitd.SharedRegion(4096) as unregistered:
                with pytest.raises(logitd.InvalidArgumentError, match="not registered"):
                    c.logits(x, handle, shm=unregistered)
            # Room for X but not for Y [8, 512] fp32: the server says so.
            with c.register_shm(4096) as small:
                with pytest.raises(logitd.InvalidArgumentError, match="y: shm bytes"):
                    c.logits(x, handle, shm=small)
                # Given the WeightInfo, the client knows Y's size and refuses before the call.
                with pytest.raises(logitd.InvalidArgumentError, match="has 4096 bytes, the call's tensors need"):
                    c.logits(x, info, shm=small)
                # The server still serves, and the region still works for what fits.
                assert c.logits(x[:1], handle, shm=small).shape == (1, 512)
                stale = small.handle
                c.release_shm(small)
                small.handle = stale
                with pytest.raises(logitd.NotFoundError):
                    c.logits(x, handle, shm=small)
                small.handle = None
            with pytest.raises(logitd.InvalidArgumentError, match="size > 0"):
                logitd.SharedRegion(0)
            with pytest.raises(logitd.InvalidArgumentError, match="name"):
                logitd.SharedRegion(64, name="no-slash")


def test_shared_memory_is_refused_without_allow_shm(tmp_path):
    with running_server(tmp_path) as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            with logitd.SharedRegion(4096) as region:
                with pytest.raises(logitd.FailedPreconditionError, match="allow_shm"):
                    c.register_shm(region)


def test_cast_through_shared_memory_equals_the_streamed_cast(tmp_path):
    rng = np.random.default_rng(43)
    # Any bit pattern: ties, subnormals, Inf and NaN payloads included.
    values = rng.integers(0, 2**32, size=(64, 300), dtype=np.uint64).astype(np.uint32).view(np.float32)
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            with c.register_shm(1 << 20) as region:
                out = c.cast_to_bf16(values, shm=region)
                assert out.dtype == logitd.BF16 and out.shape == values.shape
                assert in_region(out, region)
                np.testing.assert_array_equal(bits(out), rne_bf16_bits(values))
                assert_same_bits(out, c.cast_to_bf16(values))
                # Any shape, as streamed.
                grid = values[:4, :60].reshape(4, 3, 20)
                assert_same_bits(c.cast_to_bf16(grid, shm=region), c.cast_to_bf16(grid))
                # Without digests on either side: the same bits.
                unhashed = c.cast_to_bf16(values, shm=region, verify=False)
                np.testing.assert_array_equal(bits(unhashed), rne_bf16_bits(values))
                with pytest.raises(logitd.InvalidArgumentError, match="only with shm"):
                    c.cast_to_bf16(values, verify=False)
                # Input and output sizes are known: a region too small is refused before the call.
                with c.register_shm(4096) as small:
                    with pytest.raises(logitd.InvalidArgumentError, match="has 4096 bytes, the call's tensors need"):
                        c.cast_to_bf16(values[:8], shm=small)
                    assert_same_bits(c.cast_to_bf16(values[:2], shm=small), c.cast_to_bf16(values[:2]))
                    c.release_shm(small)
                c.release_shm(region)


def test_cross_entropy_through_shared_memory_equals_the_streamed_one(tmp_path):
    rng = np.random.default_rng(44)
    M, V, K = 24, 1000, 64
    # Integer operands: every logit is an exact fp32 integer, the same on both paths.
    w = to_bf16(int_tensor(rng, (V, K), -2, 2))
    x = to_bf16(int_tensor(rng, (M, K), -2, 2))
    targets = rng.integers(0, V, size=M).astype(np.int64)
    targets[[3, 11]] = -100
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            info = c.register_weights(w, name="shm ce head")
            with c.register_shm(1 << 20) as region:
                # A bare handle (dW gets the rest of the region) and the WeightInfo (dW sized exactly).
                for handle in (info.handle, info):
                    for reduction in ("none", "mean"):
                        for dx_dtype, t in (("bf16", targets), ("fp32", targets.astype(np.int32))):
                            kw = dict(reduction=reduction, want_lse=True, want_dx=True, want_dw=True, dx_dtype=dx_dtype)
                            got = c.cross_entropy(x, t, handle, shm=region, **kw)
                            want = c.cross_entropy(x, t, info.handle, **kw)
                            assert got.counted_tokens == want.counted_tokens == M - 2
                            assert got.loss.shape == ((M,) if reduction == "none" else (1,))
                            assert got.dw.shape == (V, K)
                            for a, b in zip(got[:4], want[:4]):
                                assert in_region(a, region)
                                assert_same_bits(a, b)
                            if reduction == "none":
                                assert np.all(got.loss[[3, 11]] == 0)
                            assert np.all(got.dx[[3, 11]] == 0)
                # The loss alone, and the sum.
                got = c.cross_entropy(x, targets, info.handle, reduction="sum", shm=region)
                want = c.cross_entropy(x, targets, info.handle, reduction="sum")
                assert got.lse is None and got.dx is None and got.dw is None
                assert_same_bits(got.loss, want.loss)
                # Without digests on either side: the same bits.
                kw = dict(reduction="none", want_lse=True, want_dx=True, want_dw=True)
                unhashed = c.cross_entropy(x, targets, info.handle, shm=region, verify=False, **kw)
                want = c.cross_entropy(x, targets, info.handle, **kw)
                for a, b in zip(unhashed[:4], want[:4]):
                    assert_same_bits(a, b)
                with pytest.raises(logitd.InvalidArgumentError, match="only with shm"):
                    c.cross_entropy(x, targets, info.handle, verify=False)
                # dW accumulated on the server: no slot for it, dX still in the region.
                kw = dict(want_dx=True, want_dw=True)
                got = c.cross_entropy(x, targets, info.handle, accumulate_dw=True, shm=region, **kw)
                assert got.dw is None and in_region(got.dx, region)
                want = c.cross_entropy(x, targets, info.handle, **kw)
                assert_same_bits(got.dx, want.dx)
                assert_same_bits(c.fetch_gradient(info.handle, zero_after=True).dw, want.dw)
                # The results are views of the region: the next call overwrites them.
                first = c.cross_entropy(x, targets, info.handle, reduction="none", shm=region)
                kept = first.loss.copy()
                c.cross_entropy(x[::-1].copy(), targets, info.handle, reduction="none", shm=region)
                assert not np.array_equal(first.loss, kept)
                c.release_shm(region)


def test_backward_through_shared_memory_equals_the_streamed_one(tmp_path):
    rng = np.random.default_rng(45)
    M, V, K = 8, 96, 512
    xi = int_tensor(rng, (M, K))
    wi = int_tensor(rng, (V, K))
    dyi = int_tensor(rng, (M, V))
    x = to_bf16(xi)
    dy = dyi.astype(np.float32)
    dx_exact = (dyi @ wi).astype(np.float32)
    dw_exact = (dyi.T @ xi).astype(np.float32)
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            h = c.register_weights(to_bf16(wi), name="shm backward head").handle
            with c.register_shm(1 << 20) as region:
                dx, dw = c.backward(dy, x, h, shm=region)
                assert dx.dtype == logitd.BF16 and dx.shape == (M, K)
                assert dw.dtype == np.float32 and dw.shape == (V, K)
                assert in_region(dx, region) and in_region(dw, region)
                # Integer operands: exact, and the bits of the streamed call.
                np.testing.assert_array_equal(bits(dx), rne_bf16_bits(dx_exact))
                np.testing.assert_array_equal(bits(dw), bits(dw_exact))
                for kw in (
                    {},
                    dict(dx_dtype="fp32", dw_dtype="bf16"),
                    dict(want_dw=False),
                    dict(want_dx=False),
                ):
                    got = c.backward(dy, x, h, shm=region, **kw)
                    want = c.backward(dy, x, h, **kw)
                    for a, b in zip(got, want):
                        assert_same_bits(a, b)
                # dY given as bf16 gives the same bits.
                got = c.backward(to_bf16(dyi), x, h, dx_dtype="fp32", shm=region)
                np.testing.assert_array_equal(bits(got[0]), bits(dx_exact))
                np.testing.assert_array_equal(bits(got[1]), bits(dw_exact))
                # Without digests on either side: the same bits.
                unhashed = c.backward(dy, x, h, shm=region, verify=False)
                np.testing.assert_array_equal(bits(unhashed[0]), rne_bf16_bits(dx_exact))
                np.testing.assert_array_equal(bits(unhashed[1]), bits(dw_exact))
                with pytest.raises(logitd.InvalidArgumentError, match="only with shm"):
                    c.backward(dy, x, h, verify=False)
                # dW accumulated on the server: only dX comes back, in the region.
                for _ in range(2):
                    dx, dw = c.backward(dy, x, h, accumulate_dw=True, shm=region)
                    assert dw is None
                    np.testing.assert_array_equal(bits(dx), rne_bf16_bits(dx_exact))
                g = c.fetch_gradient(h)
                assert g.accumulated_calls == 2
                np.testing.assert_array_equal(bits(g.dw), bits(2 * dw_exact))
                c.release_shm(region)


def test_inputs_that_are_views_of_the_region_are_read_before_being_overwritten(tmp_path):
    rng = np.random.default_rng(46)
    M, V, K = 8, 256, 64
    h_w = to_bf16(int_tensor(rng, (V, K)))
    dy = int_tensor(rng, (M, V)).astype(np.float32)
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            h = c.register_weights(h_w).handle
            with c.register_shm(1 << 20) as region:
                # X as an earlier call left it in the region: bf16 right after that call's fp32 input...
                x = c.cast_to_bf16(int_tensor(rng, (M, K)).astype(np.float32), shm=region)
                assert in_region(x, region)
                kept = x.copy()
                # ...where this call's dY [M, V] (laid out first, and larger) goes.
                got = c.backward(dy, x, h, shm=region)
                for a, b in zip(got, c.backward(dy, kept, h)):
                    assert_same_bits(a, b)
                c.release_shm(region)


def test_an_output_slot_too_small_is_the_servers_invalid_argument(tmp_path):
    rng = np.random.default_rng(47)
    M, V, K = 8, 512, 64
    w = to_bf16(int_tensor(rng, (V, K), -2, 2))
    x = to_bf16(int_tensor(rng, (M, K), -2, 2))
    targets = rng.integers(0, V, size=M).astype(np.int64)
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            info = c.register_weights(w)
            # Room for x, the targets, the loss and dX, but not for dW [512, 64] fp32.
            with c.register_shm(8192) as small:
                with pytest.raises(logitd.InvalidArgumentError) as e:
                    c.cross_entropy(x, targets, info.handle, want_dx=True, want_dw=True, shm=small)
                assert e.value.code_name == "INVALID_ARGUMENT"
                assert "dw: shm bytes" in e.value.message and "less than" in e.value.message
                # Given the WeightInfo, the client knows dW's size and refuses before the call.
                with pytest.raises(logitd.InvalidArgumentError, match="has 8192 bytes, the call's tensors need"):
                    c.cross_entropy(x, targets, info, want_dx=True, want_dw=True, shm=small)
                # The server still serves, and the region still works for what fits.
                got = c.cross_entropy(x, targets, info.handle, want_dx=True, shm=small)
                want = c.cross_entropy(x, targets, info.handle, want_dx=True)
                assert_same_bits(got.loss, want.loss)
                assert_same_bits(got.dx, want.dx)
                # Backward's outputs are sized from dY and X: too large is refused before the call.
                dy = int_tensor(rng, (M, V)).astype(np.float32)
                with pytest.raises(logitd.InvalidArgumentError, match="has 8192 bytes, the call's tensors need"):
                    c.backward(dy, x, info.handle, shm=small)
                c.release_shm(small)


def test_a_region_not_registered_is_refused_before_any_call(tmp_path):
    rng = np.random.default_rng(48)
    x = to_bf16(int_tensor(rng, (4, 64)))
    dy = int_tensor(rng, (4, 32)).astype(np.float32)
    targets = np.array([0, 1, 2, 3], dtype=np.int64)
    values = np.arange(16, dtype=np.float32)

    def every_call(c, handle, region):
        yield lambda: c.logits(x, handle, shm=region)
        yield lambda: c.backward(dy, x, handle, shm=region)
        yield lambda: c.cross_entropy(x, targets, handle, want_dx=True, want_dw=True, shm=region)
        yield lambda: c.cast_to_bf16(values, shm=region)

    # Nothing listens here: a call that went out would fail UNAVAILABLE instead.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = "127.0.0.1:%d" % s.getsockname()[1]
    with logitd.Client(nobody, timeout=10) as c:
        with logitd.SharedRegion(1 << 16) as unregistered:
            for call in every_call(c, "no-such-handle", unregistered):
                with pytest.raises(logitd.InvalidArgumentError, match="not registered"):
                    call()
            for call in every_call(c, "no-such-handle", bytearray(64)):
                with pytest.raises(logitd.InvalidArgumentError, match="expected a logitd.SharedRegion, got bytearray"):
                    call()

    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            h = c.register_weights(to_bf16(int_tensor(rng, (32, 64)))).handle
            with c.register_shm(1 << 16) as region:
                assert c.cast_to_bf16(values, shm=region).shape == (16,)
                # Released: the client no longer holds a handle for it.
                c.release_shm(region)
                for call in every_call(c, h, region):
                    with pytest.raises(logitd.InvalidArgumentError, match="not registered"):
                        call()
