"""The drain of one tunnel: relaying -> closing -> closed | reset.

A tunnel is a WebSocket (HTTP/1 Upgrade, or an HTTP/2 extended CONNECT stream, RFC 8441) or an
opaque one (CONNECT, an Upgrade to anything else). It sends no further response, so a response
cannot tell it to go away. Rules kept here (docs/tunnels.md, Envoy's draining docs):

- A connection drained by a response keeps its tunnels (``drain(now, RESPONSE)`` changes nothing).
- Drained proactively, an opaque tunnel ends at once on HTTP/1 and once G has elapsed on HTTP/2
  (Envoy's behaviour; it is reset and counted as cut).
- Drained proactively, a WebSocket is closed politely (beyond Envoy): a close 1001 "going away"
  is owed to each side, sent by the relay at the next frame boundary of that direction, and the
  close handshake is given until drained_at + G; then both sides are reset and counted as cut.
- An invalid frame closes that tunnel only: the side that sent it is owed 1002, the other side
  1001 (it did nothing wrong), each at a boundary of the direction toward it (toward the other
  side that is where the tracker stopped, before the bad frame); the sender's bytes are not read
  any more (RFC 6455 §7.1.7), so the handshake is done once the other side's close is seen.
- A close handshake already under way (a close has passed) is left to finish: nothing is owed.
- Done means both directions carried a close (each side sent one) and nothing is owed: close
  both sides cleanly. The process deadline (``drain(now, END)``) resets whatever is left.

    state     x input             -> state     action
    RELAYING    START_CLOSE          CLOSING     -           (WebSocket drained, or invalid frame)
    RELAYING    WAIT_GRACE           CLOSING     -           (opaque tunnel on HTTP/2 drained)
    RELAYING    CUT                  RESET       RESET_BOTH  (opaque on HTTP/1 drained; END)
    RELAYING    HANDSHAKE_DONE       CLOSED      CLOSE_BOTH  (the peers closed on their own)
    RELAYING    ENDED                CLOSED      -
    CLOSING     START_CLOSE          CLOSING     -           (an invalid frame while closing)
    CLOSING     SEND_TO_CLIENT       CLOSING     SEND_CLOSE_TO_CLIENT
    CLOSING     SEND_TO_UPSTREAM     CLOSING     SEND_CLOSE_TO_UPSTREAM
    CLOSING     HANDSHAKE_DONE       CLOSED      CLOSE_BOTH
    CLOSING     DEADLINE             RESET       RESET_BOTH
    CLOSING     CUT                  RESET       RESET_BOTH
    CLOSING     ENDED                CLOSED      -

When the close the relay sends is the last piece of the handshake (a side sent an invalid frame
after the other had closed), CLOSE_BOTH comes from ``timer`` at once (``next_deadline()`` is that
moment), so the close frame is written before the sockets close.

Anything else is a no-op (NOTHING). How the shell drives it: after each call, for each direction
where ``owes_close(flow)`` and that direction's frame tracker is at a boundary (feed with
``stop_at_boundary`` while a close is owed), call ``boundary(flow, now)``; on SEND_CLOSE_* write
``close_frame(close_code(flow))`` (masked toward the upstream) and from then on forward nothing
more in that direction, but keep feeding its tracker and report ``close_seen``. Keep one timer at
``next_deadline()``.
"""

from __future__ import annotations

from enum import Enum

from lameduck.drain.connection import DrainedBy

GOING_AWAY = 1001
PROTOCOL_ERROR = 1002


class TunnelKind(Enum):
    WEBSOCKET = "websocket"
    OPAQUE = "opaque"  # CONNECT, or an Upgrade other than websocket: no frames to close with


class Flow(Enum):
    """A direction of the relayed bytes, named by where they go."""

    TO_UPSTREAM = "to_upstream"  # sent by the client (masked WebSocket frames)
    TO_CLIENT = "to_client"  # sent by the upstream


class TunnelState(Enum):
    RELAYING = "relaying"
    CLOSING = "closing"
    CLOSED = "closed"
    RESET = "reset"


