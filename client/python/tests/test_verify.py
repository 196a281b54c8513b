"""Verify through the real server (cpu backend): outputs computed here the ways
kernels compute them, right and wrong, judged against the contract (the proven
bound, the precision-class test, logitd's own output); rows sampled evenly or
by a seed; the assertions of logitd.testing; and examples/verify_my_kernel.py
run as a script."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from reference import bits, to_bf16

import logitd
from logitd.testing import assert_backward_within_contract, assert_logits_within_contract

pytestmark = pytest.mark.needs_server

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "verify_my_kernel.py"
PASSING = ("within_bounds", "bitwise_equal_to_logitd")
SAMPLED_PASSING = ("within_bounds_sampled", "bitwise_equal_to_logitd_sampled")


def normal_bf16(seed, shape):
    return to_bf16(np.random.default_rng(seed).standard_normal(shape))


def fp64_logits(x, w, alpha=1.0):
    """alpha . X . W^T in float64 from the bf16 values, then rounded to float32 once."""
    return (alpha * (x.astype(np.float64) @ w.astype(np.float64).T)).astype(np.float32)


def bf16_passed_off_as_fp32(y):
    return to_bf16(y).astype(np.float32)


def reverse_order_fp32_logits(x, w):
    """Each dot product summed in float32 from its last term to its first (products of bf16 values are
    exact in float32): a conforming kernel whose order differs from logitd's."""
    products = x.astype(np.float32)[:, None, ::-1] * w.astype(np.float32)[None, :, ::-1]
    return np.cumsum(products, axis=-1, dtype=np.float32)[..., -1]


def test_the_passing_verdicts():
    assert set(logitd.PASSING_VERDICTS) == set(PASSING + SAMPLED_PASSING)
    assert "outside_precision_class" not in logitd.PASSING_VERDICTS
    assert "outside_probabilistic_bounds" not in logitd.PASSING_VERDICTS


# ---------------------------------------------------------------------------
# Logits


def test_logitds_own_logits_are_bitwise_equal(client, weights):
    M, V, K = 12, 200, 640
    x, w = normal_bf16(1, (M, K)), normal_bf16(2, (V, K))
    info = weights(w, name="verify-own")
    y = client.logits(x, info.handle)

    v = client.verify_logits(x, y, info.handle)
    assert isinstance(v, logitd.Verdict)
    assert v.verdict == "bitwise_equal_to_logitd" and v.passed
    assert list(v.candidates) == ["y"]
    c = v.candidates["y"]
    assert isinstance(c, logitd.CandidateVerdict) and c.passed
    assert c.name == "y" and c.dtype == "fp32" and c.shape == (M, V)
    assert c.xxh3 == logitd.digest(y)
    assert c.elements == M * V
    assert c.outside_bound == 0 and c.outside_probabilistic_bound == 0 and c.nan_inf_mismatches == 0
    assert c.worst_bound_fraction <= 1.0
    assert c.bitwise_equal_fraction == 1.0
    assert c.max_ulp == c.p99_ulp == c.p50_ulp == 0
    assert c.first_outside == []
    assert len(c.error_histogram) == len(logitd.ERROR_HISTOGRAM_BINS) == 10
    assert sum(c.error_histogram) == c.elements and c.error_histogram[-1] == 0
    # In fp32 accumulation's precision class, a few ulps from the correctly rounded value.
    p = c.precision_class
    assert isinstance(p, logitd.PrecisionClass)
    assert p.tested and not p.outside, p
    assert p.rms_ratio <= p.threshold and p.elements == M * V and p.rows == M and p.rows_outside == 0
    assert p.envelope
    assert 0 <= c.p50_ulp_exact <= c.p99_ulp_exact <= c.max_ulp_exact
    assert v.rows_checked == () and v.rows_total == M and v.sample_seed == 0
    assert v.inputs_xxh3 != 0 and v.reference_us >= 0
    # A WeightInfo names the weight as well as its handle; the inputs' key is the same.
    assert client.verify_logits(x, y, info).inputs_xxh3 == v.inputs_xxh3
    text = v.describe()
    assert "bitwise_equal_to_logitd" in text and "passed" in text and "y fp32 [12, 200]" in text
    assert "ulp vs logitd's: max 0, p99 0, p50 0" in text and "ulp vs correctly rounded: max" in text
    assert "effective precision" in text


def test_an_fp64_reference_rounded_to_fp32_passes_and_alpha_is_checked(client, weights):
    M, V, K = 16, 96, 512
    x, w = normal_bf16(3, (M, K)), normal_bf16(4, (V, K))
    h = weights(w, name="verify-fp64").handle

    v = client.verify_logits(x, fp64_logits(x, w), h)
    assert v.passed and v.verdict in PASSING
    c = v.candidates["y"]
    assert c.outside_bound == 0 and c.worst_bound_fraction <= 1.0

    scaled = client.verify_logits(x, fp64_logits(x, w, 0.5), h, alpha=0.5)
    assert scaled.passed
    # The unscaled logits are not alpha's.
    assert client.verify_logits(x, fp64_logits(x, w), h, alpha=0.5).verdict == "outside_bounds"
    assert scaled.inputs_xxh3 != v.inputs_xxh3  # alpha is part of the key


