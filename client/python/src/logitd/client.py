"""logitd.Client: the Python client of the logitd.v1.Logitd service.

One gRPC channel per Client; every call gets the client's deadline and, when a
token is set, an ``authorization: Bearer TOKEN`` header. Tensors are streamed
in chunks (``chunk_bytes``, default 4 MiB) with an xxh3-64 digest, and the
response tensors are reassembled and checked the same way.

Inputs may be numpy arrays (bf16 as ``ml_dtypes.bfloat16``, fp32 as
``float32``) or torch tensors (``torch.bfloat16``/``torch.float32``, any
device). Results are numpy arrays, or CPU torch tensors when the inputs were
torch tensors.
"""

import functools
import inspect
import math
import os
import random
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import grpc
import numpy as np
import xxhash

from . import _tensors as T
from .errors import DataLossError, InvalidArgumentError, LogitdError, UnavailableError, from_rpc_error
from .shm import SharedRegion
from .shm import _align as _shm_align
from .v1 import logitd_pb2 as pb
from .v1 import logitd_pb2_grpc as pb_grpc

# Tensor bytes per chunk message: 4 MiB less 4 KiB, so that a chunk with its
# framing fits the 4 MiB every gRPC peer accepts by default (the protocol's
# kDefaultChunkBytes, include/logitd/protocol.h).
DEFAULT_CHUNK_BYTES = (4 << 20) - 4096
# Room a chunk message needs beyond its payload (tensor name, offset, framing).
_MESSAGE_HEADROOM = 1 << 20
# gRPC sizes messages with a signed 32-bit int; stay well inside it.
_MAX_CHUNK_BYTES = 1 << 30


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


_REDUCTIONS = {"none": pb.REDUCTION_NONE, "sum": pb.REDUCTION_SUM, "mean": pb.REDUCTION_MEAN}


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


_LOGPROBS_OUTPUTS = ("logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank")


class Gradient(NamedTuple):
    """The server-held fp32 dW of a weight and how many Backward calls it sums."""

    dw: Any
    accumulated_calls: int


@dataclass
class TLS:
    """TLS settings. Each is a path to a PEM file (str or os.PathLike), or PEM
    contents (bytes, or a str holding a ``-----BEGIN`` line).

    ``root_ca`` None uses the system's roots; ``cert`` and ``key`` (both or
    neither) give the client's identity for mutual TLS (a server started with
    ``--tls_client_ca``). As a dict, ``ca`` may be written for ``root_ca``.
    """

    root_ca: Optional[Any] = None
    cert: Optional[Any] = None
    key: Optional[Any] = None


def _pem(what: str, value: Any) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and "-----BEGIN" in value:
        return value.encode()
    if isinstance(value, (str, os.PathLike)):
        try:
            with open(value, "rb") as f:
                return f.read()
        except OSError as e:
            raise InvalidArgumentError("tls %s: cannot read %s: %s" % (what, os.fspath(value), e.strerror)) from e
    raise InvalidArgumentError("tls %s: expected a PEM file path or PEM contents, got %s" % (what, type(value).__name__))


def _tls_credentials(tls: Any) -> Optional[grpc.ChannelCredentials]:
    if tls is None or tls is False:
        return None
    if tls is True:
        tls = TLS()
    elif isinstance(tls, dict):
        unknown = set(tls) - {"root_ca", "ca", "cert", "key"}
        if unknown:
            raise InvalidArgumentError("tls: unknown keys %s (expected ca or root_ca, cert, key)" % sorted(unknown))
        if "ca" in tls and "root_ca" in tls:
            raise InvalidArgumentError("tls: give ca or root_ca, not both")
        tls = dict(tls)
        if "ca" in tls:
            tls["root_ca"] = tls.pop("ca")
        tls = TLS(**tls)
    root_ca = _pem("root_ca", getattr(tls, "root_ca", None))
    cert = _pem("cert", getattr(tls, "cert", None))
    key = _pem("key", getattr(tls, "key", None))
    if (cert is None) != (key is None):
        raise InvalidArgumentError("tls client identity: expected both a certificate and a key, got only one")
    return grpc.ssl_channel_credentials(root_certificates=root_ca, private_key=key, certificate_chain=cert)


def _from_proto(cls, msg):
    values = {}
    for f in fields(cls):
        v = getattr(msg, f.name)
        if f.name == "shape":
            v = tuple(int(d) for d in v)
        values[f.name] = v
    return cls(**values)


