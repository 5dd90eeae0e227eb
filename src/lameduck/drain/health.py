"""Endpoint health, sans-IO: active checks (HAProxy rise/fall), agent-check replies (HAProxy
``agent-check``) and passive outlier ejection (Envoy ``outlier_detection``).

Why three: an active check sees an endpoint that stopped answering; the agent lets the endpoint
itself say "drain me" or "I am at 50%" before a deploy; outlier ejection reacts within a few
requests to an endpoint that answers but fails, faster than any check interval. The clock
(``now``) is passed in; nothing here does I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Generic, TypeVar

from lameduck.drain.endpoint import AdminState

# --------------------------------------------------------------------------- active checks


class HealthCheck:
    """One endpoint's active health-check state with HAProxy's rise/fall semantics.

    Healthy: ``fall`` consecutive failures make it unhealthy; a success resets the streak.
    Unhealthy: ``rise`` consecutive successes make it healthy; a failure resets the streak.
    One counter suffices because ``healthy`` tells which way it counts. Unlike HAProxy, which
    starts a server "up, one failure from down", the initial state here is fully settled.
    """

    __slots__ = ("_streak", "fall", "healthy", "rise")

    def __init__(self, rise: int, fall: int, healthy: bool = True) -> None:
        if rise < 1 or fall < 1:
            raise ValueError("rise and fall must be >= 1")
        self.rise = rise
        self.fall = fall
        self.healthy = healthy
        self._streak = 0  # consecutive results against the current state

    def success(self) -> bool:
        """Record a passing check; True iff this made the endpoint healthy."""
        if self.healthy:
            self._streak = 0
            return False
        self._streak += 1
        if self._streak >= self.rise:
            self.healthy = True
            self._streak = 0
            return True
        return False

    def failure(self, immediate: bool = False) -> bool:
        """Record a failing check; True iff this made the endpoint unhealthy.

        ``immediate``: the endpoint asked to be taken out now (a 503 carrying Envoy's
        ``x-envoy-immediate-health-check-fail``), so ``fall`` is not waited for.
        """
        if not self.healthy:
            self._streak = 0
            return False
        self._streak += 1
        if immediate or self._streak >= self.fall:
            self.healthy = False
            self._streak = 0
            return True
        return False


# --------------------------------------------------------------------------- agent check

MAX_WEIGHT = 256  # HAProxy: a server weight is 0..256
_MAX_PERCENT = 25600  # HAProxy clamps a relative weight here before scaling (overflow guard)

_WORD = re.compile(r"[^ \t,]+")
_LINE_END = re.compile(r"[\r\n]")
_PERCENT = re.compile(r"(?:weight:)?([0-9]+)%", re.IGNORECASE)
_MAXCONN = re.compile(r"maxconn:([0-9]+)", re.IGNORECASE)
_ADMIN = {"ready": AdminState.READY, "drain": AdminState.DRAIN, "maint": AdminState.MAINT}
_HEALTH = {"up": True, "down": False, "fail": False, "failed": False, "stopped": False}


@dataclass(frozen=True, slots=True)
class AgentReport:
    """What one agent reply says; None: the reply did not mention it (leave it as it is)."""

    admin: AdminState | None = None
    up: bool | None = None
    weight_percent: int | None = None  # relative to the configured weight; see agent_weight
    maxconn: int | None = None
    description: str = ""
    unknown: tuple[str, ...] = ()  # words not understood, as received (HAProxy warns on them)


def parse_agent(line: bytes | str) -> AgentReport:
    """Parse one agent-check reply, following HAProxy's grammar (``tcpcheck.c``,
    ``tcpcheck_agent_expect_reply``, and configuration.txt §5.2 ``agent-check``):

    - the line ends at the first CR or LF; anything after it is ignored;
    - words are separated by spaces, tabs or commas, in any order, case-insensitive;
    - ``up``; ``down``, ``stopped``, ``fail`` (operational state);
    - ``ready``, ``drain``, ``maint`` (administrative state);
    - ``<n>%``: weight relative to the configured one (see ``agent_weight``);
    - ``maxconn:<n>``;
    - a word starting with ``#`` begins the description: the rest of the line, leading blanks
      skipped; words after it are not parsed;
    - several words of one kind: the last one wins.

    Deviations, all lenient: ``failed`` is accepted as ``fail`` and ``weight:<n>%`` as ``<n>%``
    (HAProxy knows neither); the description is kept even without a health word (HAProxy only
    logs it with one); a malformed weight or maxconn (``75%x``, ``maxconn:-1``) is listed in
    ``unknown`` rather than warned about; a line without CR/LF is taken whole (HAProxy waits for
    the end of line: framing is the caller's business). Percentages above 25600 are clamped to
    25600, as HAProxy does before scaling.
    """
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    end = _LINE_END.search(text)
    if end is not None:
        text = text[: end.start()]
    admin: AdminState | None = None
    up: bool | None = None
    weight: int | None = None
    maxconn: int | None = None
    description = ""
    unknown: list[str] = []
    for m in _WORD.finditer(text):
        word = m.group()
        if word[0] == "#":
            description = text[m.start() + 1 :].lstrip(" \t")
            break
        key = word.lower()
        if key in _HEALTH:
            up = _HEALTH[key]
        elif key in _ADMIN:
            admin = _ADMIN[key]
        elif (pm := _PERCENT.fullmatch(word)) is not None:
            weight = min(int(pm.group(1)), _MAX_PERCENT)
        elif (cm := _MAXCONN.fullmatch(word)) is not None:
            maxconn = int(cm.group(1))
        else:
            unknown.append(word)
    return AgentReport(admin, up, weight, maxconn, description, tuple(unknown))


def agent_weight(initial_weight: int, percent: int) -> int:
    """The effective weight an agent's ``<percent>%`` sets: HAProxy's
    ``initial * percent / 100`` (integer), capped at 256. 0% takes the endpoint out of the
    balancing like DRAIN (HAProxy shows it as DRAIN); any other percent keeps at least 1
    (weights here are small integers, default 1: 50% of 1 must not mean "out")."""
    percent = max(0, min(percent, _MAX_PERCENT))
    if percent == 0:
        return 0
    return max(1, min(initial_weight * percent // 100, MAX_WEIGHT))


# --------------------------------------------------------------------------- outlier ejection

K = TypeVar("K")


@dataclass(slots=True)
class _Host:
    c5xx: int = 0  # consecutive 5xx (gateway failures included)
    cgw: int = 0  # consecutive gateway failures
    backoff: int = 0  # the ejection multiplier k (Envoy: ejectTimeBackoff)
    until: float | None = None  # ejected until then; None: not ejected
    healthy_since: float | None = None  # when its last ejection ended (decay of k)


class OutlierDetector(Generic[K]):
    """Passive outlier ejection, Envoy's consecutive_5xx and consecutive_gateway_failure
    detectors (``outlier_detection_impl.cc``), over hashable host keys.

    - ``failure(gateway=True)`` (502/503/504, or a local failure: connect failure, reset,
      timeout) counts in both streaks; ``gateway=False`` (another 5xx) counts in the 5xx streak
      and, as in Envoy, resets the gateway streak. ``success`` resets both. The gateway
      detector is checked first. A count of 0 disables that detector. Every detection is
      enforced (Envoy's ``enforcing_*`` percentages are not modelled).
    - Ejection lasts ``min(base_ejection_time * k, max_ejection_time)``. k grows by one per
      ejection while ``k * base < max + base`` (Envoy's cap, so k stays bounded) and shrinks by
      one per whole ``base_ejection_time`` spent not ejected, computed lazily at the next
      ejection. Envoy decrements once per ``interval`` sweep instead; there is no sweep here.
    - An ejection is refused (``ejections_overflow``) when ejected/total would exceed
      ``max_ejection_percent``; with ``always_eject_one_host`` the first ejection is never
      refused. Envoy made that rule opt-in (``always_eject_one_host``, default false) after
      envoy#27909; here it defaults to on, as older Envoy always did.
    - Unejection is the caller's timer: ``next_uneject`` says when, ``uneject_due`` does it
      (and resets the streaks, as Envoy does). Until then the host stays ejected.
    """

    def __init__(
        self,
        consecutive_5xx: int,
        consecutive_gateway_failure: int,
        base_ejection_time: float,
        max_ejection_time: float,
        max_ejection_percent: int,
        *,
        always_eject_one_host: bool = True,
    ) -> None:
        if consecutive_5xx < 0 or consecutive_gateway_failure < 0:
            raise ValueError("consecutive counts must be >= 0 (0 disables)")
        if base_ejection_time <= 0 or max_ejection_time < base_ejection_time:
            raise ValueError("need 0 < base_ejection_time <= max_ejection_time")
        if not 0 <= max_ejection_percent <= 100:
            raise ValueError("max_ejection_percent must be 0..100")
        self.consecutive_5xx = consecutive_5xx
        self.consecutive_gateway_failure = consecutive_gateway_failure
        self.base_ejection_time = base_ejection_time
        self.max_ejection_time = max_ejection_time
        self.max_ejection_percent = max_ejection_percent
        self.always_eject_one_host = always_eject_one_host
        self._hosts: dict[K, _Host] = {}
        self._ejected: dict[K, float] = {}  # host → until
        # Envoy's stat names
        self.ejections_active = 0
        self.ejections_enforced_total = 0
        self.ejections_overflow = 0
        self.ejections_enforced_consecutive_5xx = 0
        self.ejections_enforced_consecutive_gateway_failure = 0
        self.ejections_detected_consecutive_5xx = 0
        self.ejections_detected_consecutive_gateway_failure = 0

    def add(self, host: K) -> None:
        """Count ``host`` among the hosts the percentage is computed over."""
        self._hosts.setdefault(host, _Host())

    def remove(self, host: K) -> None:
        """Forget ``host`` (an ejected one stops counting as ejected)."""
        if self._hosts.pop(host, None) is not None and self._ejected.pop(host, None) is not None:
            self.ejections_active -= 1

    def __len__(self) -> int:
        return len(self._hosts)

    def is_ejected(self, host: K) -> bool:
        return host in self._ejected

    def success(self, host: K, now: float) -> None:
        """A non-5xx response: both streaks start over."""
        h = self._hosts.get(host)
        if h is not None:
            h.c5xx = h.cgw = 0

    def failure(self, host: K, now: float, gateway: bool) -> bool:
        """A 5xx or a local failure; True iff this ejected ``host``. Unknown or already
        ejected hosts: nothing happens."""
        h = self._hosts.get(host)
        if h is None or h.until is not None:
            return False
        h.c5xx += 1
        h.cgw = h.cgw + 1 if gateway else 0
        gw_limit = self.consecutive_gateway_failure
        if gw_limit and h.cgw >= gw_limit:
            h.cgw = 0
            self.ejections_detected_consecutive_gateway_failure += 1
            if self._eject(host, h, now):
                self.ejections_enforced_consecutive_gateway_failure += 1
                return True
        limit = self.consecutive_5xx
        if limit and h.c5xx >= limit:
            h.c5xx = 0
            self.ejections_detected_consecutive_5xx += 1
            if self._eject(host, h, now):
                self.ejections_enforced_consecutive_5xx += 1
                return True
        return False

    def _eject(self, host: K, h: _Host, now: float) -> bool:
        # Envoy: 100 * (active + 1) / total <= max_percent, in integers.
        allowed = 100 * (self.ejections_active + 1) <= self.max_ejection_percent * len(self._hosts)
        if not allowed and not (self.always_eject_one_host and self.ejections_active == 0):
            self.ejections_overflow += 1
            return False
        base = self.base_ejection_time
        if h.healthy_since is not None:
            h.backoff = max(0, h.backoff - int((now - h.healthy_since) // base))
        if h.backoff * base < self.max_ejection_time + base:
            h.backoff += 1
        h.until = now + min(base * h.backoff, self.max_ejection_time)
        self._ejected[host] = h.until
        self.ejections_active += 1
        self.ejections_enforced_total += 1
        return True

    def uneject_due(self, now: float) -> list[K]:
        """Return to service every host whose ejection has ended by ``now``; earliest first."""
        due = sorted(
            (item for item in self._ejected.items() if item[1] <= now), key=lambda item: item[1]
        )
        for host, until in due:
            del self._ejected[host]
            h = self._hosts[host]
            h.until = None
            h.healthy_since = until  # the ejection ended then, however late we are told
            h.c5xx = h.cgw = 0
            self.ejections_active -= 1
        return [host for host, _ in due]

    def next_uneject(self) -> float | None:
        """When ``uneject_due`` next has work (None: nothing is ejected)."""
        return min(self._ejected.values(), default=None)
