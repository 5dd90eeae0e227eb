"""Upstream endpoint drain and persistence (Kemp LoadMaster's drain stop, HAProxy's DRAIN), sans-IO.

An endpoint has an admin state (READY, DRAIN, MAINT: HAProxy's words) and a health; a
persistence record (source IP or cookie → endpoint) decides where a new connection goes, in
exactly the order of Kemp LoadMaster's drain stop:

    persistence off                     → balance over READY, healthy endpoints
    no (live) record                    → balance, create a record
    record → endpoint down (or MAINT)   → discard, balance, new record
    record → endpoint up (READY)        → send there, refresh the record
    record → endpoint DRAIN, Layer 4    → discard, balance, new record (drain stop not applied)
    record → endpoint DRAIN, Layer 7    → send there and refresh until the drain-stop timer
                                          expires; then discard, balance, new record

``clear_persistence_on_drain`` stops honouring a DRAIN endpoint's records at once. Existing
connections are not touched by the timer, unless ``drain_stop`` is 0 (dropped at once) or
``drop_at_drain_end`` (severed when it expires). The clock is passed in; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Generic, NamedTuple, TypeVar


class AdminState(StrEnum):
    READY = "ready"
    DRAIN = "drain"
    MAINT = "maint"


class Layer(Enum):
    L4 = 4  # a TCP listener: drain stop does not apply
    L7 = 7  # an HTTP listener


class Route(Enum):
    """Where a new connection goes."""

    BALANCE = "balance"  # to any READY, healthy endpoint (the balancer picks)
    STICK = "stick"  # to the record's endpoint


class Decision(NamedTuple):
    route: Route
    discard: bool  # the record that was there is dropped (a new one follows a BALANCE)
    record: bool  # create (after BALANCE) or refresh (after STICK) the record


class ConnAction(Enum):
    KEEP = "keep"
    DROP = "drop"  # sever the endpoint's existing connections now


@dataclass(slots=True)
class EndpointDrain:
    """One endpoint's admin state, health and drain-stop timer."""

    drain_stop: float = 30.0  # seconds a DRAIN endpoint keeps its persistent clients (L7)
    drop_at_drain_end: bool = False  # sever its connections when the timer expires
    clear_persistence_on_drain: bool = False  # stop honouring its records at once
    state: AdminState = AdminState.READY
    healthy: bool = True
    drain_since: float | None = None  # when it entered DRAIN

    def set_state(self, state: AdminState, now: float) -> None:
        if state is AdminState.DRAIN and self.state is not AdminState.DRAIN:
            self.drain_since = now
        elif state is not AdminState.DRAIN:
            self.drain_since = None
        self.state = state

    @property
    def up(self) -> bool:
        """Takes new sessions: enabled and healthy."""
        return self.state is AdminState.READY and self.healthy

    def drain_stop_expired(self, now: float) -> bool:
        return self.drain_since is not None and now >= self.drain_since + self.drain_stop

    def connections(self, now: float) -> ConnAction:
        """What to do with the endpoint's existing connections (the drain-stop timer leaves
        them alone, unless drain_stop is 0 or drop_at_drain_end)."""
        if self.state is AdminState.MAINT:
            return ConnAction.KEEP  # halted for new work; in-flight finishes
        if self.state is not AdminState.DRAIN:
            return ConnAction.KEEP
        if self.drain_stop <= 0:
            return ConnAction.DROP
        if self.drop_at_drain_end and self.drain_stop_expired(now):
            return ConnAction.DROP
        return ConnAction.KEEP

    def next_change(self, now: float) -> float | None:
        """When ``connections`` or ``decide`` may change without other input (a timer)."""
        if self.drain_since is None:
            return None
        at = self.drain_since + self.drain_stop
        return at if at > now else None


def decide(persistence: bool, record: EndpointDrain | None, layer: Layer,
           now: float) -> Decision:
    """The drain-stop order for a new connection. ``record``: the endpoint a live persistence
    record names (None: no record, or it expired)."""
    if not persistence:
        return Decision(Route.BALANCE, False, False)
    if record is None:
        return Decision(Route.BALANCE, False, True)
    if not record.healthy or record.state is AdminState.MAINT:
        return Decision(Route.BALANCE, True, True)  # down: discard, re-balance, new record
    if record.state is AdminState.READY:
        return Decision(Route.STICK, False, True)  # up: there, refreshed
    # DRAIN ("disabled")
    if layer is Layer.L4 or record.clear_persistence_on_drain or record.drain_stop_expired(now):
        return Decision(Route.BALANCE, True, True)
    return Decision(Route.STICK, False, True)


K = TypeVar("K")
E = TypeVar("E")


class PersistenceTable(Generic[K, E]):
    """Source IP or cookie → endpoint, each record expiring ``timeout`` after its last use.
    Bounded: past ``max_records`` the oldest record is dropped."""

    def __init__(self, timeout: float, max_records: int = 100_000) -> None:
        if timeout <= 0 or max_records <= 0:
            raise ValueError("persistence timeout and size must be > 0")
        self.timeout = timeout
        self.max_records = max_records
        self._records: dict[K, tuple[E, float]] = {}  # insertion order = refresh order

    def __len__(self) -> int:
        return len(self._records)

    def lookup(self, key: K, now: float) -> E | None:
        found = self._records.get(key)
        if found is None:
            return None
        if now >= found[1]:
            del self._records[key]
            return None
        return found[0]

    def record(self, key: K, endpoint: E, now: float) -> None:
        """Create or refresh."""
        self._records.pop(key, None)
        self._records[key] = (endpoint, now + self.timeout)
        if len(self._records) > self.max_records:
            del self._records[next(iter(self._records))]

    def discard(self, key: K) -> None:
        self._records.pop(key, None)

    def expire(self, now: float) -> int:
        """Drop expired records (oldest first: refresh order is expiry order)."""
        n = 0
        records = self._records
        while records:
            key = next(iter(records))
            if records[key][1] > now:
                break
            del records[key]
            n += 1
        return n