def test_bf16_logits_passed_off_as_fp32_are_outside_their_bound(client, weights):
    M, V, K = 16, 96, 1024
    x, w = normal_bf16(5, (M, K)), normal_bf16(6, (V, K))
    h = weights(w, name="verify-bf16-as-fp32").handle
    y = bf16_passed_off_as_fp32(fp64_logits(x, w))

    v = client.verify_logits(x, y, h)
    assert not v.passed and v.verdict == "outside_bounds"
    c = v.candidates["y"]
    assert not c.passed and c.verdict == "outside_bounds"
    assert c.outside_bound > c.elements // 10
    assert c.worst_bound_fraction > 2.0
    assert c.outside_probabilistic_bound >= c.outside_bound
    assert c.logitd_outside_probabilistic_bound == 0
    assert c.error_histogram[-1] == c.outside_bound
    assert len(c.first_outside) == 32
    e = c.first_outside[0]
    assert isinstance(e, logitd.VerifyElement) and len(e.index) == 2
    # Those outside the proven bound come first, flagged.
    assert e.outside_bound and abs(e.candidate - e.reference) > e.bound
    assert e.candidate == y[e.index]
    assert abs(e.candidate - e.reference) > e.probabilistic_bound
    assert e.probabilistic_bound <= e.bound
    # logitd's own value there is inside the same bounds.
    assert abs(e.logitd - e.reference) <= e.probabilistic_bound
    # Those outside the proven bound come first, in index order.
    flags = [f.outside_bound for f in c.first_outside]
    assert flags == sorted(flags, reverse=True)
    proven = [f.index for f in c.first_outside if f.outside_bound]
    assert proven == sorted(proven)

    text = v.describe()
    assert "outside_bounds (failed)" in text
    assert "fp64 reference" in text and "bound" in text
    assert "[%d, %d]: candidate" % e.index in text
    assert "outside its proven bound" in text
    assert "and 27 more" in text  # five of the 32 are shown
    assert v.describe(max_elements=1).count("fp64 reference") == 1


def test_bf16_logits_at_k4096_are_outside_the_precision_class(client, weights):
    # The seed's hidden size: the proven bound grows as K and holds bf16 rounding of the result
    # (growing as sqrt(K)), so no element is wrong for certain; the precision-class test finds the
    # errors those of an 8-bit significand, not of fp32 accumulation.
    M, V, K = 4, 64, 4096
    x, w = normal_bf16(41, (M, K)), normal_bf16(42, (V, K))
    h = weights(w, name="verify-k4096").handle
    own = client.logits(x, h)
    assert client.verify_logits(x, own, h).verdict == "bitwise_equal_to_logitd"
    # A conforming fp32 sum in another order.
    reversed_order = client.verify_logits(x, reverse_order_fp32_logits(x, w), h)
    assert reversed_order.verdict == "within_bounds", reversed_order.describe()
    assert not reversed_order.candidates["y"].precision_class.outside

    y = bf16_passed_off_as_fp32(own)
    v = client.verify_logits(x, y, h)
    assert not v.passed and v.verdict == "outside_precision_class", v.describe()
    c = v.candidates["y"]
    assert not c.passed and c.verdict == "outside_precision_class"
    assert c.outside_bound == 0 and c.worst_bound_fraction <= 1.0
    p = c.precision_class
    assert p.tested and p.outside
    assert p.rms_ratio > p.threshold > 1.0
    # About 8 bits plus half of log2(K) for bf16 rounding; fp32 accumulation's are near 24.
    assert p.effective_bits < 16.0 and p.class_bits > p.effective_bits + 2
    assert 0.0 < p.alpha < 1e-6
    assert p.elements == M * V and p.rows == M and p.rows_outside > 0
    assert 0 < len(p.worst_rows) <= 8
    r = p.worst_rows[0]
    assert isinstance(r, logitd.RowPrecision) and r.outside and r.rms_ratio > r.threshold and r.elements == V
    assert p.envelope
    # Many fp32 ulps from the correctly rounded value.
    assert c.max_ulp_exact > 1000
    # The elements listed: none outside the proven bound; those the test found (each over its class
    # threshold) before those of the probabilistic figure.
    found = [e.class_threshold > 0 for e in c.first_outside]
    assert found == sorted(found, reverse=True)
    for e in c.first_outside:
        assert not e.outside_bound
        if e.class_threshold > 0:
            assert abs(e.candidate - e.reference) > e.class_threshold
        else:
            assert abs(e.candidate - e.reference) <= e.bound
    assert c.outside_probabilistic_bound > 0  # still a figure beside the verdict

    text = v.describe()
    assert "outside_precision_class (failed)" in text
    assert "RMS error %.3g times the conforming envelope's (threshold %.3g)" % (p.rms_ratio, p.threshold) in text
    assert "effective precision %.1f bits" % p.effective_bits in text
    # The assertion of logitd.testing fails on it too, in the same words.
    with pytest.raises(AssertionError) as e:
        assert_logits_within_contract(client, x, y, h)
    assert str(e.value) == text
    if any(found):
        first = next(e for e in c.first_outside if e.class_threshold > 0)
        assert "[%d, %d]: candidate" % first.index in text and "over its class threshold" in text


