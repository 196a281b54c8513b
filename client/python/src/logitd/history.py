"""The server's history of Verify runs (docs/PROTOCOL.md, "Recording a Verify
run, and ListRuns"): the labels a recorded run carries (``record=`` of the
verify_* calls) and what Client.list_runs gives back.
"""

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

from .errors import InvalidArgumentError
from .v1 import logitd_pb2 as pb

_OPERATIONS = {
    pb.VERIFY_LOGITS: "logits",
    pb.VERIFY_BACKWARD: "backward",
    pb.VERIFY_CROSS_ENTROPY: "cross_entropy",
    pb.VERIFY_LOGPROBS: "logprobs",
    pb.VERIFY_VALIDATION: "validation",
}


@dataclass(frozen=True)
class RunLabels:
    """Where a recorded run belongs: project and case are required; branch and
    ref (a commit) are the caller's; each at most 256 bytes."""

    project: str
    case: str
    branch: str = ""
    ref: str = ""


@dataclass(frozen=True)
class Baseline:
    """The recorded run a Verify compares with (``compare=`` of the verify_*
    calls, which need ``record=``): the latest of a branch, of a ref, a run by
    id, or the run promoted under a name (Client.promote_run); exactly one
    given. if_present: when no such run is recorded, record this run without
    a comparison instead of raising NotFoundError (a branch's first run in CI)."""

    branch: str = ""
    ref: str = ""
    run_id: int = 0
    name: str = ""
    if_present: bool = False


@dataclass(frozen=True)
class CandidateComparison:
    """A candidate against the baseline run's of the same name: bits
    "identical", "different_within_bounds", "different_outside_bounds" or
    "new"; the deltas are this run's figure less the baseline's. Where the bits
    differ, changed_blocks names the blocks of block_rows rows whose digests
    differ (block i: rows i * block_rows to (i + 1) * block_rows - 1, the last
    ending at row rows - 1)."""

    name: str
    bits: str
    baseline_verdict: str
    worst_bound_fraction_delta: float
    max_ulp_delta: int
    effective_bits_delta: float
    block_rows: int = 0
    changed_blocks: Tuple[int, ...] = ()
    rows: int = 0


@dataclass(frozen=True)
class RunComparison:
    """A Verify's candidates against a recorded run's (Verdict.comparison).
    platform_difference: "" when the baseline was judged on this platform,
    else what differs; same_inputs: the same operation, options and tensors."""

    baseline_run_id: int
    baseline_labels: "RunLabels"
    baseline_verdict: str
    platform_difference: str
    same_inputs: bool
    candidates: Tuple[CandidateComparison, ...]


@dataclass(frozen=True)
class CandidateSummary:
    """A candidate's figures as its run's Verify gave them (rms_ratio and
    effective_bits 0 where the precision class was not tested)."""

    name: str
    verdict: str
    xxh3: int
    elements: int
    outside_bound: int
    worst_bound_fraction: float
    bitwise_equal_fraction: float
    max_ulp: int
    p99_ulp: int
    rms_ratio: float
    effective_bits: float


@dataclass(frozen=True)
class Rule:
    """A project's rule on its recorded runs (Client.set_rules): where it applies
    (case, branch, candidate; empty: any) and one check: ``bits_unchanged``
    (the candidate's bits are the baseline's), ``max_worst_fraction_growth``
    (its worst bound fraction at most that many times the baseline's, >= 1)
    or ``max_p99_ulp`` (its p99 ULP from logitd's outputs at most that). The
    first two are checked on runs compared with a baseline."""

    bits_unchanged: bool = False
    max_worst_fraction_growth: float = 0.0
    max_p99_ulp: Optional[int] = None
    case: str = ""
    branch: str = ""
    candidate: str = ""


@dataclass(frozen=True)
class Alert:
    """A rule a recorded run broke: the rule as text, the candidate, and what
    broke it (with the figures and the baseline run)."""

    rule: str
    candidate: str
    message: str


@dataclass(frozen=True)
class RunSummary:
    """One recorded Verify run: its id, labels, operation ("logits",
    "backward", "cross_entropy", "logprobs"), inputs' digest, verdict, the
    platform that judged it and when, and its candidates' figures."""

    run_id: int
    labels: RunLabels
    operation: str
    inputs_xxh3: int
    verdict: str
    backend: str
    device: str
    logitd_version: str
    recorded_unix_micros: int
    candidates: Tuple[CandidateSummary, ...]
    alerts: Tuple[Alert, ...] = ()
    baseline_run_id: int = 0
    libraries: str = ""


