"""Same-host shared memory (server --allow_shm) through the Python client."""

import os

import numpy as np
import pytest
from reference import int_tensor, to_bf16
from test_auth import running_server

import logitd

pytestmark = pytest.mark.needs_server


def exact_logits(x, w):
    return x.astype(np.float64) @ w.astype(np.float64).T


def test_logits_through_shared_memory_equal_the_streamed_ones(tmp_path):
    rng = np.random.default_rng(41)
    w = to_bf16(int_tensor(rng, (3000, 128)))
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            handle = c.register_weights(w, name="shm head").handle
            with c.register_shm(1 << 20) as region:
                assert region.handle and os.path.exists("/dev/shm" + region.name)
                for seed, m in ((1, 16), (2, 40)):
                    x = to_bf16(int_tensor(np.random.default_rng(seed), (m, 128)))
                    y = c.logits(x, handle, shm=region)
                    streamed = c.logits(x, handle)
                    assert y.dtype == np.float32 and y.shape == (m, 3000)
                    # Integer operands: the fp32 result is exact, and both paths give the same bits.
                    assert np.array_equal(y, exact_logits(x, w).astype(np.float32))
                    assert np.array_equal(y.view(np.uint32), streamed.view(np.uint32))
                yb = c.logits(x, handle, out_dtype="bf16", shm=region)
                assert yb.dtype == logitd.BF16
                assert np.array_equal(yb.view(np.uint16), c.logits(x, handle, out_dtype="bf16").view(np.uint16))
                # Without digests on either side: the same bits.
                unhashed = c.logits(x, handle, shm=region, verify=False)
                assert np.array_equal(unhashed.view(np.uint32), streamed.view(np.uint32))
                with pytest.raises(logitd.InvalidArgumentError, match="only with shm"):
                    c.logits(x, handle, verify=False)
                # The result is a view of the region: the next call overwrites it.
                kept = y.copy()
                c.logits(to_bf16(int_tensor(np.random.default_rng(9), (40, 128))), handle, shm=region)
                assert not np.array_equal(y, kept)
                c.release_shm(region)
                assert region.handle is None
            assert not os.path.exists("/dev/shm" + region.name)


def test_bad_regions_are_refused_with_the_right_error(tmp_path):
    rng = np.random.default_rng(42)
    w = to_bf16(int_tensor(rng, (512, 64)))
    x = to_bf16(int_tensor(rng, (8, 64)))
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            handle = c.register_weights(w).handle
            with logitd.SharedRegion(4096) as unregistered:
                with pytest.raises(logitd.InvalidArgumentError, match="not registered"):
                    c.logits(x, handle, shm=unregistered)
            # Room for X but not for Y [8, 512] fp32: the server says so.
            with c.register_shm(4096) as small:
                with pytest.raises(logitd.InvalidArgumentError):
                    c.logits(x, handle, shm=small)
                # The server still serves, and the region still works for what fits.
                assert c.logits(x[:1], handle, shm=small).shape == (1, 512)
                stale = small.handle
                c.release_shm(small)
                small.handle = stale
                with pytest.raises(logitd.NotFoundError):
                    c.logits(x, handle, shm=small)
                small.handle = None
            with pytest.raises(logitd.InvalidArgumentError, match="size > 0"):
                logitd.SharedRegion(0)
            with pytest.raises(logitd.InvalidArgumentError, match="name"):
                logitd.SharedRegion(64, name="no-slash")


def test_shared_memory_is_refused_without_allow_shm(tmp_path):
    with running_server(tmp_path) as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            with logitd.SharedRegion(4096) as region:
                with pytest.raises(logitd.FailedPreconditionError, match="allow_shm"):
                    c.register_shm(region)
