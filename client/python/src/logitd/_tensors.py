"""Tensors on the wire: numpy/torch conversion, chunking and reassembly.

A tensor travels as a TensorSpec (name, dtype, shape, xxh3-64 of its bytes)
followed by TensorChunk messages in order. The receiver checks every offset,
the total length and the digest; anything that does not add up is a
DataLossError, never a wrong result.
"""

import sys
from typing import Any, Iterator, Sequence, Tuple

import ml_dtypes
import numpy as np
import xxhash

from .errors import DataLossError, InvalidArgumentError
from .v1 import logitd_pb2 as pb

BF16 = np.dtype(ml_dtypes.bfloat16)
FP32 = np.dtype("<f4")
INT32 = np.dtype("<i4")
INT64 = np.dtype("<i8")

NUMPY_DTYPE = {
    pb.DTYPE_BF16: BF16,
    pb.DTYPE_FP32: FP32,
    pb.DTYPE_INT32: INT32,
    pb.DTYPE_INT64: INT64,
}

_DTYPE_NAMES = {
    "bf16": pb.DTYPE_BF16,
    "bfloat16": pb.DTYPE_BF16,
    "fp32": pb.DTYPE_FP32,
    "float32": pb.DTYPE_FP32,
    "float": pb.DTYPE_FP32,
    "int32": pb.DTYPE_INT32,
    "int64": pb.DTYPE_INT64,
}


def dtype_enum(what: str, value: Any, allowed: Sequence[int]) -> int:
    """Reads a dtype given as "fp32"/"bf16", a numpy dtype or a torch dtype."""
    enum = None
    if isinstance(value, str):
        enum = _DTYPE_NAMES.get(value.lower())
    else:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.dtype):
            enum = {
                torch.bfloat16: pb.DTYPE_BF16,
                torch.float32: pb.DTYPE_FP32,
                torch.int32: pb.DTYPE_INT32,
                torch.int64: pb.DTYPE_INT64,
            }.get(value)
        else:
            try:
                dt = np.dtype(value)
            except Exception:
                dt = None
            if dt is not None:
                for e, d in NUMPY_DTYPE.items():
                    if dt == d:
                        enum = e
                        break
    if enum is None or enum not in allowed:
        names = ", ".join(pb.DType.Name(a).replace("DTYPE_", "").lower() for a in allowed)
        raise InvalidArgumentError("%s: expected one of %s, got %r" % (what, names, value))
    return enum


def is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def import_torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("logitd: torch tensors were asked for, but torch is not installed") from e
    return torch


def _torch_to_numpy(t) -> np.ndarray:
    torch = sys.modules["torch"]
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    if t.dtype in (torch.float32, torch.int32, torch.int64):
        return t.numpy()
    raise InvalidArgumentError(
        "torch tensor of dtype %s: expected torch.bfloat16 or torch.float32 (or int32/int64 targets)" % t.dtype
    )


class Outgoing:
    """One request tensor: its spec and its bytes."""

    __slots__ = ("name", "array", "spec", "data")

    def __init__(self, name: str, value: Any, allowed: Sequence[int]):
        if is_torch(value):
            arr = _torch_to_numpy(value)
        elif isinstance(value, np.ndarray):
            arr = value
        else:
            raise InvalidArgumentError(
                "%s: expected a numpy array or a torch tensor, got %s" % (name, type(value).__name__)
            )
        enum = None
        if arr.dtype == BF16:
            enum = pb.DTYPE_BF16
        elif arr.dtype.kind == "f" and arr.dtype.itemsize == 4:
            enum = pb.DTYPE_FP32
        elif arr.dtype.kind == "i" and arr.dtype.itemsize == 4:
            enum = pb.DTYPE_INT32
        elif arr.dtype.kind == "i" and arr.dtype.itemsize == 8:
            enum = pb.DTYPE_INT64
        if enum is None or enum not in allowed:
            names = " or ".join(pb.DType.Name(a).replace("DTYPE_", "").lower() for a in allowed)
            hint = ""
            if arr.dtype.kind == "f" and pb.DTYPE_BF16 in allowed:
                hint = " (convert with .astype(ml_dtypes.bfloat16) or .to(torch.bfloat16))"
            raise InvalidArgumentError("%s: expected dtype %s, got %s%s" % (name, names, arr.dtype, hint))
        arr = np.ascontiguousarray(arr, dtype=NUMPY_DTYPE[enum])
        self.name = name
        self.array = arr  # keeps the bytes alive
        self.data = memoryview(arr.reshape(-1).view(np.uint8))
        self.spec = pb.TensorSpec(
            name=name,
            dtype=enum,
            shape=[int(d) for d in arr.shape],
            xxh3=xxhash.xxh3_64_intdigest(self.data),
        )

    def chunks(self, chunk_bytes: int) -> Iterator[pb.TensorChunk]:
        data = self.data
        for off in range(0, len(data), chunk_bytes):
            yield pb.TensorChunk(name=self.name, offset=off, data=bytes(data[off : off + chunk_bytes]))