def test_describe_and_the_assertions_list_the_worst_elements_first(client, weights):
    # Three elements outside the proven bound, the worst last in index order.
    M, V, K = 4, 64, 128
    x, w = normal_bf16(61, (M, K)), normal_bf16(62, (V, K))
    h = weights(w, name="verify-worst-first").handle
    y = client.logits(x, h).copy()
    flat = y.reshape(-1)
    for i, off in ((3, 0.01), (100, 0.1), (200, 10.0)):
        flat[i] += np.float32(off)
    v = client.verify_logits(x, y, h)
    c = v.candidates["y"]
    assert [tuple(e.index) for e in c.first_outside[:3]] == [(0, 3), (1, 36), (3, 8)]  # index order
    with pytest.raises(AssertionError) as e:
        assert_logits_within_contract(client, x, y, h)
    text = str(e.value)
    at = [text.index("[%d, %d]: candidate" % i) for i in ((3, 8), (1, 36), (0, 3))]
    assert at == sorted(at), text
    assert "worst first in each" in text


def test_one_ulp_off_is_within_bounds_and_counted(client, weights):
    M, V, K = 8, 64, 256
    x, w = normal_bf16(7, (M, K)), normal_bf16(8, (V, K))
    h = weights(w, name="verify-ulp").handle
    y = client.logits(x, h).copy()
    y.reshape(-1)[77] = np.nextafter(y.reshape(-1)[77], np.float32(np.inf))

    v = client.verify_logits(x, y, h)
    assert v.passed and v.verdict == "within_bounds"
    c = v.candidates["y"]
    assert c.max_ulp == 1 and c.p50_ulp == 0
    assert c.bitwise_equal_fraction == pytest.approx(1.0 - 1.0 / (M * V), abs=0)
    assert "ulp vs logitd's: max 1, p99 0, p50 0" in v.describe()


def test_a_nan_where_none_belongs_fails(client, weights):
    M, V, K = 4, 128, 128
    x, w = normal_bf16(9, (M, K)), normal_bf16(10, (V, K))
    h = weights(w, name="verify-nan").handle
    y = fp64_logits(x, w)
    y[2, 5] = np.nan

    v = client.verify_logits(x, y, h)
    assert not v.passed and v.verdict == "outside_bounds"
    c = v.candidates["y"]
    assert c.outside_bound == 1 and c.nan_inf_mismatches == 1
    assert [e.index for e in c.first_outside] == [(2, 5)]
    assert np.isnan(c.first_outside[0].candidate)
    assert "a NaN against a number" in v.describe()


def test_a_transposed_or_other_weight_fails(client, weights):
    M, K = 4, 128
    x, w = normal_bf16(11, (M, K)), normal_bf16(12, (K, K))
    h = weights(w, name="verify-square").handle
    # W read as [K, V]: the logits of W^T.
    transposed = client.verify_logits(x, fp64_logits(x, np.ascontiguousarray(w.T)), h)
    assert not transposed.passed and transposed.verdict == "outside_bounds"
    assert transposed.candidates["y"].outside_bound > M * K * 9 // 10

    other = client.verify_logits(x, fp64_logits(x, normal_bf16(13, (K, K))), h)
    assert not other.passed and other.verdict == "outside_bounds"


def test_bf16_candidates(client, weights):
    M, V, K = 10, 72, 300
    x, w = normal_bf16(14, (M, K)), normal_bf16(15, (V, K))
    h = weights(w, name="verify-bf16").handle
    own = client.logits(x, h, out_dtype="bf16")
    v = client.verify_logits(x, own, h)
    assert v.verdict == "bitwise_equal_to_logitd"
    assert v.candidates["y"].dtype == "bf16"

    # A bf16 output is the fp32-accurate value rounded once: the fp64 reference rounded to bf16 passes.
    rounded = to_bf16(fp64_logits(x, w))
    assert rounded.dtype == logitd.BF16
    assert client.verify_logits(x, rounded, h).passed


