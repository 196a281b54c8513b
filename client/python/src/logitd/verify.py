"""Verify: another implementation's outputs of the LM head's products, judged
against logitd's contract.

A candidate (the logits of a framework's GEMM, a Triton kernel, a library
upgrade; or its dX and dW) travels with the inputs it was computed from. For
every element the server forms an fp64 reference of the exact products of the
bf16 inputs and the proven bound on any fp32 accumulation of them; it holds the
candidate's errors against those of conforming fp32 accumulations of the same
inputs (the precision-class test), and compares with logitd's own output of
the same inputs. It answers with a verdict per candidate, worst first
(docs/PROTOCOL.md, "Verify"):

- ``"outside_bounds"``: an element outside its proven bound (wrong for
  certain), or NaN/Inf where the reference has none, or the reverse;
- ``"outside_precision_class"``: inside the proven bound, but the errors are
  not those of fp32 accumulation (bf16 rounding passed off as fp32, bf16
  partial sums, one element off): CandidateVerdict.precision_class has the
  test's figures;
- ``"within_bounds"``: a conforming result (another order of summation);
- ``"bitwise_equal_to_logitd"``: every element has logitd's own bits.

The last two pass; with sampled rows (``sample_rows``) they read
``"within_bounds_sampled"`` and ``"bitwise_equal_to_logitd_sampled"``, which
pass too (PASSING_VERDICTS). Servers before the precision-class test said
``"outside_probabilistic_bounds"`` where this says
``"outside_precision_class"``; the probabilistic bound figures remain, and
decide nothing. Client.verify_logits and Client.verify_backward build the call
here; the Verdict they return says what was found, and describe() puts it in
words. X and W go to the server as bf16: a float32 tensor is taken only when
each of its values is a bf16 value, since the candidate was computed from bits
the client must not change.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from . import _tensors as T
from .errors import InvalidArgumentError
from .results import WeightInfo
from .v1 import logitd_pb2 as pb

__all__ = [
    "ERROR_HISTOGRAM_BINS",
    "PASSING_VERDICTS",
    "CandidateVerdict",
    "PrecisionClass",
    "RowPrecision",
    "Verdict",
    "VerifyElement",
]

# The verdicts that pass (decided by the word: servers before the precision-class
# test do not set CandidateVerdict.passed on the wire). Every other one fails:
# "outside_bounds", "outside_precision_class", and an older server's
# "outside_probabilistic_bounds".
PASSING_VERDICTS = (
    "within_bounds",
    "bitwise_equal_to_logitd",
    "within_bounds_sampled",
    "bitwise_equal_to_logitd_sampled",
)

# The bins of CandidateVerdict.error_histogram: |candidate - reference| / bound.
ERROR_HISTOGRAM_BINS = (
    "0",
    "(0, 1e-6]",
    "(1e-6, 1e-5]",
    "(1e-5, 1e-4]",
    "(1e-4, 1e-3]",
    "(1e-3, 1e-2]",
    "(1e-2, 0.1]",
    "(0.1, 0.5]",
    "(0.5, 1]",
    "over 1 (NaN included)",
)

# CandidateVerdict.max_ulp (and the percentiles) for a NaN against a number.
_ULP_NAN = (1 << 63) - 1

# Largest sample_rows the wire carries (uint32), and sample_seed (uint64).
_MAX_SAMPLE_ROWS = (1 << 32) - 1
_MAX_SAMPLE_SEED = (1 << 64) - 1


@dataclass(frozen=True)
class VerifyElement:
    """One element of a candidate: its index (one entry per dimension), the
    candidate's value, the fp64 reference, the proven bound on
    |candidate - reference| and the probabilistic figure (never larger; it
    decides nothing), and logitd's own output there. outside_bound: outside
    the proven bound (wrong for certain); class_threshold: for an element the
    precision-class test found, the largest |candidate - reference| a
    conforming implementation reaches there (0 otherwise)."""

    index: Tuple[int, ...]
    candidate: float
    reference: float
    bound: float
    probabilistic_bound: float
    logitd: float
    outside_bound: bool = False
    class_threshold: float = 0.0


@dataclass(frozen=True)
class RowPrecision:
    """One row of a candidate in the precision-class test: its index (of M for y
    and dx, of V for dw), its elements, its effective precision and the worst
    a conforming implementation reaches in it (bits), its RMS error over the
    conforming envelope's with the threshold a conforming candidate stays
    under, and whether it is outside."""

    row: int
    elements: int
    effective_bits: float
    class_bits: float
    rms_ratio: float
    threshold: float
    outside: bool


@dataclass(frozen=True)
class PrecisionClass:
    """The precision-class test of a candidate: are its errors those of fp32
    accumulation? The server forms the errors of conforming implementations
    of the same inputs (the sequential fp32 sum, a tensor-core model, logitd's
    own output, the correctly rounded result: ``envelope``) and holds the
    candidate's to them; a conforming candidate is found outside with
    probability at most ``alpha``.

    tested: False where the test does not apply (integer outputs, a reduced
    loss: ``reason`` says why), and from servers without the test.
    effective_bits: the significand bits of a sequential round-to-nearest
    accumulator with the same RMS error (24 for fp32's own; about 8 plus half
    of log2(K) for bf16 rounding of the result); class_bits: the least a
    conforming implementation reaches. rms_ratio, threshold: the whole
    tensor's RMS error over the envelope's, and the most a conforming
    candidate reaches. rows_outside, elements_outside: rows outside (their RMS
    error, or their largest). worst_rows: at most 8, worst first.
    """

    tested: bool = False
    reason: str = ""
    outside: bool = False
    alpha: float = 0.0
    effective_bits: float = 0.0
    class_bits: float = 0.0
    rms_ratio: float = 0.0
    threshold: float = 0.0
    elements: int = 0
    rows: int = 0
    rows_outside: int = 0
    elements_outside: int = 0
    worst_rows: Tuple[RowPrecision, ...] = ()
    envelope: str = ""


@dataclass(frozen=True)
class CandidateVerdict:
    """What the server found in one candidate ("y"; "dx", "dw").

    dtype is "fp32" or "bf16"; xxh3 the digest of its bytes as received.
    elements: those checked (all, unless rows were sampled).
    outside_bound, worst_bound_fraction: elements outside their proven bound,
    and the largest |candidate - reference| as a fraction of its bound (inf for
    a NaN or infinity where the reference has none).
    outside_probabilistic_bound, worst_probabilistic_fraction,
    logitd_outside_probabilistic_bound: the same against the probabilistic
    bound, and logitd's own output outside it: figures kept for comparison,
    which decide no verdict.
    first_outside: at most 32 elements: those outside the proven bound first
    (index order), then those the precision-class test found (worst first),
    then those outside the probabilistic figure.
    nan_inf_mismatches: NaN or infinity where the reference has none, or the
    reverse. bitwise_equal_fraction, max_ulp, p99_ulp, p50_ulp: against
    logitd's own output of the same inputs (max_ulp is 2**63 - 1 for a NaN
    against a number). max_ulp_exact, p99_ulp_exact, p50_ulp_exact: against
    the exact value correctly rounded to the dtype (-1 for integer outputs,
    and from servers that do not report them). error_histogram:
    |candidate - reference| / bound in the bins of ERROR_HISTOGRAM_BINS.
    precision_class: the precision-class test (PrecisionClass).
    """

    name: str
    dtype: str
    shape: Tuple[int, ...]
    xxh3: int
    elements: int
    outside_bound: int
    worst_bound_fraction: float
    outside_probabilistic_bound: int
    worst_probabilistic_fraction: float
    logitd_outside_probabilistic_bound: int
    first_outside: List[VerifyElement]
    nan_inf_mismatches: int
    bitwise_equal_fraction: float
    max_ulp: int
    p99_ulp: int
    p50_ulp: int
    error_histogram: Tuple[int, ...]
    verdict: str
    precision_class: PrecisionClass = field(default_factory=PrecisionClass)
    max_ulp_exact: int = -1
    p99_ulp_exact: int = -1
    p50_ulp_exact: int = -1

    @property
    def passed(self) -> bool:
        """Within bounds, or bitwise logitd's own output, sampled or not."""
        return self.verdict in PASSING_VERDICTS


