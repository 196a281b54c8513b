"""The server's history from Python: verify_*(record=RunLabels(...)) records
a run (Verdict.run_id), list_runs gives it back with its figures, filtered and
a page at a time; a server with --history=none refuses both."""

import os

import numpy as np
import pytest
import server_process
from reference import to_bf16

import logitd

pytestmark = pytest.mark.needs_server


def _binary():
    binary = os.environ.get("LOGITD_BIN", "")
    if not (binary and os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.skip("LOGITD_BIN is not set to a logitd binary")
    return binary


def normal_bf16(seed, shape):
    return to_bf16(np.random.default_rng(seed).standard_normal(shape))


@pytest.fixture
def history_server(tmp_path):
    started = server_process.start(_binary(), tmp_path, ["--history=%s" % (tmp_path / "h.sqlite3")])
    yield started.address
    started.stop(timeout_s=40)


def test_verify_records_runs_that_list_runs_gives_back(history_server):
    with logitd.Client(history_server, timeout=120) as c:
        w = normal_bf16(1, (60, 32))
        info = c.register_weights(w, name="h")
        x = normal_bf16(2, (4, 32))
        y = c.logits(x, info)
        plain = c.verify_logits(x, y, info)
        assert plain.run_id == 0
        ids = []
        for i, branch in enumerate(["main", "main", "dev"]):
            v = c.verify_logits(x, y, info, record=logitd.RunLabels("lm", "logits", branch, "c%d" % i))
            assert v.passed and v.run_id > 0
            ids.append(v.run_id)
        targets = np.array([3, 7, -100, 59], dtype=np.int64)
        ce = c.cross_entropy(x, targets, info, reduction="none", want_lse=True)
        v = c.verify_cross_entropy(
            x, targets, info, loss=ce.loss, lse=ce.lse, reduction="none", record=logitd.RunLabels("lm", "ce")
        )
        assert v.passed and v.run_id > ids[-1]

        page = c.list_runs(project="lm", case="logits")
        assert [r.run_id for r in page.runs] == ids[::-1]
        assert page.next_before_run_id == 0
        newest = page.runs[0]
        assert newest.labels == logitd.RunLabels("lm", "logits", "dev", "c2")
        assert newest.operation == "logits" and newest.backend == "cpu"
        assert newest.libraries.endswith(" threads")  # the BLAS and its threads
        assert newest.verdict in ("within_bounds", "bitwise_equal_to_logitd")
        (cand,) = newest.candidates
        assert cand.name == "y" and cand.elements == 4 * 60
        assert [r.labels.ref for r in c.list_runs(branch="main").runs] == ["c1", "c0"]
        assert c.list_runs(case="ce").runs[0].operation == "cross_entropy"
        first = c.list_runs(page_size=2)
        assert len(first.runs) == 2 and first.next_before_run_id == first.runs[-1].run_id
        rest = c.list_runs(page_size=2, before_run_id=first.next_before_run_id)
        assert [r.run_id for r in rest.runs] == [ids[1], ids[0]] and rest.next_before_run_id == 0
        # By platform and time; the projects and cases.
        assert len(c.list_runs(backend="cpu", device=newest.device).runs) == len(c.list_runs().runs)
        assert c.list_runs(device="no such device").runs == ()
        latest = c.list_runs().runs[0]
        later = latest.recorded_unix_micros + 1
        assert c.list_runs(recorded_after_unix_micros=later).runs == ()
        assert c.list_runs(recorded_after_unix_micros=latest.recorded_unix_micros).runs[0] == latest
        assert c.list_runs(recorded_before_unix_micros=later).runs[0] == latest
        (project,) = c.list_projects()
        assert project.project == "lm" and project.runs == len(c.list_runs().runs)
        cases = c.list_cases("lm")
        assert [k.case for k in cases] == sorted(k.case for k in cases) and "logits" in [k.case for k in cases]
        assert c.list_cases("nothing") == ()

        # Compared with main's latest run: the same bits; one value far off.
        same = c.verify_logits(
            x, y, info, record=logitd.RunLabels("lm", "logits", "pr"), compare=logitd.Baseline(branch="main")
        )
        assert same.comparison.baseline_run_id == ids[1]
        assert same.comparison.same_inputs and same.comparison.platform_difference == ""
        assert [(cc.name, cc.bits) for cc in same.comparison.candidates] == [("y", "identical")]
        bad = y.copy()
        bad[0, 0] = 1e30
        far = c.verify_logits(
            x, bad, info, record=logitd.RunLabels("lm", "logits", "pr"), compare=logitd.Baseline(run_id=ids[0])
        )
        assert far.verdict == "outside_bounds"
        assert far.comparison.candidates[0].bits == "different_outside_bounds"
        assert c.verify_logits(x, y, info).comparison is None
        c.promote_run(ids[0], "golden")
        golden = c.verify_logits(
            x, y, info, record=logitd.RunLabels("lm", "logits", "pr"), compare=logitd.Baseline(name="golden")
        )
        assert golden.comparison.baseline_run_id == ids[0]
        with pytest.raises(logitd.NotFoundError):
            c.promote_run(10**9, "golden")
        with pytest.raises(logitd.NotFoundError, match="on branch 'nope'"):
            c.verify_logits(x, y, info, record=logitd.RunLabels("lm", "logits"), compare=logitd.Baseline(branch="nope"))

        with pytest.raises(logitd.InvalidArgumentError, match="record.case_name"):
            c.verify_logits(x, y, info, record=logitd.RunLabels("lm", ""))
        with pytest.raises(logitd.InvalidArgumentError, match="record"):
            c.verify_logits(x, y, info, record={"project": "lm"})


def test_a_server_without_history_refuses_to_record_and_to_list(tmp_path):
    started = server_process.start(_binary(), tmp_path, ["--history=none"])
    try:
        with logitd.Client(started.address, timeout=120) as c:
            info = c.register_weights(normal_bf16(3, (20, 16)), name="h")
            x = normal_bf16(4, (2, 16))
            y = c.logits(x, info)
            with pytest.raises(logitd.FailedPreconditionError, match="--history=none"):
                c.verify_logits(x, y, info, record=logitd.RunLabels("p", "c"))
            with pytest.raises(logitd.FailedPreconditionError):
                c.list_runs()
            assert c.verify_logits(x, y, info).passed
    finally:
        started.stop(timeout_s=40)


def test_rules_set_from_python_raise_alerts_on_the_runs_that_break_them(history_server):
    with logitd.Client(history_server, timeout=120) as c:
        info = c.register_weights(normal_bf16(11, (60, 32)), name="r")
        x = normal_bf16(12, (4, 32))
        y = c.logits(x, info)
        rules = (
            logitd.Rule(bits_unchanged=True, branch="main", candidate="y"),
            logitd.Rule(max_worst_fraction_growth=2.0, case="logits"),
            logitd.Rule(max_p99_ulp=0, branch="strict"),
        )
        c.set_rules("lm", rules)
        assert c.list_rules("lm") == rules
        assert c.list_rules("other") == ()
        labels = logitd.RunLabels("lm", "logits", "main")
        first = c.verify_logits(x, y, info, record=labels)
        assert first.alerts == ()
        same = c.verify_logits(x, y, info, record=labels, compare=logitd.Baseline(branch="main"))
        assert same.alerts == ()
        moved = y.copy()
        moved[1, 2] = np.nextafter(moved[1, 2], np.float32(np.inf), dtype=np.float32)
        v = c.verify_logits(x, moved, info, record=labels, compare=logitd.Baseline(branch="main"))
        assert v.passed  # within the contract; the rule is what breaks
        (alert,) = v.alerts
        assert alert == logitd.Alert(
            rule="bits_unchanged branch=main candidate=y",
            candidate="y",
            message="y's bits changed against run %d: different_within_bounds" % same.run_id,
        )
        assert c.list_runs(project="lm").runs[0].alerts == (alert,)
        assert c.list_runs(project="lm").runs[0].baseline_run_id == same.run_id
        with pytest.raises(logitd.InvalidArgumentError, match=r"rules\[0\].max_worst_fraction_growth"):
            c.set_rules("lm", [logitd.Rule(max_worst_fraction_growth=0.5)])
        with pytest.raises(logitd.InvalidArgumentError, match="rules"):
            c.set_rules("lm", ["bits_unchanged"])
        c.set_rules("lm", [])
        assert c.list_rules("lm") == ()


def test_delete_project_removes_its_runs_and_rules(history_server):
    with logitd.Client(history_server, timeout=120) as c:
        info = c.register_weights(normal_bf16(21, (40, 16)), name="d")
        x = normal_bf16(22, (2, 16))
        y = c.logits(x, info)
        for _ in range(2):
            c.verify_logits(x, y, info, record=logitd.RunLabels("gone", "c"))
        c.verify_logits(x, y, info, record=logitd.RunLabels("kept", "c"))
        c.set_rules("gone", [logitd.Rule(max_p99_ulp=2)])
        assert c.delete_project("gone") == 2
        assert [r.labels.project for r in c.list_runs().runs] == ["kept"]
        assert c.list_rules("gone") == ()
        with pytest.raises(logitd.NotFoundError, match="project 'gone'"):
            c.delete_project("gone")


def test_testing_assertions_record_compare_and_hold_bits_to_the_baseline(history_server):
    from logitd.testing import assert_logits_within_contract

    with logitd.Client(history_server, timeout=120) as c:
        info = c.register_weights(normal_bf16(31, (48, 16)), name="t")
        x = normal_bf16(32, (3, 16))
        y = c.logits(x, info)
        main = logitd.RunLabels("kernel", "lm-head", "main", "c1")
        first_on_main = logitd.Baseline(branch="main", if_present=True)
        # The branch's first run: nothing to compare with, recorded anyway.
        v = assert_logits_within_contract(c, x, y, info, record=main, compare=first_on_main, bits_unchanged=True)
        assert v.run_id > 0 and v.comparison is None and v.record_error == ""
        with pytest.raises(logitd.NotFoundError, match="on branch 'nope'"):
            c.verify_logits(x, y, info, record=main, compare=logitd.Baseline(branch="nope"))
        pr = logitd.RunLabels("kernel", "lm-head", "pr-7", "c2")
        same = assert_logits_within_contract(c, x, y, info, record=pr, compare=first_on_main, bits_unchanged=True)
        assert same.comparison.baseline_run_id == v.run_id
        moved = y.copy()
        moved[2, 5] = np.nextafter(moved[2, 5], np.float32(-np.inf), dtype=np.float32)
        with pytest.raises(AssertionError, match=r"y: bits different_within_bounds against run %d \(main at c1\)" % v.run_id):
            assert_logits_within_contract(c, x, moved, info, record=pr, compare=first_on_main, bits_unchanged=True)
        # Without bits_unchanged the same candidate is within the contract; the
        # comparison names the row that changed.
        v = assert_logits_within_contract(c, x, moved, info, record=pr, compare=first_on_main)
        (cc,) = v.comparison.candidates
        assert cc.block_rows == 1 and cc.changed_blocks == (2,)
        c.set_rules("kernel", [logitd.Rule(bits_unchanged=True)])
        with pytest.raises(AssertionError, match="bits_unchanged: y's bits changed"):
            assert_logits_within_contract(c, x, moved, info, record=pr, compare=first_on_main)


def test_record_validation_records_cases_judged_by_the_caller_and_compares_them(history_server):
    out = logitd.ValidatedOutput("y", 0x1234ABCD, (4, 60), True, 0.25, block_rows=2, block_xxh3=(11, 22))
    case = logitd.ValidatedCase("golden_logits", 0xFEED, (out,))
    with logitd.Client(history_server, timeout=120) as c:
        first = c.record_validation("gate", [case], branch="main", ref="a1")
        assert len(first) == 1 and first[0].case_name == "golden_logits"
        assert first[0].run_id > 0 and first[0].comparison is None and first[0].record_error == ""
        # The same bits against main's latest: identical; a changed block is named.
        changed = logitd.ValidatedOutput("y", 0x1234ABCE, (4, 60), True, 0.5, block_rows=2, block_xxh3=(11, 23))
        second = c.record_validation(
            "gate",
            [case, logitd.ValidatedCase("golden_logits", 0xFEED, (changed,))],
            branch="dev",
            ref="b2",
            compare=logitd.Baseline(branch="main"),
        )
        assert [r.comparison.baseline_run_id for r in second] == [first[0].run_id] * 2
        assert second[0].comparison.candidates[0].bits == "identical"
        moved = second[1].comparison.candidates[0]
        assert moved.bits == "different_within_bounds" and moved.changed_blocks == (1,)
        assert moved.worst_bound_fraction_delta == pytest.approx(0.25)

        runs = c.list_runs(project="gate", case="golden_logits").runs
        assert [r.run_id for r in runs] == [second[1].run_id, second[0].run_id, first[0].run_id]
        assert {r.operation for r in runs} == {"validation"}
        assert runs[-1].labels == logitd.RunLabels("gate", "golden_logits", "main", "a1")

        # A case outside its bounds is recorded as such; a bad case records none.
        failing = logitd.ValidatedOutput("y", 5, (4, 60), False, 3.0)
        bad = c.record_validation("gate", [logitd.ValidatedCase("golden_fail", 9, (failing,))], branch="main")
        assert c.list_runs(project="gate", case="golden_fail").runs[0].run_id == bad[0].run_id
        with pytest.raises(logitd.InvalidArgumentError):
            c.record_validation("gate", [logitd.ValidatedCase("", 1, (out,)), case], branch="main")
        with pytest.raises(logitd.NotFoundError):
            c.record_validation("gate", [case], compare=logitd.Baseline(branch="nowhere"))
        assert len(c.list_runs(project="gate", case="golden_logits").runs) == 3
        with pytest.raises(logitd.InvalidArgumentError):
            c.record_validation("gate", ["not a case"])
