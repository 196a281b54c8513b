"""RegisterWeight, ListWeights, ReleaseWeight and LoadWeight."""

import os

import grpc
import numpy as np
import pytest

from protocol import Tensor, chunks_of, expect_error, names, raw_bytes, to_bf16_bits, write_safetensors, xxh3
from stubs import pb


def listed(conn, handle):
    """The ListWeights entry of `handle`, or None."""
    return next((w for w in conn.list_weights() if w.handle == handle), None)


def test_register_list_release_counts_registrations(conn):
    """Identical bytes share one handle; each registration needs one release."""
    w = np.random.default_rng(101).integers(-8, 9, size=(48, 40))
    data = raw_bytes(w, pb.DTYPE_BF16)
    first = conn.register_weight(w, name="first")
    try:
        assert first.handle, "no handle"
        assert list(first.shape) == [48, 40]
        assert first.xxh3 == xxh3(data), "WeightInfo.xxh3 is not the xxh3 of the bf16 bytes"
        assert first.name == "first"
        assert first.registrations == 1 and not first.already_registered
        assert first.bytes >= len(data)

        second = conn.register_weight(w, name="second")
        assert second.handle == first.handle, "identical bytes got another handle"
        assert second.already_registered and second.registrations == 2
        assert second.name == "first", "the name is the first registration's"

        entry = listed(conn, first.handle)
        assert entry is not None, "ListWeights does not list the weight"
        assert entry.registrations == 2 and list(entry.shape) == [48, 40] and entry.xxh3 == first.xxh3

        released = conn.release(first.handle)
        assert released.registrations_left == 1 and released.bytes_freed == 0
        assert listed(conn, first.handle) is not None, "the weight went while a registration remains"
        released = conn.release(first.handle)
        assert released.registrations_left == 0
        assert released.bytes_freed == first.bytes
        assert listed(conn, first.handle) is None, "ListWeights still lists a released weight"
    finally:
        while listed(conn, first.handle) is not None:
            conn.release(first.handle, force=True)
    message = expect_error(grpc.StatusCode.NOT_FOUND, conn.release, first.handle)
    assert first.handle in message


def test_release_force_drops_every_registration(conn):
    """ReleaseWeight with force drops the weight whatever its registration count."""
    w = np.random.default_rng(102).integers(-8, 9, size=(16, 8))
    info = conn.register_weight(w)
    conn.register_weight(w)
    conn.register_weight(w)
    released = conn.release(info.handle, force=True)
    assert released.registrations_left == 0 and released.bytes_freed == info.bytes
    assert listed(conn, info.handle) is None


def test_handle_depends_only_on_bytes_and_shape(conn, weights):
    """The same bytes uploaded in other chunk sizes give the same handle; another shape another one."""
    w = np.random.default_rng(103).integers(-8, 9, size=(32, 24))
    handles = {weights(w, chunk_bytes=size).handle for size in (1, 100, 1536, 1 << 20)}
    assert len(handles) == 1, "chunking changed the handle: %s" % handles
    other = weights(w.reshape(24, 32))
    assert other.handle not in handles, "a reshaped weight got the same handle"


def test_register_rejects_non_bf16_weight(conn):
    """The weight must be BF16 [V, K]: FP32 is INVALID_ARGUMENT naming the weight."""
    t = Tensor("weight", pb.DTYPE_FP32, np.ones((4, 4)))
    messages = [pb.RegisterWeightRequest(header=pb.RegisterWeightHeader(name="fp32", weight=t.spec()))]
    messages += [pb.RegisterWeightRequest(chunk=c) for c in chunks_of(t)]
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, conn.register_stream, messages)
    assert names(message, "weight") and "BF16" in message, message


def test_register_rejects_rank_3_weight(conn):
    """A weight of rank other than 2 is INVALID_ARGUMENT."""
    t = Tensor("weight", pb.DTYPE_BF16, np.ones((2, 2, 2)))
    messages = [pb.RegisterWeightRequest(header=pb.RegisterWeightHeader(weight=t.spec()))]
    messages += [pb.RegisterWeightRequest(chunk=c) for c in chunks_of(t)]
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, conn.register_stream, messages)
    assert names(message, "weight"), message


def test_register_with_wrong_digest_is_data_loss(conn):
    """Bytes that do not match the announced xxh3 are DATA_LOSS and register nothing."""
    t = Tensor("weight", pb.DTYPE_BF16, np.random.default_rng(104).integers(-8, 9, size=(8, 8)))
    wrong = xxh3(t.data) ^ 1
    messages = [pb.RegisterWeightRequest(header=pb.RegisterWeightHeader(weight=t.spec(digest=wrong)))]
    messages += [pb.RegisterWeightRequest(chunk=c) for c in chunks_of(t)]
    message = expect_error(grpc.StatusCode.DATA_LOSS, conn.register_stream, messages)
    assert names(message, "weight"), message
    assert all(w.xxh3 not in (wrong, xxh3(t.data)) for w in conn.list_weights())


# --- LoadWeight ---------------------------------------------------------------------


def test_load_bf16_tensor_equals_upload(conn, weights_dir, weights):
    """A BF16 tensor loaded from a file gets the handle of uploading the same bytes."""
    w = np.random.default_rng(111).integers(-8, 9, size=(40, 24))
    data = raw_bytes(w, pb.DTYPE_BF16)
    write_safetensors(os.path.join(weights_dir, "bf16.safetensors"), {"lm_head.weight": ("BF16", w.shape, data)})
    uploaded = weights(w)
    loaded = conn.load_weight("bf16.safetensors", "lm_head.weight")
    try:
        assert loaded.handle == uploaded.handle
        assert loaded.xxh3 == xxh3(data)
        assert loaded.already_registered and loaded.registrations == 2
        assert loaded.converted_from == ""
    finally:
        conn.release(loaded.handle)


