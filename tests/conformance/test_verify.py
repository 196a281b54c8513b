"""Verify: a candidate's outputs judged against the contract.

Integer-valued inputs make every product and sum exact in fp32, so the
reference of each element is known here without a bound, a correct
candidate must be bitwise what logitd gives, and a candidate made wrong on
purpose is outside its bound for certain. Normal inputs at K=4096 tell the
precision-class test's verdict: bf16 rounding passed off as fp32 stays inside
the proven bound but is not fp32 accumulation. The verdict travels in one
small message whatever the size of the candidates, so a stock stub (4 MiB
receive limit) reads it for any call.

Verdicts, worst first: outside_bounds, outside_precision_class, within_bounds,
bitwise_equal_to_logitd; with sample_rows the passing two end in "_sampled".
"""

import grpc
import numpy as np
import pytest

from protocol import DEFAULT_RECEIVE_LIMIT, Tensor, as_bf16, chunks_of, expect_error, xxh3
from stubs import pb

PASSING = ("within_bounds", "bitwise_equal_to_logitd", "within_bounds_sampled", "bitwise_equal_to_logitd_sampled")
FAILING = ("outside_bounds", "outside_precision_class")


def verify(conn, operation, inputs, candidates, chunk_bytes=64 << 10, **header):
    """One Verify call: `inputs` and `candidates` are Tensors, streamed in that order."""
    specs = {t.name: t.spec() for t in inputs}
    first = pb.VerifyRequest(
        header=pb.VerifyHeader(operation=operation, candidates=[c.spec() for c in candidates], **specs, **header)
    )
    body = [pb.VerifyRequest(chunk=c) for t in inputs + candidates for c in chunks_of(t, chunk_bytes)]
    responses = list(conn.stub.Verify(iter([first] + body), **conn.kw()))
    assert len(responses) == 1 and responses[0].WhichOneof("part") == "result"
    assert responses[0].ByteSize() < DEFAULT_RECEIVE_LIMIT
    return responses[0].result


def exact_logits(x, w):
    return (np.asarray(x, np.float64) @ np.asarray(w, np.float64).T).astype(np.float32)


def problem(seed, m, v, k):
    rng = np.random.default_rng(seed)
    return rng.integers(-8, 9, size=(m, k)), rng.integers(-8, 9, size=(v, k))


def test_verify_exact_logits_are_bitwise_logitds(conn, weights):
    """A candidate with the exact fp32 sums has logitd's bits: nothing outside, every element checked."""
    x, w = problem(301, 9, 130, 33)
    info = weights(w)
    y = Tensor("y", pb.DTYPE_FP32, exact_logits(x, w))
    r = verify(conn, pb.VERIFY_LOGITS, [Tensor("x", pb.DTYPE_BF16, x)], [y], weight_handle=info.handle)
    assert r.verdict == "bitwise_equal_to_logitd"
    (c,) = r.candidates
    assert c.name == "y" and c.dtype == pb.DTYPE_FP32 and list(c.shape) == [9, 130]
    assert c.xxh3 == xxh3(y.data)
    assert c.verdict == "bitwise_equal_to_logitd" and c.passed
    assert c.elements == 9 * 130 and c.outside_bound == 0 and c.nan_inf_mismatches == 0
    assert c.bitwise_equal_fraction == 1.0 and c.max_ulp == 0
    # The exact sums are the correctly rounded values.
    assert c.max_ulp_exact == c.p99_ulp_exact == c.p50_ulp_exact == 0
    assert c.HasField("precision_class") and not c.precision_class.outside
    assert sum(c.error_histogram) == c.elements and c.error_histogram[0] == c.elements
    assert not r.rows_checked and r.rows_total == 9 and r.sample_seed == 0


