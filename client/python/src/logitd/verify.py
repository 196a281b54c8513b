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

from . import _tensors as T
from . import history as _history
# The requests, built in _verify_requests.py; Client.verify_* reach them here.
from ._verify_requests import (  # noqa: F401
    backward_request,
    cross_entropy_request,
    exact_bf16,
    logits_request,
    logprobs_request,
)
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
    error, or their largest). worst_rows: at most 8, worst first. drawn_from:
    for a per-token output, the tokens its test drew at most 512 from (0:
    every token tested; the others are held to the proven bound).
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
    drawn_from: int = 0
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
    run_id: the run's id in the server's history when the call asked to
    record it (``record=``), else 0. comparison: with ``compare=``, the
    candidates against that recorded run (a logitd.RunComparison), else None.
    alerts: the rules of its project the recorded run broke (logitd.Alert
    values; Client.set_rules); a CI step fails on any. record_error: why a
    run asked to be recorded was not (the server's store failed after the
    verdict; no rule was checked), else "".
    """

    verdict: str
    candidates: Dict[str, CandidateVerdict]
    rows_checked: Tuple[int, ...]
    inputs_xxh3: int
    reference_us: int
    reference_engine: str = ""
    rows_total: int = 0
    sample_seed: int = 0
    run_id: int = 0
    comparison: Any = None
    alerts: Tuple[Any, ...] = ()
    record_error: str = ""

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
    if p.drawn_from:
        lines[0] += "; the test took %d tokens drawn of %d" % (p.rows, p.drawn_from)
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


# -- the call -----------------------------------------------------------------------------


def call(
    transport: Any,
    header: pb.VerifyHeader,
    tensors: Sequence[T.Outgoing],
    record: Any = None,
    compare: Any = None,
) -> Verdict:
    """Streams the header and tensors through a Client (its _Transport) and reads the one result;
    with ``record`` (a RunLabels) the server records the run (Verdict.run_id), with ``compare`` (a
    Baseline) it compares it with a recorded run (Verdict.comparison)."""
    _history.set_record(header, record)
    _history.set_compare(header, compare)
    result, _ = transport._stream(transport._stub.Verify, pb.VerifyRequest, "header", header, tensors, lambda r: [])
    return _verdict_of(result)


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
        drawn_from=int(p.drawn_from),
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
        run_id=int(result.run_id),
        comparison=_history.comparison_of(result),
        alerts=_history.alerts_of(result.alerts),
        record_error=result.record_error,
    )