def test_load_f32_tensor_is_rounded_to_bf16(conn, weights_dir):
    """An F32 tensor is rounded to bf16 (nearest even) and converted_from says F32."""
    rng = np.random.default_rng(112)
    # Values that need rounding: bf16 keeps 8 significant bits.
    w = (rng.integers(-4096, 4097, size=(16, 12)) + 0.5).astype(np.float32)
    write_safetensors(
        os.path.join(weights_dir, "f32.safetensors"), {"head": ("F32", w.shape, w.astype("<f4").tobytes())}
    )
    loaded = conn.load_weight("f32.safetensors", "head", name="from-f32")
    try:
        assert loaded.converted_from == "F32"
        assert loaded.name == "from-f32"
        assert list(loaded.shape) == [16, 12]
        assert loaded.xxh3 == xxh3(to_bf16_bits(w).astype("<u2").tobytes()), "not the bf16 (RNE) of the file's values"
    finally:
        conn.release(loaded.handle)


def test_load_without_name_takes_the_tensor_name(conn, weights_dir):
    """An empty LoadWeightRequest.name means the tensor's name."""
    w = np.random.default_rng(113).integers(-8, 9, size=(8, 8))
    write_safetensors(
        os.path.join(weights_dir, "named.safetensors"),
        {"decoder.lm_head": ("BF16", w.shape, raw_bytes(w, pb.DTYPE_BF16))},
    )
    loaded = conn.load_weight("named.safetensors", "decoder.lm_head")
    try:
        assert loaded.name == "decoder.lm_head"
    finally:
        conn.release(loaded.handle)


def test_load_corrupt_file_is_failed_precondition(conn, weights_dir):
    """A file that is not safetensors is FAILED_PRECONDITION (fix the file; a retry does not help), never
    DATA_LOSS, and the message names the caller's path, not where the server keeps it."""
    with open(os.path.join(weights_dir, "corrupt.safetensors"), "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{this is no json}")
    message = expect_error(
        grpc.StatusCode.FAILED_PRECONDITION, conn.load_weight, "corrupt.safetensors", "lm_head.weight"
    )
    assert "corrupt.safetensors" in message
    assert os.path.realpath(weights_dir) not in message, message


@pytest.mark.parametrize(
    "path",
    ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors"],
    ids=["dotdot", "absolute", "nested-dotdot"],
)
def test_load_path_outside_weights_dir_is_permission_denied(conn, weights_dir, path):
    """Absolute paths and paths with '..' are PERMISSION_DENIED, whether or not the file exists."""
    message = expect_error(grpc.StatusCode.PERMISSION_DENIED, conn.load_weight, path, "lm_head.weight")
    assert path in message


def test_load_symlink_leaving_weights_dir_is_permission_denied(conn, weights_dir, tmp_path):
    """A symbolic link that resolves outside the directory is PERMISSION_DENIED."""
    w = np.ones((4, 4))
    target = tmp_path / "outside.safetensors"
    write_safetensors(str(target), {"lm_head.weight": ("BF16", w.shape, raw_bytes(w, pb.DTYPE_BF16))})
    link = os.path.join(weights_dir, "link-outside.safetensors")
    if not os.path.lexists(link):
        os.symlink(str(target), link)
    message = expect_error(
        grpc.StatusCode.PERMISSION_DENIED, conn.load_weight, "link-outside.safetensors", "lm_head.weight"
    )
    assert "link-outside.safetensors" in message
    assert str(tmp_path) not in message and os.path.realpath(weights_dir) not in message, message


def test_load_missing_file_is_not_found(conn, weights_dir):
    """A file that does not exist is NOT_FOUND naming the path."""
    message = expect_error(grpc.StatusCode.NOT_FOUND, conn.load_weight, "no-such-file.safetensors", "lm_head.weight")
    assert "no-such-file.safetensors" in message


def test_load_missing_tensor_is_not_found(conn, weights_dir):
    """A tensor the file lacks is NOT_FOUND naming the tensor."""
    w = np.ones((4, 4))
    write_safetensors(
        os.path.join(weights_dir, "one-tensor.safetensors"), {"present": ("BF16", w.shape, raw_bytes(w, pb.DTYPE_BF16))}
    )
    message = expect_error(grpc.StatusCode.NOT_FOUND, conn.load_weight, "one-tensor.safetensors", "absent")
    assert "absent" in message


def test_load_integer_tensor_is_failed_precondition(conn, weights_dir):
    """Only BF16, F32 and F16 tensors load: I32 is FAILED_PRECONDITION (the file must change) naming the dtype."""
    w = np.ones((4, 4), dtype="<i4")
    write_safetensors(os.path.join(weights_dir, "int.safetensors"), {"ids": ("I32", w.shape, w.tobytes())})
    message = expect_error(grpc.StatusCode.FAILED_PRECONDITION, conn.load_weight, "int.safetensors", "ids")
    assert "I32" in message


def test_load_empty_path_is_invalid_argument(conn, weights_dir):
    """An empty path is INVALID_ARGUMENT naming the field."""
    message = expect_error(grpc.StatusCode.INVALID_ARGUMENT, conn.load_weight, "", "lm_head.weight")
    assert names(message, "path"), message