def test_verify_names_the_wrong_element(conn, weights):
    """One element far off: outside_bounds, and first_outside names it with the exact reference."""
    x, w = problem(302, 6, 40, 16)
    info = weights(w)
    want = exact_logits(x, w)
    bad = want.copy()
    bad[4, 17] += 1000.0
    r = verify(
        conn,
        pb.VERIFY_LOGITS,
        [Tensor("x", pb.DTYPE_BF16, x)],
        [Tensor("y", pb.DTYPE_FP32, bad)],
        weight_handle=info.handle,
    )
    assert r.verdict == "outside_bounds"
    (c,) = r.candidates
    assert c.verdict == "outside_bounds" and not c.passed
    assert c.outside_bound == 1 and c.worst_bound_fraction > 1
    # Listed first as outside its bound (the precision-class test may list it again).
    e = c.first_outside[0]
    assert list(e.index) == [4, 17] and e.outside_bound
    assert {tuple(f.index) for f in c.first_outside} == {(4, 17)}
    assert e.candidate == float(bad[4, 17]) and e.reference == float(want[4, 17])
    assert e.logitd == float(want[4, 17]) and abs(e.candidate - e.reference) > e.bound
    assert c.error_histogram[-1] == 1


def test_verify_with_the_weight_streamed_in_the_call(conn):
    """W may travel in the call instead of a handle; bf16 candidates are judged after their rounding."""
    x, w = problem(303, 5, 64, 24)
    y = exact_logits(x, w)
    r = verify(
        conn,
        pb.VERIFY_LOGITS,
        [Tensor("w", pb.DTYPE_BF16, w), Tensor("x", pb.DTYPE_BF16, x)],
        [Tensor("y", pb.DTYPE_BF16, y)],
    )
    assert r.verdict == "bitwise_equal_to_logitd", r
    assert r.candidates[0].dtype == pb.DTYPE_BF16


def test_verify_backward_both_gradients(conn, weights):
    """dX = G.W and dW = G^T.X of an integer dY (G = dY exactly) are exact."""
    x, w = problem(304, 7, 50, 12)
    dy = np.random.default_rng(305).integers(-4, 5, size=(7, 50))
    info = weights(w)
    dx = (dy.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
    dw = (dy.astype(np.float64).T @ x.astype(np.float64)).astype(np.float32)
    r = verify(
        conn,
        pb.VERIFY_BACKWARD,
        [Tensor("dy", pb.DTYPE_FP32, dy), Tensor("x", pb.DTYPE_BF16, x)],
        [Tensor("dx", pb.DTYPE_FP32, dx), Tensor("dw", pb.DTYPE_FP32, dw)],
        weight_handle=info.handle,
    )
    assert r.verdict == "bitwise_equal_to_logitd"
    assert sorted((c.name, list(c.shape)) for c in r.candidates) == [("dw", [50, 12]), ("dx", [7, 12])]


@pytest.mark.parametrize("chunk_bytes", [64 << 10, 4 << 20])
def test_verify_a_candidate_over_the_message_limit(conn, weights, chunk_bytes):
    """A 4.3 MiB candidate, in chunks up to 4 MiB, gets its verdict in one small message."""
    x, w = problem(306, 1100, 1024, 8)
    info = weights(w)
    y = Tensor("y", pb.DTYPE_FP32, exact_logits(x, w))
    assert len(y.data) > DEFAULT_RECEIVE_LIMIT
    r = verify(
        conn, pb.VERIFY_LOGITS, [Tensor("x", pb.DTYPE_BF16, x)], [y], chunk_bytes=chunk_bytes, weight_handle=info.handle
    )
    assert r.verdict == "bitwise_equal_to_logitd"
    assert r.candidates[0].elements == 1100 * 1024


def test_verify_sampled_rows_name_the_first_and_last(conn, weights):
    """sample_rows checks that many rows, the first and last included, lists them, and says so in
    the verdict."""
    x, w = problem(307, 40, 30, 8)
    info = weights(w)

    def sampled(n, **header):
        return verify(
            conn,
            pb.VERIFY_LOGITS,
            [Tensor("x", pb.DTYPE_BF16, x)],
            [Tensor("y", pb.DTYPE_FP32, exact_logits(x, w))],
            weight_handle=info.handle,
            sample_rows=n,
            **header,
        )

    r = sampled(5)
    rows = list(r.rows_checked)
    assert rows[0] == 0 and rows[-1] == 39 and rows == sorted(set(rows)) and len(rows) == 5
    assert r.candidates[0].elements == len(rows) * 30
    assert r.rows_total == 40 and r.sample_seed == 0
    assert r.verdict == "bitwise_equal_to_logitd_sampled" and r.verdict in PASSING
    assert r.candidates[0].verdict == "bitwise_equal_to_logitd_sampled" and r.candidates[0].passed
    # One row or two: the first and the last.
    assert list(sampled(1).rows_checked) == [0, 39]
    assert list(sampled(2).rows_checked) == [0, 39]


def test_verify_rows_drawn_by_a_seed(conn, weights):
    """sample_seed draws the rows: reported back, the same for the same seed; without sample_rows it is
    INVALID_ARGUMENT."""
    x, w = problem(312, 40, 30, 8)
    info = weights(w)
    inputs = [Tensor("x", pb.DTYPE_BF16, x)]
    y = [Tensor("y", pb.DTYPE_FP32, exact_logits(x, w))]
    r = verify(conn, pb.VERIFY_LOGITS, inputs, y, weight_handle=info.handle, sample_rows=5, sample_seed=4242)
    rows = list(r.rows_checked)
    assert len(rows) == 5 and rows == sorted(set(rows)) and all(0 <= i < 40 for i in rows)
    assert r.sample_seed == 4242 and r.rows_total == 40
    assert r.verdict == "bitwise_equal_to_logitd_sampled"
    again = verify(conn, pb.VERIFY_LOGITS, inputs, y, weight_handle=info.handle, sample_rows=5, sample_seed=4242)
    assert list(again.rows_checked) == rows
    e = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, verify, conn, pb.VERIFY_LOGITS, inputs, y, weight_handle=info.handle,
        sample_seed=4242,
    )
    assert "sample_seed" in e


