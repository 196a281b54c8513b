"""Where a call's tensors go in a registered SharedRegion when they bypass gRPC,
and the checks of what the server wrote there."""

import math
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import xxhash

from . import _tensors as T
from .errors import DataLossError, InvalidArgumentError
from .results import WeightInfo
from .shm import SharedRegion
from .shm import _align as _shm_align
from .v1 import logitd_pb2 as pb


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