class Incoming:
    """One response tensor being reassembled from its chunks."""

    def __init__(self, spec: pb.TensorSpec):
        self.spec = spec
        if not spec.name:
            raise DataLossError("response from server: a tensor spec without a name")
        if spec.dtype not in NUMPY_DTYPE:
            raise DataLossError("response from server: %s has unknown dtype %d" % (spec.name, spec.dtype))
        if len(spec.shape) == 0 or any(d < 1 for d in spec.shape):
            raise DataLossError("response from server: %s has shape %s" % (spec.name, list(spec.shape)))
        self.dtype = NUMPY_DTYPE[spec.dtype]
        n = self.dtype.itemsize
        for d in spec.shape:
            n *= int(d)
        if n >= 1 << 62:
            raise DataLossError("response from server: %s %s overflows" % (spec.name, list(spec.shape)))
        self.nbytes = n
        self.buf = bytearray(n)
        self.view = memoryview(self.buf)
        self.received = 0
        self.hasher = xxhash.xxh3_64()
        # The digest to check: the spec's, or one sent after the chunks
        # (LogitsHeader.digest_last: the spec then carries 0).
        self.expected = spec.xxh3

    def add(self, chunk: pb.TensorChunk) -> None:
        if chunk.offset != self.received:
            raise DataLossError(
                "response from server: %s: chunk at offset %d, expected offset %d"
                % (self.spec.name, chunk.offset, self.received)
            )
        data = chunk.data
        n = len(data)
        if n > self.nbytes - self.received:
            raise DataLossError(
                "response from server: %s: chunk [%d, %d) runs past the tensor's end at %d bytes"
                % (self.spec.name, chunk.offset, chunk.offset + n, self.nbytes)
            )
        self.view[self.received : self.received + n] = data
        self.hasher.update(data)
        self.received += n

    def finish(self) -> None:
        if self.received != self.nbytes:
            raise DataLossError(
                "response from server: %s: received %d of %d bytes (truncated stream)"
                % (self.spec.name, self.received, self.nbytes)
            )
        got = self.hasher.intdigest()
        if got != self.expected:
            raise DataLossError(
                "response from server: %s: xxh3 digest of the received bytes is %016x, the server "
                "announced %016x (data corrupted in transit)" % (self.spec.name, got, self.expected)
            )

    def result(self, as_torch: bool):
        arr = np.frombuffer(self.buf, dtype=self.dtype).reshape(tuple(int(d) for d in self.spec.shape))
        return as_result(arr, as_torch)


def as_result(arr: np.ndarray, as_torch: bool):
    """The array itself, or a CPU torch tensor sharing its memory."""
    if not as_torch:
        return arr
    torch = import_torch()
    if arr.dtype == BF16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def digest(value: Any) -> int:
    """xxh3-64 (seed 0) of a tensor's row-major little-endian bytes, as the wire carries it."""
    return Outgoing("tensor", value, tuple(NUMPY_DTYPE)).spec.xxh3


def shape_of(spec: pb.TensorSpec) -> Tuple[int, ...]:
    return tuple(int(d) for d in spec.shape)
