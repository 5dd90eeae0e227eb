"""Has the load balancer let go? The evidence a listener sees on its health-check path, sans-IO.

A balancer that health-checks this server takes it out after ``fall`` consecutive failing
answers (HAProxy ``fall``, Envoy ``unhealthy_threshold``) and then sends it nothing new (HAProxy
marks the server DOWN, Envoy removes the host from the load-balancing set). The listener answers
those probes itself, so it can see the proof instead of waiting a fixed time for it.

Rules kept here:

- A *prober* is a source address that sent a request on the health-check path. Per prober: each
  probe's time, consecutive failing answers (not 2xx), when they reached ``fall`` (it *fell*),
  its interval (configured, or the median of its recent probe spacings: robust to HAProxy's
  ``spread-checks`` and Envoy's ``interval_jitter``), last seen.
- A prober not seen for ``GONE_INTERVALS`` x its interval is *gone*: no longer awaited (a
  balancer that dropped this server from its configuration stops probing it).
- Traffic (new connections, non-probe requests) is kept per source address, at most
  ``max_peers`` of them, the least recently active evicted first; what an evicted address last
  did still counts (as "evicted addresses"), so an eviction never hides traffic.
- Confirmed when at least one prober was seen, every live prober has fallen, and traffic is
  quiet: from a prober's address, nothing since it fell (or nothing for half its interval
  since the last straggler), from any other address nothing for ``quiet``. A probe may come on a new
  connection: a prober's connection after it fell is traffic unless a probe came on it.
- No prober seen: no proof; the caller's bound (``lb_buffer``) decides.
- Everything is by the time of the event, not the order it came in: with worker processes the
  main process replays each worker's 100 ms reports (``take_journal`` / ``replay``), which
  interleave; a late 2xx older than a failing answer does not undo it.

Pure: the clock is the caller's, every method takes ``now``.
"""

from __future__ import annotations

from bisect import insort
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

GONE_INTERVALS = 3.0  # a prober silent for this many intervals has stopped probing
SPACINGS = 8  # recent probe spacings kept per prober for the learned interval
QUIET_INTERVALS = 2.0  # ``quiet`` unset: this many probe intervals
MAX_FAILS = 4096  # failing answers kept per prober (the count stops there)
UNPROBED_KEPT = 64  # a prober's latest connections after its fall that carried no probe


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """A listener's ``lb_probes``; ``interval``/``quiet`` None: learned (see the module)."""

    fall: int = 3
    interval: float | None = None
    quiet: float | None = None
    max_peers: int = 1024

    def __post_init__(self) -> None:
        if self.fall < 1 or self.max_peers < 1:
            raise ValueError("fall and max_peers must be >= 1")
        if (self.interval is not None and self.interval <= 0) or (
                self.quiet is not None and self.quiet < 0):
            raise ValueError("interval must be > 0 and quiet >= 0")