class TunnelAction(Enum):
    NOTHING = "nothing"
    SEND_CLOSE_TO_CLIENT = "send_close_to_client"  # unmasked, code close_code(TO_CLIENT)
    SEND_CLOSE_TO_UPSTREAM = "send_close_to_upstream"  # masked, code close_code(TO_UPSTREAM)
    CLOSE_BOTH = "close_both"  # graceful: close both sides (H1 staged close; H2 END_STREAM)
    RESET_BOTH = "reset_both"  # abort both sides; the tunnel counts as cut


class Input(Enum):
    START_CLOSE = "start_close"
    WAIT_GRACE = "wait_grace"
    CUT = "cut"
    SEND_TO_CLIENT = "send_to_client"
    SEND_TO_UPSTREAM = "send_to_upstream"
    HANDSHAKE_DONE = "handshake_done"
    DEADLINE = "deadline"
    ENDED = "ended"


S, A, In = TunnelState, TunnelAction, Input
TRANSITIONS: dict[tuple[TunnelState, Input], tuple[TunnelState, TunnelAction]] = {
    (S.RELAYING, In.START_CLOSE): (S.CLOSING, A.NOTHING),
    (S.RELAYING, In.WAIT_GRACE): (S.CLOSING, A.NOTHING),
    (S.RELAYING, In.CUT): (S.RESET, A.RESET_BOTH),
    (S.RELAYING, In.HANDSHAKE_DONE): (S.CLOSED, A.CLOSE_BOTH),
    (S.RELAYING, In.ENDED): (S.CLOSED, A.NOTHING),
    (S.CLOSING, In.START_CLOSE): (S.CLOSING, A.NOTHING),
    (S.CLOSING, In.SEND_TO_CLIENT): (S.CLOSING, A.SEND_CLOSE_TO_CLIENT),
    (S.CLOSING, In.SEND_TO_UPSTREAM): (S.CLOSING, A.SEND_CLOSE_TO_UPSTREAM),
    (S.CLOSING, In.HANDSHAKE_DONE): (S.CLOSED, A.CLOSE_BOTH),
    (S.CLOSING, In.DEADLINE): (S.RESET, A.RESET_BOTH),
    (S.CLOSING, In.CUT): (S.RESET, A.RESET_BOTH),
    (S.CLOSING, In.ENDED): (S.CLOSED, A.NOTHING),
}
del S, A, In

_SEND = {Flow.TO_CLIENT: Input.SEND_TO_CLIENT, Flow.TO_UPSTREAM: Input.SEND_TO_UPSTREAM}
_OTHER = {Flow.TO_CLIENT: Flow.TO_UPSTREAM, Flow.TO_UPSTREAM: Flow.TO_CLIENT}


