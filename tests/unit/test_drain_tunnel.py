"""A tunnel through a drain, on a fake clock: the table, scripted plays, and a simulated relay.

G = 5 unless said otherwise; the connection is drained at 10, so a tunnel still closing is reset
at 15. The relay simulation plays the shell's part with real ``FrameTracker``s over random frame
streams split at random points, and checks that a close never goes out mid-frame.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lameduck.drain.connection import DrainedBy
from lameduck.drain.tunnel import (
    TRANSITIONS,
    Flow,
    Input,
    TunnelAction,
    TunnelDrain,
    TunnelKind,
    TunnelState,
)
from lameduck.tunnel.websocket import (
    OP_BINARY,
    OP_CONT,
    OP_PING,
    OP_TEXT,
    FrameTracker,
    apply_mask,
    close_frame,
)

G = 5.0
FAST = settings(max_examples=150, deadline=None)

WS, OPAQUE = TunnelKind.WEBSOCKET, TunnelKind.OPAQUE
UP, DOWN = Flow.TO_UPSTREAM, Flow.TO_CLIENT  # DOWN: toward the client
PROACTIVE, RESPONSE, END = DrainedBy.PROACTIVE, DrainedBy.RESPONSE, DrainedBy.END
NOTHING = TunnelAction.NOTHING
TO_CLIENT, TO_UPSTREAM = TunnelAction.SEND_CLOSE_TO_CLIENT, TunnelAction.SEND_CLOSE_TO_UPSTREAM
CLOSE_BOTH, RESET_BOTH = TunnelAction.CLOSE_BOTH, TunnelAction.RESET_BOTH
RELAYING, CLOSING = TunnelState.RELAYING, TunnelState.CLOSING
CLOSED, RESET = TunnelState.CLOSED, TunnelState.RESET

Step = tuple[object, ...]


def apply(t: TunnelDrain, step: Step) -> TunnelAction:
    """Run one scripted input: ("drain", now, by), ("boundary", flow, now), ("close", flow),
    ("invalid", flow, now[, at_boundary]), ("timer", now), ("ended",)."""
    name, *args = step
    if name == "drain":
        return t.drain(*args)  # type: ignore[arg-type]
    if name == "boundary":
        return t.boundary(*args)  # type: ignore[arg-type]
    if name == "close":
        return t.close_seen(*args)  # type: ignore[arg-type]
    if name == "invalid":
        return t.invalid(*args)  # type: ignore[arg-type]
    if name == "timer":
        return t.timer(*args)  # type: ignore[arg-type]
    assert name == "ended"
    return t.ended()


# (name, kind, http2, [(input, expected action)], final state, code owed/sent to client/upstream)
PLAYS: list[tuple[str, TunnelKind, bool, list[tuple[Step, TunnelAction]], TunnelState]] = [
    ("websocket: close handshake completes", WS, False, [
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("boundary", DOWN, 10.0), TO_CLIENT),
        (("boundary", DOWN, 10.5), NOTHING),  # sent once
        (("boundary", UP, 11.0), TO_UPSTREAM),
        (("close", UP), NOTHING),  # the client answered
        (("close", DOWN), CLOSE_BOTH),  # the upstream answered
        (("timer", 15.0), NOTHING),
    ], CLOSED),
    ("websocket on HTTP/2: the same handshake", WS, True, [
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("boundary", UP, 10.0), TO_UPSTREAM),
        (("boundary", DOWN, 10.0), TO_CLIENT),
        (("close", DOWN), NOTHING),
        (("close", UP), CLOSE_BOTH),
    ], CLOSED),
    ("websocket: the upstream never answers, reset at drained_at + G", WS, False, [
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("boundary", DOWN, 10.0), TO_CLIENT),
        (("boundary", UP, 10.0), TO_UPSTREAM),
        (("close", UP), NOTHING),
        (("timer", 14.999), NOTHING),
        (("timer", 15.0), RESET_BOTH),
        (("close", DOWN), NOTHING),  # too late
    ], RESET),
    ("websocket: a direction never reaches a boundary", WS, False, [
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("boundary", UP, 12.0), TO_UPSTREAM),
        (("boundary", DOWN, 15.0), RESET_BOTH),  # the deadline has come: no late close
    ], RESET),
    ("websocket: a drain by response keeps the tunnel", WS, False, [
        (("drain", 10.0, RESPONSE), NOTHING),
        (("boundary", DOWN, 11.0), NOTHING),
        (("timer", 100.0), NOTHING),
    ], RELAYING),
    ("websocket: the process deadline resets it", WS, False, [
        (("drain", 10.0, RESPONSE), NOTHING),
        (("drain", 40.0, END), RESET_BOTH),
    ], RESET),
    ("websocket: the process deadline resets a closing one", WS, False, [
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("drain", 12.0, END), RESET_BOTH),
    ], RESET),
    ("websocket: the peers closed on their own before any drain", WS, False, [
        (("close", UP), NOTHING),
        (("close", DOWN), CLOSE_BOTH),
        (("drain", 10.0, PROACTIVE), NOTHING),
    ], CLOSED),
    ("websocket: a handshake under way is left to finish", WS, False, [
        (("close", UP), NOTHING),  # the client closed; the upstream owes the answer
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("boundary", DOWN, 10.0), NOTHING),  # nothing owed: the upstream's own close is due
        (("boundary", UP, 10.0), NOTHING),
        (("close", DOWN), CLOSE_BOTH),
    ], CLOSED),
    ("websocket: the tunnel ends by itself while closing", WS, False, [
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("boundary", DOWN, 10.0), TO_CLIENT),
        (("ended",), NOTHING),
        (("timer", 15.0), NOTHING),
    ], CLOSED),
    ("invalid frame from the client: 1002 to it, 1001 to the upstream", WS, False, [
        (("invalid", UP, 3.0), NOTHING),
        (("boundary", UP, 3.0), TO_UPSTREAM),
        (("boundary", DOWN, 3.5), TO_CLIENT),
        (("close", DOWN), CLOSE_BOTH),  # the upstream answered; the client is not listened to
    ], CLOSED),
    ("invalid frame, its start already forwarded: no close in that direction", WS, False, [
        (("invalid", DOWN, 3.0, False), NOTHING),
        (("boundary", DOWN, 3.0), NOTHING),
        (("boundary", UP, 3.0), TO_UPSTREAM),  # 1002 to the upstream that sent it
        (("timer", 8.0), RESET_BOTH),  # the client never closed
    ], RESET),
    ("invalid frame while draining keeps the drain's deadline", WS, False, [
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("boundary", UP, 10.0), TO_UPSTREAM),
        (("invalid", DOWN, 12.0), NOTHING),  # the upstream sent garbage after our close
        (("boundary", DOWN, 12.0), TO_CLIENT),
        (("timer", 14.0), NOTHING),
        (("close", UP), CLOSE_BOTH),
    ], CLOSED),
    ("invalid frame answered by the other side's close already sent", WS, False, [
        (("close", DOWN), NOTHING),  # the upstream closed; its close reached the client
        (("invalid", UP, 4.0), NOTHING),  # the client answers with garbage
        (("boundary", UP, 4.0), TO_UPSTREAM),  # the upstream still gets its answer
        (("timer", 4.0), CLOSE_BOTH),  # due at once: next_deadline() was 4.0
    ], CLOSED),
    ("CONNECT on HTTP/1: ends at once", OPAQUE, False, [
        (("drain", 10.0, PROACTIVE), RESET_BOTH),
    ], RESET),
    ("CONNECT on HTTP/2: ends once G has elapsed", OPAQUE, True, [
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("boundary", DOWN, 10.0), NOTHING),
        (("timer", 14.0), NOTHING),
        (("timer", 15.0), RESET_BOTH),
    ], RESET),
    ("CONNECT on HTTP/2: ends by itself within G", OPAQUE, True, [
        (("drain", 10.0, PROACTIVE), NOTHING),
        (("ended",), NOTHING),
        (("timer", 15.0), NOTHING),
    ], CLOSED),
    ("CONNECT drained by response", OPAQUE, False, [
        (("drain", 10.0, RESPONSE), NOTHING),
        (("drain", 20.0, PROACTIVE), RESET_BOTH),  # later drained proactively as well
    ], RESET),
]


@pytest.mark.parametrize(("name", "kind", "http2", "script", "final"), PLAYS,
                         ids=[p[0] for p in PLAYS])
def test_play(name: str, kind: TunnelKind, http2: bool,
              script: list[tuple[Step, TunnelAction]], final: TunnelState) -> None:
    t = TunnelDrain(kind, G, http2=http2)
    got = [(step, apply(t, step)) for step, _ in script]
    assert got == script
    assert t.state is final
    assert t.cut is (final is RESET)


def test_deadline_and_codes_on_the_clock() -> None:
    t = TunnelDrain(WS, G)
    assert t.next_deadline() is None
    t.drain(10.0, PROACTIVE)
    assert (t.drained_at, t.next_deadline()) == (10.0, 15.0)
    assert t.owes_close(UP) and t.owes_close(DOWN)
    assert (t.close_code(UP), t.close_code(DOWN)) == (1001, 1001)
    t.invalid(UP, 11.0)  # the client misbehaves during the drain: its close becomes 1002
    assert (t.close_code(UP), t.close_code(DOWN)) == (1001, 1002)
    assert t.next_deadline() == 15.0  # not pushed back
    t.timer(15.0)
    assert t.next_deadline() is None and t.cut


def test_invalid_from_upstream_codes() -> None:
    t = TunnelDrain(WS, G)
    t.invalid(DOWN, 2.0)
    assert (t.close_code(UP), t.close_code(DOWN)) == (1002, 1001)
    assert t.next_deadline() == 7.0


def test_invalid_after_our_close_went_out_sends_no_second_one() -> None:
    t = TunnelDrain(WS, G)
    t.drain(10.0, PROACTIVE)
    assert t.boundary(DOWN, 10.0) is TO_CLIENT
    t.invalid(UP, 11.0)
    assert not t.owes_close(DOWN)


def test_opaque_has_no_frames() -> None:
    with pytest.raises(ValueError):
        TunnelDrain(OPAQUE, G).invalid(UP, 1.0)
    with pytest.raises(ValueError):
        TunnelDrain(WS, -1.0)


def test_table_only_moves_forward() -> None:
    """Nothing leaves CLOSED or RESET; RESET is reached only by CUT or DEADLINE."""
    order = [RELAYING, CLOSING, CLOSED, RESET]
    for (state, inp), (nxt, _) in TRANSITIONS.items():
        assert state in (RELAYING, CLOSING)
        assert order.index(nxt) >= order.index(state)
        if nxt is RESET:
            assert inp in (Input.CUT, Input.DEADLINE)


# -- properties: whatever the order of inputs ------------------------------------------------------

flows = st.sampled_from([UP, DOWN])
inputs = st.one_of(
    st.tuples(st.just("drain"), st.sampled_from([PROACTIVE, RESPONSE, PROACTIVE, END])),
    st.tuples(st.just("boundary"), flows),
    st.tuples(st.just("close"), flows),
    st.tuples(st.just("invalid"), flows, st.booleans()),
    st.tuples(st.just("ended")),
    st.tuples(st.just("timer")),
)


@given(kind=st.sampled_from([WS, OPAQUE]), http2=st.booleans(),
       script=st.lists(st.tuples(st.floats(0, 3), inputs), max_size=20))
@FAST
def test_any_order_ends_by_drained_at_plus_g(kind: TunnelKind, http2: bool,
                                             script: list[tuple[float, tuple[object, ...]]]
                                             ) -> None:
    t = TunnelDrain(kind, G, http2=http2)
    now = 0.0
    sent: list[Flow] = []
    for dt, (name, *args) in script:
        now += dt
        if name == "invalid" and kind is OPAQUE:
            continue
        if t.deadline is not None:  # the shell's timer fires at next_deadline(), never later
            assert t.deadline == t.drained_at + G  # type: ignore[operator]
            at = t.next_deadline()
            if at is not None and now >= at and not t.done:
                assert at <= t.deadline
                # G ran out: reset; or the close we sent ended the handshake: close
                assert t.timer(at) is (RESET_BOTH if at == t.deadline and t._done_at is None
                                       else CLOSE_BOTH)
        step: Step
        if name in ("drain", "timer"):
            step = (name, now, *args)
        elif name in ("boundary", "invalid"):
            step = (name, args[0], now, *args[1:])
        else:
            step = (name, *args)
        owed = {f: t.owes_close(f) for f in (UP, DOWN)}
        was_done = t.done
        action = apply(t, step)
        if was_done:
            assert action is NOTHING  # nothing after the end
        if action in (TO_CLIENT, TO_UPSTREAM):
            flow = DOWN if action is TO_CLIENT else UP
            assert name == "boundary" and owed[flow]
            assert flow not in sent  # one close per direction at most
            sent.append(flow)
        if action is RESET_BOTH:
            assert t.cut
    if t.drained_at is not None:
        t.timer(t.drained_at + G)
        assert t.done
    elif not t.done:
        assert t.state is RELAYING and t.next_deadline() is None


# -- a relay played without sockets ----------------------------------------------------------------

KEY = b"\x0f\x1e\x2d\x3c"


def frame(opcode: int, payload: bytes, fin: bool, from_client: bool) -> bytes:
    b0 = (0x80 if fin else 0) | opcode
    n = len(payload)
    head = bytes((b0, n)) if n < 126 else bytes((b0, 126)) + n.to_bytes(2, "big")
    if from_client:
        head = bytes((head[0], head[1] | 0x80)) + head[2:]
        return head + KEY + apply_mask(payload, KEY)
    return head + payload


@st.composite
def messages(draw: st.DrawFn, from_client: bool) -> list[bytes]:
    """A peer's frames: data messages in 1-3 fragments with pings between; one may be invalid."""
    out: list[bytes] = []
    for _ in range(draw(st.integers(0, 6))):
        parts = draw(st.integers(1, 3))
        for i in range(parts):
            op = draw(st.sampled_from([OP_TEXT, OP_BINARY])) if i == 0 else OP_CONT
            size = draw(st.sampled_from([0, 3, 130, 300]))
            out.append(frame(op, b"m" * size, i == parts - 1, from_client))
            if draw(st.integers(0, 3)) == 0:
                out.append(frame(OP_PING, b"p", True, from_client))
    if out and draw(st.integers(0, 2)) == 0:  # a frame with RSV2 set somewhere
        at = draw(st.integers(0, len(out)))
        out.insert(at, bytes((0xA2, 0x81 if from_client else 0x01)) +
                   (KEY if from_client else b"") + b"x")
    return out


