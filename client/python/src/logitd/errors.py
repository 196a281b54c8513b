"""Errors raised by the logitd client.

Every failure of a call is a LogitdError carrying the gRPC status code (as
``code``, a ``grpc.StatusCode``, and ``code_name``, e.g. ``"NOT_FOUND"``) and
the server's message. The common codes have their own subclasses, so callers
can write ``except logitd.NotFoundError``.
"""

from typing import Dict, Optional, Type

import grpc


class LogitdError(Exception):
    """A logitd call failed; ``code_name`` and ``message`` say how."""

    default_code = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        self.code = code if code is not None else self.default_code
        self.code_name = self.code.name
        self.message = message
        super().__init__("%s: %s" % (self.code_name, message))


class CancelledError(LogitdError):
    default_code = grpc.StatusCode.CANCELLED


class InvalidArgumentError(LogitdError, ValueError):
    """The request is malformed: a dtype, shape, K or option the server refuses.

    Also raised by the client itself for arguments it can tell are wrong before
    sending anything (it is a ValueError too).
    """

    default_code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(LogitdError):
    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(LogitdError):
    """Unknown weight handle (never registered, or released)."""

    default_code = grpc.StatusCode.NOT_FOUND


class PermissionDeniedError(LogitdError):
    default_code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(LogitdError):
    """The server's weight budget or request size limit would be exceeded."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(LogitdError):
    default_code = grpc.StatusCode.FAILED_PRECONDITION


class UnimplementedError(LogitdError):
    default_code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(LogitdError):
    default_code = grpc.StatusCode.INTERNAL


class UnavailableError(LogitdError):
    """The server cannot be reached or is shutting down."""

    default_code = grpc.StatusCode.UNAVAILABLE


class DataLossError(LogitdError):
    """Tensor bytes were corrupted or truncated in transit (digest, offset or length)."""

    default_code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(LogitdError):
    """The server wants a valid token (Client(token=...))."""

    default_code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: Dict[grpc.StatusCode, Type[LogitdError]] = {
    cls.default_code: cls
    for cls in (
        CancelledError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}


def error_for(code: grpc.StatusCode, message: str) -> LogitdError:
    """The LogitdError subclass for a gRPC status code."""
    cls = _BY_CODE.get(code, LogitdError)
    return cls(message, code)


def from_rpc_error(err: grpc.RpcError) -> LogitdError:
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else None
    if code is None:
        code = grpc.StatusCode.UNKNOWN
    return error_for(code, details or str(err))
