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

import math
import threading
from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc

from . import _tensors as T
from ._spread import _handle, _Spread
from ._shm_layout import _matrix, _ShmLayout, _verify_needs_shm, _weight_rows
from ._transport import _retried, _Transport
from ._verify_calls import _VerifyCalls
from .history import (
    Baseline,
    CaseSummary,
    ProjectSummary,
    RecordedCase,
    Rule,
    RunPage,
    ValidatedCase,
    page_of,
    recorded_cases_of,
    rule_message,
    rule_of,
    validation_request,
)
from .errors import DataLossError, InvalidArgumentError, LogitdError, UnavailableError, from_rpc_error
from .options import _MAX_CHUNK_BYTES, DEFAULT_CHUNK_BYTES, TLS, RetryPolicy, _channel
from .results import CrossEntropyResult, Gradient, LogProbs, ReleaseResult, ServerInfo, WeightInfo, _from_proto
from .shm import SharedRegion
from .v1 import logitd_pb2 as pb
from .v1 import logitd_pb2_grpc as pb_grpc
from .verify import Verdict

# Most connections one logits() call is spread over (as the C++ client's).
_MAX_CONNECTIONS = 64

# Most of these are defined elsewhere and re-exported: code imports them from logitd.client.
__all__ = [
    "Client", "DEFAULT_CHUNK_BYTES", "TLS", "RetryPolicy", "ServerInfo", "WeightInfo", "ReleaseResult",
    "CrossEntropyResult", "LogProbs", "Gradient", "SharedRegion", "Verdict", "LogitdError", "DataLossError",
    "InvalidArgumentError", "UnavailableError", "from_rpc_error",
]

_REDUCTIONS = {"none": pb.REDUCTION_NONE, "sum": pb.REDUCTION_SUM, "mean": pb.REDUCTION_MEAN}


