"""Client.verify_*: another implementation's outputs judged by the server's
Verify (the request built and the verdict read by logitd.verify). A mixin
of Client.
"""

from typing import Any, Optional

from . import verify as _verify
from ._transport import _retried
from .history import Baseline, RunLabels
from .verify import Verdict


class _VerifyCalls:
    @_retried(unless="record")
    def verify_logits(
        self,
        x: Any,
        y: Any,
        weight: Any,
        *,
        alpha: float = 1.0,
        sample_rows: int = 0,
        sample_seed: int = 0,
        record: Optional[RunLabels] = None,
        compare: Optional[Baseline] = None,
    ) -> Verdict:
        """Judges logits Y [M, V] computed elsewhere (fp32 or bf16) from X [M, K]
        and W [V, K] against the contract: per element an fp64 reference of the
        exact products and its proven bound, the errors against those of fp32
        accumulation (the precision-class test), and logitd's own output (see
        logitd.verify).

        weight: a handle, a WeightInfo, or W itself (bf16, streamed for this call
        only). X and W may be given as float32 when each value is a bf16 value.
        alpha: the scale Y was computed with. sample_rows: 0 checks every row,
        else this many rows: evenly spaced with the first and the last when
        sample_seed is 0, else drawn uniformly by sample_seed (a seed without
        sample_rows is InvalidArgumentError). A sampled pass reads
        "within_bounds_sampled" or "bitwise_equal_to_logitd_sampled". record: a
        logitd.RunLabels(project, case, branch, ref) to have the server record
        the run in its history (Verdict.run_id; Client.list_runs lists it; such
        a call is not retried); FailedPreconditionError from a server without
        history. compare: with record, a logitd.Baseline(branch=, ref= or
        run_id=) to compare the candidates with that recorded run of the same
        project and case (Verdict.comparison); NotFoundError when there is
        none. Returns a Verdict; a candidate outside its bounds or its
        precision class is a verdict, not an error.
        """
        return _verify.call(
            self,
            *_verify.logits_request(x, y, weight, alpha, sample_rows, sample_seed),
            record=record,
            compare=compare,
        )

    @_retried(unless="record")
    def verify_backward(
        self,
        dy: Any,
        x: Any,
        weight: Any,
        *,
        dx: Any = None,
        dw: Any = None,
        sample_rows: int = 0,
        sample_seed: int = 0,
        record: Optional[RunLabels] = None,
        compare: Optional[Baseline] = None,
    ) -> Verdict:
        """Judges gradients computed elsewhere, dX [M, K] and/or dW [V, K] (fp32
        or bf16), from dY [M, V] (fp32 or bf16), X and W under the backward
        contract: G = bf16(dY) once, dX = G.W, dW = G^T.X with fp32 accumulation.

        weight, sample_rows, sample_seed and the dtypes of X and W as in
        verify_logits; dW, which every row feeds, is checked whole also when
        rows are sampled (its verdict has no "_sampled").
        """
        return _verify.call(
            self,
            *_verify.backward_request(dy, x, weight, dx, dw, sample_rows, sample_seed),
            record=record,
            compare=compare,
        )

    @_retried(unless="record")
    def verify_cross_entropy(
        self,
        x: Any,
        targets: Any,
        weight: Any,
        *,
        loss: Any = None,
        lse: Any = None,
        dx: Any = None,
        dw: Any = None,
        reduction: str = "mean",
        ignore_index: int = -100,
        z_loss: float = 0.0,
        logit_softcap: float = 0.0,
        grad_scale: float = 1.0,
        sample_rows: int = 0,
        sample_seed: int = 0,
        record: Optional[RunLabels] = None,
        compare: Optional[Baseline] = None,
    ) -> Verdict:
        """Judges a fused cross-entropy's outputs computed elsewhere: loss (fp32,
        [M] with reduction="none", else one value), lse (fp32 [M]), dx (fp32 or
        bf16 [M, K]) and/or dw (fp32 [V, K]) of X, the targets (int32 or int64
        [M]) and W, with the options cross_entropy takes, against the fp64
        reference and its proven bound per element and logitd's own output. The
        gradients are judged under the bf16-G contract (G = bf16(dL/dlogits)
        once, fp32 accumulation). weight as in verify_logits. sample_rows: 0
        checks every row, else that many rows of the per-token loss, lse and
        dx (a reduced loss and dw need every row), chosen as sample_seed says
        (verify_logits)."""
        options = dict(
            reduction=reduction,
            ignore_index=ignore_index,
            z_loss=z_loss,
            logit_softcap=logit_softcap,
            grad_scale=grad_scale,
            sample_rows=sample_rows,
            sample_seed=sample_seed,
        )
        return _verify.call(
            self,
            *_verify.cross_entropy_request(x, targets, weight, loss, lse, options, dx, dw),
            record=record,
            compare=compare,
        )

    @_retried(unless="record")
    def verify_logprobs(
        self,
        x: Any,
        weight: Any,
        *,
        targets: Any = None,
        logprob: Any = None,
        lse: Any = None,
        entropy: Any = None,
        topk_ids: Any = None,
        topk_logprobs: Any = None,
        rank: Any = None,
        temperature: float = 1.0,
        logit_softcap: float = 0.0,
        vocab_size: int = 0,
        ignore_index: int = -100,
        sample_rows: int = 0,
        sample_seed: int = 0,
        record: Optional[RunLabels] = None,
        compare: Optional[Baseline] = None,
    ) -> Verdict:
        """Judges LogProbs' outputs computed elsewhere: logprob (needs targets),
        lse and/or entropy (fp32 [M]), top-k ids (int32 or int64 [M, k], most
        likely first; judged up to ties within the bound) and log-probs (fp32
        [M, k]), and the target's rank (int32 or int64 [M], needs targets) of X
        and W with the options logprobs takes, as verify_cross_entropy does.
        sample_rows, sample_seed: as there, for logprob, lse and entropy (the
        top-k and ranks need every row)."""
        options = dict(
            temperature=temperature,
            logit_softcap=logit_softcap,
            vocab_size=vocab_size,
            ignore_index=ignore_index,
            sample_rows=sample_rows,
            sample_seed=sample_seed,
        )
        return _verify.call(
            self,
            *_verify.logprobs_request(
                x, targets, weight, logprob, lse, entropy, options, topk_ids, topk_logprobs, rank
            ),
            record=record,
            compare=compare,
        )