@dataclass(frozen=True)
class Verdict:
    """The server's judgement of a Verify call.

    verdict: the worst of the candidates' verdicts; passed: whether it passes.
    candidates: each candidate's CandidateVerdict by name, in the server's order.
    rows_checked: the rows of M checked when rows were sampled (empty: every
    row), of rows_total; sample_seed: the seed they were drawn by (0: evenly
    spaced).
    inputs_xxh3: a digest of the operation, its options and the inputs'
    digests, the key a golden baseline files its cases under.
    reference_us: the server's time forming the fp64 references and checking.
    reference_engine: where the fp64 products were formed ("cuBLAS DGEMM on
    <device>", "OpenBLAS dgemm on the host").
    """

    verdict: str
    candidates: Dict[str, CandidateVerdict]
    rows_checked: Tuple[int, ...]
    inputs_xxh3: int
    reference_us: int
    reference_engine: str = ""
    rows_total: int = 0
    sample_seed: int = 0

    @property
    def passed(self) -> bool:
        """Every candidate within bounds, or bitwise logitd's own output, sampled or not."""
        return self.verdict in PASSING_VERDICTS

    def describe(self, max_elements: int = 5) -> str:
        """The verdict in words: each candidate's verdict and the figures that
        decided it (the proven bound's; the precision-class test's RMS ratio
        against its threshold and effective bits; ulps against logitd's own
        output and the correctly rounded value), and the first ``max_elements``
        elements the server listed (those outside the proven bound first), with
        their index, the candidate's value, the fp64 reference and what each
        was held to."""
        lines = [
            "verify: %s (%s); inputs xxh3 %016x"
            % (self.verdict, "passed" if self.passed else "failed", self.inputs_xxh3)
        ]
        if self.rows_checked:
            shown = ", ".join(str(r) for r in self.rows_checked[:12])
            if len(self.rows_checked) > 12:
                shown += ", ..."
            of = " of %d" % self.rows_total if self.rows_total else ""
            how = "drawn by seed %d" % self.sample_seed if self.sample_seed else "evenly spaced"
            lines.append("rows checked: %s (%d rows%s, %s)" % (shown, len(self.rows_checked), of, how))
        for c in self.candidates.values():
            lines.extend(_describe_candidate(c, max_elements))
        return "\n".join(lines)


