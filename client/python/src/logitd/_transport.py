"""How a Client's calls travel: one deadline shared by a call's attempts, retries
of idempotent calls, and tensors streamed in chunks and reassembled with their digests."""

import functools
import inspect
import random
import threading
import time
from typing import Optional, Sequence

import grpc

from . import _tensors as T
from ._shm_layout import _ShmLayout
from .errors import DataLossError, LogitdError, UnavailableError, from_rpc_error


class _CallGroup:
    """The calls of one spread call's parts, so that the first part to fail cancels the others
    instead of letting them run to their end. A part's thread joins it (_joined); every
    tensor call the thread makes meanwhile is in it."""

    _current = threading.local()

    def __init__(self):
        self._lock = threading.Lock()
        self._calls = set()
        self._cancelled = False

    @classmethod
    def of_this_thread(cls):
        return getattr(cls._current, "group", None)

    def joined(self, on):
        """Makes this the group of the calling thread's calls (on=True), or none (False)."""
        _CallGroup._current.group = self if on else None

    def add(self, call):
        with self._lock:
            if not self._cancelled:
                self._calls.add(call)
                return
        call.cancel()

    def remove(self, call):
        with self._lock:
            self._calls.discard(call)

    def cancel(self):
        """Cancels every call of the group, and those it makes from now on."""
        with self._lock:
            self._cancelled = True
            calls = list(self._calls)
        for c in calls:
            c.cancel()


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


class _Transport:
    """The plumbing under Client's calls, kept apart from the calls themselves
    (client.py). Client.__init__ sets the attributes it reads: timeout, retry,
    retries, chunk_bytes, _attempt, _metadata, _lock and _stub."""

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
            # The channel reconnects on the policy's schedule too (see options._channel),
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
        group = _CallGroup.of_this_thread()
        if group is None:
            return self._receive(call, specs_of)
        group.add(call)
        try:
            return self._receive(call, specs_of)
        finally:
            group.remove(call)

    def _call_shm(self, method, request_cls, header, layout: _ShmLayout, as_torch: bool):
        """A tensor call whose tensors all lie in shared memory (``layout``): only the header and
        the result travel. Returns the result message and its outputs by name, views of the region."""
        layout.write()
        result, _ = self._stream(method, request_cls, "header", header, [], lambda r: [])
        return result, layout.results(result, as_torch)
