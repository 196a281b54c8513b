"""The requests of Client.verify_*: the header, the inputs and the
candidates as logitd.verify's Verify call streams them (X and W as exact
bf16, the candidates by the operation's output names, the sampled rows and
the seed checked against what the wire carries). The verdicts are
logitd.verify's.
"""

import math
from typing import Any, List, Sequence, Tuple

import numpy as np

from . import _tensors as T
from .errors import InvalidArgumentError
from .results import WeightInfo
from .v1 import logitd_pb2 as pb

# Largest sample_rows the wire carries (uint32), and sample_seed (uint64).
_MAX_SAMPLE_ROWS = (1 << 32) - 1
_MAX_SAMPLE_SEED = (1 << 64) - 1


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