def _describe_precision_class(p: PrecisionClass) -> List[str]:
    if not p.tested:
        return ["  precision class: not tested%s" % (" (%s)" % p.reason if p.reason else "")]
    lines = [
        "  precision class: %s; RMS error %.3g times the conforming envelope's (threshold %.3g); "
        "effective precision %.1f bits (the envelope's %.1f); alpha %.3g; %d of %d rows and %d of %d "
        "elements outside"
        % (
            "OUTSIDE (not fp32 accumulation)" if p.outside else "inside",
            p.rms_ratio,
            p.threshold,
            p.effective_bits,
            p.class_bits,
            p.alpha,
            p.rows_outside,
            p.rows,
            p.elements_outside,
            p.elements,
        )
    ]
    if p.outside:
        for r in p.worst_rows[:3]:
            lines.append(
                "    row %d: RMS %.3g times (threshold %.3g), %.1f bits (the envelope's %.1f)%s"
                % (r.row, r.rms_ratio, r.threshold, r.effective_bits, r.class_bits, ", outside" if r.outside else "")
            )
    return lines


def _worst_first(elements: List[VerifyElement]) -> List[VerifyElement]:
    """The server's list (outside the proven bound in index order, then the
    precision-class test's worst first, then the probabilistic figure's),
    each group ordered by how far past what it was held to, largest first."""

    def key(e: VerifyElement) -> Tuple[int, float]:
        error = abs(e.candidate - e.reference)
        if e.outside_bound or not error <= e.bound:
            group, held = 0, e.bound
        elif e.class_threshold > 0:
            group, held = 1, e.class_threshold
        else:
            group, held = 2, e.probabilistic_bound
        excess = error / held if held > 0 else math.inf
        return group, -(excess if excess == excess else math.inf)

    return sorted(elements, key=key)


