"""Same-host shared memory for a logitd server started with --allow_shm.

A SharedRegion is a POSIX shared-memory object (``/dev/shm/NAME``, mode 0600,
so only this user, which must be the server's, can open it), created, sized
and mapped read-write by the client and registered once with
``Client.register_shm``. Calls given ``shm=region`` then put their inputs in
the region and have the server write their outputs there: only a header and
the result's spec travel over gRPC, the tensor bytes never do.
"""

import mmap
import os
import secrets
from typing import Optional

import numpy as np

from .errors import InvalidArgumentError

# Slices start on this boundary (an output's offset must be a multiple of its
# element size; 64 also keeps them cache-line aligned).
ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class SharedRegion:
    """A POSIX shared-memory object of ``nbytes`` bytes, zero-filled, mapped read-write.

    ``name`` is a shm_open name ("/something", no further "/"); None picks a
    fresh "/logitd-py-PID-RANDOM". Close it (or use ``with``) to unmap and
    unlink it; release its registration first with ``Client.release_shm``.
    """

    def __init__(self, nbytes: int, name: Optional[str] = None):
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise InvalidArgumentError("shared region: expected a size > 0 bytes, got %d" % nbytes)
        if name is None:
            name = "/logitd-py-%d-%s" % (os.getpid(), secrets.token_hex(8))
        if not name.startswith("/") or "/" in name[1:] or name in ("/", "/.", "/..") or len(name) > 255:
            raise InvalidArgumentError(
                "shared region: expected a name '/something' without a further '/', got %r" % name
            )
        self.name = name
        self.nbytes = nbytes
        # Set by Client.register_shm; the server's name for the region.
        self.handle: Optional[str] = None
        self._path = "/dev/shm" + name
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self._map = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(self._path)
            raise
        os.close(fd)

    @property
    def closed(self) -> bool:
        return self._map is None

    def array(self, offset: int, dtype, shape) -> np.ndarray:
        """A numpy view of ``shape`` elements of ``dtype`` at byte ``offset`` (no copy)."""
        if self._map is None:
            raise InvalidArgumentError("shared region %s is closed" % self.name)
        count = 1
        for d in shape:
            count *= int(d)
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(tuple(shape))

    def close(self) -> None:
        """Unmaps and unlinks the object. Numpy views of it keep the mapping alive until they go."""
        if self._map is None:
            return
        try:
            self._map.close()
        except BufferError:
            pass  # views still exist: the mapping goes with the last of them
        self._map = None
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "SharedRegion":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return "SharedRegion(name=%r, nbytes=%d, handle=%r)" % (self.name, self.nbytes, self.handle)
