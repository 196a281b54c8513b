"""Verify: another implementation's outputs of the LM head's products, judged
against logitd's contract.

A candidate (the logits of a framework's GEMM, a Triton kernel, a library
upgrade; or its dX and dW) travels with the inputs it was computed from. For
every element the server forms an fp64 reference of the exact products of the
bf16 inputs, the proven bound on any fp32 accumulation of them and a tighter
probabilistic bound, and logitd's own output of the same inputs, and answers
with a verdict per candidate (docs/PROTOCOL.md, "Verify"):

- ``"outside_bounds"``: an element outside its proven bound (wrong for
  certain), or NaN/Inf where the reference has none, or the reverse;
- ``"outside_probabilistic_bounds"``: none outside the proven bound, one
  outside the probabilistic bound while logitd's own output is inside it
  everywhere (bf16 rounding passed off as fp32 at a large K, say);
- ``"within_bounds"``: a conforming result (another order of summation);
- ``"bitwise_equal_to_logitd"``: every element has logitd's own bits.

The last two pass. Client.verify_logits and Client.verify_backward build the
call here; the Verdict they return says what was found, and describe() puts it
in words. X and W go to the server as bf16: a float32 tensor is taken only when
each of its values is a bf16 value, since the candidate was computed from bits
the client must not change.
"""

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from . import _tensors as T
from .errors import InvalidArgumentError
from .results import WeightInfo
from .v1 import logitd_pb2 as pb

__all__ = ["ERROR_HISTOGRAM_BINS", "PASSING_VERDICTS", "CandidateVerdict", "Verdict", "VerifyElement"]

# The verdicts that pass; the others are "outside_bounds" and "outside_probabilistic_bounds".
PASSING_VERDICTS = ("within_bounds", "bitwise_equal_to_logitd")

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

# Largest sample_rows the wire carries (uint32).
_MAX_SAMPLE_ROWS = (1 << 32) - 1


@dataclass(frozen=True)
class VerifyElement:
    """One element of a candidate: its index (one entry per dimension), the
    candidate's value, the fp64 reference, the proven bound on
    |candidate - reference| and the probabilistic one (never larger), and
    logitd's own output there."""

    index: Tuple[int, ...]
    candidate: float
    reference: float
    bound: float
    probabilistic_bound: float
    logitd: float


@dataclass(frozen=True)
class CandidateVerdict:
    """What the server found in one candidate ("y"; "dx", "dw").

    dtype is "fp32" or "bf16"; xxh3 the digest of its bytes as received.
    elements: those checked (all, unless rows were sampled).
    outside_bound, worst_bound_fraction: elements outside their proven bound,
    and the largest |candidate - reference| as a fraction of its bound (inf for
    a NaN or infinity where the reference has none).
    outside_probabilistic_bound, worst_probabilistic_fraction: the same
    against the probabilistic bound; logitd_outside_probabilistic_bound counts
    logitd's own output outside it (nonzero: the inputs defeat the model, and
    the probabilistic bound decides nothing).
    first_outside: the first 32 elements outside the probabilistic bound (those
    outside the proven one among them), in index order.
    nan_inf_mismatches: NaN or infinity where the reference has none, or the
    reverse. bitwise_equal_fraction, max_ulp, p99_ulp, p50_ulp: against
    logitd's own output of the same inputs (max_ulp is 2**63 - 1 for a NaN
    against a number). error_histogram: |candidate - reference| / bound in
    the bins of ERROR_HISTOGRAM_BINS.
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

    @property
    def passed(self) -> bool:
        """Within bounds, or bitwise logitd's own output."""
        return self.verdict in PASSING_VERDICTS


@dataclass(frozen=True)
class Verdict:
    """The server's judgement of a Verify call.

    verdict: the worst of the candidates' verdicts; passed: whether it passes.
    candidates: each candidate's CandidateVerdict by name, in the server's order.
    rows_checked: the rows of M checked when rows were sampled (empty: every row).
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

    @property
    def passed(self) -> bool:
        """Every candidate within bounds, or bitwise logitd's own output."""
        return self.verdict in PASSING_VERDICTS

    def describe(self, max_elements: int = 5) -> str:
        """The verdict in words: each candidate's verdict and figures, and the
        first ``max_elements`` elements outside their bounds with their index,
        the candidate's value, the fp64 reference and the bounds."""
        lines = [
            "verify: %s (%s); inputs xxh3 %016x"
            % (self.verdict, "passed" if self.passed else "failed", self.inputs_xxh3)
        ]
        if self.rows_checked:
            shown = ", ".join(str(r) for r in self.rows_checked[:12])
            if len(self.rows_checked) > 12:
                shown += ", ..."
            lines.append("rows checked: %s (%d rows)" % (shown, len(self.rows_checked)))
        for c in self.candidates.values():
            lines.extend(_describe_candidate(c, max_elements))
        return "\n".join(lines)