def test_verify_bf16_rounding_at_k4096_is_outside_the_precision_class(conn, weights):
    """The fp64 logits rounded to fp32 pass; rounded to bf16 and sent as fp32, they stay inside the proven
    bound at K=4096 but fail the precision-class test, which reports its figures."""
    rng = np.random.default_rng(313)
    x, w = as_bf16(rng.standard_normal((4, 4096))), as_bf16(rng.standard_normal((64, 4096)))
    info = weights(w)
    inputs = [Tensor("x", pb.DTYPE_BF16, x)]
    rounded = exact_logits(x, w)
    r = verify(conn, pb.VERIFY_LOGITS, inputs, [Tensor("y", pb.DTYPE_FP32, rounded)], weight_handle=info.handle)
    assert r.verdict in PASSING, r
    assert not r.candidates[0].precision_class.outside

    bf16 = as_bf16(rounded).astype(np.float32)
    r = verify(conn, pb.VERIFY_LOGITS, inputs, [Tensor("y", pb.DTYPE_FP32, bf16)], weight_handle=info.handle)
    assert r.verdict == "outside_precision_class" and r.verdict in FAILING, r
    (c,) = r.candidates
    assert c.verdict == "outside_precision_class" and not c.passed
    assert c.outside_bound == 0
    p = c.precision_class
    assert p.tested and p.outside
    assert p.rms_ratio > p.threshold and p.effective_bits < p.class_bits
    assert 0 < p.alpha < 1 and p.rows == 4 and p.elements == 4 * 64 and p.rows_outside > 0
    assert 0 < len(p.worst_rows) <= 8 and p.envelope
    assert c.max_ulp_exact > 0
    for e in c.first_outside:
        assert not e.outside_bound
        if e.class_threshold > 0:  # found by the precision-class test
            assert abs(e.candidate - e.reference) > e.class_threshold
        else:
            assert abs(e.candidate - e.reference) <= e.bound


