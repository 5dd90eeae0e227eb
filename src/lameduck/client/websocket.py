"""``ResumableWebSocket``: a websockets client that survives its server going away.

Each message gets the next seq and stays pending until the server acknowledges it. On close
1001 (going away), 1012, a cut or a refused handshake it waits (``Backoff``: the first attempt
uniform in 0 to 5 s, RFC 6455 §7.2.3), reconnects through the load balancer, says hello with its
token and last acknowledged seq, learns the last committed seq, and sends again only what
follows it."""

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

from lameduck.client.backoff import Backoff, GaveUp
from lameduck.resume import protocol as p


class ResumableWebSocket:
    def __init__(self, url: str, token: str | None = None, *, backoff: Backoff | None = None,
                 rng: random.Random | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic, **connect_kw: Any) -> None:
        self.url = url
        self.token = token or uuid.uuid4().hex
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()
        self.sleep = sleep
        self.clock = clock
        self.connect_kw = connect_kw
        self.next_seq = 1
        self.last_acked = 0
        self.pending: dict[int, tuple[Any, asyncio.Future[Any]]] = {}
        self.connects = 0                    # connections that said hello and were answered
        self.reconnect_times: list[float] = []  # clock() at each reconnect attempt
        self.close_codes: list[int | None] = []  # how each connection ended
        self.replayed = 0                    # messages sent again after a reconnect
        self._ws: ClientConnection | None = None
        self._ready = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None

    async def start(self) -> ResumableWebSocket:
        """Connect (retrying with backoff) and say hello; returns once the session is live."""
        self._task = asyncio.ensure_future(self._run())
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            self._task.result()  # raises GaveUp
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
            with contextlib.suppress(asyncio.CancelledError, GaveUp):
                await self._task

    async def __aenter__(self) -> ResumableWebSocket:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the connection loop ------------------------------------------------------------------
    def _acked(self, seq: int, result: Any) -> None:
        self.last_acked = max(self.last_acked, seq)
        entry = self.pending.pop(seq, None)
        if entry is not None and not entry[1].done():
            entry[1].set_result(result)

    async def _run(self) -> None:
        attempt = -1  # the first connection goes at once
        error: BaseException | None = None
        while not self._closing:
            if attempt >= 0:
                if attempt >= self.backoff.max_attempts:
                    self._failed = GaveUp(f"{self.url}: no session after {attempt} reconnects")
                    self._failed.__cause__ = error
                    for _, fut in self.pending.values():
                        if not fut.done():
                            fut.set_exception(self._failed)
                    raise self._failed
                await self.sleep(self.backoff.delay(attempt, self.rng))
                self.reconnect_times.append(self.clock())
            attempt += 1
            try:
                async with connect(self.url, **self.connect_kw) as ws:
                    await self._session(ws)
                    self.close_codes.append(ws.close_code)
            except ConnectionClosed as e:
                error = e
                self.close_codes.append(e.rcvd.code if e.rcvd else None)
            except (OSError, InvalidHandshake, TimeoutError) as e:
                error = e
            finally:
                if self._ws is not None:
                    attempt = 0  # it was live: the next cut starts the backoff over
                self._ws = None
                self._ready.clear()

    async def _session(self, ws: ClientConnection) -> None:
        await ws.send(p.hello(self.token, self.last_acked))
        reply = json.loads(await ws.recv())
        if "resumed" not in reply:  # going away before the hello was answered: reconnect
            raise ConnectionClosed(None, None)
        committed = int(reply["resumed"]["seq"])
        for seq in [s for s in self.pending if s <= committed]:
            self._acked(seq, None)  # committed; its ack went down with the last connection
        self.last_acked = max(self.last_acked, committed)
        self.connects += 1
        if self.connects > 1:
            self.replayed += len(self.pending)
        self._ws = ws
        self._ready.set()
        for seq, (data, _) in list(self.pending.items()):
            await ws.send(p.message(seq, data))
        async for raw in ws:
            d = json.loads(raw)
            if "ack" in d:
                self._acked(int(d["ack"]), d.get("result"))
