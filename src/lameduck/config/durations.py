"""Durations as operators write them ("150ms", "5s", "2m") and as code uses them (float seconds).

Config files, the admin API and the CLI all speak this one syntax, so it lives in one place.
One rule everywhere: a number without a unit is seconds, whether YAML reads it as a number
(``10``, ``0.5``) or a string (``"5"``), and a flag's ``10`` means what ``time: 10`` means.
A unitless number above a plausible bound (an hour for a drain or a timeout) is refused: a
``20000`` meant as milliseconds would otherwise drain for five and a half hours. With a unit
(``20000s``, ``2h``) it is taken as written.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Final

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

__all__ = [
    "UNITLESS_MAX",
    "Duration",
    "LongDuration",
    "format_duration",
    "parse_duration",
]

# Sub-second units divide (150 / 1000 is the float nearest 0.15; 150 * 0.001 is not).
_DIVISORS: Final[dict[str, int]] = {"us": 1_000_000, "ms": 1_000}
_MULTIPLIERS: Final[dict[str, int]] = {"s": 1, "m": 60, "h": 3600}
_DURATION_RE: Final = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(us|ms|s|m|h)?")
_ACCEPTED: Final = (
    "expected a non-negative duration: a number of seconds (10, 0.5) or a number with a unit "
    "(250us, 150ms, 5s, 1.5s, 2m, 1h; units: us, ms, s, m, h)"
)
# The largest number of seconds written without a unit: drains, deadlines, timeouts and
# intervals are seconds to minutes; more than an hour is far likelier a slip of unit.
UNITLESS_MAX: Final = 3600.0
# Session persistence records (HAProxy's stick-table expire) plausibly live for hours.
UNITLESS_MAX_LONG: Final = 86400.0


def _implausible(value: object, seconds: float, unitless_max: float) -> ValueError:
    shown = str(value).strip()
    return ValueError(
        f"implausible duration {value!r}: a number without a unit is seconds, and {shown} s "
        f"({seconds / 3600:.1f} hours) is above the {format_duration(unitless_max)} allowed "
        f"without a unit; write {shown}s if you mean it, or {shown}ms if you meant "
        "milliseconds")


def parse_duration(value: object, *, unitless_max: float = UNITLESS_MAX) -> float:
    """Return seconds for "150ms", "5s", "2m", "1h", "250us", or a plain number of seconds
    (10, 0.5, "5") up to ``unitless_max``. Raises ValueError saying what is accepted."""
    if isinstance(value, bool):  # bool is an int subclass; `time: yes` is never a duration
        raise ValueError(f"invalid duration {value!r}: {_ACCEPTED}")
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"invalid duration {value!r}: {_ACCEPTED}")
        if seconds > unitless_max:
            raise _implausible(value, seconds, unitless_max)
        return seconds
    if not isinstance(value, str):
        raise ValueError(f"invalid duration {value!r}: {_ACCEPTED}")
    match = _DURATION_RE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"invalid duration {value!r}: {_ACCEPTED}")
    number, unit = match.groups()
    if unit is None:
        seconds = float(number)
        if seconds > unitless_max:
            raise _implausible(value, seconds, unitless_max)
        return seconds
    if unit in _DIVISORS:
        return float(number) / _DIVISORS[unit]
    return float(number) * _MULTIPLIERS[unit]


def format_duration(seconds: float) -> str:
    """Render seconds in the largest unit that keeps them exact: 120 -> "2m", 0.15 -> "150ms".

    The result always parses back to the same float, so dumped configs round-trip.
    """
    if isinstance(seconds, bool) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot format duration {seconds!r}: expected finite seconds >= 0")
    if seconds == 0:
        return "0s"
    for unit, factor in (("h", 3600), ("m", 60), ("s", 1)):
        whole = seconds / factor
        if whole == int(whole) and int(whole) * factor == seconds:
            return f"{int(whole)}{unit}"
    if seconds < 1:
        for unit, divisor in (("ms", 1_000), ("us", 1_000_000)):
            whole = round(seconds * divisor)
            if whole / divisor == seconds:
                return f"{whole}{unit}"
    text = repr(float(seconds))
    if "e" not in text and parse_duration(text + "s") == seconds:
        return text + "s"  # e.g. 1.5 -> "1.5s"
    # Below microsecond precision: keep it readable; exactness is not meaningful there.
    return f"{seconds * 1_000_000:.3f}".rstrip("0").rstrip(".") + "us"


def _schema(unitless_max: float) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": _DURATION_RE.pattern},
                {"type": "number", "minimum": 0, "maximum": unitless_max},
            ],
            "description": "duration: 250us, 150ms, 5s, 2m, 1h, or seconds as a number "
                           f"(without a unit at most {format_duration(unitless_max)})",
        }
    )


_AS_TEXT: Final = PlainSerializer(format_duration, return_type=str, when_used="json")

Duration = Annotated[
    float, BeforeValidator(parse_duration), _AS_TEXT, _schema(UNITLESS_MAX)]
"""A config field holding a duration: parse_duration's syntax, a unitless number at most 1h."""
LongDuration = Annotated[
    float, BeforeValidator(functools.partial(parse_duration, unitless_max=UNITLESS_MAX_LONG)),
    _AS_TEXT, _schema(UNITLESS_MAX_LONG)]
"""A duration that plausibly runs for hours (a persistence record): unitless up to a day."""
