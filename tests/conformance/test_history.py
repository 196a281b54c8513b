"""The history's unary RPCs with stock stubs: RecordValidation records cases
that ListRuns lists (narrowed by platform and time), ListProjects and
ListCases summarise, and a second one compared with the first says the bits
are identical (or which block changed); SetRules makes a changed bit an
alert; PromoteRun names a baseline; DeleteProject removes the project; bad
input is INVALID_ARGUMENT or NOT_FOUND with a message.

Skipped when the server keeps no history (--history=none)."""

import uuid

import grpc
import pytest

from protocol import expect_error
from stubs import pb


def case(name, digest, verdict="within_bounds"):
    """A validated case of one output "y" of 4 rows, its rows' digests."""
    return pb.ValidatedCase(
        case_name=name,
        inputs_xxh3=77,
        verdict=verdict,
        outputs=[
            pb.CandidateVerdict(
                name="y",
                xxh3=digest,
                elements=16,
                verdict=verdict,
                worst_bound_fraction=0.25,
                block_rows=1,
                block_xxh3=[11, 12, digest, 14],
            )
        ],
    )


@pytest.fixture
def project(conn):
    """A project of its own, removed afterwards; skips without a history."""
    name = "conformance-" + uuid.uuid4().hex[:12]
    try:
        conn.stub.ListRuns(pb.ListRunsRequest(project=name), **conn.kw())
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
            pytest.skip("the server keeps no history: %s" % e.details())
        raise
    yield name
    try:
        conn.stub.DeleteProject(pb.DeleteProjectRequest(project=name), **conn.kw())
    except grpc.RpcError:
        pass


def record(conn, project, cases, branch="main", ref="", compare=None):
    request = pb.RecordValidationRequest(labels=pb.RunLabels(project=project, branch=branch, ref=ref), cases=cases)
    if compare is not None:
        request.compare.CopyFrom(compare)
    return conn.stub.RecordValidation(request, **conn.kw())


def test_recorded_cases_are_listed_and_compared(conn, project):
    """Each case a run; a second recording against main's latest: identical, then one block changed."""
    first = record(conn, project, [case("golden/a", 5), case("golden/b", 6)], ref="r1")
    assert len(first.cases) == 2
    ids = [c.run_id for c in first.cases]
    assert all(i > 0 for i in ids) and ids[0] != ids[1]
    assert not first.cases[0].HasField("comparison")
    runs = conn.stub.ListRuns(pb.ListRunsRequest(project=project), **conn.kw()).runs
    assert sorted(r.run_id for r in runs) == sorted(ids)
    assert all(r.operation == pb.VERIFY_VALIDATION for r in runs)
    assert {r.labels.case_name for r in runs} == {"golden/a", "golden/b"}

    second = record(conn, project, [case("golden/a", 5), case("golden/b", 9)], branch="pr", ref="r2",
                    compare=pb.BaselineSelector(branch="main"))
    a, b = second.cases
    assert a.comparison.baseline_run_id == ids[0]
    assert a.comparison.baseline_labels.ref == "r1"
    assert [c.bits for c in a.comparison.candidates] == ["identical"]
    assert [c.bits for c in b.comparison.candidates] == ["different_within_bounds"]
    assert list(b.comparison.candidates[0].changed_blocks) == [2]

    # The project and its cases are listed; ListRuns narrows by platform and time.
    projects = conn.stub.ListProjects(pb.ListProjectsRequest(), **conn.kw()).projects
    mine = [p for p in projects if p.project == project]
    assert len(mine) == 1 and mine[0].cases == 2 and mine[0].runs == 4
    cases = conn.stub.ListCases(pb.ListCasesRequest(project=project), **conn.kw()).cases
    assert [c.case_name for c in cases] == ["golden/a", "golden/b"]
    assert cases[0].latest_run_id == a.run_id and cases[0].latest_branch == "pr"
    run = runs[0]

    def listed(**filters):
        request = pb.ListRunsRequest(project=project, **filters)
        return [r.run_id for r in conn.stub.ListRuns(request, **conn.kw()).runs]

    assert len(listed(backend=run.backend, device=run.device)) == 4
    assert listed(device="no such device") == []
    assert listed(recorded_after_unix_micros=run.recorded_unix_micros + 10**12) == []
    assert len(listed(recorded_before_unix_micros=run.recorded_unix_micros + 10**12)) == 4


def test_rules_alert_and_a_promoted_run_is_a_baseline(conn, project):
    """bits_unchanged raises an alert on changed bits; a promoted run is compared by name."""
    first = record(conn, project, [case("golden/a", 5)])
    conn.stub.PromoteRun(pb.PromoteRunRequest(run_id=first.cases[0].run_id, name="golden"), **conn.kw())
    conn.stub.SetRules(
        pb.SetRulesRequest(project=project, rules=[pb.HistoryRule(bits_unchanged=True)]), **conn.kw()
    )
    rules = conn.stub.ListRules(pb.ListRulesRequest(project=project), **conn.kw()).rules
    assert len(rules) == 1 and rules[0].bits_unchanged
    changed = record(conn, project, [case("golden/a", 8)], compare=pb.BaselineSelector(name="golden"))
    assert changed.cases[0].comparison.baseline_run_id == first.cases[0].run_id
    assert [a.candidate for a in changed.cases[0].alerts] == ["y"]
    deleted = conn.stub.DeleteProject(pb.DeleteProjectRequest(project=project), **conn.kw())
    assert deleted.runs_deleted == 2


def test_bad_validations_are_refused_with_a_message(conn, project):
    """Missing labels, no cases, a bad verdict, repeated outputs, a missing baseline."""
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    assert "project" in expect_error(INVALID, record, conn, "", [case("golden/a", 5)])
    assert "cases" in expect_error(INVALID, record, conn, project, [])
    assert "verdict" in expect_error(INVALID, record, conn, project, [case("golden/a", 5, verdict="fine")])
    twice = case("golden/a", 5)
    twice.outputs.append(twice.outputs[0])
    assert "outputs" in expect_error(INVALID, record, conn, project, [twice])
    assert "case_name" in expect_error(INVALID, record, conn, project, [case("", 5)])
    assert "project" in expect_error(INVALID, conn.stub.ListCases, pb.ListCasesRequest(), **conn.kw())
    message = expect_error(
        INVALID, conn.stub.ListRuns, pb.ListRunsRequest(recorded_after_unix_micros=-1), **conn.kw()
    )
    assert "recorded_after_unix_micros" in message
    message = expect_error(
        grpc.StatusCode.NOT_FOUND, record, conn, project, [case("golden/a", 5)], compare=pb.BaselineSelector(branch="none")
    )
    assert "no recorded run" in message
    # Nothing was recorded by the refused calls; if_present records without a comparison.
    assert not conn.stub.ListRuns(pb.ListRunsRequest(project=project), **conn.kw()).runs
    kept = record(conn, project, [case("golden/a", 5)], compare=pb.BaselineSelector(branch="none", if_present=True))
    assert kept.cases[0].run_id > 0 and not kept.cases[0].HasField("comparison")
