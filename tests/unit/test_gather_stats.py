"""The main process's stats gathering over its workers: each gather waits for the reply to a
request of its own, so the numbers it reads reflect every message the worker got before it
(an endpoint's new state, say), even while an earlier request is still unanswered."""

from __future__ import annotations

import asyncio
from typing import Any

from lameduck.server.workers import WorkerSet


class Channel:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)


def _set(loop: asyncio.AbstractEventLoop) -> WorkerSet:
    ws = WorkerSet(loop, 1, {}, {}, [], lambda w: None, lambda w, m, n: None, lambda m: None)
    w = ws.workers[0]
    w.channel = Channel()  # type: ignore[assignment]
    w.ready = True
    return ws


def test_a_gather_behind_an_unanswered_one_asks_again_and_waits_for_its_own_reply() -> None:
    async def play() -> None:
        loop = asyncio.get_running_loop()
        ws = _set(loop)
        w = ws.workers[0]
        chan: Channel = w.channel  # type: ignore[assignment]
        first = loop.create_task(ws.gather_stats())  # a housekeeping gather, say
        await asyncio.sleep(0)
        ws.broadcast({"op": "endpoints", "cluster": "c", "hosts": []})
        second = loop.create_task(ws.gather_stats())  # an admin GET /stats after the change
        await asyncio.sleep(0)
        assert [m["op"] for m in chan.sent] == ["stats", "endpoints", "stats"]
        old = {"op": "stats", "stats": [["g", 1, "gauge"]], "clusters": [], "status": {}}
        ws._message(w, old)  # the reply to the first request: from before the change
        await asyncio.wait_for(first, 1)
        assert not second.done()  # that reply is not the one it asked for
        new = {"op": "stats", "stats": [["g", 0, "gauge"]], "clusters": [], "status": {}}
        ws._message(w, new)
        await asyncio.wait_for(second, 1)
        assert w.stats == [["g", 0, "gauge"]]

    asyncio.run(play())
