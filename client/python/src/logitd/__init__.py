"""Python client of logitd, the language-model head GEMM service.

    import logitd
    client = logitd.Client("127.0.0.1:50051")
    w = client.register_weights(weight_bf16, name="lm_head.weight")
    y = client.logits(x_bf16, w.handle)             # fp32 [M, V]
    dx, dw = client.backward(dy, x_bf16, w.handle)  # bf16 [M, K], fp32 [V, K]
    verdict = client.verify_logits(x_bf16, my_y, w)  # another kernel's Y against the contract
"""

try:
    from .v1 import logitd_pb2 as _pb  # noqa: F401
except ImportError as _e:  # pragma: no cover - only from an unbuilt source tree
    raise ImportError(
        "logitd: the generated gRPC stubs (logitd.v1.logitd_pb2) are missing; install the package "
        "with `pip install ./client/python`, which generates them from proto/"
    ) from _e

from . import testing  # logitd.testing: assertions for a project's own tests
from ._tensors import BF16, digest
from .client import TLS, Client, CrossEntropyResult, Gradient, LogProbs, ReleaseResult, RetryPolicy, ServerInfo, WeightInfo
from .errors import (
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    LogitdError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from .history import (
    Alert,
    Baseline,
    CandidateComparison,
    CandidateSummary,
    CaseSummary,
    ProjectSummary,
    Rule,
    RunComparison,
    RunLabels,
    RunPage,
    RunSummary,
    RecordedCase,
    ValidatedCase,
    ValidatedOutput,
)
from .shm import SharedRegion
from .verify import (
    ERROR_HISTOGRAM_BINS,
    PASSING_VERDICTS,
    CandidateVerdict,
    PrecisionClass,
    RowPrecision,
    Verdict,
    VerifyElement,
)

__version__ = "0.1.0"

__all__ = [
    "RecordedCase",
    "ValidatedCase",
    "ValidatedOutput",
    "BF16",
    "Alert",
    "Baseline",
    "CandidateComparison",
    "ERROR_HISTOGRAM_BINS",
    "TLS",
    "CancelledError",
    "CandidateSummary",
    "CaseSummary",
    "CandidateVerdict",
    "Client",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "CrossEntropyResult",
    "LogProbs",
    "Gradient",
    "InternalError",
    "InvalidArgumentError",
    "LogitdError",
    "NotFoundError",
    "PASSING_VERDICTS",
    "PermissionDeniedError",
    "ProjectSummary",
    "PrecisionClass",
    "ReleaseResult",
    "ResourceExhaustedError",
    "RetryPolicy",
    "RowPrecision",
    "RunComparison",
    "Rule",
    "RunLabels",
    "RunPage",
    "RunSummary",
    "ServerInfo",
    "SharedRegion",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "Verdict",
    "VerifyElement",
    "WeightInfo",
    "digest",
]
