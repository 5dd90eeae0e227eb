"""``ResumeMiddleware``: the server side of resume as ASGI, for uvicorn, hypercorn and granian.

- ``Resume-Token`` + ``Resume-Seq`` on a request: the seq is applied once. The next seq runs the
  app and is committed with the app's new session state and its response (buffered, so the
  answer a replay gets is the one the first attempt would have got); a seq already committed
  is answered from the store without running the app; a gap gets 409.
- ``Idempotency-Key`` (IETF httpapi draft): 409 while the original runs, 422 for the same key
  with another request, the stored response for a repeat.
- WebSockets: a first message ``{"resume": {"token", "seq"}}`` is answered with the last
  committed seq (the app never sees it); the app commits each message with
  ``scope["lameduck.session"].commit(seq, ...)``.
- While the process drains: 503 + ``Retry-After`` for new requests, close 1001 for WebSockets;
  at the deadline, what is left is cut and answers "going away" (nothing of it committed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import signal
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from lameduck.drain.commit import SeqGap, Verdict, parse_seq, verdict
from lameduck.resume import protocol as p
from lameduck.resume.app_drain import Drain
from lameduck.resume.store import LOCK_TTL, Claim, Committed, Session, SessionStore, open_store

log = logging.getLogger("lameduck.resume")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# Headers not stored with a result: they describe one connection, not the answer.
_NOT_STORED = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"date",
                         b"server", b"content-length"})


class ResumeSession:
    """What the app sees as ``scope["lameduck.session"]``: the session as loaded, the seq of
    this request (HTTP), and ``state``, which the app may replace; the middleware commits it."""

    def __init__(self, store: SessionStore, loaded: Session, seq: int = 0) -> None:
        self.store = store
        self.token = loaded.token
        self.last_seq = loaded.last_seq
        self.state = loaded.state
        self.seq = seq

    async def commit(self, seq: int, state: bytes | None = None,
                     result: bytes | None = None) -> Committed:
        """Commit ``seq`` (WebSocket apps): applied once, a replay otherwise (``applied``
        False, the stored result); ``SeqGap`` when seqs were skipped. After a replay the
        session is read again: another connection committed meanwhile, and the next seq
        must build on its state, not on what this one loaded."""
        if not self.token:
            raise NoSession("no resume token: the client did not say hello")
        c = await self.store.commit(self.token, seq, state, result)
        if c.applied:
            self.last_seq = seq
            if state is not None:
                self.state = state
        else:
            loaded = await self.store.load(self.token)
            self.last_seq, self.state = loaded.last_seq, loaded.state
        return c

    def resumed(self, loaded: Session) -> None:
        self.token, self.last_seq, self.state = loaded.token, loaded.last_seq, loaded.state


class NoSession(Exception):
    """A commit on a WebSocket whose client never resumed a session (no hello, no header)."""


class _Buffer:
    """The app's response, held until it is committed (bounded: a result is small)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.done = False
        self.too_large = False

    async def send(self, msg: Message) -> None:
        if msg["type"] == "http.response.start":
            self.status = msg["status"]
            self.headers = [(bytes(k).lower(), bytes(v)) for k, v in msg.get("headers", [])]
        elif msg["type"] == "http.response.body":
            self.body += msg.get("body", b"")
            if len(self.body) > self.limit:
                self.too_large = True
                self.body.clear()
            if not msg.get("more_body", False):
                self.done = True

    @property
    def complete(self) -> bool:
        """The whole response, within the limit: it can be stored."""
        return self.done and not self.too_large

    def encode(self) -> bytes:
        return encode_response(self.status, self.headers, bytes(self.body))


def encode_response(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    """A response as stored: JSON with latin-1 strings, which keep bytes exact."""
    kept = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in headers
            if k not in _NOT_STORED]
    return json.dumps({"status": status, "headers": kept,
                       "body": body.decode("latin-1")}).encode()