def _describe_element(e: VerifyElement) -> str:
    error = abs(e.candidate - e.reference)
    logitd_value = ", logitd %.9g" % e.logitd
    if e.outside_bound:
        held = "outside its proven bound %.3e" % e.bound
    elif e.class_threshold > 0:
        held = "over its class threshold %.3e" % e.class_threshold
        if e.bound > 0:
            held += " (proven bound %.3e)" % e.bound
        else:
            # The precision-class test's elements may come without their bound and logitd's value.
            logitd_value = ""
    elif not error <= e.bound:
        # A server before outside_bound flagged it.
        held = "outside its proven bound %.3e" % e.bound
    else:
        held = "outside the probabilistic figure %.3e (proven bound %.3e)" % (e.probabilistic_bound, e.bound)
    return "    [%s]: candidate %.9g, fp64 reference %.17g, |error| %.3e %s%s" % (
        ", ".join(str(i) for i in e.index),
        e.candidate,
        e.reference,
        error,
        held,
        logitd_value,
    )


def _describe_candidate(c: CandidateVerdict, max_elements: int) -> List[str]:
    lines = ["%s %s [%s]: %s" % (c.name, c.dtype, ", ".join(str(d) for d in c.shape), c.verdict)]
    lines.append(
        "  %d of %d elements outside the proven bound (worst %.3g times it), %d NaN/Inf mismatches"
        % (c.outside_bound, c.elements, c.worst_bound_fraction, c.nan_inf_mismatches)
    )
    lines.extend(_describe_precision_class(c.precision_class))
    if c.max_ulp == _ULP_NAN:
        ulps = "a NaN against a number"
    else:
        ulps = "ulp vs logitd's: max %d, p99 %d, p50 %d" % (c.max_ulp, c.p99_ulp, c.p50_ulp)
    if c.max_ulp_exact >= 0:
        if c.max_ulp_exact == _ULP_NAN:
            ulps += "; vs correctly rounded: a NaN against a number"
        else:
            ulps += "; ulp vs correctly rounded: max %d, p99 %d, p50 %d" % (
                c.max_ulp_exact,
                c.p99_ulp_exact,
                c.p50_ulp_exact,
            )
    lines.append("  %.2f%% bitwise equal to logitd's own output; %s" % (100.0 * c.bitwise_equal_fraction, ulps))
    if c.first_outside:
        shown = _worst_first(c.first_outside)[: max(0, max_elements)]
        if shown:
            lines.append(
                "  elements listed: %d (outside the proven bound first, then the precision-class test's, "
                "then the probabilistic figure's; worst first in each); the first %d:"
                % (len(c.first_outside), len(shown))
            )
        for e in shown:
            lines.append(_describe_element(e))
        rest = len(c.first_outside) - len(shown)
        if rest > 0:
            lines.append("    and %d more in first_outside" % rest)
    return lines


# -- requests -----------------------------------------------------------------------------


def logits_request(
    x: Any, y: Any, weight: Any, alpha: float, sample_rows: int, sample_seed: int = 0
) -> Tuple[pb.VerifyHeader, List[T.Outgoing]]:
    """The header and streamed tensors of a VERIFY_LOGITS call."""
    alpha = float(alpha)
    if alpha == 0.0:
        raise InvalidArgumentError("alpha: expected a non-zero scale (0 on the wire means the default 1), got 0")
    if not math.isfinite(alpha):
        raise InvalidArgumentError("alpha: expected a finite scale, got %r" % alpha)
    header = pb.VerifyHeader(
        operation=pb.VERIFY_LOGITS,
        alpha=alpha,
        sample_rows=_sample_rows(sample_rows),
        sample_seed=_sample_seed(sample_seed),
    )
    inputs = _inputs(header, x, weight)
    candidates = _candidates(header, [("y", y)])
    return header, inputs + candidates


def backward_request(
    dy: Any, x: Any, weight: Any, dx: Any, dw: Any, sample_rows: int, sample_seed: int = 0
) -> Tuple[pb.VerifyHeader, List[T.Outgoing]]:
    """The header and streamed tensors of a VERIFY_BACKWARD call."""
    if dx is None and dw is None:
        raise InvalidArgumentError(
            "dx, dw: expected at least one candidate (dx [M, K] and/or dw [V, K]), got neither"
        )
    header = pb.VerifyHeader(
        operation=pb.VERIFY_BACKWARD,
        sample_rows=_sample_rows(sample_rows),
        sample_seed=_sample_seed(sample_seed),
    )
    inputs = _inputs(header, x, weight)
    dyt = T.Outgoing("dy", dy, (pb.DTYPE_FP32, pb.DTYPE_BF16))
    header.dy.CopyFrom(dyt.spec)
    candidates = _candidates(header, [("dx", dx), ("dw", dw)])
    return header, inputs + [dyt] + candidates