@dataclass(slots=True)
class Prober:
    addr: str
    last: float
    probes: int = 0
    failing: int = 0  # consecutive failing answers (since the latest 2xx)
    fell: float | None = None  # when ``failing`` reached fall
    last_ok: float = float("-inf")  # the latest 2xx answer
    fails: list[float] = field(default_factory=list)  # failing answers since, in time order
    times: list[float] = field(default_factory=list)  # the recent probes, in time order
    # after it fell: the times of its new connections no probe came on (yet), its requests
    cx_unprobed: list[float] = field(default_factory=list)
    rq_after: int = 0
    last_rq_after: float = 0.0

    def learned(self) -> float | None:
        """The median of the recent spacings (None before the second probe). Spacings under a
        tenth of their mean are left out: probes that queued behind a stall of this server and
        were read together, not the prober's spacing (which would make it look gone between
        two such bursts)."""
        s = sorted(b - a for a, b in pairwise(self.times))
        if not s:
            return None
        floor = sum(s) / len(s) / 10
        s = [x for x in s if x >= floor] or s
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclass(slots=True)
class Talker:
    """New connections and non-probe requests from one source address."""

    addr: str
    last: float
    connections: int = 0
    requests: int = 0
    since_connections: int = 0  # since ``mark``
    since_requests: int = 0


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the tracker concludes at ``now``: ``confirmed`` and, in words, why or what is
    awaited; ``next_change``: when it may change with no new input (None: only on input)."""

    confirmed: bool
    detail: str
    awaited: tuple[str, ...] = ()
    next_change: float | None = None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class ProbeTracker:
    """One listener's probers and talkers (see the module for the rules)."""

    def __init__(self, settings: ProbeSettings | None = None) -> None:
        self.settings = settings or ProbeSettings()
        self.probers: OrderedDict[str, Prober] = OrderedDict()
        self.talkers: OrderedDict[str, Talker] = OrderedDict()
        self.evicted = 0  # talkers and probers dropped for max_peers
        self.evicted_last = -1.0  # the latest traffic of an evicted talker
        self.marked: float | None = None
        self.gone_logged: set[str] = set()
        # In a worker process: what it saw since it last reported, for the main process
        # (``take_journal`` there, ``replay`` here); None: nobody reads it.
        self.journal: list[tuple[str, float, str, int]] | None = None

    # -- input -----------------------------------------------------------------------------
    def probe(self, now: float, addr: str, status: int) -> None:
        """A request on the health-check path from ``addr``, answered ``status``."""
        if self.journal is not None:
            self.journal.append(("p", now, addr, status))
        p = self.probers.get(addr)
        if p is None:
            if len(self.probers) >= self.settings.max_peers:
                self.probers.popitem(last=False)
                self.evicted += 1
            p = self.probers[addr] = Prober(addr, now)
        else:
            self.probers.move_to_end(addr)
            p.last = max(p.last, now)
        insort(p.times, now)
        if len(p.times) > SPACINGS + 1:
            del p.times[0]
        p.probes += 1
        self.gone_logged.discard(addr)
        # Counted by time, not by arrival: the probes of one prober may come through several
        # worker processes, whose reports interleave (a late 2xx older than a failing answer
        # does not undo it).
        if 200 <= status < 300:
            if now >= p.last_ok:
                p.last_ok = now
                p.fails = [t for t in p.fails if t > now]
        elif now > p.last_ok and len(p.fails) < MAX_FAILS:
            insort(p.fails, now)
        fall = self.settings.fall
        fell = p.fails[fall - 1] if len(p.fails) >= fall else None
        if fell is None and p.fell is not None:
            p.rq_after = 0  # back in rotation (HAProxy rise)
            p.cx_unprobed.clear()
        p.fell = fell
        p.failing = len(p.fails)
        if fell is not None and now > fell:
            # the connection it came on (the latest not yet taken by a probe) was no traffic
            unprobed = p.cx_unprobed
            for i in range(len(unprobed) - 1, -1, -1):
                if unprobed[i] <= now:
                    del unprobed[i]
                    break

    def connection(self, now: float, addr: str) -> None:
        """A new connection from ``addr``."""
        t = self._heard("c", now, addr)
        t.connections += 1
        t.since_connections += 1
        p = self._fallen(now, addr)
        if p is not None:
            insort(p.cx_unprobed, now)
            if len(p.cx_unprobed) > UNPROBED_KEPT:
                del p.cx_unprobed[0]  # the latest are what a quiet window waits on

    def request(self, now: float, addr: str) -> None:
        """A request from ``addr`` that is not a probe."""
        t = self._heard("r", now, addr)
        t.requests += 1
        t.since_requests += 1
        p = self._fallen(now, addr)
        if p is not None:
            p.rq_after += 1
            p.last_rq_after = now

    def _heard(self, kind: str, now: float, addr: str) -> Talker:
        """Traffic from ``addr``: journaled for the main process, its talker."""
        if self.journal is not None:
            self.journal.append((kind, now, addr, 0))
        return self._talker(now, addr)

    def _fallen(self, now: float, addr: str) -> Prober | None:
        """The prober at ``addr`` if ``now`` is after its fall (its traffic is then evidence)."""
        p = self.probers.get(addr)
        return p if p is not None and p.fell is not None and now > p.fell else None

    def _talker(self, now: float, addr: str) -> Talker:
        t = self.talkers.get(addr)
        if t is None:
            if len(self.talkers) >= self.settings.max_peers:
                _, old = self.talkers.popitem(last=False)
                self.evicted += 1
                self.evicted_last = max(self.evicted_last, old.last)
            t = self.talkers[addr] = Talker(addr, now)
        else:
            self.talkers.move_to_end(addr)
            t.last = max(t.last, now)
        return t

    def take_journal(self) -> dict[str, list[list[object]]] | None:
        """What to report since the last call (None: nothing): each probe as it was, and the
        traffic folded per address (count, last time): a worker reports every 100 ms, and
        a request counted at its address's last time is counted late, never early."""
        j = self.journal
        if not j:
            return None
        self.journal = []
        probes: list[list[object]] = []
        folded: dict[tuple[str, str], list[float]] = {}
        for kind, at, addr, status in j:
            if kind == "p":
                probes.append([at, addr, status])
                continue
            f = folded.get((kind, addr))
            if f is None:
                folded[(kind, addr)] = [1, at]
            else:
                f[0] += 1
                f[1] = max(f[1], at)
        traffic: list[list[object]] = [[kind, addr, int(f[0]), f[1]]
                                       for (kind, addr), f in folded.items()]
        return {"probes": probes, "traffic": traffic}

    def replay(self, batch: dict[str, list[list[Any]]]) -> None:
        """Another process's ``take_journal``, fed in time order."""
        events: list[tuple[float, int, str, str, int]] = []
        for at, addr, status in batch.get("probes", []):
            events.append((float(at), 1, "p", str(addr), int(status)))
        for kind, addr, n, at in batch.get("traffic", []):
            events.append((float(at), 0, str(kind), str(addr), int(n)))
        for at, _, kind, addr, n in sorted(events):
            if kind == "p":
                self.probe(at, addr, n)
            elif kind == "c":
                for _ in range(n):
                    self.connection(at, addr)
            else:
                for _ in range(n):
                    self.request(at, addr)

    def mark(self, now: float) -> None:
        """The leave window begins (the health check fails): counts in words start here."""
        self.marked = now
        for t in self.talkers.values():
            t.since_connections = t.since_requests = 0

    # -- reading -----------------------------------------------------------------------------
    def interval(self, p: Prober) -> float | None:
        return self.settings.interval or p.learned()

    def gone(self, p: Prober, now: float) -> bool:
        iv = self.interval(p)
        return iv is not None and now - p.last >= GONE_INTERVALS * iv

    def quiet(self, now: float) -> float | None:
        """The quiet window: configured, else two of the longest interval of a live prober
        (of any prober seen, when none is live: a window that ended with its probers would
        leave traffic that stopped unquiet for good)."""
        if self.settings.quiet is not None:
            return self.settings.quiet
        ivs = [iv for p in self.probers.values()
               if not self.gone(p, now) and (iv := self.interval(p)) is not None]
        if not ivs:
            ivs = [iv for p in self.probers.values() if (iv := self.interval(p)) is not None]
        return QUIET_INTERVALS * max(ivs) if ivs else None

    def newly_gone(self, now: float) -> list[Prober]:
        """Probers gone since the last call (for a log line, once each)."""
        out = [p for p in self.probers.values()
               if p.addr not in self.gone_logged and self.gone(p, now)]
        self.gone_logged.update(p.addr for p in out)
        return out

    def evidence(self, now: float) -> Evidence:
        """The confirm rule at ``now`` (see the module)."""
        fall = self.settings.fall
        if not self.probers:
            return Evidence(False, "no prober seen on the health-check path: no proof, "
                                   "the bound decides", ("a prober",))
        quiet = self.quiet(now)
        awaited: list[str] = []  # traffic first, then the probers still awaited
        falling: list[str] = []
        fell: list[str] = []
        marks: list[float] = []  # when a wait may end with no input
        since = self.marked
        for p in self.probers.values():
            iv = self.interval(p)
            if self.gone(p, now):
                continue
            if iv is not None:
                marks.append(p.last + GONE_INTERVALS * iv)
            if p.fell is None:
                falling.append(f"prober {p.addr} has {p.failing}/{fall} failing answers")
                continue
            after = f"+{p.fell - since:.3f}s" if since is not None else f"{p.fell:.3f}"
            fell.append(f"prober {p.addr} fell at {after} ({p.failing}/{fall} failing)")
        gone = [p for p in self.probers.values() if self.gone(p, now)]
        # traffic: from a prober's address after it fell, from any other address at all
        for p in self.probers.values():
            if p.fell is None and not self.gone(p, now):
                continue  # awaited already; its traffic is expected until it falls
            t = self.talkers.get(p.addr)
            if p.fell is not None:
                # What it dispatched before it marked us down arrives within moments of its
                # fall: waited out for half its interval (it sends again sooner than that if it
                # has not stopped, and is seen), not the quiet window of a stranger.
                last = max(p.last_rq_after if p.rq_after else -1.0,
                           p.cx_unprobed[-1] if p.cx_unprobed else -1.0)
                settle = iv / 2 if (iv := self.interval(p)) is not None else quiet
                if last >= 0 and (settle is None or now < last + settle):
                    awaited.append(self._arriving(p.addr, t))
                    if settle is not None:
                        marks.append(last + settle)
            elif t is not None and (quiet is None or now < t.last + quiet):
                awaited.append(self._arriving(p.addr, t))
                if quiet is not None:
                    marks.append(t.last + quiet)
        for t in self.talkers.values():
            if t.addr in self.probers:
                continue
            if quiet is None or now < t.last + quiet:
                awaited.append(self._arriving(t.addr, t))
                if quiet is not None:
                    marks.append(t.last + quiet)
        if self.evicted_last >= 0 and (quiet is None or now < self.evicted_last + quiet):
            awaited.append(f"still arriving from evicted addresses ({self.evicted} evicted)")
            if quiet is not None:
                marks.append(self.evicted_last + quiet)
        awaited += falling
        nxt = min((m for m in marks if m > now), default=None)
        if awaited:
            return Evidence(False, ", ".join(awaited), tuple(awaited), nxt)
        words = fell + [f"prober {p.addr} gone (silent {now - p.last:.3f}s)" for p in gone]
        if quiet is not None and any(a not in self.probers for a in self.talkers):
            words.append(f"other addresses quiet for {quiet:.3f}s")
        return Evidence(True, ", ".join(words), (), None)

    def _arriving(self, addr: str, t: Talker | None) -> str:
        if t is None:
            return f"still arriving from {addr}"
        if self.marked is not None:
            rq, cx = t.since_requests, t.since_connections
        else:
            rq, cx = t.requests, t.connections
        return (f"still arriving from {addr} ({_plural(rq, 'request')}, "
                f"{_plural(cx, 'connection')})")

    def view(self, now: float, top: int = 10) -> dict[str, object]:
        """``/server_info``: the probers and the top talkers (most requests first)."""
        fall = self.settings.fall
        probers = []
        for p in self.probers.values():
            iv = self.interval(p)
            probers.append({
                "address": p.addr, "probes": p.probes, "failing": p.failing, "fall": fall,
                "fell_ago": None if p.fell is None else round(now - p.fell, 3),
                "interval": None if iv is None else round(iv, 3),
                "interval_learned": self.settings.interval is None,
                "last_seen_ago": round(now - p.last, 3), "gone": self.gone(p, now)})
        talkers = sorted(self.talkers.values(), key=lambda t: (-t.requests, -t.connections))
        return {
            "probers": probers,
            "top_talkers": [{"address": t.addr, "requests": t.requests,
                             "connections": t.connections,
                             "last_seen_ago": round(now - t.last, 3)}
                            for t in talkers[:top]],
            "peers": len(self.talkers), "evicted": self.evicted,
        }


def combine(now: float, trackers: list[ProbeTracker]) -> Evidence:
    """Every listener's balancer must have let go: the first listener still waiting says what
    it awaits; with no listener that answers probes, there is no proof."""
    if not trackers:
        return Evidence(False, "no listener has a health_check_path: no proof, the bound "
                               "decides", ("a prober",))
    seen = [t.evidence(now) for t in trackers]
    waiting = [e for e in seen if not e.confirmed]
    if waiting:
        marks = [e.next_change for e in waiting if e.next_change is not None]
        awaited = tuple(a for e in waiting for a in e.awaited)
        return Evidence(False, ", ".join(e.detail for e in waiting), awaited,
                        min(marks) if marks else None)
    return Evidence(True, "; ".join(e.detail for e in seen))
