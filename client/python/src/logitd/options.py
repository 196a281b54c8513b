"""How a Client connects: TLS settings, the retry policy, message sizes, and the
gRPC channel made from them."""

import math
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import grpc

from .errors import InvalidArgumentError

# Tensor bytes per chunk message: 4 MiB less 4 KiB, so that a chunk with its
# framing fits the 4 MiB every gRPC peer accepts by default (the protocol's
# kDefaultChunkBytes, core/include/logitd/protocol.h).
DEFAULT_CHUNK_BYTES = (4 << 20) - 4096
# Room a chunk message needs beyond its payload (tensor name, offset, framing).
_MESSAGE_HEADROOM = 1 << 20
# gRPC sizes messages with a signed 32-bit int; stay well inside it.
_MAX_CHUNK_BYTES = 1 << 30


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


@dataclass(frozen=True)
class RetryPolicy:
    """Retrying calls that failed with UNAVAILABLE (server down, restarting or unreachable,
    connection lost mid-call), as the C++ client's RetryPolicy. A Client without one makes
    each call once. Only idempotent calls are ever retried: info, list_weights,
    load_weight, register_weights, logits, logprobs, cast_to_bf16, zero_gradient,
    verify_logits, verify_backward, fetch_gradient(zero_after=False), backward and
    cross_entropy without accumulate_dw;
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


def _channel(
    address: str,
    tls: Any,
    chunk_bytes: int,
    lb_policy: str,
    retry: Optional[RetryPolicy],
    options: Optional[Sequence[Tuple[str, Any]]],
) -> grpc.Channel:
    channel_options = [
        ("grpc.max_send_message_length", chunk_bytes + _MESSAGE_HEADROOM),
        # The server picks its own chunk size; each tensor is bounded by the size it announced.
        ("grpc.max_receive_message_length", -1),
        ("grpc.lb_policy_name", lb_policy),
    ]
    if retry is not None:
        # Reconnect on the policy's schedule (see _Transport._retrying).
        channel_options += [
            ("grpc.initial_reconnect_backoff_ms", max(1, int(retry.initial_backoff * 1000))),
            ("grpc.min_reconnect_backoff_ms", max(1, int(retry.initial_backoff * 1000))),
            ("grpc.max_reconnect_backoff_ms", max(1, int(retry.max_backoff * 1000))),
        ]
    if options:
        channel_options.extend(options)
    credentials = _tls_credentials(tls)
    if credentials is None:
        return grpc.insecure_channel(address, options=channel_options)
    return grpc.secure_channel(address, credentials, options=channel_options)