def test_verify_bad_requests(conn, weights):
    """Each bad header gets the status the contract gives it, naming what was expected."""
    x, w = problem(308, 4, 32, 8)
    info = weights(w)
    xt = Tensor("x", pb.DTYPE_BF16, x)
    y = exact_logits(x, w)

    def call(operation, candidates, inputs=(xt,), **header):
        header.setdefault("weight_handle", info.handle)
        return verify(conn, operation, list(inputs), candidates, **header)

    e = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call, pb.VERIFY_LOGITS, [Tensor("y", pb.DTYPE_FP32, y[:, :31])])
    assert "y: expected shape [4, 32]" in e
    e = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call, pb.VERIFY_LOGITS, [])
    assert "candidates: expected at least one" in e
    e = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call, pb.VERIFY_LOGITS, [Tensor("dx", pb.DTYPE_FP32, y)])
    assert "'dx' is not an output of VERIFY_LOGITS" in e
    expect_error(grpc.StatusCode.NOT_FOUND, call, pb.VERIFY_LOGITS, [Tensor("y", pb.DTYPE_FP32, y)], weight_handle="w-0")
    loss = Tensor("loss", pb.DTYPE_FP32, y[:, 0])
    e = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call, pb.VERIFY_CROSS_ENTROPY, [loss])
    assert "targets" in e
    targets = Tensor("targets", pb.DTYPE_INT64, np.arange(4))
    e = expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        call,
        pb.VERIFY_LOGPROBS,
        [Tensor("rank", pb.DTYPE_FP32, y[:, 0])],
        inputs=(xt, targets),
    )
    assert "rank: expected dtype INT32 or INT64, got FP32" in e


def test_verify_refuses_options_the_operation_does_not_read(conn, weights):
    """Another operation's options, and fields of the operation's own block that Verify takes from
    its header, are refused by name; a loss of the wrong shape with the reduction unset says that
    unset means the mean."""
    x, w = problem(312, 4, 32, 8)
    info = weights(w)
    xt = Tensor("x", pb.DTYPE_BF16, x)
    y = Tensor("y", pb.DTYPE_FP32, exact_logits(x, w))
    targets = Tensor("targets", pb.DTYPE_INT64, np.arange(4))
    loss = Tensor("loss", pb.DTYPE_FP32, np.zeros(4, np.float32))

    def call(operation, candidates, inputs=(xt,), **header):
        header.setdefault("weight_handle", info.handle)
        return verify(conn, operation, list(inputs), candidates, **header)

    code = grpc.StatusCode.INVALID_ARGUMENT
    e = expect_error(code, call, pb.VERIFY_LOGITS, [y], cross_entropy=pb.CrossEntropyHeader(z_loss=1e-4))
    assert "cross_entropy.z_loss: given, but VERIFY_LOGITS does not read it" in e
    e = expect_error(
        code, call, pb.VERIFY_CROSS_ENTROPY, [loss], inputs=(xt, targets), logprobs=pb.LogProbsHeader(temperature=0.7)
    )
    assert "logprobs.temperature: given, but VERIFY_CROSS_ENTROPY does not read it" in e
    e = expect_error(
        code,
        call,
        pb.VERIFY_CROSS_ENTROPY,
        [loss],
        inputs=(xt, targets),
        cross_entropy=pb.CrossEntropyHeader(reduction=pb.REDUCTION_NONE, weight_handle=info.handle),
    )
    assert "cross_entropy.weight_handle: given, but VERIFY_CROSS_ENTROPY does not read it" in e
    e = expect_error(code, call, pb.VERIFY_CROSS_ENTROPY, [loss], inputs=(xt, targets))
    assert "cross_entropy.reduction is unset, which means REDUCTION_MEAN" in e
    # What the operation reads passes.
    r = call(
        pb.VERIFY_CROSS_ENTROPY,
        [loss],
        inputs=(xt, targets),
        cross_entropy=pb.CrossEntropyHeader(reduction=pb.REDUCTION_NONE, z_loss=0.0, grad_scale=1.0),
    )
    assert r.verdict == "outside_bounds"  # zeros are not the losses