@dataclass(frozen=True)
class ProjectSummary:
    """A project of this caller's history: its cases, runs and alerts, and when
    its latest run was recorded."""

    project: str
    cases: int
    runs: int
    alerts: int
    latest_unix_micros: int


@dataclass(frozen=True)
class CaseSummary:
    """A case of a project: its runs and alerts, and its latest run."""

    case: str
    runs: int
    alerts: int
    latest_run_id: int
    latest_unix_micros: int
    latest_verdict: str
    latest_branch: str
    latest_ref: str


@dataclass(frozen=True)
class RunPage:
    """A page of runs, newest first; next_before_run_id is the before_run_id of
    the next page (0: this is the last)."""

    runs: Tuple[RunSummary, ...]
    next_before_run_id: int


@dataclass(frozen=True)
class ValidatedOutput:
    """One output of a case the caller judged itself (the golden cases of
    ``logitctl validate``, or a harness of its own): its digest (xxh3-64, seed
    0) and shape, whether it lay within its bound of the fp64 reference, the
    worst fraction of that bound it used, and its rows' digests in at most 64
    blocks of block_rows rows where the caller kept them."""

    name: str
    xxh3: int
    shape: Tuple[int, ...]
    within_bounds: bool
    worst_bound_fraction: float
    block_rows: int = 0
    block_xxh3: Tuple[int, ...] = ()


@dataclass(frozen=True)
class ValidatedCase:
    """A case the caller judged, recorded by Client.record_validation as a run
    of operation "validation": its name (the run's case), the digest of its
    inputs (operation, options, tensors) and its outputs; within_bounds None
    means every output's."""

    case_name: str
    inputs_xxh3: int
    outputs: Tuple[ValidatedOutput, ...]
    within_bounds: Optional[bool] = None


@dataclass(frozen=True)
class RecordedCase:
    """A case as the server recorded it, as a recording verify_* call's Verdict
    says: its run, the comparison with the baseline asked for, the alerts of
    the project's rules, and record_error where the run was judged but not
    kept."""

    case_name: str
    run_id: int
    comparison: Optional[RunComparison]
    alerts: Tuple[Alert, ...]
    record_error: str


def validation_request(
    project: str, branch: str, ref: str, cases: Sequence[ValidatedCase], compare: Optional[Baseline]
) -> pb.RecordValidationRequest:
    request = pb.RecordValidationRequest(labels=pb.RunLabels(project=project, branch=branch, ref=ref))
    set_compare(request, compare)
    for case in cases:
        if not isinstance(case, ValidatedCase):
            raise InvalidArgumentError("cases: expected logitd.ValidatedCase values, got %r" % (case,))
        within = all(o.within_bounds for o in case.outputs) if case.within_bounds is None else case.within_bounds
        out = request.cases.add(
            case_name=case.case_name,
            inputs_xxh3=int(case.inputs_xxh3),
            verdict="within_bounds" if within else "outside_bounds",
        )
        for o in case.outputs:
            elements = 1
            for d in o.shape:
                elements *= int(d)
            out.outputs.add(
                name=o.name,
                xxh3=int(o.xxh3),
                shape=[int(d) for d in o.shape],
                elements=elements,
                passed=bool(o.within_bounds),
                verdict="within_bounds" if o.within_bounds else "outside_bounds",
                worst_bound_fraction=float(o.worst_bound_fraction),
                block_rows=int(o.block_rows),
                block_xxh3=[int(d) for d in o.block_xxh3],
            )
    return request


def recorded_cases_of(
    request: pb.RecordValidationRequest, response: pb.RecordValidationResponse
) -> Tuple[RecordedCase, ...]:
    return tuple(
        RecordedCase(
            case_name=request.cases[i].case_name if i < len(request.cases) else "",
            run_id=int(r.run_id),
            comparison=comparison_of(r),
            alerts=alerts_of(r.alerts),
            record_error=r.record_error,
        )
        for i, r in enumerate(response.cases)
    )


def set_record(header: pb.VerifyHeader, record: Optional[RunLabels]) -> None:
    """Asks the server to record the run under ``record`` (None: not recorded)."""
    if record is None:
        return
    if not isinstance(record, RunLabels):
        raise InvalidArgumentError("record: expected a logitd.RunLabels, got %r" % (record,))
    header.record.CopyFrom(
        pb.RunLabels(project=record.project, case_name=record.case, branch=record.branch, ref=record.ref)
    )