class TunnelDrain:
    """The drain side of one tunnel; the shell owns the sockets, the frame trackers, the timer."""

    __slots__ = ("_code", "_done_at", "_owed", "_seen", "_sent", "deadline", "drained_at",
                 "grace", "http2", "kind", "state")

    def __init__(self, kind: TunnelKind, grace: float, http2: bool = False) -> None:
        if grace < 0:
            raise ValueError(f"grace must be >= 0, got {grace}")
        self.kind = kind
        self.grace = grace
        self.http2 = http2
        self.state = TunnelState.RELAYING
        self.drained_at: float | None = None  # when the closing began
        self.deadline: float | None = None  # drained_at + G while closing
        self._owed: dict[Flow, bool] = {Flow.TO_CLIENT: False, Flow.TO_UPSTREAM: False}
        self._seen: dict[Flow, bool] = {Flow.TO_CLIENT: False, Flow.TO_UPSTREAM: False}
        self._sent: dict[Flow, bool] = {Flow.TO_CLIENT: False, Flow.TO_UPSTREAM: False}
        self._done_at: float | None = None  # the handshake ended with a close we sent
        self._code: dict[Flow, int] = {Flow.TO_CLIENT: GOING_AWAY, Flow.TO_UPSTREAM: GOING_AWAY}

    @property
    def cut(self) -> bool:
        """Reset rather than closed: count it with the requests cut by the drain."""
        return self.state is TunnelState.RESET

    @property
    def done(self) -> bool:
        return self.state in (TunnelState.CLOSED, TunnelState.RESET)

    def owes_close(self, flow: Flow) -> bool:
        """A close must go into this direction at its next frame boundary."""
        return self.state is TunnelState.CLOSING and self._owed[flow]

    def close_code(self, flow: Flow) -> int:
        """The code of the close owed in this direction: 1001, or 1002 toward a bad sender."""
        return self._code[flow]

    def next_deadline(self) -> float | None:
        """The one moment the shell must call ``timer`` at, or None."""
        if self.state is not TunnelState.CLOSING:
            return None
        return self.deadline if self._done_at is None else self._done_at

    def _go(self, inp: Input) -> TunnelAction:
        step = TRANSITIONS.get((self.state, inp))
        if step is None:
            return TunnelAction.NOTHING
        self.state, action = step
        return action

    def _begin(self, now: float, inp: Input) -> TunnelAction:
        if self.state is TunnelState.RELAYING:
            self.drained_at = now
            self.deadline = now + self.grace
        return self._go(inp)

    def drain(self, now: float, by: DrainedBy) -> TunnelAction:
        """The tunnel's connection was drained ``by`` a response, proactively, or at the end."""
        if by is DrainedBy.END:
            return self._go(Input.CUT)
        if by is DrainedBy.RESPONSE or self.state is not TunnelState.RELAYING:
            return TunnelAction.NOTHING
        if self.kind is TunnelKind.OPAQUE:
            return self._begin(now, Input.WAIT_GRACE if self.http2 else Input.CUT)
        if not (self._seen[Flow.TO_CLIENT] or self._seen[Flow.TO_UPSTREAM]):
            self._owed[Flow.TO_CLIENT] = self._owed[Flow.TO_UPSTREAM] = True
        return self._begin(now, Input.START_CLOSE)

    def invalid(self, flow: Flow, now: float, at_boundary: bool = True) -> TunnelAction:
        """The sender of ``flow`` sent an invalid frame; its tracker stopped before it.

        ``at_boundary`` False (the bad frame began in an earlier, forwarded chunk) means no close
        can follow in ``flow``: its receiver gets none, and the end is a clean close anyway.
        """
        if self.kind is not TunnelKind.WEBSOCKET:
            raise ValueError("only a WebSocket has frames to be invalid")
        if self.done:
            return TunnelAction.NOTHING
        back = _OTHER[flow]
        if not (self._seen[back] or self._sent[back]):  # the bad sender gets 1002
            self._owed[back] = True
            self._code[back] = PROTOCOL_ERROR
        self._owed[flow] = at_boundary and not (self._seen[flow] or self._sent[flow])
        self._seen[flow] = True  # its sender is not listened to any more
        action = self._begin(now, Input.START_CLOSE)
        return self._check_done() or action

    def boundary(self, flow: Flow, now: float) -> TunnelAction:
        """``flow`` stands at a frame boundary: send the close owed there, if any."""
        if self.state is TunnelState.CLOSING and self.deadline is not None \
                and now >= self.deadline:
            return self._go(Input.DEADLINE)
        if not self.owes_close(flow):
            return TunnelAction.NOTHING
        self._owed[flow] = False
        self._sent[flow] = True
        if all(self._seen.values()) and not any(self._owed.values()):
            self._done_at = now  # the last close: CLOSE_BOTH from the timer, once it is written
        return self._go(_SEND[flow])

    def close_seen(self, flow: Flow) -> TunnelAction:
        """A close frame from the sender of ``flow`` went by (forwarded, or after ours)."""
        if self.done or self._seen[flow]:
            return TunnelAction.NOTHING
        self._seen[flow] = True
        self._owed[flow] = False  # it passed: the receiver has its close
        return self._check_done() or TunnelAction.NOTHING

    def _check_done(self) -> TunnelAction | None:
        if all(self._seen.values()) and not any(self._owed.values()):
            return self._go(Input.HANDSHAKE_DONE)
        return None

    def ended(self) -> TunnelAction:
        """The tunnel ended by itself (a side closed or reset); not cut by the drain."""
        return self._go(Input.ENDED)

    def timer(self, now: float) -> TunnelAction:
        """Advance time: past drained_at + G a tunnel still closing is reset."""
        if self._done_at is not None and now >= self._done_at:
            return self._go(Input.HANDSHAKE_DONE)
        if self.deadline is not None and now >= self.deadline:
            return self._go(Input.DEADLINE)
        return TunnelAction.NOTHING
