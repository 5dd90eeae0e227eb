"""Properties of the drain core over random drains, on a fake clock (hypothesis).

- A proactive moment always lies in its window [start + 2T/3, start + T - G).
- From T/2 on every response drains; before it, a response drains iff rng() < elapsed / (T/2).
- No request is both counted and refused: active == admitted - ended - cut at every point.
- Completion (shutdown_step EXIT) never precedes the end of the last request in flight.
- A drained connection that is idle is closed exactly at drained_at + G, never before; one the
  drain's end finds open and idle is closed at once (played on the real drain manager).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from lameduck.drain import (
    ConnAction,
    ConnState,
    DrainedBy,
    DrainEvent,
    DrainSettings,
    Ledger,
    ProcessDrain,
    ShutdownSettings,
    Step,
    Strategy,
    proactive_moment,
    proactive_window,
    response_drains,
)
from tests.drainplay import (
    CLOSE,
    DRAIN,
    END,
    FINAL,
    NOTICE,
    RESPONSE,
    RESPONSE_DRAINS,
    Play,
    ScriptedRng,
)

FAST = settings(max_examples=120, deadline=None)

times = st.floats(min_value=0.0, max_value=3600.0, allow_nan=False, allow_infinity=False)
starts = st.floats(min_value=-1e6, max_value=1e9, allow_nan=False, allow_infinity=False)
unit = st.floats(min_value=0.0, max_value=1.0, exclude_max=True, allow_nan=False)
strategies = st.sampled_from(list(Strategy))


@FAST
@given(start=starts, time=times, grace=times, accept_offset=st.floats(-1e4, 4000.0), r=unit)
def test_proactive_moment_lies_in_its_window(
    start: float, time: float, grace: float, accept_offset: float, r: float
) -> None:
    ev = DrainEvent(start, Strategy.GRADUAL, time, grace)
    accepted_at = start + accept_offset
    rng = ScriptedRng(r)
    moment = proactive_moment(ev, accepted_at, rng)
    window = proactive_window(ev)
    if window is None:
        assert moment is None
        return
    lo, hi = window
    assert lo == start + time * 2.0 / 3.0
    assert hi == start + time - grace
    if accepted_at > lo:
        assert moment is None
        assert not rng.drawn  # no draw for a connection that gets no moment
    else:
        assert moment is not None
        assert lo <= moment < hi
        assert moment >= accepted_at


@FAST
@given(start=starts, time=times, past_half=st.floats(0.0, 1e4), r=unit)
def test_from_half_t_every_response_drains(
    start: float, time: float, past_half: float, r: float
) -> None:
    ev = DrainEvent(start, Strategy.GRADUAL, time, 1.0)
    now = start + time / 2.0 + past_half
    if now - start < time / 2.0:  # float rounding at a far start: not past T/2 after all
        return
    assert response_drains(ev, now, ScriptedRng(r)) is True


@FAST
@given(time=st.floats(1e-3, 3600.0), frac=unit, r=unit)
def test_before_half_t_the_ramp_is_linear(time: float, frac: float, r: float) -> None:
    ev = DrainEvent(0.0, Strategy.GRADUAL, time, 1.0)
    now = frac * time / 2.0
    expected = now > 0.0 and r < now / (time / 2.0)
    assert response_drains(ev, now, ScriptedRng(r)) is expected
    assert response_drains(DrainEvent(0.0, Strategy.IMMEDIATE, time, 1.0), now,
                           ScriptedRng()) is True


# -- the ledger under random interleavings --------------------------------------------------------


class LedgerMachine(RuleBasedStateMachine):
    """begin / end / cut / SIGTERM / time passing, in any order, checked against a model."""

    admitted = Bundle("admitted")

    def __init__(self) -> None:
        super().__init__()
        self.pd = ProcessDrain(DrainSettings(time=10.0, grace=1.0),
                               ShutdownSettings(deadline=15.0, min_drain=1.0))
        self.pd.initialized()
        self.now = 0.0
        self.next_id = 0
        self.in_flight: set[int] = set()
        self.refused: set[int] = set()
        self.n_admitted = self.n_ended = self.n_cut = 0

    @rule(target=admitted)
    def begin(self) -> int:
        rid = self.next_id
        self.next_id += 1
        before = self.pd.ledger.active
        if self.pd.ledger.begin():
            self.in_flight.add(rid)
            self.n_admitted += 1
            assert self.pd.ledger.active == before + 1
        else:
            self.refused.add(rid)
            assert self.pd.ledger.active == before
            # refused only from T on, after SIGTERM
            assert self.pd.shutdown is not None and self.now >= self.pd.shutdown.ends_at
        return rid

    @rule(rid=consumes(admitted))
    def end(self, rid: int) -> None:
        if rid in self.in_flight:
            self.in_flight.remove(rid)
            self.pd.ledger.end()
            self.n_ended += 1

    @rule(rid=consumes(admitted))
    def cut(self, rid: int) -> None:
        if rid in self.in_flight:
            self.in_flight.remove(rid)
            self.pd.ledger.cut_one()
            self.n_cut += 1

    @precondition(lambda self: self.pd.shutdown is None)
    @rule()
    def sigterm(self) -> None:
        self.pd.start_shutdown(self.now)

    @rule(dt=st.sampled_from([0.0, 0.5, 3.0, 10.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.pd.tick(self.now)

    @invariant()
    def counted_exactly_once(self) -> None:
        ledger = self.pd.ledger
        assert ledger.active == self.n_admitted - self.n_ended - self.n_cut
        assert ledger.active == len(self.in_flight)
        assert ledger.refused == len(self.refused)
        assert not (self.refused & self.in_flight)
        assert ledger.active >= 0


TestLedgerInterleavings = LedgerMachine.TestCase
TestLedgerInterleavings.settings = settings(max_examples=40, stateful_step_count=30,
                                            deadline=None)


# -- completion never precedes the last in-flight request's end -----------------------------------


requests = st.lists(
    st.tuples(st.floats(0.0, 30.0), st.floats(0.0, 40.0)),  # (arrival, duration)
    max_size=12,
)


def end_due(ends: list[float], now: float, ledger: Ledger) -> None:
    for e in [e for e in ends if e <= now]:
        ends.remove(e)
        ledger.end()


@settings(max_examples=120, deadline=None)
@given(
    reqs=requests,
    sigterm=st.floats(0.0, 20.0),
    time=st.floats(0.0, 15.0),
    deadline=st.floats(0.0, 25.0),
    min_drain=st.floats(0.0, 5.0),
    conns=st.lists(st.integers(0, 3), min_size=1, max_size=8),
)
def test_exit_never_precedes_the_last_request(
    reqs: list[tuple[float, float]],
    sigterm: float,
    time: float,
    deadline: float,
    min_drain: float,
    conns: list[int],
) -> None:
    pd = ProcessDrain(DrainSettings(time=time, grace=1.0),
                      ShutdownSettings(deadline=deadline, min_drain=min_drain))
    pd.initialized()
    ledger = pd.ledger
    arrivals = sorted(reqs)
    ends: list[float] = []  # end times of admitted requests in flight
    marks = {sigterm} | {a for a, _ in arrivals} | {a + d for a, d in arrivals}
    now, step, i = -1.0, 0, 0  # every mark lies at or after 0
    while True:
        pending = [m for m in marks if m > now]
        nd = pd.next_deadline(now)
        if nd is not None:
            pending.append(nd)
        if not pending:
            break
        now = min(pending)
        # requests that end now, then SIGTERM, then arrivals (a request arriving at T is refused),
        # then the arrivals that also end now
        end_due(ends, now, ledger)
        if pd.shutdown is None and now >= sigterm:
            pd.start_shutdown(now)
        pd.tick(now)
        while i < len(arrivals) and arrivals[i][0] <= now:
            a, d = arrivals[i]
            i += 1
            if ledger.begin():
                ends.append(a + d)
        end_due(ends, now, ledger)
        assert ledger.active == len(ends)
        # the shell's connection count need not match requests (upstream requests, races)
        connections = conns[step % len(conns)]
        step += 1
        verdict = pd.shutdown_step(now, connections)
        if verdict is Step.EXIT:
            assert ledger.active == 0
            assert not ends
            assert now <= sigterm + deadline
            return
        if verdict is Step.CUT:
            assert now >= sigterm + deadline
            assert ledger.active > 0
            for _ in ends:
                ledger.cut_one()
            assert ledger.idle
            return
    raise AssertionError("a shutdown that was started never finished")


# -- an idle drained connection closes exactly at drained_at + G ----------------------------------


@settings(max_examples=150, deadline=None)
@given(
    start=st.floats(0.0, 1e6),
    time=st.floats(0.0, 600.0),
    grace=st.floats(0.0, 60.0),
    strategy=strategies,
    r=unit,
    how=st.sampled_from(["proactive", "response", "end"]),
    at=unit,
    probes=st.lists(unit, max_size=5),
)
def test_idle_drained_connection_closes_exactly_at_drained_at_plus_g(
    start: float, time: float, grace: float, strategy: Strategy, r: float, how: str,
    at: float, probes: list[float],
) -> None:
    ev = DrainEvent(start, strategy, time, grace)
    window = proactive_window(ev)
    rng_values = [r] if window is not None else []
    play = Play.through(ev, start, *rng_values)
    conn = play.conn
    when = start + at * (time + 1.0)
    if how == "proactive":
        if conn.proactive_at is None:
            return
        play.run(until=conn.proactive_at)
        if conn.proactive_at + grace > conn.proactive_at:  # G not lost to float rounding
            assert play.log == [(conn.proactive_at, NOTICE), (conn.proactive_at, DRAIN)]
    elif how == "response":
        play.rng.push(0.0)  # a ramp draw, if any, drains
        if conn.proactive_at is not None and when >= conn.proactive_at:
            return  # drained proactively first: covered above
        if not play.response(at=when):
            return
    else:
        if conn.proactive_at is not None and when >= conn.proactive_at:
            return
        play.close_at_end(at=when)  # the deadline leaves no G: an idle connection closes now
        assert conn.drained_by is DrainedBy.END and conn.drained_at == when
        assert play.log == [(when, END), (when, FINAL), (when, CLOSE)]
        assert conn.state is ConnState.CLOSING
        return
    drained_at = conn.drained_at
    assert drained_at is not None
    close_at = drained_at + grace
    # the close, or first a proactive moment still due for the tunnels of a response-drained
    # connection (as Envoy's draining docs describe)
    assert conn.next_deadline() in (close_at, None, conn.proactive_at)
    # probes strictly before the close never close it
    for p in probes:
        t = drained_at + p * grace
        if t < close_at and conn.state is ConnState.DRAINING:
            assert conn.on_timer(t, idle=True) is not ConnAction.CLOSE
    play.run(until=close_at + 10.0)
    closes = [t for t, a in play.log if a is CLOSE]
    assert closes == [close_at]
    assert [t for t, a in play.log if a == FINAL] == [close_at]  # the last word, then the close
    assert conn.state is ConnState.CLOSING


# -- drain.idle_close: on_response: nothing reaches an idle, untold connection before T + G --------


@settings(max_examples=150, deadline=None)
@given(
    start=st.floats(0.0, 1e6),
    time=st.floats(0.1, 600.0),
    grace=st.floats(0.0, 60.0),
    strategy=strategies,
    r=unit,
    ramp=st.lists(unit, min_size=6, max_size=6),
    requests=st.lists(st.tuples(unit, unit), max_size=6),
)
def test_on_response_never_tells_or_closes_an_idle_untold_connection_before_t_plus_g(
    start: float, time: float, grace: float, strategy: Strategy, r: float, ramp: list[float],
    requests: list[tuple[float, float]],
) -> None:
    """Requests at random moments (the client stops after a response that drains); whatever
    the drain does: a notice goes out only during a request (with its response, or at the
    moment of a busy connection) and a close only after a draining response, until T + G,
    which ends what is left."""
    ev = DrainEvent(start, strategy, time, grace)
    rng_values = ([r] if proactive_window(ev) is not None else []) + ramp
    play = Play.through(ev, start, *rng_values, on_response=True)
    end_at = start + time + grace
    busy: list[tuple[float, float]] = []
    told_at: float | None = None
    t = start
    for u, d in sorted(requests):
        begin = max(t, start + u * (time + grace))
        if play.state is not ConnState.OPEN and play.state is not ConnState.DRAINING:
            break
        play.begin(at=begin)
        finish = begin + d * (grace + 0.5)
        play.end(at=finish)
        busy.append((begin, finish))
        t = finish
        answers = [e for _, e in play.log if e in (RESPONSE, RESPONSE_DRAINS)]
        if answers[-1] == RESPONSE_DRAINS:  # its client is told: it sends no more here
            told_at = finish
            break
    play.run(until=max(end_at, t + grace) + 1.0)  # (a response after T + G: G after it)
    for when, entry in play.log:
        if when >= end_at:
            continue
        if entry == NOTICE:
            assert any(b <= when <= f for b, f in busy), (when, play.log)
        if entry is CLOSE:
            assert told_at is not None and when >= told_at, (when, play.log)
    if play.conn.proactive_at is not None:  # a connection with a moment is not left open
        assert play.state in (ConnState.CLOSING, ConnState.CLOSED), play.log


def test_on_response_end_with_a_request_in_flight_leaves_no_timer_behind() -> None:
    """A connection drained at its moment while busy, G = 0, its request still in flight at
    T + G: the end has come (its timer must not stay due: the shell's loop would spin on it),
    and the response that follows closes it. Found by the property above."""
    ev = DrainEvent(0.0, Strategy.GRADUAL, 0.5, 0.0)
    play = Play.through(ev, 0.0, *[0.0] * 7, on_response=True)
    play.begin(at=0.25)
    play.end(at=0.5)
    assert play.conn.next_deadline() is None
    assert play.state in (ConnState.CLOSING, ConnState.CLOSED), play.log
