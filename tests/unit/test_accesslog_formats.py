"""Every access-log format operator and option lameduck knows, and unknown ones: what
``validate`` accepts (the config's validator) a listener builds and writes, as ``run`` builds
it (``open_access_log``); what one refuses the other refuses with the same words, the field
named. The real processes are checked in tests/integration/test_cli.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import lameduck.listeners  # noqa: F401  (registers the format check, as every command does)
from lameduck.config import ConfigError, load_config_text
from lameduck.proxy.accesslog import (
    CB,
    GA,
    OPERATORS,
    PD,
    RD,
    UF,
    FormatError,
    open_access_log,
)
from tests.unit.test_accesslog import record

NOW, WALL = 100.25, 1460751420.5  # the record started at 100.0: 2016-04-15T20:17:00.250Z

# (format, the line written for ``record()``, or None: refused with these words)
ACCEPTED: list[tuple[str, str]] = [
    ("%START_TIME%", "2016-04-15T20:17:00.250Z"),
    ("%START_TIME()%", "2016-04-15T20:17:00.250Z"),
    ("%START_TIME(%s)%", "1460751420"),
    ("%START_TIME(%s.%3f)%", "1460751420.250"),
    ("%START_TIME(%s.%6f)%", "1460751420.250000"),
    ("%START_TIME(%1f|%f)%", "2|250000000"),
    ("%START_TIME(%Y/%m/%dT%H:%M:%S%z %s)%", "2016/04/15T20:17:00+0000 1460751420"),
    ("%START_TIME(%a %A %b %B %d %e %j %u %w %y %p %I %D %F %R %T %Z %%)%",
     "Fri Friday Apr April 15 15 106 5 5 16 PM 08 04/15/16 2016-04-15 20:17 20:17:00 UTC %"),
    ("%PROTOCOL%", "HTTP/1.1"),
    ("%RESPONSE_CODE%", "204"),
    ("%RESPONSE_FLAGS%", "UF,GA"),
    ("%DRAIN_FLAGS%", "RD,PD"),
    ("%BYTES_RECEIVED%", "154"),
    ("%BYTES_SENT%", "0"),
    ("%DURATION%", "250"),
    ("%UPSTREAM_HOST%", "10.0.2.1:80"),
    ("%UPSTREAM_CLUSTER%", "app"),
    ("%DOWNSTREAM_REMOTE_ADDRESS%", "-"),
    ("%REQUEST_ID%", "r-1"),
    ("%REQ(USER-AGENT)%", "nsq2http"),
    ("%REQ(user-agent)%", "nsq2http"),
    ("%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%", "/api/v1/locations"),
    ("%REQ(:METHOD)% %REQ(:AUTHORITY)%", "POST locations"),
    ("%REQ(X-MISSING)%", "-"),
    ("%REQ(USER-AGENT):3%", "nsq"),  # Envoy's %REQ(X):Z%: at most Z characters
    ("%REQ(USER-AGENT):0%", ""),
    ("%REQ(X-MISSING):1%", "-"),
    ("%REQ(X-ENVOY-ORIGINAL-PATH?:PATH):4%", "/api"),
    ("%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%", "17"),
    ("%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME):1%", "1"),
    ("%RESP(X-MISSING):3%", "-"),
    ("literal text %RESPONSE_CODE% and more\n", "literal text 204 and more\n"),
]

REFUSED: list[tuple[str, str]] = [
    ("%RESPONSE_CODE_DETAILS%", "unknown operator %RESPONSE_CODE_DETAILS%"),
    ("%NOPE% %RESPONSE_CODE%", "unknown operator %NOPE%"),
    ("jsn", "'jsn' is neither \"json\" nor a format string"),
    ("JSON", "'JSON' is neither"),
    ("", "'' is neither"),
    ("100%", "no command operator at position 3"),
    ("%% %RESPONSE_CODE%", "no command operator at position 0"),
    ("%RESPONSE_CODE", "no command operator at position 0"),
    ("%response_code%", "no command operator at position 0"),
    ("%START_TIME(%Q)%", "unsupported specifier '%Q'"),
    ("%START_TIME(%Ez)%", "unsupported specifier '%E'"),
    ("%START_TIME(%0f)%", "unsupported specifier '%0'"),
    ("%START_TIME(%)%", "unsupported specifier '%'"),
    ("%START_TIME:10%", "only %REQ(X)% and %RESP(X)% take a length"),
    ("%DURATION:3%", "only %REQ(X)% and %RESP(X)% take a length"),
    ("%PROTOCOL(x)%", "%PROTOCOL% takes no argument"),
    ("%REQ%", "%REQ(X)% needs a header name"),
    ("%REQ()%", "%REQ(X)% needs a header name"),
    ("%RESP%", "%RESP(X)% needs a header name"),
    ("%REQ(A?B?C)%", "one header name, or two as X?Y"),
    ("%REQ(A?)%", "one header name, or two as X?Y"),
    ("%RESP(A?B)%", "one response header name"),
]


def line_of(fmt: str) -> str:
    ex = record(flags=UF | GA | RD | PD, resp_fields=[(b"X-Envoy-Upstream-Service-Time", b"17")])
    return _run_builds(fmt).text(ex, NOW, WALL)  # type: ignore[no-any-return]


def _run_builds(fmt: str | None) -> Any:
    """The access log ``run`` builds for a listener (listeners/http.py, listeners/tcp.py)."""
    loop = asyncio.new_event_loop()
    try:
        return open_access_log("stdout", fmt, loop)
    finally:
        loop.close()


def config_text(fmt: str | None, path: str = "stdout") -> str:
    import json

    log = {"path": path} if fmt is None else {"path": path, "format": fmt}
    return ("listeners:\n- name: ingress\n  address: 127.0.0.1:0\n  routes: [{cluster: app}]\n"
            f"  access_log: {json.dumps(log)}\n"
            "clusters:\n- name: app\n  endpoints: [127.0.0.1:9]\n")


def validate(fmt: str | None, path: str = "stdout") -> ConfigError | None:
    try:
        load_config_text(config_text(fmt, path), "cfg.yaml")
    except ConfigError as e:
        return e
    return None


def test_the_tables_name_every_operator() -> None:
    named = {f[1:].split("%")[0].split("(")[0].split(":")[0] for f, _ in ACCEPTED if "%" in f}
    assert set(OPERATORS) <= named | {"REQ", "RESP"}
    assert set(OPERATORS) <= named


@pytest.mark.parametrize(("fmt", "line"), ACCEPTED)
def test_validate_accepts_what_run_writes(fmt: str, line: str) -> None:
    assert validate(fmt) is None
    assert line_of(fmt) == line


@pytest.mark.parametrize(("fmt", "words"), REFUSED)
def test_validate_and_run_refuse_alike(fmt: str, words: str) -> None:
    error = validate(fmt)
    assert error is not None, fmt
    ((field, message),) = error.problems
    assert field == "listeners[0].access_log.format"
    assert words in message
    with pytest.raises(FormatError) as built:
        _run_builds(fmt)
    assert str(built.value) == message


@pytest.mark.parametrize("fmt", [None, "json"])
def test_the_default_and_json_options(fmt: str | None) -> None:
    assert validate(fmt) is None
    log = _run_builds(fmt)
    assert (log.text is None) == (fmt is None)  # None: Envoy's default by its own fast path


def test_a_path_run_cannot_open_is_refused_by_validate(tmp_path: Path) -> None:
    assert validate(None, str(tmp_path / "a.log")) is None
    assert not (tmp_path / "a.log").exists()  # validate creates nothing
    for path, words in ((str(tmp_path / "no" / "a.log"), "no directory"),
                        (str(tmp_path), "is a directory"), ("", '"stdout"')):
        error = validate(None, path)
        assert error is not None
        ((field, message),) = error.problems
        assert field == "listeners[0].access_log.path" and words in message, message
        with pytest.raises(OSError):  # what run met: open() failing at start
            _open_as_run_does(path)


def _open_as_run_does(path: str) -> None:
    loop = asyncio.new_event_loop()
    try:
        open_access_log(path, None, loop)
    finally:
        loop.close()


def test_drained_success_logs_no_response_flag() -> None:
    """RD/PD are %DRAIN_FLAGS%: a 200 that drained its connection has no failure flag."""
    ex = record(status=200, flags=RD | PD)
    log = _run_builds("%RESPONSE_FLAGS% %DRAIN_FLAGS%")
    assert log.text(ex, NOW, WALL) == "- RD,PD"
    ex = record(status=503, flags=CB | PD)
    assert log.text(ex, NOW, WALL) == "CB PD"