def softmax_of_logits(z, targets):
    """lse, the target's loss (lse - z_t) and the entropy of each row of float64 logits z."""
    mx = z.max(axis=1, keepdims=True)
    p = np.exp(z - mx)
    s = p.sum(axis=1, keepdims=True)
    lse = (mx + np.log(s))[:, 0]
    prob = p / s
    entropy = -(prob * np.log(np.where(prob > 0, prob, 1))).sum(axis=1)
    return lse, lse - z[np.arange(len(targets)), targets], entropy


def softmax_parts(x, w, targets, temperature=1.0):
    """lse, the target's log-prob and the entropy of each row, in float64 (integer logits: exact z)."""
    z = (np.asarray(x, np.float64) @ np.asarray(w, np.float64).T) / temperature
    lse, loss, entropy = softmax_of_logits(z, np.maximum(targets, 0))
    return lse, np.where(targets >= 0, -loss, 0), entropy


def test_verify_cross_entropy_loss_and_lse(conn, weights):
    """Per-token loss and lse formed in float64 and rounded once are within bounds; one far off is not."""
    x, w = problem(309, 6, 50, 16)
    targets = np.array([3, -100, 0, 49, 7, 12])
    info = weights(w)
    lse, logprob, _ = softmax_parts(x, w, targets)
    loss = np.where(targets >= 0, -logprob, 0).astype(np.float32)
    inputs = [Tensor("x", pb.DTYPE_BF16, x), Tensor("targets", pb.DTYPE_INT64, targets)]
    header = dict(weight_handle=info.handle, cross_entropy=pb.CrossEntropyHeader(reduction=pb.REDUCTION_NONE))
    r = verify(
        conn,
        pb.VERIFY_CROSS_ENTROPY,
        inputs,
        [Tensor("loss", pb.DTYPE_FP32, loss), Tensor("lse", pb.DTYPE_FP32, lse.astype(np.float32))],
        **header,
    )
    assert r.verdict in ("within_bounds", "bitwise_equal_to_logitd"), r
    assert [list(c.shape) for c in r.candidates] == [[6], [6]]
    bad = loss.copy()
    bad[2] += 1.0
    r = verify(conn, pb.VERIFY_CROSS_ENTROPY, inputs, [Tensor("loss", pb.DTYPE_FP32, bad)], **header)
    assert r.verdict == "outside_bounds"
    assert list(r.candidates[0].first_outside[0].index) == [2]


def test_verify_per_token_outputs_from_bf16_logits_are_outside_the_precision_class(conn, weights):
    """64 tokens over V = 32,768 with logits of an LM head's spread (z ~ N(0, 3²)): the cross-entropy's
    per-token loss and lse, and LogProbs' log-prob, lse and entropy, from fp32 logits pass; from the
    same logits rounded to bf16 they fail (every value still a correct softmax of its logits), each
    with its precision-class figures, a token a row."""
    rng = np.random.default_rng(47)
    m, k, v = 64, 256, 32768
    x = as_bf16(rng.standard_normal((m, k)))
    w = as_bf16(rng.standard_normal((v, k)) * (3 / np.sqrt(k)))
    targets = rng.integers(0, v, size=m)
    info = weights(w)
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    inputs = [Tensor("x", pb.DTYPE_BF16, x), Tensor("targets", pb.DTYPE_INT64, targets)]
    ce = dict(weight_handle=info.handle, cross_entropy=pb.CrossEntropyHeader(reduction=pb.REDUCTION_NONE))
    for logits, passes in ((exact.astype(np.float32), True), (as_bf16(exact.astype(np.float32)), False)):
        lse, loss, entropy = softmax_of_logits(np.asarray(logits, np.float64), targets)
        f32 = lambda a: a.astype(np.float32)  # noqa: E731
        for op, cands, header in (
            (pb.VERIFY_CROSS_ENTROPY, [Tensor("loss", pb.DTYPE_FP32, f32(loss)), Tensor("lse", pb.DTYPE_FP32, f32(lse))], ce),
            (
                pb.VERIFY_LOGPROBS,
                [
                    Tensor("logprob", pb.DTYPE_FP32, f32(-loss)),
                    Tensor("lse", pb.DTYPE_FP32, f32(lse)),
                    Tensor("entropy", pb.DTYPE_FP32, f32(entropy)),
                ],
                dict(weight_handle=info.handle),
            ),
        ):
            r = verify(conn, op, inputs, cands, **header)
            for c in r.candidates:
                p = c.precision_class
                assert p.tested and p.elements == m and p.rows == m, (c.name, p)
                if passes:
                    assert c.passed and not p.outside, (c.name, c.verdict, p)
                else:
                    assert not c.passed and c.verdict in FAILING, (c.name, c.verdict, p)
                    assert p.outside and p.rms_ratio > p.threshold and p.effective_bits < p.class_bits, (c.name, p)
                    assert 0 < len(p.worst_rows) <= 8 and p.worst_rows[0].elements == 1