_REDUCTIONS = {"none": pb.REDUCTION_NONE, "sum": pb.REDUCTION_SUM, "mean": pb.REDUCTION_MEAN}


def _targets(header: pb.VerifyHeader, targets: Any) -> List[T.Outgoing]:
    if targets is None:
        return []
    tt = T.Outgoing("targets", _numpy("targets", targets), (pb.DTYPE_INT32, pb.DTYPE_INT64))
    header.targets.CopyFrom(tt.spec)
    return [tt]


def cross_entropy_request(
    x: Any,
    targets: Any,
    weight: Any,
    loss: Any,
    lse: Any,
    options: dict,
    dx: Any = None,
    dw: Any = None,
) -> Tuple[pb.VerifyHeader, List[T.Outgoing]]:
    """The header and streamed tensors of a VERIFY_CROSS_ENTROPY call."""
    if loss is None and lse is None and dx is None and dw is None:
        raise InvalidArgumentError("loss, lse, dx, dw: expected at least one candidate, got none")
    reduction = options.get("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise InvalidArgumentError(
            "reduction: expected one of %s, got %r" % (", ".join(sorted(_REDUCTIONS)), reduction)
        )
    header = pb.VerifyHeader(
        operation=pb.VERIFY_CROSS_ENTROPY,
        cross_entropy=pb.CrossEntropyHeader(
            ignore_index=int(options.get("ignore_index", -100)),
            reduction=_REDUCTIONS[reduction],
            z_loss=float(options.get("z_loss", 0.0)),
            logit_softcap=float(options.get("logit_softcap", 0.0)),
            grad_scale=float(options.get("grad_scale", 1.0)),
        ),
        sample_rows=_sample_rows(options.get("sample_rows", 0)),
        sample_seed=_sample_seed(options.get("sample_seed", 0)),
    )
    inputs = _inputs(header, x, weight) + _targets(header, targets)
    if loss is not None and np.ndim(loss) == 0:
        loss = np.asarray(loss, dtype=np.float32).reshape(1)
    candidates = _candidates(header, [("loss", loss), ("lse", lse), ("dx", dx), ("dw", dw)])
    return header, inputs + candidates


def logprobs_request(
    x: Any,
    targets: Any,
    weight: Any,
    logprob: Any,
    lse: Any,
    entropy: Any,
    options: dict,
    topk_ids: Any = None,
    topk_logprobs: Any = None,
    rank: Any = None,
) -> Tuple[pb.VerifyHeader, List[T.Outgoing]]:
    """The header and streamed tensors of a VERIFY_LOGPROBS call."""
    given = (logprob, lse, entropy, topk_ids, topk_logprobs, rank)
    if all(c is None for c in given):
        raise InvalidArgumentError(
            "logprob, lse, entropy, topk_ids, topk_logprobs, rank: expected at least one candidate, got none"
        )
    header = pb.VerifyHeader(
        operation=pb.VERIFY_LOGPROBS,
        logprobs=pb.LogProbsHeader(
            ignore_index=int(options.get("ignore_index", -100)),
            temperature=float(options.get("temperature", 1.0)),
            logit_softcap=float(options.get("logit_softcap", 0.0)),
            vocab_size=int(options.get("vocab_size", 0)),
        ),
        sample_rows=_sample_rows(options.get("sample_rows", 0)),
        sample_seed=_sample_seed(options.get("sample_seed", 0)),
    )
    inputs = _inputs(header, x, weight) + _targets(header, targets)
    candidates = _candidates(
        header,
        [
            ("logprob", logprob),
            ("lse", lse),
            ("entropy", entropy),
            ("topk_ids", topk_ids),
            ("topk_logprobs", topk_logprobs),
            ("rank", rank),
        ],
    )
    return header, inputs + candidates


def call(transport: Any, header: pb.VerifyHeader, tensors: Sequence[T.Outgoing]) -> Verdict:
    """Streams the header and tensors through a Client (its _Transport) and reads the one result."""
    result, _ = transport._stream(transport._stub.Verify, pb.VerifyRequest, "header", header, tensors, lambda r: [])
    return _verdict_of(result)


