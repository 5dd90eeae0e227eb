"""The access-log formatter: Envoy's operators and flag rendering, on a plain record."""

from __future__ import annotations

import json
from types import SimpleNamespace

from lameduck.proxy.accesslog import (
    CB,
    DEFAULT_FORMAT,
    GA,
    PD,
    RD,
    UF,
    UH,
    URX,
    compile_text,
    default_line,
    flag_string,
    json_line,
)


def record(**over: object) -> SimpleNamespace:
    ex = SimpleNamespace(
        method=b"POST", request_id=b"r-1", t0=100.0, sid=0, v10=False, status=204,
        flags=0, bytes_rx=154, bytes_tx=0, resp_fields=None, cluster=SimpleNamespace(name="app"),
        endpoint=SimpleNamespace(host="10.0.2.1", port=80, address="10.0.2.1:80"),
        down=SimpleNamespace(transport=None),
        log_req=(b"/api/v1/locations", None, [(b"host", b"locations")],
                 [b"user-agent: nsq2http\r\n", b"x-forwarded-for: 10.0.35.28\r\n\r\n"]))
    ex.__dict__.update(over)
    return ex


def test_flags_render_as_envoy_does_in_bit_order() -> None:
    assert flag_string(0) == "-"
    assert flag_string(UH) == "UH"
    assert flag_string(URX | UF) == "UF,URX"
    assert flag_string(PD | RD | GA | CB) == "GA,CB,RD,PD"


def test_default_format_is_envoy_layout() -> None:
    line = compile_text(DEFAULT_FORMAT)(record(), 100.25, 1460751420.5)
    assert line == ('[2016-04-15T20:17:00.250Z] "POST /api/v1/locations HTTP/1.1" 204 - 154 0 '
                    '250 - "10.0.35.28" "nsq2http" "r-1" "locations" "10.0.2.1:80"\n')
    # the default's own formatter writes the same text
    assert default_line(record(), 100.25, 1460751420.5) == line
    bare = record(endpoint=None, log_req=None, request_id=b"", method=b"GET")
    assert default_line(bare, 100.25, 1460751420.5) == compile_text(DEFAULT_FORMAT)(
        bare, 100.25, 1460751420.5)


def test_operators_alternatives_and_missing_values() -> None:
    fmt = compile_text("%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %REQ(TRACEPARENT)% %PROTOCOL% "
                       "%RESPONSE_FLAGS% %UPSTREAM_CLUSTER% %DOWNSTREAM_REMOTE_ADDRESS% "
                       "%REQUEST_ID% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%")
    ex = record(sid=3, flags=UF, log_req=(b"/p", b"a.test", [(b"traceparent", b"00-ab")], None),
                resp_fields=[(b"X-Envoy-Upstream-Service-Time", b"7")])
    assert fmt(ex, 100.0, 0.0) == "/p 00-ab HTTP/2 UF app - r-1 7"


def test_json_line_keys_named_after_the_operators() -> None:
    rec = json.loads(json_line(record(flags=GA, endpoint=None), 100.5, 1_000_000.0))
    assert rec["response_flags"] == "GA" and rec["duration"] == 500
    assert rec["upstream_host"] is None and rec["x_forwarded_for"] == "10.0.35.28"
    assert (rec["method"], rec["path"], rec["authority"]) == ("POST", "/api/v1/locations",
                                                               "locations")


def test_unknown_operator_is_refused() -> None:
    try:
        compile_text("%NOPE%")
    except ValueError as e:
        assert "NOPE" in str(e)
    else:
        raise AssertionError("an unknown operator was accepted")