def test_verify_logprobs_at_a_temperature(conn, weights):
    """logprob, lse and entropy at temperature 2 in float64 are within bounds."""
    x, w = problem(310, 5, 40, 12)
    targets = np.array([0, 39, -100, 5, 17])
    info = weights(w)
    lse, logprob, entropy = softmax_parts(x, w, targets, temperature=2.0)
    r = verify(
        conn,
        pb.VERIFY_LOGPROBS,
        [Tensor("x", pb.DTYPE_BF16, x), Tensor("targets", pb.DTYPE_INT64, targets)],
        [
            Tensor("logprob", pb.DTYPE_FP32, logprob.astype(np.float32)),
            Tensor("lse", pb.DTYPE_FP32, lse.astype(np.float32)),
            Tensor("entropy", pb.DTYPE_FP32, entropy.astype(np.float32)),
        ],
        weight_handle=info.handle,
        logprobs=pb.LogProbsHeader(temperature=2.0),
    )
    assert r.verdict in ("within_bounds", "bitwise_equal_to_logitd"), r
    assert sorted(c.name for c in r.candidates) == ["entropy", "logprob", "lse"]


def test_verify_logprobs_top_k_and_ranks(conn, weights):
    """Top-k ids, their log-probs and the targets' ranks of exact integer logits: numpy's order
    (ties to the lower id) passes; two places swapped are named."""
    x, w = problem(311, 5, 40, 12)
    targets = np.array([0, 39, -100, 5, 17])
    info = weights(w)
    z = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    lse, _, _ = softmax_parts(x, w, targets)
    ids = np.argsort(-z, axis=1, kind="stable")[:, :3]
    topk_logprobs = (np.take_along_axis(z, ids, axis=1) - lse[:, None]).astype(np.float32)
    rank = np.array(
        [-1 if t < 0 else int((z[i] > z[i, t]).sum() + (z[i, :t] == z[i, t]).sum()) for i, t in enumerate(targets)]
    )
    inputs = [Tensor("x", pb.DTYPE_BF16, x), Tensor("targets", pb.DTYPE_INT64, targets)]

    def judge(ids_):
        return verify(
            conn,
            pb.VERIFY_LOGPROBS,
            inputs,
            [
                Tensor("topk_ids", pb.DTYPE_INT32, ids_.astype(np.int32)),
                Tensor("topk_logprobs", pb.DTYPE_FP32, topk_logprobs),
                Tensor("rank", pb.DTYPE_INT64, rank),
            ],
            weight_handle=info.handle,
        )

    r = judge(ids)
    assert r.verdict in ("within_bounds", "bitwise_equal_to_logitd"), r
    swapped = ids.copy()
    row = next(i for i in range(5) if z[i, ids[i, 0]] != z[i, ids[i, 2]])
    swapped[row, [0, 2]] = swapped[row, [2, 0]]
    r = judge(swapped)
    assert r.verdict == "outside_bounds"
    c = next(c for c in r.candidates if c.name == "topk_ids")
    assert c.outside_bound == 2
    assert list(c.first_outside[0].index) == [row, 0]
