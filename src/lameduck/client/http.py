"""``ResumableClient``: an httpx client whose requests carry ``Resume-Token`` and the next
``Resume-Seq``. On "going away" (503), a 502/504 from the balancer, a cut connection or a
refused stream it waits (``Backoff``), goes back through the load balancer and presents the
same seq: the server applies it once, so only what never committed is redone."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from lameduck.client.backoff import Backoff, GaveUp
from lameduck.resume import protocol as p

# Statuses that mean "this instance did not do it; try again through the balancer".
RETRY_STATUSES = frozenset({502, 503, 504})


class ResumeGap(Exception):
    """The server's last committed seq is not where this client thinks it is (409)."""

    def __init__(self, last: int, seq: int) -> None:
        super().__init__(f"server committed up to seq {last}, this client sent {seq}")
        self.last = last
        self.seq = seq


class ResumableClient:
    def __init__(self, base_url: str = "", token: str | None = None, *, last_acked: int = 0,
                 backoff: Backoff | None = None, rng: random.Random | None = None,
                 client: httpx.AsyncClient | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 **httpx_kw: Any) -> None:
        self.token = token or uuid.uuid4().hex
        self.last_acked = last_acked
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()
        self.sleep = sleep
        self._own = client is None
        self.http = client or httpx.AsyncClient(base_url=base_url, **httpx_kw)
        self.retries = 0  # over the client's life: how often it went back

    async def request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        """Send the next seq until it is committed (or was already): the response."""
        seq = self.last_acked + 1
        headers = dict(kw.pop("headers", None) or {})
        headers[p.TOKEN] = self.token
        headers[p.SEQ] = str(seq)
        error: BaseException | None = None
        for attempt in range(self.backoff.max_attempts + 1):
            if attempt:
                self.retries += 1
                await self.sleep(self.backoff.delay(attempt - 1, self.rng))
            try:
                r = await self.http.request(method, url, headers=headers, **kw)
            except httpx.TransportError as e:  # cut, refused, reset, refused stream
                error = e
                continue
            if r.status_code in RETRY_STATUSES:
                error = httpx.HTTPStatusError(f"{r.status_code}", request=r.request,
                                              response=r)
                continue
            if r.status_code == 409 and p.LAST_SEQ in r.headers:
                raise ResumeGap(int(r.headers[p.LAST_SEQ]), seq)
            self.last_acked = max(self.last_acked, seq)
            return r
        raise GaveUp(f"seq {seq} not committed after {self.backoff.max_attempts} "
                     f"retries") from error

    async def post(self, url: str, **kw: Any) -> httpx.Response:
        return await self.request("POST", url, **kw)

    async def aclose(self) -> None:
        if self._own:
            await self.http.aclose()

    async def __aenter__(self) -> ResumableClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