@dataclass(frozen=True)
class RetryPolicy:
    """Retrying calls that failed with UNAVAILABLE (server down, restarting or unreachable,
    connection lost mid-call), as the C++ client's RetryPolicy. A Client without one makes
    each call once. Only idempotent calls are ever retried: info, list_weights,
    load_weight, register_weights, logits, cast_to_bf16, zero_gradient,
    fetch_gradient(zero_after=False), backward and cross_entropy without accumulate_dw;
    never release_weights, register_shm, release_shm, fetch_gradient(zero_after=True),
    nor backward/cross_entropy with accumulate_dw. Attempts share the call's deadline
    (the Client's timeout, from the start of the call).

    max_attempts: attempts in all, the first included (0: no limit but the deadline).
    initial_backoff, max_backoff: seconds before the first retry, and at most; each
    further retry waits ``multiplier`` times longer, scaled by a random factor in
    [1 - jitter, 1 + jitter]. The defaults cover some 11 s of outage.
    """

    max_attempts: int = 8
    initial_backoff: float = 0.1
    multiplier: float = 2.0
    max_backoff: float = 5.0
    jitter: float = 0.2

    def __post_init__(self):
        if not isinstance(self.max_attempts, int) or self.max_attempts < 0:
            raise InvalidArgumentError("max_attempts: expected 0 (no limit) or more, got %r" % (self.max_attempts,))
        for name in ("initial_backoff", "max_backoff"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InvalidArgumentError("%s: expected a positive number of seconds, got %r" % (name, v))
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1):
            raise InvalidArgumentError("multiplier: expected 1 or more, got %r" % (self.multiplier,))
        if not 0 <= self.jitter < 1:
            raise InvalidArgumentError("jitter: expected 0 <= jitter < 1, got %r" % (self.jitter,))


def _retried(unless: Optional[str] = None):
    """Marks a call as idempotent: retried on UNAVAILABLE under the client's RetryPolicy.
    With ``unless``, only when that argument of the call is false."""

    def wrap(method):
        signature = inspect.signature(method)

        @functools.wraps(method)
        def call(self, *args, **kwargs):
            idempotent = True
            if unless is not None:
                bound = signature.bind(self, *args, **kwargs)
                bound.apply_defaults()
                idempotent = not bound.arguments[unless]
            return self._retrying(idempotent, lambda: method(self, *args, **kwargs))

        return call

    return wrap