def test_a_streamed_weight_gives_the_registered_ones_verdict_and_keeps_nothing(client, weights):
    M, V, K = 5, 72, 160
    x, w = normal_bf16(16, (M, K)), normal_bf16(17, (V, K))
    y = fp64_logits(x, w)
    registered = client.verify_logits(x, y, weights(w, name="verify-streamed").handle)
    before = {i.handle for i in client.list_weights()}

    streamed = client.verify_logits(x, y, w)
    assert streamed.verdict == registered.verdict
    assert streamed.candidates["y"].worst_bound_fraction == registered.candidates["y"].worst_bound_fraction
    assert streamed.inputs_xxh3 == registered.inputs_xxh3
    assert {i.handle for i in client.list_weights()} == before

    # X and W as float32 holding bf16 values are taken exactly: the same inputs, the same key.
    exact = client.verify_logits(x.astype(np.float32), y, w.astype(np.float32))
    assert exact.inputs_xxh3 == registered.inputs_xxh3 and exact.verdict == registered.verdict

    bad = normal_bf16(18, (V, K)).astype(np.float32)
    assert client.verify_logits(x, y, bad).verdict == "outside_bounds"


def test_sampled_rows(client, weights):
    M, V, K = 50, 40, 300
    x, w = normal_bf16(19, (M, K)), normal_bf16(20, (V, K))
    h = weights(w, name="verify-sampled").handle
    y = fp64_logits(x, w)
    y[3, 1] += 1.0  # row 3 is not among the 5 rows checked

    sampled = client.verify_logits(x, y, h, sample_rows=5)
    assert sampled.rows_checked == (0, 12, 24, 36, 49)
    assert len(sampled.rows_checked) < M and sampled.rows_total == M and sampled.sample_seed == 0
    assert sampled.candidates["y"].elements == 5 * V
    # A pass of some rows says so, and passes.
    assert sampled.passed and sampled.verdict == "within_bounds_sampled"
    assert sampled.candidates["y"].passed and sampled.candidates["y"].verdict == "within_bounds_sampled"
    assert "rows checked: 0, 12, 24, 36, 49 (5 rows of 50, evenly spaced)" in sampled.describe()
    assert client.verify_logits(x, y, h).verdict == "outside_bounds"
    # One row or two: the first and the last.
    for n in (1, 2):
        assert client.verify_logits(x, y, h, sample_rows=n).rows_checked == (0, M - 1)


def test_rows_drawn_by_a_seed(client, weights):
    M, V, K = 40, 24, 128
    x, w = normal_bf16(43, (M, K)), normal_bf16(44, (V, K))
    h = weights(w, name="verify-seeded").handle
    own = client.logits(x, h)
    lattice = client.verify_logits(x, own, h, sample_rows=6).rows_checked

    v = client.verify_logits(x, own, h, sample_rows=6, sample_seed=20261206)
    assert v.verdict == "bitwise_equal_to_logitd_sampled" and v.passed
    assert v.sample_seed == 20261206 and v.rows_total == M
    rows = v.rows_checked
    assert len(rows) == 6 and list(rows) == sorted(set(rows)) and all(0 <= r < M for r in rows)
    assert rows != lattice
    assert "drawn by seed 20261206" in v.describe()
    # The same seed, the same rows; another, others.
    assert client.verify_logits(x, own, h, sample_rows=6, sample_seed=20261206).rows_checked == rows
    assert client.verify_logits(x, own, h, sample_rows=6, sample_seed=7).rows_checked != rows

    # A wrong row the evenly spaced sample misses and the seeded one draws.
    row = next(r for r in rows if r not in lattice)
    y = own.copy()
    y[row, 3] += 1.0
    assert client.verify_logits(x, y, h, sample_rows=6).verdict == "bitwise_equal_to_logitd_sampled"
    found = client.verify_logits(x, y, h, sample_rows=6, sample_seed=20261206)
    assert found.verdict == "outside_bounds" and not found.passed
    assert found.candidates["y"].first_outside[0].index == (row, 3)

    # A seed without a sample is the server's INVALID_ARGUMENT; a seed off the wire's range, the client's.
    with pytest.raises(logitd.InvalidArgumentError, match="sample_seed: given without sample_rows"):
        client.verify_logits(x, own, h, sample_seed=5)
    for bad in (-1, 1 << 64, 1.5, True):
        with pytest.raises(logitd.InvalidArgumentError, match="sample_seed"):
            client.verify_logits(x, own, h, sample_rows=6, sample_seed=bad)


# ---------------------------------------------------------------------------
# Backward


def grad_input(dy, w, cast):
    """dX = G . W in float64 rounded to float32 once, with G = bf16(dY) or dY itself when cast is False."""
    g = to_bf16(dy).astype(np.float64) if cast else dy.astype(np.float64)
    return (g @ w.astype(np.float64)).astype(np.float32)


