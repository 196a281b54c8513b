"""The Python client against a real logitd (cpu backend): numerics, weights, gradients, chunking, errors."""

import dataclasses
import time

import numpy as np
import pytest
import xxhash
from reference import bits, gamma, int_tensor, rne_bf16_bits, to_bf16

import logitd

pytestmark = pytest.mark.needs_server


def rng_for(seed):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------
# Server info and weights


def test_info(client, server):
    info = client.info()
    assert isinstance(info, logitd.ServerInfo)
    assert info.backend == "cpu"
    assert info.version
    assert info.build_id
    assert info.chunk_bytes == 64 << 10
    # A server streaming 64 KiB chunks sends nothing near gRPC's 4 MiB default limit.
    assert info.max_send_message_bytes == 4 << 20
    assert info.request_digest_last
    assert info.max_request_chunk_bytes == 4 << 20
    assert info.max_receive_message_bytes == (4 << 20) + 4096
    assert info.max_request_bytes > 0
    assert info.weight_budget_bytes > 0
    assert "OpenBLAS" in info.blas_version
    as_dict = dataclasses.asdict(info)
    assert as_dict["backend"] == "cpu"


def test_register_same_bytes_twice_shares_the_handle(client, weights):
    rng = rng_for(101)
    w = to_bf16(rng.standard_normal((96, 64)))
    first = weights(w, name="lm_head.weight")
    assert isinstance(first, logitd.WeightInfo)
    assert first.shape == (96, 64)
    assert first.name == "lm_head.weight"
    assert first.xxh3 == xxhash.xxh3_64_intdigest(w.tobytes())
    assert first.xxh3 == logitd.digest(w)
    assert not first.already_registered
    assert first.registrations == 1
    assert first.bytes >= w.nbytes

    second = weights(w.copy(), name="another name")
    assert second.handle == first.handle
    assert second.already_registered
    assert second.registrations == 2
    assert second.name == "lm_head.weight"  # the first name is kept

    listed = {x.handle: x for x in client.list_weights()}
    assert listed[first.handle].registrations == 2

    r = client.release_weights(first.handle)
    assert r.registrations_left == 1
    assert r.bytes_freed == 0
    r = client.release_weights(first)  # a WeightInfo works as a handle too
    assert r.registrations_left == 0
    assert r.bytes_freed >= w.nbytes
    assert first.handle not in {x.handle for x in client.list_weights()}
    with pytest.raises(logitd.NotFoundError):
        client.release_weights(first.handle)


def test_force_release_drops_every_registration(client, weights):
    w = to_bf16(rng_for(102).standard_normal((32, 64)))
    h = weights(w).handle
    weights(w)
    weights(w)
    r = client.release_weights(h, force=True)
    assert r.registrations_left == 0
    assert r.bytes_freed > 0
    with pytest.raises(logitd.NotFoundError):
        client.logits(to_bf16(np.ones((1, 64))), h)


# ---------------------------------------------------------------------------
# Logits


def test_logits_integer_exact(client, weights):
    rng = rng_for(1)
    M, V, K = 16, 384, 512
    xi = int_tensor(rng, (M, K))
    wi = int_tensor(rng, (V, K))
    exact = xi @ wi.T  # int64; |sum| <= 512 * 64 < 2^24, so fp32 holds it exactly
    h = weights(to_bf16(wi)).handle
    x = to_bf16(xi)

    y = client.logits(x, h)
    assert y.dtype == np.float32 and y.shape == (M, V)
    np.testing.assert_array_equal(bits(y), bits(exact.astype(np.float32)))

    y16 = client.logits(x, h, out_dtype="bf16")
    assert y16.dtype == logitd.BF16 and y16.shape == (M, V)
    np.testing.assert_array_equal(bits(y16), rne_bf16_bits(exact.astype(np.float32)))
    # Some sums need more than bf16's 8 significant bits: the test does exercise rounding.
    assert np.any(bits(y16) != (bits(exact.astype(np.float32)) >> 16))

    # A power-of-two alpha scales exactly.
    yq = client.logits(x, h, alpha=0.25)
    np.testing.assert_array_equal(bits(yq), bits((exact / 4).astype(np.float32)))

    # numpy and torch-style dtype spellings are accepted.
    np.testing.assert_array_equal(bits(client.logits(x, h, out_dtype=np.float32)), bits(y))
    np.testing.assert_array_equal(bits(client.logits(x, h, out_dtype=logitd.BF16)), bits(y16))