class Client:
    """A connection to a logitd server.

    Args:
      address: gRPC target, e.g. ``"127.0.0.1:50051"``, ``"dns:///logitd.ns.svc:50051"`` or
        ``"ipv4:10.0.0.1:50051,10.0.0.2:50051"``.
      token: bearer token sent as ``authorization: Bearer TOKEN`` on every call.
      tls: None/False for plaintext; True for TLS with the system's roots; or a
        ``logitd.TLS``, a dict (``ca`` or ``root_ca``, ``cert``, ``key``) or any object
        with ``root_ca``/``cert``/``key``: each a PEM file path or PEM contents.
      timeout: deadline of each call in seconds (None: no deadline).
      chunk_bytes: size of the chunks request tensors are streamed in.
      options: extra gRPC channel options, ``[(name, value), ...]``.
      lb_policy: ``"pick_first"`` (every call on one of the target's servers) or
        ``"round_robin"`` (calls spread over all of them). Weights are registered per
        server, so round_robin suits calls that need none (``info``, ``cast``) or weights
        registered on every server.
      retry: a ``logitd.RetryPolicy`` to ride over a server restart or a lost
        connection (idempotent calls only); None (default): each call once.
    """

    def __init__(
        self,
        address: str,
        token: Optional[str] = None,
        tls: Any = None,
        timeout: Optional[float] = 600,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        options: Optional[Sequence[Tuple[str, Any]]] = None,
        lb_policy: str = "pick_first",
        retry: Optional[RetryPolicy] = None,
    ):
        if not address:
            raise InvalidArgumentError("address: expected a gRPC target such as 127.0.0.1:50051, got an empty string")
        if not isinstance(chunk_bytes, int) or not 1 <= chunk_bytes <= _MAX_CHUNK_BYTES:
            raise InvalidArgumentError("chunk_bytes: expected 1 to %d bytes, got %r" % (_MAX_CHUNK_BYTES, chunk_bytes))
        if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
            raise InvalidArgumentError("timeout: expected a positive number of seconds or None, got %r" % (timeout,))
        if lb_policy not in ("pick_first", "round_robin"):
            raise InvalidArgumentError("lb_policy: expected pick_first or round_robin, got %r" % (lb_policy,))
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidArgumentError("retry: expected a logitd.RetryPolicy or None, got %s" % type(retry).__name__)
        self.address = address
        self.timeout = timeout
        self.retry = retry
        # Attempts repeated after UNAVAILABLE, over the client's lifetime.
        self.retries = 0
        self._attempt = threading.local()
        self.chunk_bytes = chunk_bytes
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        channel_options = [
            ("grpc.max_send_message_length", chunk_bytes + _MESSAGE_HEADROOM),
            # The server picks its own chunk size; each tensor is bounded by the size it announced.
            ("grpc.max_receive_message_length", -1),
            ("grpc.lb_policy_name", lb_policy),
        ]
        if retry is not None:
            channel_options += [
                ("grpc.initial_reconnect_backoff_ms", max(1, int(retry.initial_backoff * 1000))),
                ("grpc.min_reconnect_backoff_ms", max(1, int(retry.initial_backoff * 1000))),
                ("grpc.max_reconnect_backoff_ms", max(1, int(retry.max_backoff * 1000))),
            ]
        if options:
            channel_options.extend(options)
        credentials = _tls_credentials(tls)
        if credentials is None:
            self._channel = grpc.insecure_channel(address, options=channel_options)
        else:
            self._channel = grpc.secure_channel(address, credentials, options=channel_options)
        self._stub = pb_grpc.LogitdStub(self._channel)
        self._closed = False
        self._lock = threading.Lock()

    # -- lifetime ---------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "logitd.Client(%r)" % self.address

    # -- plumbing -----------------------------------------------------------------

    def _timeout(self) -> Optional[float]:
        """The time left to the current call (its attempts share one deadline)."""
        deadline = getattr(self._attempt, "deadline", None)
        if deadline is None:
            return self.timeout
        return max(deadline - time.monotonic(), 0.001)

    def _retrying(self, idempotent: bool, attempt):
        policy = self.retry
        if policy is None or not idempotent or policy.max_attempts == 1:
            return attempt()
        start = time.monotonic()
        deadline = None if self.timeout is None else start + self.timeout
        backoff = policy.initial_backoff
        n = 0
        while True:
            n += 1
            self._attempt.deadline = deadline
            try:
                return attempt()
            except UnavailableError as e:
                wait = min(backoff, policy.max_backoff) * random.uniform(1 - policy.jitter, 1 + policy.jitter)
                if (policy.max_attempts > 0 and n >= policy.max_attempts) or (
                    deadline is not None and time.monotonic() + wait >= deadline
                ):
                    raise UnavailableError(
                        "%s (gave up after %d attempts in %.1f s)" % (e.message, n, time.monotonic() - start),
                        e.code,
                    ) from None
            finally:
                self._attempt.deadline = None
            # Wait on the channel, not only the clock: that makes gRPC try to
            # reconnect (and notice that it can) while the client waits.
            # The channel reconnects on the policy's schedule too (see __init__),
            # so the next attempt finds it trying again rather than in a long
            # reconnect backoff of its own.
            time.sleep(wait)
            backoff *= policy.multiplier
            with self._lock:
                self.retries += 1

    def _unary(self, method, request):
        try:
            return method(request, timeout=self._timeout(), metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _requests(self, request_cls, header_field: str, header, tensors: Sequence[T.Outgoing]):
        yield request_cls(**{header_field: header})
        for t in tensors:
            for chunk in t.chunks(self.chunk_bytes):
                yield request_cls(chunk=chunk)

    def _receive(self, call, specs_of):
        """Reads a response stream: one result message, then the chunks of the tensors it announces
        (and, for a tensor announced without its digest, the digest after its chunks)."""
        result = None
        incoming = {}
        try:
            try:
                for msg in call:
                    part = msg.WhichOneof("part")
                    if part == "result":
                        if result is not None:
                            raise DataLossError("response from server: a second result message")
                        result = msg.result
                        for spec in specs_of(result):
                            if spec.name in incoming:
                                raise DataLossError("response from server: tensor %r announced twice" % spec.name)
                            incoming[spec.name] = T.Incoming(spec)
                    elif part == "chunk":
                        if result is None:
                            raise DataLossError(
                                "response from server: chunk of %r arrived before the result that announces it"
                                % msg.chunk.name
                            )
                        target = incoming.get(msg.chunk.name)
                        if target is None:
                            raise DataLossError(
                                "response from server: chunk for tensor %r, which the result did not announce"
                                % msg.chunk.name
                            )
                        target.add(msg.chunk)
                    elif part == "digest":
                        target = incoming.get(msg.digest.name)
                        if target is None:
                            raise DataLossError(
                                "response from server: digest of tensor %r, which the result did not announce"
                                % msg.digest.name
                            )
                        target.expected = msg.digest.xxh3
                    else:
                        raise DataLossError("response from server: a message with neither result nor chunk")
            except LogitdError:
                call.cancel()  # stop the request stream and the server's work
                raise
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if result is None:
            raise DataLossError("response from server: the call ended without a result")
        for t in incoming.values():
            t.finish()
        return result, incoming

    def _stream(self, method, request_cls, header_field, header, tensors, specs_of):
        call = method(
            self._requests(request_cls, header_field, header, tensors),
            timeout=self._timeout(),
            metadata=self._metadata,
        )
        return self._receive(call, specs_of)

    # -- server info ----------------------------------------------------------------

    @_retried()
    def info(self) -> ServerInfo:
        """Backend, device, library versions and limits of the server."""
        return _from_proto(ServerInfo, self._unary(self._stub.GetServerInfo, pb.GetServerInfoRequest()))

    # -- weights ------------------------------------------------------------------------

    @_retried()
    def register_weights(self, tensor: Any, name: str = "") -> WeightInfo:
        """Uploads a bf16 weight [V, K]; identical bytes return the existing handle."""
        w = T.Outgoing("weight", tensor, (pb.DTYPE_BF16,))
        header = pb.RegisterWeightHeader(name=name, weight=w.spec)
        try:
            info = self._stub.RegisterWeight(
                self._requests(pb.RegisterWeightRequest, "header", header, [w]),
                timeout=self._timeout(),
                metadata=self._metadata,
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return _from_proto(WeightInfo, info)

    register_weight = register_weights

    @_retried()
    def load_weight(self, path: str, tensor: str, name: str = "") -> WeightInfo:
        """Registers a weight the server reads from a safetensors file under its
        --weights_dir (path relative to it); F32/F16 tensors are rounded to bf16."""
        request = pb.LoadWeightRequest(path=path, tensor=tensor, name=name)
        return _from_proto(WeightInfo, self._unary(self._stub.LoadWeight, request))

    @_retried()
    def list_weights(self) -> List[WeightInfo]:
        response = self._unary(self._stub.ListWeights, pb.ListWeightsRequest())
        return [_from_proto(WeightInfo, w) for w in response.weights]

    def release_weights(self, handle: Union[str, WeightInfo], force: bool = False) -> ReleaseResult:
        """Releases one registration (all of them with force=True)."""
        request = pb.ReleaseWeightRequest(handle=_handle(handle), force=force)
        response = self._unary(self._stub.ReleaseWeight, request)
        return ReleaseResult(
            bytes_freed=response.bytes_freed,
            registrations_left=response.registrations_left,
            bytes_freed_when_calls_end=response.bytes_freed_when_calls_end,
        )

    release_weight = release_weights

    # -- GEMMs ------------------------------------------------------------------------------

    @_retried()
    def logits(
        self,
        x: Any,
        handle: Union[str, WeightInfo],
        out_dtype: Any = "fp32",
        alpha: float = 1.0,
        shm: Optional[SharedRegion] = None,
        verify: bool = True,
    ):
        """Y[M, V] = alpha * X[M, K] . W[V, K]^T with fp32 accumulation.

        out_dtype "fp32" (default) returns the accumulator; "bf16" is the legacy
        path, the accumulator rounded to bf16 once.

        shm: a registered SharedRegion (same host, server --allow_shm): X is
        copied to its start and the server writes Y right after it (64-byte
        aligned); no tensor bytes travel over gRPC. Given only a handle, the
        client does not know V and offers Y the rest of the region (the
        server refuses a Y that does not fit); given the WeightInfo, Y's slot
        is sized exactly. The result is then a view of the region,
        overwritten by the next call that uses it: copy it to keep it.
        verify=False (with shm only) asks the server not to hash Y and skips
        the client's check: one pass over Y fewer on each side.
        """
        alpha = float(alpha)
        if alpha == 0.0:
            raise InvalidArgumentError("alpha: expected a non-zero scale (0 on the wire means the default 1), got 0")
        if not math.isfinite(alpha):
            raise InvalidArgumentError("alpha: expected a finite scale, got %r" % alpha)
        out = T.dtype_enum("out_dtype", out_dtype, (pb.DTYPE_FP32, pb.DTYPE_BF16))
        xt = T.Outgoing("x", x, (pb.DTYPE_BF16,))
        header = pb.LogitsHeader(weight_handle=_handle(handle), x=xt.spec, out_dtype=out, alpha=alpha)
        _verify_needs_shm(verify, shm)
        if shm is not None:
            layout = _ShmLayout(shm, verify)
            m, _ = _matrix(xt, "M, K")
            header.x_shm.CopyFrom(layout.input(xt))
            # V is known from a WeightInfo; from a bare handle, Y gets the rest of the region.
            header.y_shm.CopyFrom(layout.output("y", out, (m, _weight_rows(handle))))
            _, outputs = self._call_shm(self._stub.Logits, pb.LogitsRequest, header, layout, T.is_torch(x))
            return outputs["y"]
        # The server hashes Y while its chunks travel and sends the digest last.
        header.digest_last = True
        result, tensors = self._stream(
            self._stub.Logits, pb.LogitsRequest, "header", header, [xt], lambda r: [r.y]
        )
        return tensors[result.y.name].result(T.is_torch(x))

    # -- shared memory -----------------------------------------------------------------------

    def register_shm(self, region_or_bytes: Union[SharedRegion, int]) -> SharedRegion:
        """Registers a SharedRegion (or creates one of that many bytes) with a server started with
        --allow_shm; FailedPreconditionError otherwise. Pass it as ``shm=`` to calls."""
        region = region_or_bytes if isinstance(region_or_bytes, SharedRegion) else SharedRegion(region_or_bytes)
        response = self._unary(self._stub.RegisterShm, pb.RegisterShmRequest(name=region.name, bytes=region.nbytes))
        region.handle = response.handle
        return region

    def release_shm(self, region: SharedRegion) -> None:
        """Ends the registration (the object itself stays until region.close())."""
        if region.handle is None:
            return
        self._unary(self._stub.ReleaseShm, pb.ReleaseShmRequest(handle=region.handle))
        region.handle = None

    def _call_shm(self, method, request_cls, header, layout: "_ShmLayout", as_torch: bool):
        """A tensor call whose tensors all lie in shared memory (``layout``): only the header and
        the result travel. Returns the result message and its outputs by name, views of the region."""
        layout.write()
        result, _ = self._stream(method, request_cls, "header", header, [], lambda r: [])
        return result, layout.results(result, as_torch)

    @_retried(unless="accumulate_dw")
    def backward(
        self,
        dy: Any,
        x: Any,
        handle: Union[str, WeightInfo],
        want_dx: bool = True,
        want_dw: bool = True,
        dx_dtype: Any = "bf16",
        dw_dtype: Any = "fp32",
        accumulate_dw: bool = False,
        shm: Optional[SharedRegion] = None,
        verify: bool = True,
    ):
        """G = bf16(dY) (round to nearest even, once); dX = G.W [M, K]; dW = G^T.X [V, K].

        Returns (dx, dw); an entry is None when not asked for, and dw is None
        when accumulate_dw adds it into the server-held buffer instead
        (see fetch_gradient).

        shm: a registered SharedRegion (same host, server --allow_shm): dY and
        X are copied to its start and the server writes dX and dW after them
        (each 64-byte aligned, sized from dY [M, V] and X [M, K]); no tensor
        bytes travel over gRPC. The results are then views of the region,
        overwritten by the next call that uses it: copy them to keep them.
        verify=False (with shm only) asks the server not to hash dX and dW
        and skips the client's check.
        """
        dxt = T.dtype_enum("dx_dtype", dx_dtype, (pb.DTYPE_BF16, pb.DTYPE_FP32))
        dwt = T.dtype_enum("dw_dtype", dw_dtype, (pb.DTYPE_FP32, pb.DTYPE_BF16))
        dyt = T.Outgoing("dy", dy, (pb.DTYPE_FP32, pb.DTYPE_BF16))
        xt = T.Outgoing("x", x, (pb.DTYPE_BF16,))
        header = pb.BackwardHeader(
            weight_handle=_handle(handle),
            dy=dyt.spec,
            x=xt.spec,
            want_dx=bool(want_dx),
            want_dw=bool(want_dw),
            dx_dtype=dxt,
            dw_dtype=dwt,
            accumulate_dw=bool(accumulate_dw),
        )
        as_torch = T.is_torch(dy) or T.is_torch(x)
        _verify_needs_shm(verify, shm)
        if shm is not None:
            layout = _ShmLayout(shm, verify)
            m, v = _matrix(dyt, "M, V")
            _, k = _matrix(xt, "M, K")
            header.dy_shm.CopyFrom(layout.input(dyt))
            header.x_shm.CopyFrom(layout.input(xt))
            if header.want_dx:
                header.dx_shm.CopyFrom(layout.output("dx", dxt, (m, k)))
            if header.want_dw and not header.accumulate_dw:
                header.dw_shm.CopyFrom(layout.output("dw", dwt, (v, k)))
            _, outputs = self._call_shm(self._stub.Backward, pb.BackwardRequest, header, layout, as_torch)
            return outputs.get("dx"), outputs.get("dw")
        header.digest_last = True

        def specs_of(r):
            specs = []
            if r.HasField("dx"):
                specs.append(r.dx)
            if r.HasField("dw"):
                specs.append(r.dw)
            return specs

        result, tensors = self._stream(self._stub.Backward, pb.BackwardRequest, "header", header, [dyt, xt], specs_of)
        dx = tensors[result.dx.name].result(as_torch) if result.HasField("dx") else None
        dw = tensors[result.dw.name].result(as_torch) if result.HasField("dw") else None
        return dx, dw

    # -- fused cross-entropy ------------------------------------------------------------------

    @_retried(unless="accumulate_dw")
    def cross_entropy(
        self,
        x: Any,
        targets: Any,
        handle: Union[str, WeightInfo],
        reduction: str = "mean",
        ignore_index: int = -100,
        z_loss: float = 0.0,
        logit_softcap: float = 0.0,
        grad_scale: float = 1.0,
        want_lse: bool = False,
        want_dx: bool = False,
        want_dw: bool = False,
        dx_dtype: Any = "bf16",
        accumulate_dw: bool = False,
        shm: Optional[SharedRegion] = None,
        verify: bool = True,
    ) -> CrossEntropyResult:
        """Cross-entropy of the logits x . W^T against int32/int64 targets [M],
        computed by the server chunk by chunk over the vocabulary (the logits
        never travel). Gradients follow the backward contract: G = bf16(dL/dY)
        rounded to nearest even once, dX = G.W, dW = G^T.X (fp32 accumulation).

        shm: a registered SharedRegion (same host, server --allow_shm): x and
        the targets are copied to its start and the server writes loss, lse,
        dx and dw (those asked for) after them, in that order, each 64-byte
        aligned; no tensor bytes travel over gRPC. dW [V, K] comes last: given
        the weight's WeightInfo its slot is sized exactly, given only a handle
        the client does not know V and offers dW the rest of the region (the
        server refuses a dW that does not fit). The results are then views of
        the region, overwritten by the next call that uses it: copy them to
        keep them. verify=False (with shm only) asks the server not to hash
        the outputs and skips the client's check.
        """
        if reduction not in _REDUCTIONS:
            raise InvalidArgumentError(
                "reduction: expected one of %s, got %r" % (", ".join(sorted(_REDUCTIONS)), reduction)
            )
        if grad_scale == 0:
            # proto3 cannot tell 0 from unset, which the server reads as 1.
            raise InvalidArgumentError("grad_scale: expected a non-zero loss gradient, got 0")
        dxt = T.dtype_enum("dx_dtype", dx_dtype, (pb.DTYPE_BF16, pb.DTYPE_FP32))
        xt = T.Outgoing("x", x, (pb.DTYPE_BF16,))
        tt = T.Outgoing("targets", targets, (pb.DTYPE_INT32, pb.DTYPE_INT64))
        header = pb.CrossEntropyHeader(
            weight_handle=_handle(handle),
            x=xt.spec,
            targets=tt.spec,
            ignore_index=int(ignore_index),
            reduction=_REDUCTIONS[reduction],
            z_loss=float(z_loss),
            logit_softcap=float(logit_softcap),
            grad_scale=float(grad_scale),
            want_lse=bool(want_lse),
            want_dx=bool(want_dx),
            want_dw=bool(want_dw),
            dx_dtype=dxt,
            accumulate_dw=bool(accumulate_dw),
        )
        as_torch = T.is_torch(x)
        _verify_needs_shm(verify, shm)
        if shm is not None:
            layout = _ShmLayout(shm, verify)
            m, k = _matrix(xt, "M, K")
            header.x_shm.CopyFrom(layout.input(xt))
            header.targets_shm.CopyFrom(layout.input(tt))
            header.loss_shm.CopyFrom(layout.output("loss", pb.DTYPE_FP32, (m if reduction == "none" else 1,)))
            if header.want_lse:
                header.lse_shm.CopyFrom(layout.output("lse", pb.DTYPE_FP32, (m,)))
            if header.want_dx:
                header.dx_shm.CopyFrom(layout.output("dx", dxt, (m, k)))
            if header.want_dw and not header.accumulate_dw:
                # Last: without the WeightInfo, V is unknown and dW gets the rest of the region.
                header.dw_shm.CopyFrom(layout.output("dw", pb.DTYPE_FP32, (_weight_rows(handle), k)))
            result, outputs = self._call_shm(
                self._stub.CrossEntropy, pb.CrossEntropyRequest, header, layout, as_torch
            )
            return CrossEntropyResult(
                outputs["loss"], outputs.get("lse"), outputs.get("dx"), outputs.get("dw"), int(result.counted_tokens)
            )
        header.digest_last = True

        def specs_of(r):
            return [spec for field, spec in ((f, getattr(r, f)) for f in ("loss", "lse", "dx", "dw")) if r.HasField(field)]

        result, tensors = self._stream(
            self._stub.CrossEntropy, pb.CrossEntropyRequest, "header", header, [xt, tt], specs_of
        )

        def get(field):
            return tensors[getattr(result, field).name].result(as_torch) if result.HasField(field) else None

        return CrossEntropyResult(get("loss"), get("lse"), get("dx"), get("dw"), int(result.counted_tokens))

    @_retried()
    def logprobs(
        self,
        x: Any,
        handle: Union[str, WeightInfo],
        targets: Any = None,
        top_k: int = 0,
        temperature: float = 1.0,
        logit_softcap: float = 0.0,
        want_entropy: bool = False,
        want_lse: bool = False,
        want_rank: bool = False,
        vocab_size: int = 0,
        ignore_index: int = -100,
    ) -> LogProbs:
        """Per-token log-probabilities of the fp32 logits x . W^T (divided by
        `temperature`, after tanh soft-capping when `logit_softcap` > 0, over
        the first `vocab_size` vocabulary entries, 0 meaning all), computed by
        the server chunk by chunk: the log-prob of each target (int32/int64
        [M], optional), and as asked the entropy, the log-sum-exp, the top_k
        (0 to 64) most likely tokens with their log-probs, and each target's
        rank. Only these per-token numbers travel, never the [M, V] logits.
        With temperature 1 and nothing capped or masked, logprob is bitwise
        -loss of cross_entropy(..., reduction="none")."""
        temperature = float(temperature)
        if not math.isfinite(temperature) or temperature <= 0:
            raise InvalidArgumentError("temperature: expected a finite temperature > 0, got %r" % temperature)
        top_k = int(top_k)
        if top_k < 0:
            raise InvalidArgumentError("top_k: expected 0 to 64, got %d" % top_k)
        xt = T.Outgoing("x", x, (pb.DTYPE_BF16,))
        header = pb.LogProbsHeader(
            weight_handle=_handle(handle),
            x=xt.spec,
            ignore_index=int(ignore_index),
            temperature=temperature,
            logit_softcap=float(logit_softcap),
            top_k=top_k,
            want_entropy=bool(want_entropy),
            want_lse=bool(want_lse),
            want_rank=bool(want_rank),
            vocab_size=int(vocab_size),
            digest_last=True,
        )
        tensors_out = [xt]
        if targets is not None:
            tt = T.Outgoing("targets", targets, (pb.DTYPE_INT32, pb.DTYPE_INT64))
            header.targets.CopyFrom(tt.spec)
            tensors_out.append(tt)

        def specs_of(r):
            return [getattr(r, f) for f in _LOGPROBS_OUTPUTS if r.HasField(f)]

        result, tensors = self._stream(
            self._stub.LogProbs, pb.LogProbsRequest, "header", header, tensors_out, specs_of
        )
        as_torch = T.is_torch(x)
        return LogProbs(
            *(
                tensors[getattr(result, f).name].result(as_torch) if result.HasField(f) else None
                for f in _LOGPROBS_OUTPUTS
            )
        )

    # -- server-held gradient buffers -----------------------------------------------------

    @_retried(unless="zero_after")
    def fetch_gradient(self, handle: Union[str, WeightInfo], zero_after: bool = False, as_torch: bool = False) -> Gradient:
        """Reads the fp32 dW accumulated by backward(accumulate_dw=True); optionally zeroes it."""
        request = pb.FetchGradientRequest(weight_handle=_handle(handle), zero_after_fetch=zero_after, digest_last=True)
        try:
            call = self._stub.FetchGradient(request, timeout=self._timeout(), metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        result, tensors = self._receive(call, lambda r: [r.dw])
        return Gradient(tensors[result.dw.name].result(as_torch), int(result.accumulated_calls))

    @_retried()
    def zero_gradient(self, handle: Union[str, WeightInfo]) -> None:
        self._unary(self._stub.ZeroGradient, pb.ZeroGradientRequest(weight_handle=_handle(handle)))

    # -- cast ---------------------------------------------------------------------------------

    @_retried()
    def cast_to_bf16(self, x: Any, shm: Optional[SharedRegion] = None, verify: bool = True):
        """The server's fp32 -> bf16 conversion (round to nearest even), the one backward applies to dY.

        shm: a registered SharedRegion (same host, server --allow_shm): the
        input is copied to its start and the server writes the output right
        after it (64-byte aligned); no tensor bytes travel over gRPC. The
        result is then a view of the region, overwritten by the next call
        that uses it: copy it to keep it. verify=False (with shm only) asks
        the server not to hash the output and skips the client's check.
        """
        xt = T.Outgoing("input", x, (pb.DTYPE_FP32,))
        header = pb.CastHeader(input=xt.spec)
        _verify_needs_shm(verify, shm)
        if shm is not None:
            layout = _ShmLayout(shm, verify)
            header.input_shm.CopyFrom(layout.input(xt))
            header.output_shm.CopyFrom(layout.output("output", pb.DTYPE_BF16, T.shape_of(xt.spec)))
            _, outputs = self._call_shm(self._stub.Cast, pb.CastRequest, header, layout, T.is_torch(x))
            return outputs["output"]
        header.digest_last = True
        result, tensors = self._stream(self._stub.Cast, pb.CastRequest, "header", header, [xt], lambda r: [r.output])
        return tensors[result.output.name].result(T.is_torch(x))

def _handle(handle: Union[str, WeightInfo]) -> str:
    if isinstance(handle, WeightInfo):
        return handle.handle
    if not isinstance(handle, str):
        raise InvalidArgumentError("handle: expected a str or a WeightInfo, got %s" % type(handle).__name__)
    return handle


# -- shared-memory layout ----------------------------------------------------------------


class _ShmSlot(NamedTuple):
    """Where one output of a call goes in the region, and what the call expects of it."""

    offset: int
    room: int
    dtype: int
    # The expected shape; None for a dimension the call does not know (the weight's V).
    shape: Tuple[Optional[int], ...]


class _ShmLayout:
    """One call's tensors in a registered SharedRegion, the same way for every call.

    The inputs are copied in from the region's start, each at a 64-byte-aligned
    offset; the outputs' slots follow them, each aligned too and sized from the
    shape the call knows. An output whose size the call cannot know (a
    dimension of a weight given by handle only) gets the rest of the region
    and comes last: the server says when that is too small. ``results`` then
    checks what the server says it wrote (dtype, shape, region, offset, bytes,
    digest) and returns views of the region.
    """

    def __init__(self, region: SharedRegion, verify: bool):
        if not isinstance(region, SharedRegion):
            raise InvalidArgumentError("shm: expected a logitd.SharedRegion, got %s" % type(region).__name__)
        if region.handle is None or region.closed:
            raise InvalidArgumentError("shm: region %s is not registered (Client.register_shm)" % region.name)
        self.region = region
        self.verify = bool(verify)
        self._end = 0
        self._inputs: List[Tuple[T.Outgoing, int]] = []
        self._outputs = {}
        # The output given the rest of the region, which nothing may follow.
        self._open_ended: Optional[str] = None

    def _place(self, what: str) -> int:
        if self._open_ended is not None:
            raise AssertionError("shm layout: %s after %s, which has the rest of the region" % (what, self._open_ended))
        return _shm_align(self._end)

    def input(self, t: T.Outgoing) -> pb.ShmRef:
        """Reserves room for an input; its bytes are copied in by ``write``."""
        offset = self._place(t.name)
        self._inputs.append((t, offset))
        self._end = offset + len(t.data)
        return pb.ShmRef(region=self.region.handle, offset=offset, bytes=len(t.data))

    def output(self, name: str, dtype: int, shape: Sequence[Optional[int]]) -> pb.ShmRef:
        """A slot for the output ``name`` (its field in the result, and ``name``_shm)."""
        offset = self._place(name)
        shape = tuple(None if d is None else int(d) for d in shape)
        if None in shape:
            room = max(self.region.nbytes - offset, 0)
            self._open_ended = name
            self._end = offset + room
        else:
            room = T.NUMPY_DTYPE[dtype].itemsize * math.prod(shape)
            self._end = offset + room
        self._outputs[name] = _ShmSlot(offset, room, dtype, shape)
        return pb.ShmRef(region=self.region.handle, offset=offset, bytes=room, skip_digest=not self.verify)

    def _describe(self) -> str:
        parts = ["%s %d at %d" % (t.name, len(t.data), off) for t, off in self._inputs]
        for name, s in self._outputs.items():
            parts.append("%s %s at %d" % (name, "the rest" if name == self._open_ended else s.room, s.offset))
        return ", ".join(parts)

    def write(self) -> None:
        """Checks that the layout fits the region and copies the inputs in."""
        region = self.region
        if self._open_ended is not None:
            last = self._outputs[self._open_ended]
            # The output of unknown size needs one element at least; the server checks the rest.
            if last.offset + T.NUMPY_DTYPE[last.dtype].itemsize > region.nbytes:
                raise InvalidArgumentError(
                    "shm: region %s has %d bytes, which leaves no room for %s after the call's other tensors (%s)"
                    % (region.name, region.nbytes, self._open_ended, self._describe())
                )
        elif self._end > region.nbytes:
            raise InvalidArgumentError(
                "shm: region %s has %d bytes, the call's tensors need %d (%s)"
                % (region.name, region.nbytes, self._end, self._describe())
            )
        whole = region.array(0, np.uint8, (region.nbytes,))
        # An input that is itself a view of the region (an earlier call's
        # result) is read before any input is written over it.
        sources = [
            np.frombuffer(bytes(t.data) if np.may_share_memory(t.array, whole) else t.data, dtype=np.uint8)
            for t, _ in self._inputs
        ]
        for (t, offset), src in zip(self._inputs, sources):
            whole[offset : offset + len(t.data)] = src

    def results(self, result, as_torch: bool) -> dict:
        """The outputs the server wrote, by name: checked views of the region."""
        return {name: self._result(result, name, slot, as_torch) for name, slot in self._outputs.items()}

    def _result(self, result, name: str, slot: _ShmSlot, as_torch: bool):
        region = self.region
        if not result.HasField(name) or not result.HasField(name + "_shm"):
            raise DataLossError(
                "response from server: expected %s in shared memory at %s [%d, +%d), got %s"
                % (name, region.handle, slot.offset, slot.room, "it streamed" if result.HasField(name) else "none")
            )
        spec = getattr(result, name)
        ref = getattr(result, name + "_shm")
        got_shape = T.shape_of(spec)
        if (
            spec.dtype != slot.dtype
            or len(got_shape) != len(slot.shape)
            or any(d < 1 or (e is not None and d != e) for d, e in zip(got_shape, slot.shape))
        ):
            expected = ["?" if d is None else str(d) for d in slot.shape]
            raise DataLossError(
                "response from server: %s has dtype %s shape %s, expected dtype %s shape [%s]"
                % (name, _dtype_name(spec.dtype), list(got_shape), _dtype_name(slot.dtype), ", ".join(expected))
            )
        dtype = T.NUMPY_DTYPE[spec.dtype]
        nbytes = dtype.itemsize * math.prod(got_shape)
        if ref.region != region.handle or ref.offset != slot.offset or ref.bytes != nbytes or nbytes > slot.room:
            raise DataLossError(
                "response from server: %s was written to %s [%d, +%d), expected %s [%d, +%d) within %d bytes"
                % (name, ref.region, ref.offset, ref.bytes, region.handle, slot.offset, nbytes, slot.room)
            )
        if ref.skip_digest and self.verify:
            raise DataLossError("response from server: %s was written without a digest, which was not asked" % name)
        view = region.array(slot.offset, dtype, got_shape)
        # A server that hashed anyway (skip_digest unset) is still checked.
        got = 0 if ref.skip_digest else xxhash.xxh3_64_intdigest(memoryview(view.reshape(-1).view(np.uint8)))
        if got != spec.xxh3:
            raise DataLossError(
                "response from server: %s: xxh3 digest of the shared-memory bytes is %016x, the server "
                "announced %016x (the region was written during the call?)" % (name, got, spec.xxh3)
            )
        return T.as_result(view, as_torch)


def _dtype_name(enum: int) -> str:
    try:
        return pb.DType.Name(enum).replace("DTYPE_", "").lower()
    except ValueError:
        return str(enum)


def _verify_needs_shm(verify: bool, shm: Optional[SharedRegion]) -> None:
    if shm is None and not verify:
        raise InvalidArgumentError("verify=False: only with shm= (streamed tensors are always checked)")


def _matrix(t: T.Outgoing, dims: str) -> Tuple[int, int]:
    """The two dimensions of a rank-2 input, which size a call's outputs in shared memory."""
    if len(t.spec.shape) != 2:
        raise InvalidArgumentError("%s: expected shape [%s], got %s" % (t.name, dims, list(t.spec.shape)))
    return int(t.spec.shape[0]), int(t.spec.shape[1])


def _weight_rows(handle: Union[str, WeightInfo]) -> Optional[int]:
    """The weight's V when the call was given its WeightInfo, else None (a handle says nothing of it)."""
    if isinstance(handle, WeightInfo) and len(handle.shape) == 2:
        return int(handle.shape[0])
    return None
