"""A worker's requests in flight, in memory its main process reads after a SIGKILL.

A status message is up to 100 ms old when a worker dies; the requests it took since are lost
all the same. So a worker keeps its ledger's in-flight counts in a page shared with the main
process (a memfd both map): what the main process reads there after the worker died is
exactly what its clients lost — the requests it had begun and not finished, and the
connections it had accepted whose first request it had not yet read. The worker's ledger
writes both there at each change (``Ledger.share``).
"""

from __future__ import annotations

import mmap
import os

_SIZE = 16  # two signed 64-bit counts: requests in flight, fresh connections


class InFlight:
    """The shared page: made by the main process (``fd=None``), mapped by the worker."""

    def __init__(self, fd: int | None = None) -> None:
        if fd is None:
            fd = os.memfd_create("lameduck-inflight", os.MFD_CLOEXEC)
            os.ftruncate(fd, _SIZE)
        self.fd = fd
        self._map = mmap.mmap(fd, _SIZE)
        self.slots = memoryview(self._map).cast("q")

    def lost(self) -> int:
        """What the worker had in flight (read once it has died)."""
        return max(0, self.slots[0]) + max(0, self.slots[1])

    def close(self) -> None:
        self.slots.release()
        self._map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