def test_logitds_own_gradients_are_bitwise_equal(client, weights):
    M, V, K = 24, 384, 40
    x, w = normal_bf16(21, (M, K)), normal_bf16(22, (V, K))
    dy = np.random.default_rng(23).standard_normal((M, V)).astype(np.float32)
    h = weights(w, name="verify-backward").handle

    dx, dw = client.backward(dy, x, h, dx_dtype="fp32")
    v = client.verify_backward(dy, x, h, dx=dx, dw=dw)
    assert v.verdict == "bitwise_equal_to_logitd" and v.passed
    assert set(v.candidates) == {"dx", "dw"}
    assert v.candidates["dx"].shape == (M, K) and v.candidates["dx"].elements == M * K
    assert v.candidates["dw"].shape == (V, K) and v.candidates["dw"].elements == V * K

    # The default dtypes (bf16 dX, fp32 dW), each alone, and dY given as bf16.
    dx16, dw32 = client.backward(dy, x, h)
    only_dx = client.verify_backward(dy, x, h, dx=dx16)
    assert only_dx.verdict == "bitwise_equal_to_logitd" and list(only_dx.candidates) == ["dx"]
    assert only_dx.candidates["dx"].dtype == "bf16"
    only_dw = client.verify_backward(to_bf16(dy), x, h, dw=dw32)
    assert only_dw.verdict == "bitwise_equal_to_logitd" and list(only_dw.candidates) == ["dw"]

    # Sampled rows leave dW whole: its verdict is not a sampled one.
    sampled = client.verify_backward(dy, x, h, dx=dx, dw=dw, sample_rows=4)
    assert 0 < len(sampled.rows_checked) < M
    assert sampled.candidates["dx"].elements == len(sampled.rows_checked) * K
    assert sampled.candidates["dw"].elements == V * K
    assert sampled.verdict == "bitwise_equal_to_logitd_sampled"
    assert sampled.candidates["dx"].verdict == "bitwise_equal_to_logitd_sampled"
    assert sampled.candidates["dw"].verdict == "bitwise_equal_to_logitd"
    seeded = client.verify_backward(dy, x, h, dx=dx, dw=dw, sample_rows=4, sample_seed=3)
    assert seeded.sample_seed == 3 and len(seeded.rows_checked) == 4 and seeded.passed


def test_backward_holds_the_gradient_cast_contract(client, weights):
    M, V, K = 24, 384, 40
    x, w = normal_bf16(11, (M, K)), normal_bf16(12, (V, K))
    dy = np.random.default_rng(13).standard_normal((M, V)).astype(np.float32)
    h = weights(w, name="verify-cast").handle

    # dY used as it came, without the cast to bf16.
    uncast = client.verify_backward(dy, x, h, dx=grad_input(dy, w, cast=False))
    assert not uncast.passed and uncast.verdict == "outside_bounds"
    # With the cast, the same product conforms.
    cast = client.verify_backward(dy, x, h, dx=grad_input(dy, w, cast=True))
    assert cast.passed


# ---------------------------------------------------------------------------
# Errors


def test_bad_requests_raise_the_clients_errors(client, weights):
    M, V, K = 4, 32, 64
    x, w = normal_bf16(24, (M, K)), normal_bf16(25, (V, K))
    h = weights(w, name="verify-bad").handle
    y = fp64_logits(x, w)

    with pytest.raises(logitd.InvalidArgumentError) as e:
        client.verify_logits(x, np.ascontiguousarray(y.T), h)
    assert e.value.code_name == "INVALID_ARGUMENT"
    assert "y: expected shape [4, 32]" in e.value.message

    with pytest.raises(logitd.NotFoundError):
        client.verify_logits(x, y, "w-0000000000000000-32x64")
    with pytest.raises(logitd.NotFoundError):
        client.verify_backward(
            np.ones((M, V), np.float32), x, "w-0000000000000000-32x64", dw=np.ones((V, K), np.float32)
        )

    # Refused before anything is sent.
    with pytest.raises(logitd.InvalidArgumentError, match="y: expected dtype fp32 or bf16"):
        client.verify_logits(x, y.astype(np.int32), h)
    with pytest.raises(logitd.InvalidArgumentError, match="dx, dw"):
        client.verify_backward(np.ones((M, V), np.float32), x, h)
    with pytest.raises(logitd.InvalidArgumentError, match="alpha"):
        client.verify_logits(x, y, h, alpha=0.0)
    with pytest.raises(logitd.InvalidArgumentError, match="sample_rows"):
        client.verify_logits(x, y, h, sample_rows=-1)
    with pytest.raises(logitd.InvalidArgumentError, match="weight"):
        client.verify_logits(x, y, 42)
    with pytest.raises(logitd.InvalidArgumentError, match="weight"):
        client.verify_logits(x, y, "")

    # X and W as float32 only when each value is a bf16 value; the error names the tensor.
    x32 = x.astype(np.float32)
    x32[1, 2] += np.float32(1e-3)
    not_bf16 = r"x: expected bf16, got float32 with values that are not bf16 \(.* at \[1, 2\]\)"
    with pytest.raises(ValueError, match=not_bf16):
        client.verify_logits(x32, y, h)
    w32 = w.astype(np.float32)
    w32[0, 0] = np.float32(0.1)
    with pytest.raises(ValueError, match="^INVALID_ARGUMENT: w: expected bf16"):
        client.verify_logits(x, y, w32)
    with pytest.raises(logitd.InvalidArgumentError, match="x: expected dtype bf16"):
        client.verify_logits(x.astype(np.float64), y, h)
    assert client.info().backend == "cpu"