def test_logits_random_within_fp32_bound(client, weights):
    rng = rng_for(1234)
    M, V, K = 16, 512, 1024
    x = to_bf16(rng.standard_normal((M, K)))
    w = to_bf16(rng.standard_normal((V, K)))
    h = weights(w).handle
    x64 = x.astype(np.float64)
    w64 = w.astype(np.float64)
    ref = x64 @ w64.T
    bound = gamma(K) * (np.abs(x64) @ np.abs(w64).T)

    y = client.logits(x, h)
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= bound), "max err/bound %g" % np.max(err / bound)

    # bf16 out is the same accumulator rounded once, and far less accurate.
    y16 = client.logits(x, h, out_dtype="bf16")
    np.testing.assert_array_equal(bits(y16), rne_bf16_bits(y))
    err16 = np.abs(y16.astype(np.float64) - ref)
    assert np.max(err16) > 50 * np.max(err)


def test_logits_in_row_blocks_give_the_bits_of_the_whole_call(client, weights):
    # 777 rows: blocks of 256 rows, the last one taking the rest; the chunks
    # on both sides fall inside rows. Random values, so every bit counts.
    rng = rng_for(4321)
    M, V, K = 777, 96, 200
    x = to_bf16(rng.standard_normal((M, K)))
    h = weights(to_bf16(rng.standard_normal((V, K)))).handle
    for out in ("fp32", "bf16"):
        whole = client.logits(x, h, out_dtype=out, alpha=0.3, pipeline=False)
        blocks = client.logits(x, h, out_dtype=out, alpha=0.3, pipeline=True)
        np.testing.assert_array_equal(bits(blocks), bits(whole))


def test_logprobs_in_row_blocks_give_the_bits_of_the_whole_call(client, weights):
    # 777 rows in blocks of 256; the targets travel before X, int32 with ignored rows.
    rng = rng_for(4322)
    M, V, K = 777, 96, 200
    x = to_bf16(rng.standard_normal((M, K)))
    h = weights(to_bf16(rng.standard_normal((V, K)))).handle
    targets = rng.integers(0, V, size=M).astype(np.int32)
    targets[::9] = -100
    asked = dict(top_k=4, want_entropy=True, want_lse=True, want_rank=True, temperature=0.9)
    whole = client.logprobs(x, h, targets=targets, pipeline=False, **asked)
    blocks = client.logprobs(x, h, targets=targets, pipeline=True, **asked)
    for name in ("logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank"):
        np.testing.assert_array_equal(getattr(blocks, name), getattr(whole, name), err_msg=name)
        assert getattr(blocks, name).tobytes() == getattr(whole, name).tobytes(), name


def test_cross_entropy_in_row_blocks_gives_the_bits_of_the_whole_call(client, weights):
    rng = rng_for(4323)
    M, V, K = 600, 96, 200
    x = to_bf16(rng.standard_normal((M, K)))
    h = weights(to_bf16(rng.standard_normal((V, K)))).handle
    targets = rng.integers(0, V, size=M).astype(np.int64)
    targets[::7] = -100
    for reduction in ("none", "mean"):
        asked = dict(reduction=reduction, want_lse=True, want_dx=True, dx_dtype="fp32", z_loss=1e-3)
        whole = client.cross_entropy(x, targets, h, pipeline=False, **asked)
        blocks = client.cross_entropy(x, targets, h, pipeline=True, **asked)
        for name in ("loss", "lse", "dx"):
            assert getattr(blocks, name).tobytes() == getattr(whole, name).tobytes(), (reduction, name)
        assert blocks.counted_tokens == whole.counted_tokens