class Client(_VerifyCalls, _Spread, _Transport):
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
        self._channel = _channel(address, tls, chunk_bytes, lb_policy, retry, options)
        self._stub = pb_grpc.LogitdStub(self._channel)
        self._closed = False
        self._lock = threading.Lock()
        # logits(connections=N): the further connections, each a channel of its
        # own (its own subchannel pool), made when first needed.
        self._channel_args = (address, tls, chunk_bytes, lb_policy, retry, list(options or []))
        self._spread = []
        self._block_rows = {}

    # -- lifetime ---------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._channel.close()
                for channel, _ in self._spread:
                    channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "logitd.Client(%r)" % self.address

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

    @_retried()
    def list_runs(
        self,
        project: str = "",
        case: str = "",
        branch: str = "",
        page_size: int = 0,
        before_run_id: int = 0,
        run_id: int = 0,
        backend: str = "",
        device: str = "",
        recorded_after_unix_micros: int = 0,
        recorded_before_unix_micros: int = 0,
    ) -> RunPage:
        """The Verify runs the server recorded for this caller's tenant (verify_*'s
        ``record=``), newest first, those whose labels equal the non-empty ones
        given; a page of page_size runs (0: 100; at most 1000) older than
        before_run_id (0: from the newest); run_id: only that run (0: any);
        backend, device: only runs judged there; recorded in
        [recorded_after_unix_micros, recorded_before_unix_micros) (0: unbounded).
        FailedPreconditionError from a
        server that keeps no history (logitd --history=none)."""
        request = pb.ListRunsRequest(
            project=project,
            case_name=case,
            branch=branch,
            page_size=page_size,
            before_run_id=before_run_id,
            run_id=int(run_id),
            backend=backend,
            device=device,
            recorded_after_unix_micros=int(recorded_after_unix_micros),
            recorded_before_unix_micros=int(recorded_before_unix_micros),
        )
        return page_of(self._unary(self._stub.ListRuns, request))

    @_retried()
    def list_projects(self) -> Tuple[ProjectSummary, ...]:
        """This caller's projects in the server's history, by name."""
        response = self._unary(self._stub.ListProjects, pb.ListProjectsRequest())
        return tuple(
            ProjectSummary(p.project, int(p.cases), int(p.runs), int(p.alerts), int(p.latest_unix_micros))
            for p in response.projects
        )

    @_retried()
    def list_cases(self, project: str) -> Tuple[CaseSummary, ...]:
        """The cases of this caller's ``project``, by name (none: empty)."""
        response = self._unary(self._stub.ListCases, pb.ListCasesRequest(project=project))
        return tuple(
            CaseSummary(
                c.case_name,
                int(c.runs),
                int(c.alerts),
                int(c.latest_run_id),
                int(c.latest_unix_micros),
                c.latest_verdict,
                c.latest_branch,
                c.latest_ref,
            )
            for c in response.cases
        )

    @_retried()
    def promote_run(self, run_id: int, name: str) -> None:
        """Names the recorded run ``run_id`` a baseline of its project and case
        (``compare=logitd.Baseline(name=...)``); retention never prunes it."""
        self._unary(self._stub.PromoteRun, pb.PromoteRunRequest(run_id=int(run_id), name=name))

    def record_validation(
        self,
        project: str,
        cases: Sequence[ValidatedCase],
        branch: str = "",
        ref: str = "",
        compare: Optional[Baseline] = None,
    ) -> Tuple[RecordedCase, ...]:
        """Records cases the caller judged itself (logitd.ValidatedCase: the
        golden cases of ``logitctl validate --project``, or a harness's own) as
        runs of ``project`` on ``branch`` at ``ref``, each compared with
        ``compare`` and checked against the project's rules; the cases as
        recorded, in order. All are checked before any is recorded. Not retried:
        an attempt whose answer was lost may have recorded them."""
        request = validation_request(project, branch, ref, cases, compare)
        response = self._unary(self._stub.RecordValidation, request)
        return recorded_cases_of(request, response)

    def set_rules(self, project: str, rules: Sequence[Rule]) -> None:
        """Replaces this tenant's rules of ``project`` (logitd.Rule values, at most
        100; none: no rules); every run recorded in it from then on is checked
        against them (Verdict.alerts)."""
        request = pb.SetRulesRequest(project=project, rules=[rule_message(r) for r in rules])
        self._unary(self._stub.SetRules, request)

    def delete_project(self, project: str) -> int:
        """Removes this tenant's project from the history: its runs, baselines and
        rules; the runs removed. NotFoundError when it has none."""
        response = self._unary(self._stub.DeleteProject, pb.DeleteProjectRequest(project=project))
        return int(response.runs_deleted)

    def list_rules(self, project: str) -> Tuple[Rule, ...]:
        """This tenant's rules of ``project``, in the order they were set."""
        response = self._unary(self._stub.ListRules, pb.ListRulesRequest(project=project))
        return tuple(rule_of(r) for r in response.rules)

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
        pipeline: bool = True,
        connections: int = 1,
    ):
        """Y[M, V] = alpha * X[M, K] . W[V, K]^T with fp32 accumulation.

        out_dtype "fp32" (default) returns the accumulator; "bf16" is the legacy
        path, the accumulator rounded to bf16 once.

        pipeline (default True) asks the server to start on X's first rows
        while the rest arrive and to stream Y's rows as they are done
        (LogitsHeader.pipeline): the same bits, sooner. Y is returned only
        once the call ended OK and Y matched the digest sent after it.

        connections (1 to 64, default 1) spreads a call of many rows over that
        many connections at once, for a link one connection does not fill:
        X's rows are cut at multiples of the weight's logits_block_rows, where
        every row keeps its bits, each part a call of its own on a connection
        of its own, and Y is the parts' rows in order (the same bits as one
        call). Not with shm.

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
        if not isinstance(connections, int) or not 1 <= connections <= _MAX_CONNECTIONS:
            raise InvalidArgumentError("connections: expected 1 to %d, got %r" % (_MAX_CONNECTIONS, connections))
        if connections > 1 and shm is not None:
            raise InvalidArgumentError("connections: a call through shared memory is one call; leave connections at 1")
        xt = T.Outgoing("x", x, (pb.DTYPE_BF16,))
        if connections > 1:
            spread = self._logits_spread(xt, handle, out, alpha, pipeline, connections, T.is_torch(x))
            if spread is not None:
                return spread
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
        header.pipeline = bool(pipeline)
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
        pipeline: bool = True,
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

        pipeline (default True, streamed calls) asks the server to start on the
        first rows while the rest arrive (CrossEntropyHeader.pipeline): the same
        bits; a call with dW runs whole. The outputs are returned only once the
        call ended OK and each matched the digest sent after it.
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
            return self._cross_entropy_shm(header, xt, tt, dxt, reduction, handle, shm, verify, as_torch)
        return self._cross_entropy_stream(header, xt, tt, pipeline, as_torch)

    def _cross_entropy_shm(self, header, xt, tt, dxt, reduction, handle, shm, verify, as_torch):
        """cross_entropy() through a registered SharedRegion: x and the targets
        copied to its start, then slots for loss, lse, dx and dw (those asked
        for), in that order; the results are views of the region."""
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

    def _cross_entropy_stream(self, header, xt, tt, pipeline, as_torch):
        """cross_entropy() over gRPC: the targets and x streamed in chunks, the
        outputs returned once each matched the digest the server sent after it."""
        header.digest_last = True
        header.pipeline = bool(pipeline)

        def specs_of(r):
            return [spec for field, spec in ((f, getattr(r, f)) for f in ("loss", "lse", "dx", "dw")) if r.HasField(field)]

        # The targets before X: in row blocks the server waits for all of them first.
        result, tensors = self._stream(
            self._stub.CrossEntropy, pb.CrossEntropyRequest, "header", header, [tt, xt], specs_of
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
        pipeline: bool = True,
        connections: int = 1,
    ) -> LogProbs:
        """Per-token log-probabilities of the fp32 logits x . W^T (divided by
        `temperature`, after tanh soft-capping when `logit_softcap` > 0, over
        the first `vocab_size` vocabulary entries, 0 meaning all), computed by
        the server chunk by chunk: the log-prob of each target (int32/int64
        [M], optional), and as asked the entropy, the log-sum-exp, the top_k
        (0 to 64) most likely tokens with their log-probs, and each target's
        rank. Only these per-token numbers travel, never the [M, V] logits.
        With temperature 1 and nothing capped or masked, logprob is bitwise
        -loss of cross_entropy(..., reduction="none").

        pipeline (default True) asks the server to start on the first rows
        while the rest arrive (LogProbsHeader.pipeline), as logits() does:
        the same bits; the outputs are returned only once the call ended OK
        and each matched the digest sent after it.

        connections (1 to 64, default 1) spreads a call of many rows over that
        many connections at once, as logits() does: X's and the targets' rows
        cut at multiples of the weight's logprobs_block_rows, each part a call
        of its own on a connection of its own, the same bits as one call."""
        temperature = float(temperature)
        if not math.isfinite(temperature) or temperature <= 0:
            raise InvalidArgumentError("temperature: expected a finite temperature > 0, got %r" % temperature)
        top_k = int(top_k)
        if top_k < 0:
            raise InvalidArgumentError("top_k: expected 0 to 64, got %d" % top_k)
        if not isinstance(connections, int) or not 1 <= connections <= _MAX_CONNECTIONS:
            raise InvalidArgumentError("connections: expected 1 to %d, got %r" % (_MAX_CONNECTIONS, connections))
        xt = T.Outgoing("x", x, (pb.DTYPE_BF16,))
        tt = None if targets is None else T.Outgoing("targets", targets, (pb.DTYPE_INT32, pb.DTYPE_INT64))
        options = dict(
            ignore_index=int(ignore_index),
            temperature=temperature,
            logit_softcap=float(logit_softcap),
            top_k=top_k,
            want_entropy=bool(want_entropy),
            want_lse=bool(want_lse),
            want_rank=bool(want_rank),
            vocab_size=int(vocab_size),
            digest_last=True,
            pipeline=bool(pipeline),
        )
        as_torch = T.is_torch(x)
        if connections > 1:
            spread = self._logprobs_spread(xt, tt, handle, options, connections, as_torch)
            if spread is not None:
                return spread
        outputs = self._logprobs_call(self._stub, handle, xt, tt, options)
        return LogProbs(*(None if o is None else T.as_result(o, as_torch) for o in outputs))

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