def set_compare(header: Any, compare: Optional[Baseline]) -> None:
    """Asks the server to compare with a recorded run (None: no comparison)."""
    if compare is None:
        return
    if not isinstance(compare, Baseline):
        raise InvalidArgumentError("compare: expected a logitd.Baseline, got %r" % (compare,))
    if compare.branch:
        header.compare.branch = compare.branch
    elif compare.ref:
        header.compare.ref = compare.ref
    elif compare.run_id:
        header.compare.run_id = int(compare.run_id)
    elif compare.name:
        header.compare.name = compare.name
    else:
        raise InvalidArgumentError("compare: expected a branch, a ref, a run_id or a name")
    header.compare.if_present = bool(compare.if_present)


def comparison_of(result: Any) -> Optional[RunComparison]:
    if not result.HasField("comparison"):
        return None
    c = result.comparison
    return RunComparison(
        baseline_run_id=int(c.baseline_run_id),
        baseline_labels=RunLabels(
            c.baseline_labels.project, c.baseline_labels.case_name, c.baseline_labels.branch, c.baseline_labels.ref
        ),
        baseline_verdict=c.baseline_verdict,
        platform_difference=c.platform_difference,
        same_inputs=bool(c.same_inputs),
        candidates=tuple(
            CandidateComparison(
                name=cc.name,
                bits=cc.bits,
                baseline_verdict=cc.baseline_verdict,
                worst_bound_fraction_delta=float(cc.worst_bound_fraction_delta),
                max_ulp_delta=int(cc.max_ulp_delta),
                effective_bits_delta=float(cc.effective_bits_delta),
                block_rows=int(cc.block_rows),
                changed_blocks=tuple(int(b) for b in cc.changed_blocks),
                rows=int(cc.rows),
            )
            for cc in c.candidates
        ),
    )


def _run_of(r: Any) -> RunSummary:
    return RunSummary(
        run_id=int(r.run_id),
        labels=RunLabels(r.labels.project, r.labels.case_name, r.labels.branch, r.labels.ref),
        operation=_OPERATIONS.get(r.operation, "unspecified"),
        inputs_xxh3=int(r.inputs_xxh3),
        verdict=r.verdict,
        backend=r.backend,
        device=r.device,
        logitd_version=r.logitd_version,
        libraries=r.libraries,
        recorded_unix_micros=int(r.recorded_unix_micros),
        candidates=tuple(
            CandidateSummary(
                name=c.name,
                verdict=c.verdict,
                xxh3=int(c.xxh3),
                elements=int(c.elements),
                outside_bound=int(c.outside_bound),
                worst_bound_fraction=float(c.worst_bound_fraction),
                bitwise_equal_fraction=float(c.bitwise_equal_fraction),
                max_ulp=int(c.max_ulp),
                p99_ulp=int(c.p99_ulp),
                rms_ratio=float(c.rms_ratio),
                effective_bits=float(c.effective_bits),
            )
            for c in r.candidates
        ),
        alerts=alerts_of(r.alerts),
        baseline_run_id=int(r.baseline_run_id),
    )


def alerts_of(alerts: Any) -> Tuple[Alert, ...]:
    return tuple(Alert(rule=a.rule, candidate=a.candidate, message=a.message) for a in alerts)


def rule_message(rule: Rule) -> pb.HistoryRule:
    if not isinstance(rule, Rule):
        raise InvalidArgumentError("rules: expected logitd.Rule values, got %r" % (rule,))
    out = pb.HistoryRule(case_name=rule.case, branch=rule.branch, candidate=rule.candidate)
    if rule.bits_unchanged:
        out.bits_unchanged = True
    elif rule.max_worst_fraction_growth:
        out.max_worst_fraction_growth = float(rule.max_worst_fraction_growth)
    elif rule.max_p99_ulp is not None:
        out.max_p99_ulp = int(rule.max_p99_ulp)
    return out


def rule_of(r: Any) -> Rule:
    check = r.WhichOneof("check")
    return Rule(
        bits_unchanged=check == "bits_unchanged",
        max_worst_fraction_growth=float(r.max_worst_fraction_growth),
        max_p99_ulp=int(r.max_p99_ulp) if check == "max_p99_ulp" else None,
        case=r.case_name,
        branch=r.branch,
        candidate=r.candidate,
    )


def page_of(response: pb.ListRunsResponse) -> RunPage:
    return RunPage(
        runs=tuple(_run_of(r) for r in response.runs),
        next_before_run_id=int(response.next_before_run_id),
    )