@dataclass
class Peer:
    """A WebSocket endpoint: sends its frames in chunks; answers a close after its current frame."""

    frames: deque[bytes]
    from_client: bool
    current: bytes = b""
    got_close: bool = False
    sent_close: bool = False
    stream: bytearray = field(default_factory=bytearray)  # all it sent
    ends: set[int] = field(default_factory=set)  # frame ends in stream

    def has_more(self) -> bool:
        return bool(self.current) or (not self.sent_close and (self.got_close or
                                                                 bool(self.frames)))

    def chunk(self, data: st.DataObject) -> bytes:
        if not self.current:
            if self.got_close:
                self.current = close_frame(1000, mask=self.from_client, mask_key=KEY)
                self.sent_close = True
            else:
                self.current = self.frames.popleft()
            self.ends.add(len(self.stream) + len(self.current))
        k = min(len(self.current), data.draw(st.sampled_from([1, 2, 3, 7, 64, 4096])))
        out, self.current = self.current[:k], self.current[k:]
        self.stream += out
        return out


class Relay:
    """What the I/O shell does with two ``FrameTracker``s and a ``TunnelDrain``."""

    def __init__(self, tunnel: TunnelDrain, client: Peer, upstream: Peer) -> None:
        self.tunnel = tunnel
        self.trackers = {UP: FrameTracker(from_client=True), DOWN: FrameTracker(from_client=False)}
        self.receiver = {UP: upstream, DOWN: client}
        self.out = {UP: bytearray(), DOWN: bytearray()}  # what each receiver got
        self.injected: dict[Flow, int | None] = {UP: None, DOWN: None}  # where our close went
        self.reported = {UP: False, DOWN: False}
        self.log: list[tuple[float, TunnelAction]] = []

    def act(self, action: TunnelAction, now: float) -> None:
        if action is NOTHING:
            return
        self.log.append((now, action))
        if action in (TO_CLIENT, TO_UPSTREAM):
            flow = DOWN if action is TO_CLIENT else UP
            self.injected[flow] = len(self.out[flow])
            self.out[flow] += close_frame(self.tunnel.close_code(flow), mask=flow is UP,
                                          mask_key=KEY if flow is UP else None)
            self.receiver[flow].got_close = True

    def boundaries(self, now: float) -> None:
        for flow in (UP, DOWN):
            if self.tunnel.owes_close(flow) and self.trackers[flow].at_boundary:
                self.act(self.tunnel.boundary(flow, now), now)

    def relay(self, flow: Flow, chunk: bytes, now: float) -> None:
        t = self.trackers[flow]
        data = memoryview(chunk)
        while data and t.error is None and not self.tunnel.done:
            k = t.feed(data, stop_at_boundary=self.tunnel.owes_close(flow))
            if self.injected[flow] is None:
                self.out[flow] += data[:k]
            data = data[k:]
            if t.close_seen and not self.reported[flow]:
                self.reported[flow] = True
                if self.injected[flow] is None:
                    self.receiver[flow].got_close = True  # forwarded
                self.act(self.tunnel.close_seen(flow), now)
            if t.error is not None:
                self.act(self.tunnel.invalid(flow, now, t.at_boundary), now)
            self.boundaries(now)


