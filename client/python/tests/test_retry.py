"""The client's retry policy against a real logitd that is not up yet (cpu backend)."""

import socket
import threading
import time

import numpy as np
import pytest
from reference import int_tensor, to_bf16
from test_auth import running_server

import logitd

pytestmark = pytest.mark.needs_server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_policy_values_are_checked():
    with pytest.raises(logitd.InvalidArgumentError, match="max_attempts"):
        logitd.RetryPolicy(max_attempts=-1)
    with pytest.raises(logitd.InvalidArgumentError, match="initial_backoff"):
        logitd.RetryPolicy(initial_backoff=0)
    with pytest.raises(logitd.InvalidArgumentError, match="jitter"):
        logitd.RetryPolicy(jitter=1.5)
    with pytest.raises(logitd.InvalidArgumentError, match="retry"):
        logitd.Client("127.0.0.1:1", retry=3)


def test_idempotent_calls_ride_over_a_server_that_comes_up_late(tmp_path):
    port = free_port()
    address = "127.0.0.1:%d" % port
    policy = logitd.RetryPolicy(max_attempts=0, initial_backoff=0.05, max_backoff=0.5)
    with logitd.Client(address, timeout=60, retry=policy) as c, logitd.Client(address, timeout=10) as plain:
        # Nothing listens yet: without a policy the call fails at once; a call
        # that is never retried fails at once with one too.
        with pytest.raises(logitd.UnavailableError):
            plain.info()
        start = time.monotonic()
        with pytest.raises(logitd.UnavailableError):
            c.release_weights("w-0000000000000000-1x1")
        assert c.retries == 0
        assert time.monotonic() - start < 5

        up = threading.Event()
        done = threading.Event()
        failures = []

        def serve_later():
            try:
                time.sleep(1.0)
                with running_server(tmp_path, "--address=%s" % address):
                    up.set()
                    done.wait(60)
            except BaseException as e:  # reported by the main thread
                failures.append(e)
                up.set()

        t = threading.Thread(target=serve_later)
        t.start()
        try:
            assert c.info().backend == "cpu"  # retried until the server answered
            assert up.is_set() and not failures, failures
            assert c.retries > 0
            rng = np.random.default_rng(51)
            w = to_bf16(int_tensor(rng, (64, 32)))
            x = to_bf16(int_tensor(rng, (4, 32)))
            handle = c.register_weights(w).handle
            y = c.logits(x, handle)
            assert np.array_equal(y, (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32))
        finally:
            done.set()
            t.join(90)

        # The server is gone again: a retried call gives up at its attempt limit
        # and says so.
        bounded = logitd.Client(address, timeout=60, retry=logitd.RetryPolicy(max_attempts=3, initial_backoff=0.05))
        with bounded, pytest.raises(logitd.UnavailableError, match="gave up after 3 attempts"):
            bounded.info()


def test_only_the_idempotent_calls_are_retried():
    # Nothing listens, so every attempt fails with UNAVAILABLE at once; a call
    # retried under the policy counts one retry before it gives up.
    rng = np.random.default_rng(52)
    x = to_bf16(int_tensor(rng, (2, 4)))
    dy = int_tensor(rng, (2, 3)).astype(np.float32)
    targets = np.zeros(2, np.int32)
    w = "w-0000000000000000-1x1"
    calls = {
        "info": (lambda c: c.info(), True),
        "list_weights": (lambda c: c.list_weights(), True),
        "load_weight": (lambda c: c.load_weight("w.safetensors", "lm_head.weight"), True),
        "register_weights": (lambda c: c.register_weights(to_bf16(int_tensor(rng, (3, 4)))), True),
        "logits": (lambda c: c.logits(x, w), True),
        "cast_to_bf16": (lambda c: c.cast_to_bf16(dy), True),
        "zero_gradient": (lambda c: c.zero_gradient(w), True),
        "fetch_gradient": (lambda c: c.fetch_gradient(w), True),
        "fetch_gradient(zero_after=True)": (lambda c: c.fetch_gradient(w, zero_after=True), False),
        "backward": (lambda c: c.backward(dy, x, w), True),
        "backward(accumulate_dw=True)": (lambda c: c.backward(dy, x, w, accumulate_dw=True), False),
        "cross_entropy": (lambda c: c.cross_entropy(x, targets, w, want_dw=True), True),
        "cross_entropy(accumulate_dw=True)": (
            lambda c: c.cross_entropy(x, targets, w, want_dw=True, accumulate_dw=True),
            False,
        ),
        "logprobs": (lambda c: c.logprobs(x, w, targets), True),
        "release_weights": (lambda c: c.release_weights(w), False),
    }
    policy = logitd.RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.01)
    with logitd.Client("127.0.0.1:%d" % free_port(), timeout=30, retry=policy) as c:
        for name, (call, idempotent) in calls.items():
            before = c.retries
            with pytest.raises(logitd.UnavailableError):
                call(c)
            assert c.retries - before == (1 if idempotent else 0), name
