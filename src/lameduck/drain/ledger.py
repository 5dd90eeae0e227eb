"""The in-flight ledger : count first, then check.

A request increments the count before it tests whether new work is still taken; one that loses
that race takes itself back out and is answered "going away". So the drain loop, which waits for
the count to reach zero, can never miss a request that slipped in, and no request is both counted
and refused.

Compiled with the hot path (every request begins and ends here). A worker process keeps its
counts in a page its main process reads after a SIGKILL too (``share``, ``server.inflight``).
"""

from __future__ import annotations


class Ledger:
    """Requests in flight across the process, and what a drain did with them."""

    __slots__ = ("accepting", "active", "completed", "cut", "draining", "fresh", "refused",
                 "slots")

    def __init__(self) -> None:
        self.active = 0
        # Connections accepted whose first request has not begun: in flight for their client
        # (it sent, or is sending, a request this process has not read yet).
        self.fresh = 0
        self.accepting = True  # False once the process takes no new work
        self.draining = False  # while True, completions are counted for the drain report
        self.completed = 0
        self.refused = 0
        self.cut = 0
        # A worker's page shared with its main process: [active, fresh] written at each change
        # (None: a single process, nobody else reads them).
        self.slots: memoryview | None = None

    def share(self, slots: memoryview) -> None:
        """From now on every change of ``active`` and ``fresh`` is written to ``slots`` too."""
        self.slots = slots
        slots[0] = self.active
        slots[1] = self.fresh

    def begin(self) -> bool:
        """Admit a request. False: it was refused and must be answered "going away"."""
        self.active += 1
        if self.accepting:
            if self.slots is not None:
                self.slots[0] = self.active
            return True
        self.active -= 1
        self.refused += 1
        return False

    def end(self) -> None:
        """A request admitted by ``begin`` finished (its response is complete)."""
        self.active -= 1
        if self.draining:
            self.completed += 1
        if self.slots is not None:
            self.slots[0] = self.active

    def abandon(self) -> None:
        """A request admitted by ``begin`` ended without completing: its client went away."""
        self.active -= 1
        if self.slots is not None:
            self.slots[0] = self.active

    def cut_one(self) -> None:
        """A request admitted by ``begin`` was cut at the deadline."""
        self.active -= 1
        self.cut += 1
        if self.slots is not None:
            self.slots[0] = self.active

    def cut_unheard(self, n: int) -> None:
        """``n`` requests on the way that were never read (a TLS handshake under way, a
        request head partly read) were cut at the deadline: their clients lose what they
        sent, counted as cut."""
        self.cut += n

    def accepted(self) -> None:
        """A connection was accepted: in flight for its client until its first request."""
        self.fresh += 1
        if self.slots is not None:
            self.slots[1] = self.fresh

    def heard(self) -> None:
        """A fresh connection's first request began (or it closed without one)."""
        self.fresh -= 1
        if self.slots is not None:
            self.slots[1] = self.fresh

    @property
    def idle(self) -> bool:
        return self.active == 0
