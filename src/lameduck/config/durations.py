"""Durations as operators write them ("150ms", "5s", "2m") and as code uses them (float seconds).

Config files, the admin API and the CLI all speak this one syntax, so it lives in one place.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Final

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

__all__ = ["Duration", "format_duration", "parse_duration"]

# Sub-second units divide (150 / 1000 is the float nearest 0.15; 150 * 0.001 is not).
_DIVISORS: Final[dict[str, int]] = {"us": 1_000_000, "ms": 1_000}
_MULTIPLIERS: Final[dict[str, int]] = {"s": 1, "m": 60, "h": 3600}
_DURATION_RE: Final = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(us|ms|s|m|h)")
_ACCEPTED: Final = (
    "expected a non-negative duration such as 250us, 150ms, 5s, 1.5s, 2m or 1h "
    "(units: us, ms, s, m, h), or a plain number of seconds"
)


def parse_duration(value: object) -> float:
    """Return seconds for "150ms", "5s", "2m", "1h", "250us" or a plain number of seconds.

    Strings need a unit: a bare "20" is rejected because "20 what?" is exactly the mistake that
    turns a 20 s drain into a 20 ms one. Raises ValueError saying what is accepted.
    """
    if isinstance(value, bool):  # bool is an int subclass; `time: yes` is never a duration
        raise ValueError(f"invalid duration {value!r}: {_ACCEPTED}")
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"invalid duration {value!r}: {_ACCEPTED}")
        return seconds
    if not isinstance(value, str):
        raise ValueError(f"invalid duration {value!r}: {_ACCEPTED}")
    text = value.strip()
    match = _DURATION_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid duration {value!r}: {_ACCEPTED}")
    number, unit = match.groups()
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


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": _DURATION_RE.pattern},
                {"type": "number", "minimum": 0},
            ],
            "description": "duration: 250us, 150ms, 5s, 2m, 1h, or seconds as a number",
        }
    ),
]
"""A config field holding a duration: accepts parse_duration's syntax, holds float seconds."""
