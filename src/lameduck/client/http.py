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

from lameduck.drain.backoff import Backoff
from lameduck.resume import protocol as p

# Statuses that mean "this instance did not do it; try again through the balancer".
RETRY_STATUSES = frozenset({502, 503, 504})
# Transport errors after which the request is surely not running any more. Not a read
# timeout: the request may still be running there, and sending it again would run it twice
# at once (commit-once keeps the store right, not the work).
RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError,
                httpx.RemoteProtocolError, httpx.PoolTimeout)
# httpx's own default (5 s for everything) would end a longer unit of work with a ReadTimeout
# that is not retried (above). Connecting stays quick, so a dead instance is left fast for
# another; reading, writing and waiting for a pooled connection may take minutes: work that
# resumes is often long. A read silent for longer is taken as a hung instance and raised.
DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=5.0)


class GaveUp(Exception):
    """``max_attempts`` reconnects failed; the last error is the cause."""


class ResumeGap(Exception):
    """The server's last committed seq is not where this client thinks it is (409)."""

    def __init__(self, last: int, seq: int) -> None:
        super().__init__(f"server committed up to seq {last}, this client sent {seq}")
        self.last = last
        self.seq = seq


class ResumableClient:
    """Requests go one at a time (a lock): each seq must commit before the next is sent.

    ``timeout`` (passed to httpx with the other keywords) defaults to ``DEFAULT_TIMEOUT``:
    connect 5 s, read, write and pool 300 s. A ``client`` passed in keeps its own.

    ``last_acked`` moves only on an answer that says it committed (``Resume-Last-Seq`` at
    or past the seq); any other answer (the app's 5xx, a 4xx of the middleware) is returned
    and the same seq is sent next time."""

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
        httpx_kw.setdefault("timeout", DEFAULT_TIMEOUT)
        self.http = client or httpx.AsyncClient(base_url=base_url, **httpx_kw)
        self.retries = 0  # over the client's life: how often it went back
        self._lock = asyncio.Lock()

    async def request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        """Send the next seq until it is committed (or was already): the response."""
        async with self._lock:
            return await self._request(method, url, **kw)

    async def _request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        seq = self.last_acked + 1
        headers = dict(kw.pop("headers", None) or {})
        headers[p.TOKEN] = self.token
        headers[p.SEQ] = str(seq)
        error: BaseException | None = None
        for attempt in range(self.backoff.max_attempts + 1):
            if attempt:
                self.retries += 1
                await self.sleep(self.backoff.delay(attempt - 1, self.rng.random))
            try:
                r = await self.http.request(method, url, headers=headers, **kw)
            except RETRY_ERRORS as e:  # cut, refused, reset, refused stream
                error = e
                continue
            if r.status_code in RETRY_STATUSES and p.LAST_SEQ not in r.headers:
                error = httpx.HTTPStatusError(f"{r.status_code}", request=r.request,
                                              response=r)
                continue
            last = r.headers.get(p.LAST_SEQ)
            if r.status_code == 409 and r.headers.get(p.GAP) == "true" and last is not None:
                raise ResumeGap(int(last), seq)
            if last is not None and last.isdigit() and int(last) >= seq:
                # committed (or, on a replay, the server was further along than this client
                # knew: its last seq is where the next one starts)
                self.last_acked = max(self.last_acked, int(last))
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