def test_float32_nan_inputs_are_bf16_values():
    nan_low_payload = np.array([0x7F800001, 0xFFC00000, 0x3F800000], dtype=np.uint32).view(np.float32)
    out = logitd.verify.exact_bf16("x", nan_low_payload)
    assert out.dtype == logitd.BF16
    b = bits(out)
    assert (b[0] & 0x7F80) == 0x7F80 and (b[0] & 0x007F) != 0  # still a NaN, not infinity
    assert b[1] == 0xFFC0 and b[2] == 0x3F80


# ---------------------------------------------------------------------------
# logitd.testing


def test_assert_logits_within_contract(client, weights):
    M, V, K = 16, 96, 1024
    x, w = normal_bf16(26, (M, K)), normal_bf16(27, (V, K))
    info = weights(w, name="verify-assert")
    good = fp64_logits(x, w)

    v = assert_logits_within_contract(client, x, good, info)
    assert isinstance(v, logitd.Verdict) and v.passed
    assert logitd.testing.assert_logits_within_contract is assert_logits_within_contract

    with pytest.raises(AssertionError) as e:
        assert_logits_within_contract(client, x, bf16_passed_off_as_fp32(good), info)
    message = str(e.value)
    assert "outside_bounds" in message and "fp64 reference" in message
    assert message == client.verify_logits(x, bf16_passed_off_as_fp32(good), info).describe()

    # A failed call is the client's error, not a failed assertion.
    with pytest.raises(logitd.InvalidArgumentError):
        assert_logits_within_contract(client, x, good[:, :-1], info)


def test_assert_backward_within_contract(client, weights):
    M, V, K = 24, 384, 40
    x, w = normal_bf16(11, (M, K)), normal_bf16(12, (V, K))
    dy = np.random.default_rng(13).standard_normal((M, V)).astype(np.float32)
    h = weights(w, name="verify-assert-backward").handle
    dw = (to_bf16(dy).astype(np.float64).T @ x.astype(np.float64)).astype(np.float32)

    v = assert_backward_within_contract(client, dy, x, h, dx=grad_input(dy, w, cast=True), dw=dw)
    assert v.passed and set(v.candidates) == {"dx", "dw"}
    with pytest.raises(AssertionError, match="dx fp32 \\[24, 40\\]: outside_bounds"):
        assert_backward_within_contract(client, dy, x, h, dx=grad_input(dy, w, cast=False), dw=dw)


# ---------------------------------------------------------------------------
# torch


def test_torch_tensors(client, weights):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch to run this test)")
    M, V, K = 8, 80, 256
    x = torch.from_numpy(normal_bf16(28, (M, K)).astype(np.float32)).to(torch.bfloat16)
    w = torch.from_numpy(normal_bf16(29, (V, K)).astype(np.float32)).to(torch.bfloat16)
    h = weights(w, name="verify-torch").handle

    y = client.logits(x, h)
    assert isinstance(y, torch.Tensor)
    assert client.verify_logits(x, y, h).verdict == "bitwise_equal_to_logitd"
    # W streamed as a torch tensor, X as float32 holding bf16 values, a tensor in a graph.
    v = client.verify_logits(x.float().requires_grad_(), y, w)
    assert v.verdict == "bitwise_equal_to_logitd"
    assert client.verify_logits(x, y.to(torch.bfloat16), h).passed
    with pytest.raises(ValueError, match="x: expected bf16"):
        client.verify_logits(x.float() + 1e-3, y, h)
    with pytest.raises(logitd.InvalidArgumentError, match="y: "):
        client.verify_logits(x, y.to(torch.float16), h)

    dy = torch.randn(M, V, generator=torch.Generator().manual_seed(30))
    dx, dw = client.backward(dy, x, h, dx_dtype="fp32")
    assert client.verify_backward(dy, x, h, dx=dx, dw=dw).verdict == "bitwise_equal_to_logitd"


# ---------------------------------------------------------------------------
# examples/verify_my_kernel.py


def run_example(server, *args):
    cmd = [sys.executable, str(EXAMPLE), "--server", server, "--tokens", "16", "--hidden", "1024", "--vocab", "96"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=300)


def test_verify_my_kernel_example(server, client):
    before = {i.handle for i in client.list_weights()}
    done = run_example(server)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "y fp32 [16, 96]" in done.stdout
    assert "(passed)" in done.stdout

    done = run_example(server, "--round-to-bf16")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "outside_bounds (failed)" in done.stdout
    assert "fp64 reference" in done.stdout
    # It released what it registered.
    assert {i.handle for i in client.list_weights()} == before

    done = run_example("127.0.0.1:1", "--round-to-bf16")
    assert done.returncode == 1 and "UNAVAILABLE" in done.stderr


# ---------------------------------------------------------------------------
# Cross-entropy and LogProbs