def _sample_rows(sample_rows: int) -> int:
    try:
        n = int(sample_rows)
    except (TypeError, ValueError):
        n = -1
    if n != sample_rows or not 0 <= n <= _MAX_SAMPLE_ROWS:
        raise InvalidArgumentError(
            "sample_rows: expected 0 (every row) or a number of rows to check, got %r" % (sample_rows,)
        )
    return n


def _sample_seed(sample_seed: int) -> int:
    # Whether it comes with sample_rows is the server's to say (INVALID_ARGUMENT).
    try:
        n = int(sample_seed)
    except (TypeError, ValueError):
        n = -1
    if isinstance(sample_seed, bool) or n != sample_seed or not 0 <= n <= _MAX_SAMPLE_SEED:
        raise InvalidArgumentError(
            "sample_seed: expected 0 (evenly spaced rows) or a seed in [1, 2**64), got %r" % (sample_seed,)
        )
    return n


def _inputs(header: pb.VerifyHeader, x: Any, weight: Any) -> List[T.Outgoing]:
    """Sets the weight (handle or streamed w) and x in the header; returns the tensors to stream."""
    tensors = []
    if isinstance(weight, WeightInfo):
        header.weight_handle = weight.handle
    elif isinstance(weight, str):
        if not weight:
            raise InvalidArgumentError("weight: expected a handle, a WeightInfo or a bf16 tensor [V, K], got ''")
        header.weight_handle = weight
    elif T.is_torch(weight) or isinstance(weight, np.ndarray):
        w = T.Outgoing("w", exact_bf16("w", weight), (pb.DTYPE_BF16,))
        header.w.CopyFrom(w.spec)
        tensors.append(w)
    else:
        raise InvalidArgumentError(
            "weight: expected a handle, a WeightInfo or a bf16 tensor [V, K], got %s" % type(weight).__name__
        )
    xt = T.Outgoing("x", exact_bf16("x", x), (pb.DTYPE_BF16,))
    header.x.CopyFrom(xt.spec)
    return tensors + [xt]


def _candidates(header: pb.VerifyHeader, named: Sequence[Tuple[str, Any]]) -> List[T.Outgoing]:
    out = []
    for name, value in named:
        if value is None:
            continue
        # LogProbs' top-k ids and ranks are integers.
        dtypes = (pb.DTYPE_INT32, pb.DTYPE_INT64) if name in ("topk_ids", "rank") else (pb.DTYPE_FP32, pb.DTYPE_BF16)
        t = T.Outgoing(name, _numpy(name, value), dtypes)
        header.candidates.add().CopyFrom(t.spec)
        out.append(t)
    return out


def _numpy(name: str, value: Any) -> Any:
    """A torch tensor as a CPU numpy array (an error naming the tensor for a dtype the wire lacks)."""
    if not T.is_torch(value):
        return value
    try:
        return T._torch_to_numpy(value)
    except InvalidArgumentError as e:
        raise InvalidArgumentError("%s: %s" % (name, e.message)) from None


def exact_bf16(name: str, value: Any) -> np.ndarray:
    """A bf16 tensor as it is; a float32 one as bf16 when each of its values is a
    bf16 value (NaN included), else InvalidArgumentError (a ValueError) naming it."""
    arr = _numpy(name, value)
    if not isinstance(arr, np.ndarray):
        raise InvalidArgumentError(
            "%s: expected a numpy array or a torch tensor, got %s" % (name, type(arr).__name__)
        )
    if arr.dtype == T.BF16:
        return arr
    if not (arr.dtype.kind == "f" and arr.dtype.itemsize == 4):
        raise InvalidArgumentError(
            "%s: expected dtype bf16 (or float32 holding bf16 values), got %s (convert with "
            ".astype(ml_dtypes.bfloat16) or .to(torch.bfloat16))" % (name, arr.dtype)
        )
    a = np.ascontiguousarray(arr, dtype=T.FP32)
    u = a.view(np.uint32)
    nan = np.isnan(a)
    inexact = ((u & 0xFFFF) != 0) & ~nan
    if inexact.any():
        flat = int(np.flatnonzero(inexact)[0])
        index = ", ".join(str(int(i)) for i in np.unravel_index(flat, a.shape)) if a.ndim else ""
        raise InvalidArgumentError(
            "%s: expected bf16, got float32 with values that are not bf16 (%.9g at [%s]); pass the bf16 "
            "tensor the candidate was computed from" % (name, float(a.reshape(-1)[flat]), index)
        )
    high = (u >> 16).astype(np.uint16)
    # A NaN whose payload lies in the low bits only would read as infinity: keep it a (quiet) NaN.
    high = np.where(nan, high | np.uint16(0x0040), high)
    return high.view(T.BF16)


