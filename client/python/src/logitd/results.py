"""The results of Client calls: what the server reports of itself and of its
weights, and the named outputs of the tensor calls."""

from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Tuple


@dataclass(frozen=True)
class ServerInfo:
    """What is serving. Results are bitwise comparable only across equal backend/device/versions."""

    version: str
    build_id: str
    backend: str
    device_name: str
    compute_capability: str
    multiprocessor_count: int
    driver_version: str
    cuda_runtime_version: str
    cublaslt_version: str
    blas_version: str
    weight_budget_bytes: int
    weight_bytes_in_use: int
    max_request_bytes: int
    chunk_bytes: int
    device_bytes_in_use: int
    split_k: str
    # The wire's limits (docs/PROTOCOL.md): the largest message the server
    # takes, the largest request chunk, the largest message it sends.
    max_receive_message_bytes: int = 0
    max_request_chunk_bytes: int = 0
    max_send_message_bytes: int = 0
    # How long GEMM algorithm choices last: "fixed" (cpu), "kept" (in
    # algo_cache_path, across restarts) or "per_process" (a restart may give
    # other bits).
    algo_choices: str = ""
    algo_cache_path: str = ""
    # Whether a streamed request tensor's digest may follow its chunks
    # (docs/PROTOCOL.md, section 3); this client sends it up front.
    request_digest_last: bool = False


@dataclass(frozen=True)
class WeightInfo:
    """A weight held by the server; ``handle`` names it in later calls."""

    handle: str
    name: str
    shape: Tuple[int, ...]
    xxh3: int
    bytes: int
    has_gradient: bool
    already_registered: bool
    registrations: int
    # "F32" or "F16" when load_weight rounded the file's tensor to bf16, else "".
    converted_from: str = ""
    # A logits call on this weight cut at multiples of these rows (fp32 or
    # bf16 out) keeps every row's bits (0 from a server that does not say).
    logits_block_rows_fp32: int = 0
    logits_block_rows_bf16: int = 0
    # The same for a logprobs call (every output of every row).
    logprobs_block_rows: int = 0


@dataclass(frozen=True)
class ReleaseResult:
    """Bytes freed now (0 while other registrations remain or calls still use
    the weight), registrations left, and bytes that go when those calls end."""

    bytes_freed: int
    registrations_left: int
    bytes_freed_when_calls_end: int = 0


class CrossEntropyResult(NamedTuple):
    """Fused cross-entropy outputs: loss (fp32, [M] for reduction "none", else
    [1]); lse, dx, dw when asked for (else None); tokens not ignored."""

    loss: Any
    lse: Any
    dx: Any
    dw: Any
    counted_tokens: int


class LogProbs(NamedTuple):
    """Per-token outputs of Client.logprobs, each None when not asked for:
    logprob (fp32 [M], with targets; 0 for an ignored one), lse and entropy
    (fp32 [M]), topk_ids (int32 [M, top_k], most likely first, ties by the
    lower id) and topk_logprobs (fp32 [M, top_k]), rank (int64 [M]; -1 for an
    ignored target)."""

    logprob: Any
    lse: Any
    entropy: Any
    topk_ids: Any
    topk_logprobs: Any
    rank: Any


class Gradient(NamedTuple):
    """The server-held fp32 dW of a weight and how many Backward calls it sums."""

    dw: Any
    accumulated_calls: int


def _from_proto(cls, msg):
    values = {}
    for f in fields(cls):
        v = getattr(msg, f.name)
        if f.name == "shape":
            v = tuple(int(d) for d in v)
        values[f.name] = v
    return cls(**values)