@given(data=st.data(), http2=st.booleans(), grace=st.sampled_from([0.0, 0.5, 1000.0]))
@settings(max_examples=120, deadline=None)
def test_relay_never_closes_mid_frame(data: st.DataObject, http2: bool, grace: float) -> None:
    client = Peer(deque(data.draw(messages(True))), from_client=True)
    upstream = Peer(deque(data.draw(messages(False))), from_client=False)
    tunnel = TunnelDrain(WS, grace, http2=http2)
    relay = Relay(tunnel, client, upstream)
    drain_at = data.draw(st.integers(0, 30)) * 0.1
    now, drained = 0.0, False
    while not tunnel.done:
        now = round(now + 0.1, 1)
        deadline = tunnel.next_deadline()
        if deadline is not None and now >= deadline:
            now = deadline
            relay.act(tunnel.timer(now), now)
            break
        if not drained and now >= drain_at:
            drained = True
            relay.act(tunnel.drain(now, PROACTIVE), now)
            relay.boundaries(now)
            continue
        senders = [(p, f) for p, f in ((client, UP), (upstream, DOWN)) if p.has_more()]
        if not senders:
            if drained or relay.trackers[UP].error or relay.trackers[DOWN].error:
                now = max(now, tunnel.next_deadline() or now)
                relay.act(tunnel.timer(now), now)
            break
        peer, flow = data.draw(st.sampled_from(senders))
        relay.relay(flow, peer.chunk(data), now)

    bad = any(t.error for t in relay.trackers.values())
    sent = sum(v is not None for v in relay.injected.values())
    event(f"{tunnel.state.value}, closes sent: {sent}, invalid frame: {bad}")
    for flow, sender in ((UP, client), (DOWN, upstream)):
        out = bytes(relay.out[flow])
        at = relay.injected[flow]
        if at is None:
            assert out == sender.stream[:len(out)]  # forwarded as is, never re-framed
            continue
        assert out[:at] == sender.stream[:at]
        assert at in sender.ends or at == 0  # never mid-frame
        check = FrameTracker(from_client=flow is UP)
        assert check.feed(out) == len(out) and check.error is None  # the receiver reads it whole
        assert check.at_boundary and check.close_code == tunnel.close_code(flow)
    if relay.log and relay.log[-1][1] is RESET_BOTH:
        assert tunnel.drained_at is not None
        assert relay.log[-1][0] <= tunnel.drained_at + grace
    if grace == 1000.0 and drained and not (relay.trackers[UP].error or
                                            relay.trackers[DOWN].error):
        assert tunnel.state is CLOSED  # cooperative peers finish the handshake in time
        assert relay.log[-1][1] is CLOSE_BOTH
