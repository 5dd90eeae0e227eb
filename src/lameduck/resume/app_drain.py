"""The app process's drain, as a graceful drain runs it: the core's in-flight ``Ledger`` (counted
first, tested second), close 1001 to the open WebSockets (staggered), a wait to the deadline,
then the stragglers cut. The middleware feeds it; the app's server exits after it. (The
proxy's own drain is ``lameduck.drain``; this one runs inside an ASGI app.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from lameduck.drain.ledger import Ledger

log = logging.getLogger("lameduck.resume")

CloseFn = Callable[[], Awaitable[None]]


class Drain:
    """``grace``: how long in-flight work may take after the drain starts; ``stagger``: the
    window over which the open WebSockets are told 1001 (0: all at once)."""

    def __init__(self, grace: float = 20.0, stagger: float = 2.0,
                 rng: random.Random | None = None) -> None:
        self.grace = grace
        self.stagger = stagger
        self.rng = rng or random.Random()
        self.ledger = Ledger()  # admission: count first, then test ``accepting``
        self.started_at: float | None = None
        self.took: float | None = None
        self.cut = 0  # stragglers cut at the deadline, over the process's life
        self.tasks: set[asyncio.Future[Any]] = set()  # app calls a deadline may cut
        self.sockets: dict[object, CloseFn] = {}  # open WebSockets: how to tell each 1001
        self._idle: asyncio.Event | None = None
        self._done: asyncio.Future[int] | None = None
        self._closing: set[asyncio.Future[None]] = set()  # the staggered 1001s under way
        self._signalled = False

    # -- the request side -------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return not self.ledger.accepting

    def enter(self) -> bool:
        """Admit a request or WebSocket; False once draining (answer "going away")."""
        return self.ledger.begin()

    def leave(self) -> None:
        self.ledger.end()
        if self.ledger.idle and self._idle is not None:
            self._idle.set()

    # -- the drain --------------------------------------------------------------------------
    def begin(self) -> asyncio.Future[int]:
        """Start the drain (once; later calls share it): the number of stragglers cut."""
        if self._done is None:
            self.ledger.accepting = False
            self.started_at = time.monotonic()
            self._done = asyncio.ensure_future(self._run())
        return self._done

    async def _run(self) -> int:
        self._idle = asyncio.Event()
        if self.ledger.idle:
            self._idle.set()
        closers = list(self.sockets.values())
        window = min(self.stagger, self.grace / 2)
        def tell(close: CloseFn) -> None:
            task = asyncio.ensure_future(close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        for close in closers:
            asyncio.get_running_loop().call_later(
                self.rng.uniform(0, window) if window > 0 else 0, tell, close)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self.grace)
        stragglers = [t for t in self.tasks if not t.done()]
        for t in stragglers:
            t.cancel()
        if stragglers:
            self.cut += len(stragglers)
            log.warning("drain deadline (%.3gs): cut %d request(s)", self.grace, len(stragglers))
            # the cut requests answer "going away" and leave; wait for them (briefly)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 5.0)
        self.took = time.monotonic() - (self.started_at or 0.0)
        return len(stragglers)

    # -- signals ----------------------------------------------------------------------------
    def install(self, sig: int = signal.SIGTERM,
                then: Callable[[], None] | None = None) -> bool:
        """Drain on ``sig``, then hand the signal to whoever handled it before (the ASGI
        server, which then shuts down with nothing left in flight). Must run on the main
        thread's event loop; False where it cannot."""
        loop = asyncio.get_running_loop()
        # asyncio's own signal handlers (hypercorn uses them) sit in the loop, not in signal
        handles = getattr(loop, "_signal_handlers", None)
        handle = handles.get(sig) if isinstance(handles, dict) else None
        prev = signal.getsignal(sig)

        def chain() -> None:
            if then is not None:
                then()
            elif handle is not None:
                handle._run()
            elif callable(prev):
                prev(sig, None)
            elif prev == signal.SIG_DFL:
                signal.signal(sig, signal.SIG_DFL)
                signal.raise_signal(sig)

        def on_signal(*_: object) -> None:
            if self._signalled:  # a second signal: the server's own handling, now
                chain()
                return
            self._signalled = True
            # (a drain started before, by the drain path, is the one the signal waits for)
            log.info("signal %d: draining (grace %.3gs)", sig, self.grace)
            loop.call_soon_threadsafe(lambda: self.begin().add_done_callback(
                lambda _f: chain()))

        try:
            if handle is not None:
                loop.remove_signal_handler(sig)
                loop.add_signal_handler(sig, on_signal)
            else:
                signal.signal(sig, on_signal)
        except (ValueError, RuntimeError) as e:  # not the main thread
            log.warning("cannot drain on signal %d here: %s", sig, e)
            return False
        return True