def _describe_candidate(c: CandidateVerdict, max_elements: int) -> List[str]:
    lines = ["%s %s [%s]: %s" % (c.name, c.dtype, ", ".join(str(d) for d in c.shape), c.verdict)]
    lines.append(
        "  %d of %d elements outside the proven bound (worst %.3g times it), %d outside the probabilistic "
        "bound (worst %.3g times it), %d NaN/Inf mismatches"
        % (
            c.outside_bound,
            c.elements,
            c.worst_bound_fraction,
            c.outside_probabilistic_bound,
            c.worst_probabilistic_fraction,
            c.nan_inf_mismatches,
        )
    )
    if c.max_ulp == _ULP_NAN:
        ulps = "a NaN against a number"
    else:
        ulps = "max %d ulp (p99 %d, p50 %d)" % (c.max_ulp, c.p99_ulp, c.p50_ulp)
    lines.append("  against logitd's own output: %.2f%% bitwise equal, %s" % (100.0 * c.bitwise_equal_fraction, ulps))
    if c.logitd_outside_probabilistic_bound:
        lines.append(
            "  logitd's own output is outside the probabilistic bound at %d elements: for these inputs "
            "that bound decides nothing" % c.logitd_outside_probabilistic_bound
        )
    if c.first_outside:
        shown = c.first_outside[: max(0, max_elements)]
        if shown:
            lines.append(
                "  elements outside the probabilistic bound: %d; the first %d:"
                % (c.outside_probabilistic_bound, len(shown))
            )
        for e in shown:
            where = "proven" if not abs(e.candidate - e.reference) <= e.bound else "probabilistic"
            lines.append(
                "    [%s]: candidate %.9g, fp64 reference %.17g, bound %.3e (probabilistic %.3e), logitd %.9g; "
                "outside the %s bound"
                % (", ".join(str(i) for i in e.index), e.candidate, e.reference, e.bound, e.probabilistic_bound,
                   e.logitd, where)
            )
        rest = len(c.first_outside) - len(shown)
        if rest > 0:
            lines.append("    and %d more in first_outside" % rest)
    return lines


# -- requests -----------------------------------------------------------------------------


def logits_request(
    x: Any, y: Any, weight: Any, alpha: float, sample_rows: int
) -> Tuple[pb.VerifyHeader, List[T.Outgoing]]:
    """The header and streamed tensors of a VERIFY_LOGITS call."""
    alpha = float(alpha)
    if alpha == 0.0:
        raise InvalidArgumentError("alpha: expected a non-zero scale (0 on the wire means the default 1), got 0")
    if not math.isfinite(alpha):
        raise InvalidArgumentError("alpha: expected a finite scale, got %r" % alpha)
    header = pb.VerifyHeader(operation=pb.VERIFY_LOGITS, alpha=alpha, sample_rows=_sample_rows(sample_rows))
    inputs = _inputs(header, x, weight)
    candidates = _candidates(header, [("y", y)])
    return header, inputs + candidates


def backward_request(
    dy: Any, x: Any, weight: Any, dx: Any, dw: Any, sample_rows: int
) -> Tuple[pb.VerifyHeader, List[T.Outgoing]]:
    """The header and streamed tensors of a VERIFY_BACKWARD call."""
    if dx is None and dw is None:
        raise InvalidArgumentError(
            "dx, dw: expected at least one candidate (dx [M, K] and/or dw [V, K]), got neither"
        )
    header = pb.VerifyHeader(operation=pb.VERIFY_BACKWARD, sample_rows=_sample_rows(sample_rows))
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
    )


def _verdict_of(result: pb.VerifyResult) -> Verdict:
    return Verdict(
        verdict=result.verdict,
        candidates={c.name: _candidate_of(c) for c in result.candidates},
        rows_checked=tuple(int(r) for r in result.rows_checked),
        inputs_xxh3=int(result.inputs_xxh3),
        reference_us=int(result.reference_us),
        reference_engine=result.reference_engine,
    )