def test_logits_spread_over_connections_gives_the_bits_of_one_call(client, weights):
    # 1029 rows are 5 blocks of the cpu backend's 256 rows: 2 connections take
    # 768 + 261 rows, 3 take 512 + 512 + 5, 8 take five parts.
    rng = rng_for(4324)
    M, V, K = 1029, 96, 200
    x = to_bf16(rng.standard_normal((M, K)))
    info = weights(to_bf16(rng.standard_normal((V, K))))
    assert info.logits_block_rows_fp32 == 256
    for out in ("fp32", "bf16"):
        one = client.logits(x, info.handle, out_dtype=out, alpha=0.3)
        for connections in (2, 3, 8):
            for handle in (info, info.handle):  # the WeightInfo says the block; a handle asks the server
                spread = client.logits(x, handle, out_dtype=out, alpha=0.3, connections=connections)
                assert spread.shape == one.shape
                assert spread.tobytes() == one.tobytes(), (out, connections)
    # Fewer rows than a block: one call.
    assert client.logits(x[:100], info, connections=4).shape == (100, V)
    with pytest.raises(logitd.InvalidArgumentError, match="connections"):
        client.logits(x, info, connections=0)
    with pytest.raises(logitd.InvalidArgumentError, match="connections"):
        client.logits(x, info, connections=65)
    with pytest.raises(logitd.NotFoundError):
        client.logits(x, "w-not-registered", connections=2)


def test_logprobs_spread_over_connections_gives_the_bits_of_one_call(client, weights):
    # 1029 rows, the cpu backend's blocks of 256: every output of every row
    # keeps the bits of one call, targets int32 or int64, with or without them.
    rng = rng_for(4325)
    M, V, K = 1029, 96, 200
    x = to_bf16(rng.standard_normal((M, K)))
    info = weights(to_bf16(rng.standard_normal((V, K))))
    assert info.logprobs_block_rows == 256
    names = ("logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank")
    asked = dict(top_k=3, want_entropy=True, want_lse=True, want_rank=True, temperature=0.8)
    for dtype in (np.int32, np.int64):
        targets = rng.integers(0, V, size=M).astype(dtype)
        targets[::11] = -100
        one = client.logprobs(x, info.handle, targets=targets, **asked)
        for connections in (2, 3, 8):
            for handle in (info, info.handle):
                spread = client.logprobs(x, handle, targets=targets, connections=connections, **asked)
                for name in names:
                    assert getattr(spread, name).tobytes() == getattr(one, name).tobytes(), (connections, name)
    one = client.logprobs(x, info, top_k=2, want_lse=True)
    spread = client.logprobs(x, info, top_k=2, want_lse=True, connections=4)
    assert spread.logprob is None and spread.rank is None and spread.entropy is None
    for name in ("lse", "topk_ids", "topk_logprobs"):
        assert getattr(spread, name).tobytes() == getattr(one, name).tobytes(), name
    # A bad target in the second part: the server's INVALID_ARGUMENT, the part's rows named.
    bad = np.full(M, 3, dtype=np.int64)
    bad[900] = V
    with pytest.raises(logitd.InvalidArgumentError, match=r"rows \[768, 1029\) of 1029"):
        client.logprobs(x, info, targets=bad, connections=2)
    with pytest.raises(logitd.InvalidArgumentError, match="connections"):
        client.logprobs(x, info, connections=65)