def softmax_parts(x, w, targets, temperature=1.0):
    """lse, each target's log-prob (0 when ignored) and the entropy, in float64 from the bf16 values."""
    z = (x.astype(np.float64) @ w.astype(np.float64).T) / temperature
    mx = z.max(axis=1, keepdims=True)
    p = np.exp(z - mx)
    s = p.sum(axis=1, keepdims=True)
    lse = (mx + np.log(s))[:, 0]
    prob = p / s
    entropy = -(prob * np.log(np.where(prob > 0, prob, 1.0))).sum(axis=1)
    rows = np.arange(len(targets))
    logprob = np.where(targets >= 0, z[rows, np.maximum(targets, 0)] - lse, 0.0)
    return lse, logprob, entropy


def test_cross_entropy_of_logitd_and_of_float64_pass_and_a_shifted_loss_fails(client, weights):
    M, V, K = 10, 120, 96
    x, w = normal_bf16(21, (M, K)), normal_bf16(22, (V, K))
    targets = np.array([3, -100, 0, 119, 7, 12, 50, -100, 1, 2], dtype=np.int64)
    info = weights(w, name="verify-ce")
    own = client.cross_entropy(x, targets, info.handle, reduction="none", want_lse=True)
    v = client.verify_cross_entropy(x, targets, info.handle, loss=own.loss, lse=own.lse, reduction="none")
    assert v.verdict == "bitwise_equal_to_logitd", v.describe()
    assert sorted(v.candidates) == ["loss", "lse"]
    assert v.candidates["loss"].shape == (M,)

    lse, logprob, _ = softmax_parts(x, w, targets)
    loss = np.where(targets >= 0, -logprob, 0.0).astype(np.float32)
    v = client.verify_cross_entropy(x, targets, info.handle, loss=loss, lse=lse.astype(np.float32), reduction="none")
    assert v.verdict in PASSING, v.describe()

    loss[2] += 0.25
    v = client.verify_cross_entropy(x, targets, info.handle, loss=loss, reduction="none")
    assert v.verdict == "outside_bounds"
    assert v.candidates["loss"].first_outside[0].index == (2,)

    mean = client.cross_entropy(x, targets, info.handle).loss
    v = client.verify_cross_entropy(x, targets, w, loss=mean)  # W streamed, reduction mean
    assert v.verdict == "bitwise_equal_to_logitd", v.describe()
    assert v.candidates["loss"].shape == (1,)


def test_cross_entropy_gradients_of_logitd_and_of_numpy(client, weights):
    M, V, K = 12, 160, 64
    x, w = normal_bf16(25, (M, K)), normal_bf16(26, (V, K))
    targets = np.array([3, -100, 0, 159, 7, 12, 50, -100, 1, 2, 80, 81], dtype=np.int64)
    info = weights(w, name="verify-ce-grads")
    own = client.cross_entropy(x, targets, info.handle, want_dx=True, want_dw=True, dx_dtype="fp32")
    v = client.verify_cross_entropy(x, targets, info.handle, dx=own.dx, dw=own.dw)
    assert v.verdict == "bitwise_equal_to_logitd", v.describe()
    assert v.candidates["dw"].shape == (V, K)

    # G = bf16(dL/dlogits) of the mean from float64, then float32 products.
    lse, _, _ = softmax_parts(x, w, targets)
    z = x.astype(np.float64) @ w.astype(np.float64).T
    p = np.exp(z - lse[:, None])
    counted = targets >= 0
    p[np.arange(M)[counted], targets[counted]] -= 1.0
    p[~counted] = 0.0
    g = to_bf16(p / counted.sum()).astype(np.float32)
    dx = g @ w.astype(np.float32)
    dw = g.T @ x.astype(np.float32)
    v = client.verify_cross_entropy(x, targets, info.handle, dx=dx, dw=dw)
    assert v.verdict in PASSING, v.describe()

    v = client.verify_cross_entropy(x, targets, info.handle, dx=dx * np.float32(counted.sum()), dw=dw)
    assert v.verdict == "outside_bounds"
    assert v.candidates["dx"].outside_bound > 0 and v.candidates["dw"].outside_bound == 0


def test_logprobs_at_a_temperature(client, weights):
    M, V, K = 8, 150, 64
    x, w = normal_bf16(23, (M, K)), normal_bf16(24, (V, K))
    targets = np.array([0, 149, -100, 5, 17, 33, 2, 90], dtype=np.int32)
    info = weights(w, name="verify-lp")
    lse, logprob, entropy = softmax_parts(x, w, targets, temperature=0.8)
    v = client.verify_logprobs(
        x,
        info.handle,
        targets=targets,
        logprob=logprob.astype(np.float32),
        lse=lse.astype(np.float32),
        entropy=entropy.astype(np.float32),
        temperature=0.8,
    )
    assert v.verdict in PASSING, v.describe()
    v = client.verify_logprobs(x, info.handle, targets=targets, logprob=logprob.astype(np.float32))
    assert v.verdict == "outside_bounds", "judged at temperature 1"
    with pytest.raises(logitd.InvalidArgumentError, match="give targets"):
        client.verify_logprobs(x, info.handle, logprob=logprob.astype(np.float32))