def decode_response(blob: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    d = json.loads(blob)
    return (d["status"], [(k.encode("latin-1"), v.encode("latin-1")) for k, v in d["headers"]],
            d["body"].encode("latin-1"))


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return bytes(v)
    return None


async def _respond(send: Send, status: int, body: bytes,
                   headers: list[tuple[bytes, bytes]] | None = None) -> None:
    hs = [(b"content-type", b"text/plain; charset=utf-8"),
          (b"content-length", str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body})


async def _replay_body(receive: Receive, limit: int) -> tuple[bytes | None, Receive]:
    """The whole request body (None past ``limit``) and a receive that hands it to the app."""
    chunks = bytearray()
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return None, receive
        chunks += msg.get("body", b"")
        if len(chunks) > limit:
            return None, receive
        if not msg.get("more_body", False):
            break
    body = bytes(chunks)
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return body, again


class ResumeMiddleware:
    """``ResumeMiddleware(app, store="redis://…" | "sqlite:///…" | SessionStore, …)``.

    ``drain``: the process's ``Drain`` (grace, stagger); ``drain_signal``: the signal that
    starts it (SIGTERM; None: only ``drain.begin()`` or the drain path); ``health_path``:
    answered here, 200 LIVE or 503 DRAINING with Envoy's immediate-fail header;
    ``drain_path``: ``POST`` from loopback starts the drain (for servers whose signals
    cannot be chained); ``retry_after``: seconds, on "going away"; ``key_scope``: the
    client an ``Idempotency-Key`` belongs to (e.g. the authenticated subject), so two
    clients' keys never meet (the draft's composite key)."""

    def __init__(self, app: ASGIApp, store: str | SessionStore, *, drain: Drain | None = None,
                 drain_signal: int | None = signal.SIGTERM, health_path: str | None = None,
                 drain_path: str | None = None, retry_after: int = 5,
                 max_result: int = 64 * 1024, max_body: int = 1024 * 1024,
                 lock_ttl: float = LOCK_TTL,
                 key_scope: Callable[[Scope], str] | None = None) -> None:
        self.app = app
        self._store_spec = store
        self._store: SessionStore | None = store if isinstance(store, SessionStore) else None
        self.drain = drain or Drain()
        self.drain_signal = drain_signal
        self.health_path = health_path
        self.drain_path = drain_path
        self.retry_after = str(retry_after).encode()
        self.max_result = max_result
        self.max_body = max_body
        self.lock_ttl = lock_ttl
        self.key_scope = key_scope
        self._owns_store = self._store is None  # a store passed in is the caller's to close
        self._armed = False

    @property
    def store(self) -> SessionStore:
        if self._store is None:
            assert isinstance(self._store_spec, str)
            self._store = open_store(self._store_spec)
        return self._store

    def _arm(self) -> None:
        """Install the drain signal once, on the server's loop (lifespan or first request)."""
        if not self._armed:
            self._armed = True
            if self.drain_signal is not None:
                self.drain.install(self.drain_signal)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            self._arm()
            path = scope["path"]
            if path == self.health_path:
                return await self._health(send)
            if path == self.drain_path and scope["method"] == "POST":
                return await self._drain_request(scope, send)
            if not self.drain.enter():
                return await self._going_away(send)
            try:
                await self._http(scope, receive, send)
            finally:
                self.drain.leave()
        elif kind == "websocket":
            self._arm()
            if not self.drain.enter():
                return await self._ws_going_away(receive, send)
            try:
                await self._websocket(scope, receive, send)
            finally:
                self.drain.leave()
        elif kind == "lifespan":
            await self._lifespan(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    # -- lifespan, health, drain trigger ------------------------------------------------------
    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def recv() -> Message:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                self._arm()
            elif (msg["type"] == "lifespan.shutdown" and self._owns_store
                  and self._store is not None):
                await self._store.close()
                self._store = None
            return msg
        await self.app(scope, recv, send)

    async def _health(self, send: Send) -> None:
        if self.drain.draining:
            await _respond(send, 503, b"DRAINING\n",
                           [(b"x-envoy-immediate-health-check-fail", b"true")])
        else:
            await _respond(send, 200, b"LIVE\n")

    async def _drain_request(self, scope: Scope, send: Send) -> None:
        client = scope.get("client") or ("", 0)
        # A request forwarded by a proxy on this host comes from loopback too: refuse those.
        forwarded = any(k in (b"forwarded", b"x-forwarded-for", b"x-real-ip")
                        for k, _ in scope.get("headers", ()))
        if client[0] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1") or forwarded:
            return await _respond(send, 403, b"the drain path answers direct loopback "
                                  b"requests only\n")
        self.drain.begin()
        await _respond(send, 202, b"draining\n")

    async def _going_away(self, send: Send, extra: list[tuple[bytes, bytes]] | None = None
                          ) -> None:
        await _respond(send, 503, b"going away\n",
                       [(b"retry-after", self.retry_after), (b"connection", b"close"),
                        *(extra or [])])

    # -- HTTP ---------------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _header(scope, b"resume-token")
        if token is not None:
            return await self._resumable(scope, receive, send, token.decode("latin-1").strip())
        key = _header(scope, b"idempotency-key")
        if key is not None and scope["method"] not in SAFE_METHODS:
            return await self._idempotent(scope, receive, send, key)
        started = False

        async def tracked(msg: Message) -> None:
            nonlocal started
            started = True
            await send(msg)
        if await self._run_app(scope, receive, tracked):
            if not started:
                await self._going_away(send)
            else:
                raise ConnectionAbortedError("cut at the drain deadline")

    async def _run_app(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Run the app where the drain deadline can cut it: True if it was cut."""
        task = asyncio.ensure_future(self.app(scope, receive, send))
        self.drain.tasks.add(task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:  # the server gave up on this request
            task.cancel()
            raise
        finally:
            self.drain.tasks.discard(task)
        if task.cancelled():
            return True
        task.result()  # the app's exception, if any, is the server's to answer
        return False

    async def _resumable(self, scope: Scope, receive: Receive, send: Send, token: str) -> None:
        try:
            seq = parse_seq(_header(scope, b"resume-seq"))
            if not token or len(token) > 200:
                raise ValueError("Resume-Token must be 1 to 200 characters")
            if seq < 1:
                raise ValueError("Resume-Seq of a request starts at 1")
        except ValueError as e:
            return await _respond(send, 400, f"{e}\n".encode())
        store = self.store
        try:
            loaded = await store.load(token)
        except Exception:
            log.exception("session store: load %r", token)
            return await self._store_down(send)
        v = verdict(loaded.last_seq, seq)
        if v is Verdict.REPLAY:
            return await self._stored(send, loaded.result, loaded.last_seq, p.REPLAYED)
        if v is Verdict.GAP:
            return await self._gap(send, SeqGap(token, loaded.last_seq, seq))
        session = ResumeSession(store, loaded, seq)
        scope = dict(scope)
        scope["lameduck.session"] = session
        buf = _Buffer(self.max_result)
        if await self._run_app(scope, receive, buf.send):
            return await self._going_away(send)  # cut: nothing committed; the client replays
        if not buf.complete:
            return await self._unstorable(send)
        if buf.status >= 500:  # a failure is not committed: the client may replay it
            return await self._send_buffer(send, buf)
        try:
            # (state unchanged: the loaded one, stored again; None: nothing to store)
            c = await store.commit(token, seq, session.state, buf.encode())
        except SeqGap as e:
            return await self._gap(send, e)
        except Exception:
            log.exception("session store: commit %r seq %d", token, seq)
            return await self._store_down(send)
        if not c.applied:  # another instance committed it meanwhile: its answer stands
            return await self._stored(send, c.result, c.last_seq, p.REPLAYED)
        await self._send_buffer(send, buf, [(p.LAST_SEQ.lower().encode(), str(seq).encode())])

    async def _send_buffer(self, send: Send, buf: _Buffer,
                           extra: list[tuple[bytes, bytes]] | None = None) -> None:
        await self._send(send, buf.status, buf.headers, bytes(buf.body), extra)

    async def _unstorable(self, send: Send) -> None:
        await _respond(send, 500, b"the response of a resumable or idempotent request must be "
                       b"complete and at most %d bytes\n" % self.max_result)

    async def _send(self, send: Send, status: int, headers: list[tuple[bytes, bytes]],
                    body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        hs = [(k, v) for k, v in headers if k not in _NOT_STORED]
        if status not in (204, 304) and status >= 200:
            hs.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status,
                    "headers": hs + (extra or [])})
        await send({"type": "http.response.body", "body": body})

    async def _stored(self, send: Send, blob: bytes | None, last: int | None, flag: str
                      ) -> None:
        extra = [(flag.lower().encode(), b"true")]
        if last is not None:
            extra.append((p.LAST_SEQ.lower().encode(), str(last).encode()))
        if blob is None:  # committed without a stored result
            return await _respond(send, 200, b"already committed\n", extra)
        status, headers, body = decode_response(blob)
        await self._send(send, status, headers, body, extra)

    async def _gap(self, send: Send, e: SeqGap) -> None:
        body = json.dumps({"error": "seq_gap", "last_seq": e.last, "seq": e.seq,
                           "detail": str(e)}).encode()
        await send({"type": "http.response.start", "status": 409, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
            (p.LAST_SEQ.lower().encode(), str(e.last).encode()),
            (p.GAP.lower().encode(), b"true")]})
        await send({"type": "http.response.body", "body": body})

    async def _store_down(self, send: Send) -> None:
        await _respond(send, 503, b"session store unavailable\n",
                       [(b"retry-after", b"1")])

    async def _idempotent(self, scope: Scope, receive: Receive, send: Send, raw: bytes) -> None:
        key = raw.decode("latin-1").strip().strip('"')
        if not key or len(key) > 255:
            return await _respond(send, 400, b"Idempotency-Key must be 1 to 255 characters\n")
        if self.key_scope is not None:
            key = f"{self.key_scope(scope)}\0{key}"
        body, receive = await _replay_body(receive, self.max_body)
        if body is None:
            return await _respond(send, 413, b"request body too large for an idempotent "
                                  b"request\n")
        digest = hashlib.sha256()
        for part in (scope["method"].encode(), scope.get("raw_path") or scope["path"].encode(),
                     scope.get("query_string", b""), body):
            digest.update(part)
            digest.update(b"\0")
        fp = digest.hexdigest()
        store = self.store
        try:
            claim = await store.claim_key(key, fp, self.lock_ttl)
        except Exception:
            log.exception("session store: claim %r", key)
            return await self._store_down(send)
        if claim.claim is Claim.RUNNING:
            return await _respond(send, 409, b"a request with this Idempotency-Key is still "
                                  b"being processed\n", [(b"retry-after", b"1")])
        if claim.claim is Claim.MISMATCH:
            return await _respond(send, 422, b"this Idempotency-Key was used for a different "
                                  b"request\n")
        if claim.claim is Claim.DONE:
            return await self._stored(send, claim.response, None, p.IDEMPOTENT_REPLAYED)
        owner = claim.owner
        buf = _Buffer(self.max_result)
        renewing = asyncio.ensure_future(self._renew(key, owner))
        try:
            cut = await self._run_app(scope, receive, buf.send)
        except BaseException:
            renewing.cancel()
            await store.release_key(key, owner)
            raise
        renewing.cancel()
        if cut or not buf.complete or buf.status >= 500:
            await store.release_key(key, owner)  # not done: a retry may run it
            if cut:
                return await self._going_away(send)
            if not buf.complete:
                return await self._unstorable(send)
            return await self._send_buffer(send, buf)
        try:
            await store.finish_key(key, owner, buf.encode())
        except Exception:
            log.exception("session store: finish %r", key)  # answered all the same
        await self._send_buffer(send, buf)

    async def _renew(self, key: str, owner: str) -> None:
        """Keep the key's "running" mark alive while its request runs (a third of the lock's
        life at a time): a long request is not taken for a dead one and run again."""
        while True:
            await asyncio.sleep(self.lock_ttl / 3)
            try:
                if not await self.store.renew_key(key, owner, self.lock_ttl):
                    log.warning("Idempotency-Key %r: the claim was lost while running", key)
                    return
            except Exception:
                log.exception("session store: renew %r", key)

    # -- WebSocket ----------------------------------------------------------------------------
    async def _ws_going_away(self, receive: Receive, send: Send) -> None:
        msg = await receive()
        if msg["type"] == "websocket.connect":
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": p.GOING_AWAY,
                        "reason": "going away"})

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        store = self.store
        session = ResumeSession(store, Session(""))
        scope = dict(scope)
        scope["lameduck.session"] = session
        state = {"accepted": False, "closed": False, "hello": False}
        raw_token = _header(scope, b"resume-token")
        token = raw_token.decode("latin-1").strip() if raw_token is not None else None
        if token is not None and not 0 < len(token) <= 200:
            token = None

        async def close_going_away() -> None:
            if state["accepted"] and not state["closed"]:
                state["closed"] = True
                with contextlib.suppress(Exception):  # the connection went first
                    await send({"type": "websocket.close", "code": p.GOING_AWAY,
                                "reason": "going away"})

        async def wsend(msg: Message) -> None:
            if state["closed"]:
                return  # told 1001 already: the client replays what was not acknowledged
            if msg["type"] == "websocket.accept":
                state["accepted"] = True
                self.drain.sockets[conn_id] = close_going_away
                await send(msg)
                if self.drain.draining:
                    return await close_going_away()
                if token is not None:  # resumed by the handshake's header: answer as a hello
                    await send({"type": "websocket.send", "text": p.resumed(session.last_seq)})
                return
            elif msg["type"] == "websocket.close":
                state["closed"] = True
            await send(msg)

        async def wreceive() -> Message:
            while True:
                msg = await receive()
                if msg["type"] == "websocket.connect" and token is not None:
                    session.resumed(await store.load(token))
                    state["hello"] = True
                if msg["type"] != "websocket.receive" or state["hello"]:
                    return msg
                text = msg.get("text")
                got = p.parse_hello(text) if text is not None else None
                if got is None:
                    state["hello"] = True  # a plain session: no resume (commit refuses)
                    return msg
                loaded = await store.load(got[0])
                session.resumed(loaded)
                state["hello"] = True
                await wsend({"type": "websocket.send", "text": p.resumed(loaded.last_seq)})

        conn_id = object()
        try:
            if await self._run_app(scope, wreceive, wsend):
                await close_going_away()  # cut at the deadline: what was not acked replays
        finally:
            self.drain.sockets.pop(conn_id, None)
