"""A small ASGI app behind ``ResumeMiddleware``, for the tests, the docs and trying it out:
``uvicorn lameduck.demo.resume_app:app``. Its session state counts what it committed, so a
seq applied twice would show.

Environment: ``LAMEDUCK_STORE`` (``sqlite:///…`` or ``redis://…``), ``LAMEDUCK_APP_NAME``
(answered as ``instance``), ``LAMEDUCK_GRACE``, ``LAMEDUCK_STAGGER`` and ``LAMEDUCK_LOCK_TTL``
(seconds).

- ``POST /work?ms=N`` (``Resume-Token``/``Resume-Seq``): works N ms, adds the seq to the state.
- ``POST /pay?ms=N`` (``Idempotency-Key``): works N ms, answers a new charge id.
- ``POST /fail`` and ``/conflict``: the app's own 500 and 409.
- WebSocket ``/ws``: each ``{"seq", "data"}`` is committed and acknowledged (``"crash"``
  makes the app raise).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from typing import Any
from urllib.parse import parse_qs

from lameduck.resume import SeqGap
from lameduck.resume.app_drain import Drain
from lameduck.resume.middleware import (
    Message,
    NoSession,
    Receive,
    ResumeMiddleware,
    Scope,
    Send,
)
from lameduck.resume.protocol import ack, error

NAME = os.environ.get("LAMEDUCK_APP_NAME", "app")
STORE = os.environ.get("LAMEDUCK_STORE", "sqlite:///tmp/lameduck-sessions.db")
_charges = itertools.count(1)


def _state(blob: bytes | None) -> dict[str, Any]:
    return json.loads(blob) if blob else {"count": 0, "sum": 0}


async def _reply(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


async def _body(receive: Receive) -> bytes:
    out = bytearray()
    while True:
        msg = await receive()
        out += msg.get("body", b"")
        if not msg.get("more_body", False):
            return bytes(out)


async def inner(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    if scope["type"] == "websocket":
        return await _ws(scope, receive, send)
    query = parse_qs(scope.get("query_string", b"").decode())
    await _body(receive)
    await asyncio.sleep(int(query.get("ms", ["0"])[0]) / 1000)
    session = scope.get("lameduck.session")
    if scope["path"] == "/work" and session is not None:
        state = _state(session.state)
        state["count"] += 1
        state["sum"] += session.seq
        session.state = json.dumps(state).encode()
        return await _reply(send, 200, {"instance": NAME, "token": session.token,
                                        "seq": session.seq, **state})
    if scope["path"] == "/fail":  # the app's own failure: not committed, replayed next time
        return await _reply(send, 500, {"instance": NAME, "error": "failed"})
    if scope["path"] == "/conflict":  # the app's own 409: an answer like any other
        return await _reply(send, 409, {"instance": NAME, "error": "conflict"})
    if scope["path"] == "/pay":
        return await _reply(send, 201, {"instance": NAME, "charge": next(_charges)})
    await _reply(send, 200, {"instance": NAME, "path": scope["path"]})


async def _ws(scope: Scope, receive: Receive, send: Send) -> None:
    msg: Message = await receive()
    await send({"type": "websocket.accept"})
    session = scope["lameduck.session"]
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            return
        d = json.loads(msg.get("text") or "{}")
        seq = d.get("seq")
        if d.get("data") == "crash":  # a message the app cannot take: uvicorn closes 1011
            raise RuntimeError("crash requested")
        if not isinstance(seq, int):
            await send({"type": "websocket.send", "text": error(None, "no_seq")})
            continue
        state = _state(session.state)
        state["count"] += 1
        state["sum"] += seq
        result = json.dumps({"instance": NAME, **state}).encode()
        try:
            c = await session.commit(seq, json.dumps(state).encode(), result)
        except SeqGap as e:
            await send({"type": "websocket.send", "text": error(seq, "seq_gap", e.last)})
            continue
        except NoSession:
            await send({"type": "websocket.send", "text": error(seq, "no_session")})
            continue
        await send({"type": "websocket.send", "text": ack(
            seq, json.loads(c.result) if c.result else None, replayed=not c.applied)})


app = ResumeMiddleware(
    inner, STORE, health_path="/health", drain_path="/_drain",
    lock_ttl=float(os.environ.get("LAMEDUCK_LOCK_TTL", "60")),
    drain=Drain(grace=float(os.environ.get("LAMEDUCK_GRACE", "20")),
                stagger=float(os.environ.get("LAMEDUCK_STAGGER", "2"))))
