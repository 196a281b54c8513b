"""Assertions for a project's own tests: is my kernel's output within logitd's contract?

    from logitd.testing import assert_logits_within_contract

    def test_my_lm_head(client):
        y = my_kernel(x, w)                        # fp32 or bf16 [M, V]
        assert_logits_within_contract(client, x, y, w)

Each helper runs a Verify call (see logitd.verify) and raises AssertionError
when a candidate does not pass: outside its proven bound ("outside_bounds"), or
inside it with errors that are not those of fp32 accumulation
("outside_precision_class": bf16 rounding passed off as fp32, say). The message
is the verdict's describe(): each candidate's verdict and the figures that
decided it (the proven bound's; the precision-class test's RMS ratio against
its threshold and effective bits), and the worst elements the server listed:
those outside the proven bound first, each group worst first, with the fp64
reference and what each was held to. Else it returns the Verdict (a sampled pass included). Errors of
the call itself (an unknown weight, a candidate of the wrong shape, a
sample_seed without sample_rows) are raised as the client's LogitdError, not as
a failed assertion.

With ``record=logitd.RunLabels(project, case, branch, ref)`` the run is kept in
the server's history, and with ``compare=logitd.Baseline(branch="main",
if_present=True)`` compared with a recorded run; then the assertion also fails
when the run broke a rule of its project (Verdict.alerts), when it was not
recorded (Verdict.record_error), and, with ``bits_unchanged=True``, when any
candidate's bits differ from the baseline's: "within the contract and the same
bits as main" in one line.
"""

from typing import Any

from .verify import Verdict

__all__ = ["assert_backward_within_contract", "assert_logits_within_contract"]


def _passed(verdict: Verdict, bits_unchanged: bool = False) -> Verdict:
    if not verdict.passed:
        raise AssertionError(verdict.describe())
    problems = ["%s: %s" % (a.rule, a.message) for a in verdict.alerts]
    if verdict.record_error:
        problems.append(verdict.record_error)
    if bits_unchanged and verdict.comparison is not None:
        c = verdict.comparison
        for cc in c.candidates:
            if cc.bits != "identical":
                problems.append(
                    "%s: bits %s against run %d (%s at %s)"
                    % (cc.name, cc.bits, c.baseline_run_id, c.baseline_labels.branch or "no branch",
                       c.baseline_labels.ref or "no ref")
                )
    if problems:
        raise AssertionError("within the contract, but:\n  " + "\n  ".join(problems))
    return verdict


def assert_logits_within_contract(
    client: Any,
    x: Any,
    y: Any,
    weight: Any,
    *,
    alpha: float = 1.0,
    sample_rows: int = 0,
    sample_seed: int = 0,
    record: Any = None,
    compare: Any = None,
    bits_unchanged: bool = False,
) -> Verdict:
    """Asserts that logits Y [M, V] (fp32 or bf16) of X [M, K] and the weight are
    within bounds and fp32 accumulation's precision class, or bitwise logitd's
    own; arguments as Client.verify_logits (record, compare and bits_unchanged:
    the module's doc)."""
    verdict = client.verify_logits(
        x, y, weight, alpha=alpha, sample_rows=sample_rows, sample_seed=sample_seed, record=record, compare=compare
    )
    return _passed(verdict, bits_unchanged)


def assert_backward_within_contract(
    client: Any,
    dy: Any,
    x: Any,
    weight: Any,
    *,
    dx: Any = None,
    dw: Any = None,
    record: Any = None,
    compare: Any = None,
    bits_unchanged: bool = False,
    sample_rows: int = 0,
    sample_seed: int = 0,
) -> Verdict:
    """Asserts that dX [M, K] and/or dW [V, K] from dY [M, V], X and the weight are
    within bounds and fp32 accumulation's precision class, or bitwise logitd's
    own (G = bf16(dY) once); arguments as Client.verify_backward (record,
    compare and bits_unchanged: the module's doc)."""
    verdict = client.verify_backward(
        dy, x, weight, dx=dx, dw=dw, sample_rows=sample_rows, sample_seed=sample_seed, record=record, compare=compare
    )
    return _passed(verdict, bits_unchanged)