def test_logprobs_top_k_and_ranks_from_numpy(client, weights):
    M, V, K, k = 8, 150, 64, 4
    x, w = normal_bf16(25, (M, K)), normal_bf16(26, (V, K))
    targets = np.array([3, 149, -100, 5, 17, 33, 2, 90], dtype=np.int64)
    info = weights(w, name="verify-lp-topk")
    # numpy's float64 logits: the ids by z descending (ties to the lower
    # id), their log-probs and each target's rank.
    z = x.astype(np.float64) @ w.astype(np.float64).T
    lse = np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1)) + z.max(axis=1)
    order = np.argsort(-z, axis=1, kind="stable")[:, :k]
    topk_logprobs = (np.take_along_axis(z, order, axis=1) - lse[:, None]).astype(np.float32)
    rank = np.array(
        [-1 if t < 0 else int((z[i] > z[i, t]).sum() + (z[i, :t] == z[i, t]).sum()) for i, t in enumerate(targets)],
        dtype=np.int64,
    )
    v = client.verify_logprobs(
        x,
        info.handle,
        targets=targets,
        topk_ids=order.astype(np.int32),
        topk_logprobs=topk_logprobs,
        rank=rank,
    )
    assert v.verdict in PASSING, v.describe()
    assert v.candidates["topk_ids"].shape == (M, k)

    swapped = order.copy()
    swapped[1, [0, 3]] = swapped[1, [3, 0]]
    v = client.verify_logprobs(x, info.handle, topk_ids=swapped)
    assert v.verdict == "outside_bounds"
    assert v.candidates["topk_ids"].outside_bound == 2
    with pytest.raises(logitd.InvalidArgumentError, match="expected dtype int32 or int64"):
        client.verify_logprobs(x, info.handle, topk_ids=order.astype(np.float32))


def test_the_per_token_class_test_draws_at_most_512_tokens(client, weights):
    M, V, K = 600, 100, 32
    x, w = normal_bf16(29, (M, K)), normal_bf16(30, (V, K))
    targets = (np.arange(M, dtype=np.int64) * 37) % V
    info = weights(w, name="verify-ce-drawn")
    own = client.cross_entropy(x, targets, info.handle, reduction="none", want_lse=True)
    v = client.verify_cross_entropy(x, targets, info.handle, loss=own.loss, lse=own.lse, reduction="none")
    assert v.verdict == "bitwise_equal_to_logitd", v.describe()
    for name in ("loss", "lse"):
        p = v.candidates[name].precision_class
        assert (p.tested, p.rows, p.drawn_from) == (True, 512, M), (name, p)
        assert v.candidates[name].elements == M
    assert "the test took 512 tokens drawn of 600" in v.describe()
    small = client.verify_cross_entropy(
        x[:64], targets[:64], info.handle, loss=own.loss[:64], reduction="none"
    )
    assert small.candidates["loss"].precision_class.drawn_from == 0


def test_sampled_rows_of_the_cross_entropy(client, weights):
    M, V, K = 12, 150, 64
    x, w = normal_bf16(27, (M, K)), normal_bf16(28, (V, K))
    targets = np.array([0, 149, -100, 5, 17, 33, 2, 90, 7, 8, 9, 10], dtype=np.int64)
    info = weights(w, name="verify-ce-sampled")
    own = client.cross_entropy(x, targets, info.handle, want_lse=True, want_dx=True, dx_dtype="fp32")
    dx = own.dx.copy()
    dx[11, 3] += 1.0  # a row that is checked (0, 5, 11)
    v = client.verify_cross_entropy(x, targets, info.handle, lse=own.lse, dx=dx, sample_rows=3)
    assert v.rows_checked == (0, 5, 11)
    assert v.candidates["lse"].elements == 3
    assert v.verdict == "outside_bounds"
    assert v.candidates["lse"].verdict == "bitwise_equal_to_logitd_sampled"
    seeded = client.verify_cross_entropy(
        x, targets, info.handle, lse=own.lse, sample_rows=3, sample_seed=11
    )
    assert seeded.verdict == "bitwise_equal_to_logitd_sampled" and seeded.sample_seed == 11
    assert len(seeded.rows_checked) == 3
    lp = client.logprobs(x, info.handle, targets=targets, want_lse=True)
    seeded = client.verify_logprobs(
        x, info.handle, targets=targets, logprob=lp.logprob, lse=lp.lse, sample_rows=3, sample_seed=11
    )
    assert seeded.verdict == "bitwise_equal_to_logitd_sampled" and seeded.sample_seed == 11
    with pytest.raises(logitd.InvalidArgumentError, match="sums every row"):
        client.verify_cross_entropy(x, targets, info.handle, loss=own.loss, sample_rows=3)
