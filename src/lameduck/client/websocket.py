"""``ResumableWebSocket``: a websockets client that survives its server going away.

Each message gets the next seq and stays pending until the server acknowledges it. On close
1001 (going away), 1012 (restart), 1013 (try again later), a cut, or a refused handshake it
waits (``Backoff``: the first attempt uniform in 0 to 5 s, RFC 6455 §7.2.3), reconnects
through the load balancer, says hello with its token and last acknowledged seq, learns the
last committed seq, and sends again only what follows it. Any other close code, an error
reply, or a session the server no longer has fails the calls instead: retrying those would
never end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from lameduck.client.http import GaveUp, ResumeGap
from lameduck.drain.backoff import Backoff
from lameduck.resume import protocol as p

# Close codes after which the session goes on elsewhere (None: no close frame, a cut).
RECONNECT_CODES = frozenset({None, 1001, 1006, 1012, 1013})


class SessionError(Exception):
    """The server refused a message (an ``error`` reply) or ended the session for good."""


class ResumableWebSocket:
    def __init__(self, url: str, token: str | None = None, *, backoff: Backoff | None = None,
                 rng: random.Random | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic, hello_timeout: float = 10.0,
                 **connect_kw: Any) -> None:
        self.url = url
        self.token = token or uuid.uuid4().hex
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()
        self.sleep = sleep
        self.clock = clock
        self.hello_timeout = hello_timeout
        self.connect_kw = connect_kw
        self.next_seq = 1
        self.last_acked = 0
        self.pending: dict[int, tuple[Any, asyncio.Future[Any]]] = {}
        self.connects = 0                    # connections that said hello and were answered
        self.reconnect_times: list[float] = []  # clock() at each reconnect attempt
        self.close_codes: list[int | None] = []  # how each connection ended
        self.replayed = 0                    # messages sent again after a reconnect
        self._ws: ClientConnection | None = None  # set once the replay is out
        self._ready = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._progress = False  # an ack on the current connection: the backoff starts over

    async def start(self) -> ResumableWebSocket:
        """Connect (retrying with backoff) and say hello; returns once the session is live."""
        self._task = asyncio.ensure_future(self._run())
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            ready.cancel()
            self._task.cancel()
            raise
        if not ready.done():
            ready.cancel()
            self._task.result()  # raises why it ended (GaveUp, ResumeGap, SessionError)
        return self

    async def call(self, data: Any) -> Any:
        """Send ``data`` as the next seq; the app's result once it is committed (None when
        its acknowledgement was lost with a connection and the hello said it committed)."""
        if self._failed is not None:
            raise self._failed
        seq = self.next_seq
        self.next_seq += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[seq] = (data, fut)
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(ConnectionClosed):
                await ws.send(p.message(seq, data))
        return await fut

    async def close(self) -> None:
        self._closing = True
        if self._ws is not None:
            await self._ws.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._fail(ConnectionError("ResumableWebSocket closed"))

    async def __aenter__(self) -> ResumableWebSocket:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the connection loop ------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        """No call is left waiting for good: every pending one (and every later one) fails."""
        if self._failed is None:
            self._failed = exc
        for _, fut in self.pending.values():
            if not fut.done():
                fut.set_exception(self._failed)
        self.pending.clear()

    def _acked(self, seq: int, result: Any) -> None:
        self.last_acked = max(self.last_acked, seq)
        entry = self.pending.pop(seq, None)
        if entry is not None and not entry[1].done():
            entry[1].set_result(result)

    async def _run(self) -> None:
        try:
            await self._loop()
        except BaseException as e:
            self._fail(e if isinstance(e, Exception) else ConnectionError("stopped"))
            raise

    async def _loop(self) -> None:
        attempt = -1  # the first connection goes at once
        error: BaseException | None = None
        while not self._closing:
            if attempt >= 0:
                if attempt >= self.backoff.max_attempts:
                    raise GaveUp(f"{self.url}: no session after {attempt} reconnects") from error
                await self.sleep(self.backoff.delay(attempt, self.rng.random))
                self.reconnect_times.append(self.clock())
            attempt += 1
            self._progress = False
            code: int | None = None
            try:
                async with connect(self.url, **self.connect_kw) as ws:
                    await self._session(ws)
                    code = ws.close_code
            except ConnectionClosed as e:
                error = e
                code = e.rcvd.code if e.rcvd else None
            except (OSError, InvalidHandshake, TimeoutError) as e:
                error = e
                self.close_codes.append(None)
                continue
            finally:
                self._ws = None
                self._ready.clear()
            self.close_codes.append(code)
            if self._closing:
                return
            if code not in RECONNECT_CODES:
                raise SessionError(f"{self.url}: the server closed the session ({code})")
            if self._progress or not self.pending:
                attempt = 0  # it was live: the next cut starts the backoff over

    async def _session(self, ws: ClientConnection) -> None:
        await ws.send(p.hello(self.token, self.last_acked))
        reply = json.loads(await asyncio.wait_for(ws.recv(), self.hello_timeout))
        if not isinstance(reply, dict) or "resumed" not in reply:
            raise SessionError(f"{self.url}: no answer to the hello: {str(reply)[:100]}")
        committed = int(reply["resumed"]["seq"])
        if committed < self.last_acked:  # the store lost the session (expired?)
            raise ResumeGap(committed, self.last_acked)
        for seq in [s for s in self.pending if s <= committed]:
            self._acked(seq, None)  # committed; its ack went down with the last connection
        self.last_acked = max(self.last_acked, committed)
        self.connects += 1
        # Send what is pending, in order, before calls may send on this connection: a call
        # made meanwhile waits in ``pending`` and is picked up by the next round.
        sent = committed
        while True:
            todo = sorted(s for s in self.pending if s > sent)
            if not todo:
                break
            for seq in todo:
                await ws.send(p.message(seq, self.pending[seq][0]))
            if self.connects > 1:
                self.replayed += len(todo)
            sent = todo[-1]
        self._ws = ws
        self._ready.set()
        async for raw in ws:
            self._on_message(raw)

    def _on_message(self, raw: str | bytes) -> None:
        try:
            d = json.loads(raw)
        except ValueError:
            return  # not ours to read
        if not isinstance(d, dict):
            return
        if isinstance(d.get("ack"), int):
            self._progress = True
            self._acked(d["ack"], d.get("result"))
        elif "error" in d:
            seq = d.get("seq")
            if d["error"] == "seq_gap" and isinstance(d.get("last_seq"), int):
                exc: Exception = ResumeGap(d["last_seq"], seq if isinstance(seq, int) else 0)
            else:
                exc = SessionError(f"the server refused seq {seq}: {d['error']}")
            entry = self.pending.pop(seq, None) if isinstance(seq, int) else None
            if entry is not None and not entry[1].done():
                entry[1].set_exception(exc)
