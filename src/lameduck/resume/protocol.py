"""The wire words of resume, shared by the ASGI middleware and ``lameduck.client``."""

from __future__ import annotations

import json
from typing import Any

# HTTP request headers (the client's): the session and this request's sequence number.
TOKEN = "Resume-Token"
SEQ = "Resume-Seq"
# HTTP response headers (the middleware's).
LAST_SEQ = "Resume-Last-Seq"      # the last committed seq (on a commit, a replay and a gap)
REPLAYED = "Resume-Replayed"      # "true": the stored result of an earlier commit
GAP = "Resume-Gap"                # "true" on the 409 of a seq that skips one
IDEMPOTENCY_KEY = "Idempotency-Key"
IDEMPOTENT_REPLAYED = "Idempotent-Replayed"

# WebSocket close code for "going away" (RFC 6455 §7.4.1), and uvicorn's "service restart".
GOING_AWAY = 1001
SERVICE_RESTART = 1012


def hello(token: str, seq: int) -> str:
    """The client's first WebSocket message: who it is and the last seq it saw acknowledged."""
    return json.dumps({"resume": {"token": token, "seq": seq}})


def parse_hello(text: str) -> tuple[str, int] | None:
    """``(token, seq)`` of a hello, or None for any other message."""
    if not text.startswith('{"resume"'):
        return None
    try:
        body = json.loads(text)["resume"]
        token, seq = body["token"], body["seq"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(token, str) or not token or not isinstance(seq, int) or seq < 0:
        return None
    return token, seq


def resumed(seq: int) -> str:
    """The middleware's answer to a hello: the last committed seq; replay what follows it."""
    return json.dumps({"resumed": {"seq": seq}})


def message(seq: int, data: Any) -> str:
    return json.dumps({"seq": seq, "data": data})


def ack(seq: int, result: Any = None, replayed: bool = False) -> str:
    """What an app answers a message with once it committed (or found it committed)."""
    return json.dumps({"ack": seq, "result": result, "replayed": replayed})


def error(seq: int | None, kind: str, last_seq: int | None = None) -> str:
    """What an app answers a message it will not commit with: ``seq_gap`` (replay from
    ``last_seq + 1``), ``no_session`` (no hello) or its own word; the client fails that call."""
    return json.dumps({"error": kind, "seq": seq, "last_seq": last_seq})