# -- the result ---------------------------------------------------------------------------


def _dtype_name(dtype: int) -> str:
    try:
        return pb.DType.Name(dtype).replace("DTYPE_", "").lower()
    except ValueError:
        return "dtype %d" % dtype


def _candidate_of(c: pb.CandidateVerdict) -> CandidateVerdict:
    return CandidateVerdict(
        name=c.name,
        dtype=_dtype_name(c.dtype),
        shape=tuple(int(d) for d in c.shape),
        xxh3=int(c.xxh3),
        elements=int(c.elements),
        outside_bound=int(c.outside_bound),
        worst_bound_fraction=float(c.worst_bound_fraction),
        outside_probabilistic_bound=int(c.outside_probabilistic_bound),
        worst_probabilistic_fraction=float(c.worst_probabilistic_fraction),
        logitd_outside_probabilistic_bound=int(c.logitd_outside_probabilistic_bound),
        first_outside=[
            VerifyElement(
                index=tuple(int(i) for i in e.index),
                candidate=float(e.candidate),
                reference=float(e.reference),
                bound=float(e.bound),
                probabilistic_bound=float(e.probabilistic_bound),
                logitd=float(e.logitd),
                outside_bound=bool(e.outside_bound),
                class_threshold=float(e.class_threshold),
            )
            for e in c.first_outside
        ],
        nan_inf_mismatches=int(c.nan_inf_mismatches),
        bitwise_equal_fraction=float(c.bitwise_equal_fraction),
        max_ulp=int(c.max_ulp),
        p99_ulp=int(c.p99_ulp),
        p50_ulp=int(c.p50_ulp),
        error_histogram=tuple(int(n) for n in c.error_histogram),
        verdict=c.verdict,
        precision_class=_precision_class_of(c.precision_class),
        # Servers before these figures send no precision class either, and
        # leave them 0, which would read as exact.
        max_ulp_exact=int(c.max_ulp_exact) if c.HasField("precision_class") else -1,
        p99_ulp_exact=int(c.p99_ulp_exact) if c.HasField("precision_class") else -1,
        p50_ulp_exact=int(c.p50_ulp_exact) if c.HasField("precision_class") else -1,
    )


def _precision_class_of(p: pb.PrecisionClass) -> PrecisionClass:
    return PrecisionClass(
        tested=bool(p.tested),
        reason=p.reason,
        outside=bool(p.outside),
        alpha=float(p.alpha),
        effective_bits=float(p.effective_bits),
        class_bits=float(p.class_bits),
        rms_ratio=float(p.rms_ratio),
        threshold=float(p.threshold),
        elements=int(p.elements),
        rows=int(p.rows),
        rows_outside=int(p.rows_outside),
        elements_outside=int(p.elements_outside),
        worst_rows=tuple(
            RowPrecision(
                row=int(r.row),
                elements=int(r.elements),
                effective_bits=float(r.effective_bits),
                class_bits=float(r.class_bits),
                rms_ratio=float(r.rms_ratio),
                threshold=float(r.threshold),
                outside=bool(r.outside),
            )
            for r in p.worst_rows
        ),
        envelope=p.envelope,
    )


def _verdict_of(result: pb.VerifyResult) -> Verdict:
    return Verdict(
        verdict=result.verdict,
        candidates={c.name: _candidate_of(c) for c in result.candidates},
        rows_checked=tuple(int(r) for r in result.rows_checked),
        inputs_xxh3=int(result.inputs_xxh3),
        reference_us=int(result.reference_us),
        reference_engine=result.reference_engine,
        rows_total=int(result.rows_total),
        sample_seed=int(result.sample_seed),
    )

