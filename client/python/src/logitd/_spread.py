"""Client calls spread over several connections: a logits() or logprobs()
call of many rows cut into blocks of the weight's block rows, each block a
call of its own on one of up to `connections` channels, the results
reassembled in row order (as the C++ client's LogitsSpread and
LogProbsSpread). A mixin of Client: it uses the client's channel options,
stub and deadline.
"""

import threading

import numpy as np

from . import _tensors as T
from ._transport import _CallGroup
from .errors import DataLossError, InvalidArgumentError, LogitdError
from .options import _channel
from .results import LogProbs, WeightInfo
from .v1 import logitd_pb2 as pb
from .v1 import logitd_pb2_grpc as pb_grpc

# The outputs of a LogProbs call, in the order its calls return them.
_LOGPROBS_OUTPUTS = ("logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank")


def _handle(handle) -> str:
    """A handle given as a str or a WeightInfo, as the header takes it."""
    if isinstance(handle, WeightInfo):
        return handle.handle
    if not isinstance(handle, str):
        raise InvalidArgumentError("handle: expected a str or a WeightInfo, got %s" % type(handle).__name__)
    return handle


class _Spread:
    def _logits_spread(self, xt, handle, out, alpha, pipeline, connections, as_torch):
        """logits() over several connections; None where it is one call (few rows, a weight the
        server does not list or whose block it does not say)."""
        shape = xt.array.shape
        if len(shape) != 2 or shape[0] < 2:
            return None
        field = "logits_block_rows_fp32" if out == pb.DTYPE_FP32 else "logits_block_rows_bf16"
        w = self._spread_weight(handle, field)
        m = int(shape[0])
        if w is None or getattr(w, field) <= 0 or m <= getattr(w, field):
            return None
        v = int(w.shape[0])
        y = np.empty((m, v), dtype=T.NUMPY_DTYPE[out])

        def part(stub, r0, rows):
            x_part = T.Outgoing("x", xt.array[r0 : r0 + rows], (pb.DTYPE_BF16,))
            header = pb.LogitsHeader(
                weight_handle=_handle(handle), x=x_part.spec, out_dtype=out, alpha=alpha,
                digest_last=True, pipeline=bool(pipeline),
            )
            result, tensors = self._stream(stub.Logits, pb.LogitsRequest, "header", header, [x_part], lambda r: [r.y])
            got = tensors[result.y.name].result(False)
            if got.shape != (rows, v):
                raise DataLossError(
                    "response from server: rows %d+%d of the logits came back as shape %s" % (r0, rows, got.shape)
                )
            y[r0 : r0 + rows] = got

        self._spread_parts(m, int(getattr(w, field)), connections, part)
        return T.as_result(y, as_torch)

    def _spread_weight(self, handle, field):
        """The weight's WeightInfo with `field` (a block's rows) set, from the one given or once
        from list_weights; None for a weight the server does not list."""
        if isinstance(handle, WeightInfo) and getattr(handle, field) and len(handle.shape) == 2:
            return handle
        name = _handle(handle)
        if name not in self._block_rows:
            for w in self.list_weights():
                self._block_rows[w.handle] = w
        w = self._block_rows.get(name)
        return w if w is not None and len(w.shape) == 2 else None

    def _spread_parts(self, m, block, connections, part):
        """Runs part(stub, r0, rows) for a call of m rows cut at multiples of block over at most
        `connections` connections, each part on a thread and a connection of its own. The first
        part to fail cancels the others; its error, naming its rows, is raised."""
        # Whole blocks a part, as even as they come, the last part taking the rest
        # (5 blocks over 4 connections are 2 + 2 + 1), as the C++ client cuts.
        blocks = -(-m // block)
        wanted = min(connections, blocks)
        per_part = -(-blocks // wanted)
        parts = -(-blocks // per_part)
        part_rows = per_part * block
        stubs = [self._stub] + self._spread_stubs(parts - 1)
        group = _CallGroup()
        lock = threading.Lock()
        failed = []  # the first part's error to fail; the others' CANCELLED follows from it

        def run(i):
            r0 = i * part_rows
            rows = m - r0 if i + 1 == parts else part_rows
            group.joined(True)
            try:
                part(stubs[i], r0, rows)
                return
            except LogitdError as e:
                error = type(e)(
                    "rows [%d, %d) of %d (a part on its own connection): %s" % (r0, r0 + rows, m, e.message),
                    getattr(e, "code", None),
                )
            except BaseException as e:  # noqa: B036 -- handed to the caller's thread
                error = e
            finally:
                group.joined(False)
            with lock:
                if failed:
                    return
                failed.append(error)
            group.cancel()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(parts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            raise failed[0]

    def _spread_stubs(self, n):
        """n stubs, each on a connection of its own."""
        with self._lock:
            while len(self._spread) < n:
                address, tls, chunk_bytes, lb_policy, retry, options = self._channel_args
                own = options + [("grpc.use_local_subchannel_pool", 1)]
                channel = _channel(address, tls, chunk_bytes, lb_policy, retry, own)
                self._spread.append((channel, pb_grpc.LogitdStub(channel)))
            return [stub for _, stub in self._spread[:n]]

    def _logprobs_call(self, stub, handle, xt, tt, options):
        """One LogProbs call on `stub`: its outputs as numpy arrays (None where not returned), in
        the order of _LOGPROBS_OUTPUTS."""
        header = pb.LogProbsHeader(weight_handle=_handle(handle), x=xt.spec, **options)
        # The targets before X: a row block waits for its rows of both.
        tensors_out = []
        if tt is not None:
            header.targets.CopyFrom(tt.spec)
            tensors_out.append(tt)
        tensors_out.append(xt)

        def specs_of(r):
            return [getattr(r, f) for f in _LOGPROBS_OUTPUTS if r.HasField(f)]

        result, tensors = self._stream(stub.LogProbs, pb.LogProbsRequest, "header", header, tensors_out, specs_of)
        return [
            tensors[getattr(result, f).name].result(False) if result.HasField(f) else None for f in _LOGPROBS_OUTPUTS
        ]

    def _logprobs_spread(self, xt, tt, handle, options, connections, as_torch):
        """logprobs() over several connections; None where it is one call (few rows, targets
        that do not match X's rows, a weight the server does not list or whose block it does not
        say)."""
        shape = xt.array.shape
        if len(shape) != 2 or shape[0] < 2:
            return None
        m = int(shape[0])
        if tt is not None and tuple(tt.array.shape) != (m,):
            return None
        w = self._spread_weight(handle, "logprobs_block_rows")
        if w is None or w.logprobs_block_rows <= 0 or m <= w.logprobs_block_rows:
            return None
        parts = {}

        def part(stub, r0, rows):
            x_part = T.Outgoing("x", xt.array[r0 : r0 + rows], (pb.DTYPE_BF16,))
            t_part = None
            if tt is not None:
                t_part = T.Outgoing("targets", tt.array[r0 : r0 + rows], (pb.DTYPE_INT32, pb.DTYPE_INT64))
            got = self._logprobs_call(stub, handle, x_part, t_part, options)
            for name, o in zip(_LOGPROBS_OUTPUTS, got):
                if o is not None and (o.ndim < 1 or o.shape[0] != rows):
                    raise DataLossError(
                        "response from server: rows %d+%d of %s came back as shape %s" % (r0, rows, name, o.shape)
                    )
            parts[r0] = got

        self._spread_parts(m, int(w.logprobs_block_rows), connections, part)
        ordered = [parts[r0] for r0 in sorted(parts)]
        return LogProbs(
            *(
                None if ordered[0][i] is None else T.as_result(np.concatenate([p[i] for p in ordered]), as_torch)
                for i in range(len(_LOGPROBS_OUTPUTS))
            )
        )