def test_a_spread_calls_failing_part_cancels_the_others(client, weights, started_server):
    # Two parts of 390 blocks of 256 rows (25 MB of X each); the second has a
    # bad target in its first block, so it fails while the first still
    # uploads. The first is cancelled, not run to its end (the server logs it
    # CANCELLED), and the call's error is the failing part's.
    rng = rng_for(4326)
    M, V, K = 2 * 390 * 256, 96, 256
    x = to_bf16(rng.standard_normal((M, K), dtype=np.float32))
    info = weights(to_bf16(rng.standard_normal((V, K))))
    assert info.logprobs_block_rows == 256
    targets = np.full(M, 3, dtype=np.int32)
    targets[M // 2 + 5] = V

    def cancelled():
        return started_server.log_text().count("rpc=LogProbs code=CANCELLED")

    before = cancelled()
    with pytest.raises(logitd.InvalidArgumentError, match=r"rows \[99840, 199680\) of 199680"):
        client.logprobs(x, info, targets=targets, connections=2)
    until = time.monotonic() + 10
    while cancelled() == before and time.monotonic() < until:
        time.sleep(0.01)
    assert cancelled() == before + 1, started_server.log_text()[-2000:]


def test_logits_accepts_non_contiguous_input(client, weights):
    rng = rng_for(7)
    wi = int_tensor(rng, (64, 128))
    xi = int_tensor(rng, (128, 10))
    h = weights(to_bf16(wi)).handle
    x = to_bf16(xi).T  # a transposed view: [10, 128], not C-contiguous
    assert not x.flags.c_contiguous
    y = client.logits(x, h)
    np.testing.assert_array_equal(y, (xi.T @ wi.T).astype(np.float32))


# ---------------------------------------------------------------------------
# Backward


def test_backward_integer_exact(client, weights):
    rng = rng_for(2)
    M, V, K = 8, 96, 512
    xi = int_tensor(rng, (M, K))
    wi = int_tensor(rng, (V, K))
    dyi = int_tensor(rng, (M, V))
    h = weights(to_bf16(wi)).handle
    x = to_bf16(xi)
    dx_exact = (dyi @ wi).astype(np.float32)  # |.| <= 96 * 64
    dw_exact = (dyi.T @ xi).astype(np.float32)  # |.| <= 8 * 64

    dx, dw = client.backward(dyi.astype(np.float32), x, h)
    assert dx.dtype == logitd.BF16 and dx.shape == (M, K)
    assert dw.dtype == np.float32 and dw.shape == (V, K)
    np.testing.assert_array_equal(bits(dx), rne_bf16_bits(dx_exact))
    np.testing.assert_array_equal(bits(dw), bits(dw_exact))

    dx32, dw16 = client.backward(dyi.astype(np.float32), x, h, dx_dtype="fp32", dw_dtype="bf16")
    assert dx32.dtype == np.float32 and dw16.dtype == logitd.BF16
    np.testing.assert_array_equal(bits(dx32), bits(dx_exact))
    np.testing.assert_array_equal(bits(dw16), rne_bf16_bits(dw_exact))

    # dY given as bf16 gives the same bits.
    dx_b, dw_b = client.backward(to_bf16(dyi), x, h, dx_dtype="fp32")
    np.testing.assert_array_equal(bits(dx_b), bits(dx_exact))
    np.testing.assert_array_equal(bits(dw_b), bits(dw_exact))

    only_dx, none_dw = client.backward(dyi.astype(np.float32), x, h, want_dw=False)
    assert none_dw is None
    np.testing.assert_array_equal(bits(only_dx), bits(dx))
    none_dx, only_dw = client.backward(dyi.astype(np.float32), x, h, want_dx=False)
    assert none_dx is None
    np.testing.assert_array_equal(bits(only_dw), bits(dw))


def test_backward_casts_dy_once_with_rne(client, weights):
    """fp32 dY gives exactly the bits of bf16(dY) sent as bf16: G = bf16(dY), one RNE cast."""
    rng = rng_for(3)
    M, V, K = 8, 200, 256
    x = to_bf16(rng.standard_normal((M, K)))
    h = weights(to_bf16(rng.standard_normal((V, K)))).handle
    dy = rng.standard_normal((M, V)).astype(np.float32)
    g = rne_bf16_bits(dy).view(logitd.BF16)
    dx_a, dw_a = client.backward(dy, x, h, dx_dtype="fp32")
    dx_b, dw_b = client.backward(g, x, h, dx_dtype="fp32")
    np.testing.assert_array_equal(bits(dx_a), bits(dx_b))
    np.testing.assert_array_equal(bits(dw_a), bits(dw_b))


def test_accumulate_then_fetch(client, weights):
    rng = rng_for(4)
    M, V, K = 8, 64, 128
    xi = [int_tensor(rng, (M, K)) for _ in range(3)]
    dyi = [int_tensor(rng, (M, V)) for _ in range(3)]
    wi = int_tensor(rng, (V, K))
    info = weights(to_bf16(wi))
    h = info.handle
    assert not info.has_gradient

    expected = np.zeros((V, K), dtype=np.int64)
    for x, dy in zip(xi, dyi):
        dx, dw = client.backward(dy.astype(np.float32), to_bf16(x), h, accumulate_dw=True)
        assert dw is None
        np.testing.assert_array_equal(bits(dx), rne_bf16_bits((dy @ wi).astype(np.float32)))
        expected += dy.T @ x

    listed = {w.handle: w for w in client.list_weights()}
    assert listed[h].has_gradient

    g = client.fetch_gradient(h)
    assert isinstance(g, logitd.Gradient)
    assert g.accumulated_calls == 3
    assert g.dw.dtype == np.float32 and g.dw.shape == (V, K)
    np.testing.assert_array_equal(bits(g.dw), bits(expected.astype(np.float32)))

    dw, calls = client.fetch_gradient(h, zero_after=True)
    assert calls == 3
    np.testing.assert_array_equal(bits(dw), bits(expected.astype(np.float32)))
    after = client.fetch_gradient(h)
    assert after.accumulated_calls == 0
    assert not np.any(after.dw)

    client.backward(dyi[0].astype(np.float32), to_bf16(xi[0]), h, want_dx=False, accumulate_dw=True)
    assert client.fetch_gradient(h).accumulated_calls == 1
    client.zero_gradient(h)
    z = client.fetch_gradient(h)
    assert z.accumulated_calls == 0
    assert not np.any(z.dw)


# ---------------------------------------------------------------------------
# Cast


def test_cast_edge_values_match_rne(client):
    f32_bits = np.array(
        [
            0x00000000, 0x80000000,  # +-0
            0x3F800000, 0xBF800000,  # +-1
            0x3F808000,  # 1 + half an ulp: tie, rounds down to even
            0x3F818000,  # tie between odd and even: rounds up to even
            0x3F808001, 0x3F807FFF,  # just above / below a tie
            0xBF818000, 0xBF808000,  # negative ties
            0x7F800000, 0xFF800000,  # +-Inf
            0x7FC00000, 0xFFC00000,  # quiet NaNs
            0x7F800001, 0xFF800001,  # signalling NaNs, payload only in the low bits
            0x7FA12345, 0x7FFFFFFF,  # NaN payloads
            0x7F7FFFFF, 0xFF7FFFFF,  # fp32 max: past bf16 max, rounds to +-Inf
            0x7F7F7FFF, 0x7F7F8000,  # just below / at the tie under bf16 max
            0x7F7F0000,  # bf16 max itself
            0x00000001, 0x80000001,  # smallest subnormals
            0x00008000, 0x00018000,  # subnormal ties
            0x007FFFFF,  # largest subnormal: rounds up to the smallest normal
            0x00800000,  # smallest normal
            0x4B800000, 0x4B808000, 0x4B818000,  # 2^24 and ties above it
        ],
        dtype=np.uint32,
    )
    rng = rng_for(5)
    random_bits = rng.integers(0, 2**32, size=65536, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate([f32_bits, random_bits]).view(np.float32)

    out = client.cast_to_bf16(values)
    assert out.dtype == logitd.BF16 and out.shape == values.shape
    np.testing.assert_array_equal(bits(out), rne_bf16_bits(values))

    # Any shape; it comes back as it went.
    grid = values[:64].reshape(4, 4, 4)
    out3 = client.cast_to_bf16(grid)
    assert out3.shape == (4, 4, 4)
    np.testing.assert_array_equal(bits(out3).reshape(-1), rne_bf16_bits(values[:64]))

    # Finite values agree with ml_dtypes' own RNE conversion too.
    finite = values[np.isfinite(values)]
    np.testing.assert_array_equal(bits(client.cast_to_bf16(finite)), bits(finite.astype(logitd.BF16)))


# ---------------------------------------------------------------------------
# Chunked transfer


def test_multi_chunk_round_trips(server):
    chunk = 64 << 10
    rng = rng_for(6)
    V, K, M = 1024, 2048, 48  # weight 4 MiB = 64 chunks; logits 192 KiB; dW 8 MiB
    wi = int_tensor(rng, (V, K))
    xi = int_tensor(rng, (M, K))
    dyi = int_tensor(rng, (M, V), lo=-2, hi=2)
    w = to_bf16(wi)
    with logitd.Client(server, chunk_bytes=chunk, timeout=300) as c:
        info = c.register_weights(w, name="multi-chunk")
        try:
            assert info.shape == (V, K)
            assert info.xxh3 == xxhash.xxh3_64_intdigest(w.tobytes())

            y = c.logits(to_bf16(xi), info.handle)
            np.testing.assert_array_equal(bits(y), bits((xi @ wi.T).astype(np.float32)))

            dx, dw = c.backward(dyi.astype(np.float32), to_bf16(xi), info.handle, dx_dtype="fp32")
            np.testing.assert_array_equal(bits(dx), bits((dyi @ wi).astype(np.float32)))
            np.testing.assert_array_equal(bits(dw), bits((dyi.T @ xi).astype(np.float32)))

            c.backward(dyi.astype(np.float32), to_bf16(xi), info.handle, want_dx=False, accumulate_dw=True)
            g = c.fetch_gradient(info.handle)
            assert g.accumulated_calls == 1
            np.testing.assert_array_equal(bits(g.dw), bits(dw))

            big = rng.standard_normal(3 << 18).astype(np.float32)  # 3 MiB = 48 chunks
            np.testing.assert_array_equal(bits(c.cast_to_bf16(big)), rne_bf16_bits(big))
        finally:
            c.release_weights(info.handle, force=True)


def test_odd_chunk_size(server, weights):
    """A chunk size that does not divide the tensor: the last chunk is short."""
    rng = rng_for(8)
    wi = int_tensor(rng, (33, 77))
    xi = int_tensor(rng, (5, 77))
    with logitd.Client(server, chunk_bytes=1000) as c:
        info = c.register_weights(to_bf16(wi))
        try:
            y = c.logits(to_bf16(xi), info.handle)
            np.testing.assert_array_equal(y, (xi @ wi.T).astype(np.float32))
        finally:
            c.release_weights(info.handle, force=True)


# ---------------------------------------------------------------------------
# Errors


def test_unknown_handle_is_not_found(client):
    x = to_bf16(np.ones((2, 64)))
    with pytest.raises(logitd.NotFoundError) as e:
        client.logits(x, "w-0000000000000000-1x64")
    assert e.value.code_name == "NOT_FOUND"
    assert isinstance(e.value, logitd.LogitdError)
    assert "w-0000000000000000-1x64" in e.value.message
    with pytest.raises(logitd.NotFoundError):
        client.backward(np.ones((2, 1), np.float32), x, "w-0000000000000000-1x64")
    with pytest.raises(logitd.NotFoundError):
        client.fetch_gradient("w-0000000000000000-1x64")
    with pytest.raises(logitd.NotFoundError):
        client.zero_gradient("w-0000000000000000-1x64")
    with pytest.raises(logitd.NotFoundError):
        client.release_weights("w-0000000000000000-1x64")


def test_k_mismatch_is_invalid_argument(client, weights):
    h = weights(to_bf16(rng_for(9).standard_normal((16, 512)))).handle
    with pytest.raises(logitd.InvalidArgumentError) as e:
        client.logits(to_bf16(np.ones((2, 256))), h)
    assert e.value.code_name == "INVALID_ARGUMENT"
    with pytest.raises(logitd.InvalidArgumentError):
        client.backward(np.ones((2, 16), np.float32), to_bf16(np.ones((2, 256))), h)
    # dY must be [M, V].
    with pytest.raises(logitd.InvalidArgumentError):
        client.backward(np.ones((2, 17), np.float32), to_bf16(np.ones((2, 512))), h)
    # An accumulated dW is fp32 only.
    with pytest.raises(logitd.InvalidArgumentError):
        client.backward(
            np.ones((2, 16), np.float32), to_bf16(np.ones((2, 512))), h, accumulate_dw=True, dw_dtype="bf16"
        )


def test_local_argument_errors(client, weights):
    h = weights(to_bf16(np.ones((4, 8)))).handle
    x = to_bf16(np.ones((1, 8)))
    with pytest.raises(logitd.InvalidArgumentError, match="alpha"):
        client.logits(x, h, alpha=0.0)
    with pytest.raises(logitd.InvalidArgumentError, match="out_dtype"):
        client.logits(x, h, out_dtype="fp16")
    with pytest.raises(logitd.InvalidArgumentError, match="bfloat16"):
        client.logits(np.ones((1, 8), np.float32), h)  # X must be bf16
    with pytest.raises(logitd.InvalidArgumentError, match="weight"):
        client.register_weights(np.ones((4, 8), np.float32))
    with pytest.raises(logitd.InvalidArgumentError):
        client.cast_to_bf16(np.ones(4, np.float64))
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        client.logits([[1.0] * 8], h)



def test_dns_target_with_round_robin(server):
    port = server.rsplit(":", 1)[1]
    with logitd.Client("dns:///localhost:%s" % port, timeout=30, lb_policy="round_robin") as c:
        for _ in range(3):
            assert c.info().backend == "cpu"


def test_token_is_accepted_by_a_server_without_auth(server):
    with logitd.Client(server, token="unused") as c:
        assert c.info().backend == "cpu"


# ---------------------------------------------------------------------------
# Fused cross-entropy


def _ce_reference(x, w, targets, ignore_index=-100):
    """fp64 per-token loss, lse and dL/dlogits (unscaled) of softmax cross-entropy."""
    logits = x.astype(np.float64) @ w.astype(np.float64).T
    mx = logits.max(axis=1, keepdims=True)
    lse = (mx + np.log(np.exp(logits - mx).sum(axis=1, keepdims=True)))[:, 0]
    counted = targets != ignore_index
    safe = np.where(counted, targets, 0)
    loss = np.where(counted, lse - logits[np.arange(len(targets)), safe], 0.0)
    g = np.exp(logits - lse[:, None])
    g[np.arange(len(targets)), safe] -= 1.0
    g[~counted] = 0.0
    return loss, lse, g


def test_cross_entropy_matches_fp64_reference(client, weights):
    rng = rng_for(77)
    M, V, K = 24, 1000, 256
    x = to_bf16(rng.standard_normal((M, K)))
    w = to_bf16(rng.standard_normal((V, K)) * 0.25)
    targets = rng.integers(0, V, size=M).astype(np.int64)
    targets[[3, 11]] = -100
    h = weights(w).handle
    loss_ref, lse_ref, g_ref = _ce_reference(x, w, targets)
    counted = int(np.sum(targets != -100))

    per_token = client.cross_entropy(x, targets, h, reduction="none", want_lse=True)
    assert per_token.counted_tokens == counted
    assert per_token.loss.dtype == np.float32 and per_token.loss.shape == (M,)
    assert per_token.dx is None and per_token.dw is None
    np.testing.assert_allclose(per_token.loss, loss_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(per_token.lse, lse_ref, rtol=1e-6)
    assert np.all(per_token.loss[[3, 11]] == 0)

    mean = client.cross_entropy(
        x, targets.astype(np.int32), h, want_dx=True, want_dw=True, dx_dtype="fp32"
    )
    assert mean.loss.shape == (1,)
    np.testing.assert_allclose(mean.loss[0], loss_ref.sum() / counted, rtol=1e-5)
    # Gradients of the mean: G = bf16(g / counted); the bf16 cast bounds the error.
    dx_ref = (g_ref / counted) @ w.astype(np.float64)
    dw_ref = (g_ref / counted).T @ x.astype(np.float64)
    assert np.linalg.norm(mean.dx - dx_ref) <= 2 ** -7 * np.linalg.norm(dx_ref)
    assert np.linalg.norm(mean.dw - dw_ref) <= 2 ** -7 * np.linalg.norm(dw_ref)
    assert np.all(mean.dx[[3, 11]] == 0)


def test_cross_entropy_refuses_out_of_range_targets(client, weights):
    rng = rng_for(78)
    x = to_bf16(rng.standard_normal((4, 64)))
    h = weights(to_bf16(rng.standard_normal((50, 64)))).handle
    with pytest.raises(logitd.InvalidArgumentError, match="targets"):
        client.cross_entropy(x, np.array([0, 1, 50, 2], dtype=np.int64), h)
    with pytest.raises(logitd.InvalidArgumentError):
        client.cross_entropy(x, np.array([0, 1, 2, 3], dtype=np.int64), h, grad_scale=0)
    assert client.info().backend == "cpu"


# ---------------------------------------------------------------------------
# Log-probabilities


def test_logprobs_match_fp64_reference_and_cross_entropy(client, weights):
    rng = rng_for(91)
    M, V, K, top_k = 10, 500, 128, 4
    x = to_bf16(rng.standard_normal((M, K)))
    w = to_bf16(rng.standard_normal((V, K)) * 0.25)
    targets = rng.integers(0, V, size=M).astype(np.int64)
    targets[2] = -100
    h = weights(w).handle
    loss_ref, lse_ref, _ = _ce_reference(x, w, targets)
    logits = x.astype(np.float64) @ w.astype(np.float64).T
    p = np.exp(logits - lse_ref[:, None])
    entropy_ref = -(p * (logits - lse_ref[:, None])).sum(axis=1)

    out = client.logprobs(x, h, targets=targets, top_k=top_k, want_entropy=True, want_lse=True, want_rank=True)
    assert isinstance(out, logitd.LogProbs)
    assert out.logprob.dtype == np.float32 and out.logprob.shape == (M,)
    assert out.topk_ids.dtype == np.int32 and out.topk_ids.shape == (M, top_k)
    assert out.rank.dtype == np.int64
    np.testing.assert_allclose(out.logprob, -loss_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.lse, lse_ref, rtol=1e-6)
    np.testing.assert_allclose(out.entropy, entropy_ref, rtol=1e-4, atol=1e-5)
    assert out.logprob[2] == 0 and out.rank[2] == -1
    order = np.argsort(-logits, axis=1, kind="stable")
    np.testing.assert_array_equal(out.topk_ids, order[:, :top_k])
    np.testing.assert_allclose(
        out.topk_logprobs, np.take_along_axis(logits, order[:, :top_k], 1) - lse_ref[:, None], rtol=1e-5, atol=1e-5
    )
    for i in range(M):
        if targets[i] != -100:
            assert out.rank[i] == int(np.where(order[i] == targets[i])[0][0])

    # The contract: bitwise -loss of the per-token cross-entropy.
    ce = client.cross_entropy(x, targets, h, reduction="none")
    counted = targets != -100
    np.testing.assert_array_equal(out.logprob[counted], -ce.loss[counted])

    # Top-k alone, no targets.
    only = client.logprobs(x, h, top_k=2)
    assert only.logprob is None and only.entropy is None
    np.testing.assert_array_equal(only.topk_ids, out.topk_ids[:, :2])


def test_logprobs_refuses_bad_arguments(client, weights):
    rng = rng_for(92)
    x = to_bf16(rng.standard_normal((4, 64)))
    h = weights(to_bf16(rng.standard_normal((50, 64)))).handle
    with pytest.raises(logitd.InvalidArgumentError, match="top_k"):
        client.logprobs(x, h, top_k=65)
    with pytest.raises(logitd.InvalidArgumentError, match="want_rank"):
        client.logprobs(x, h, want_rank=True)
    with pytest.raises(logitd.InvalidArgumentError, match="temperature"):
        client.logprobs(x, h, top_k=1, temperature=0)
    with pytest.raises(logitd.InvalidArgumentError, match="targets"):
        client.logprobs(x, h, targets=np.array([0, 1, 2, 40], dtype=np.int64), vocab_size=40)


def test_load_weight_needs_a_weights_dir(client):
    # The test server runs without --weights_dir: the server refuses, and says why.
    with pytest.raises(logitd.FailedPreconditionError, match="weights_dir"):
        client.load_weight("lm_head.safetensors", "lm_head.weight")
