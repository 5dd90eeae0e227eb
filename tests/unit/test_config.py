"""lameduck.config: durations, the packaged default, and errors that name the field to fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

import lameduck.listeners  # noqa: F401  (registers the format check, as every command does)
from lameduck.config import (
    AdminConfig,
    ClusterConfig,
    Config,
    ConfigError,
    Direction,
    DrainType,
    HostPort,
    StopAccepting,
    Strategy,
    default_config,
    drain_settings,
    format_duration,
    load_config,
    load_config_text,
    parse_duration,
)
from lameduck.drain import IdleClose

# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("150ms", 0.15),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        ("0s", 0.0),
        ("0ms", 0.0),
        ("250us", 0.00025),
        (".5s", 0.5),
        ("90s", 90.0),
        (" 5s ", 5.0),
        (5, 5.0),
        (0, 0.0),
        (1.5, 1.5),
        ("5", 5.0),  # a plain number is seconds, as a string too
        ("0.5", 0.5),
        (" 10 ", 10.0),
        ("3600", 3600.0),  # the unitless bound itself
        (3600, 3600.0),
        ("2h", 7200.0),  # with a unit, as written
        ("20000s", 20000.0),
        ("20000ms", 20.0),
    ],
)
def test_parse_duration_valid(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", " ", "-5s", -1, -0.5, "-5", "5 s", "5x", "5sec", "1d", "s", "ms", "1.s", "5S",
     "1m30s", "nan", float("nan"), float("inf"), True, None, [], "5s5"],
)  # fmt: skip
def test_parse_duration_invalid_says_what_is_accepted(text: object) -> None:
    with pytest.raises(ValueError, match=r"invalid duration .*a number of seconds \(10, 0\.5\) "
                                         r"or a number with a unit .*units: us, ms, s, m, h"):
        parse_duration(text)


@pytest.mark.parametrize("value", [20000, "20000", 3600.5, "3601"])
def test_unitless_duration_over_an_hour_is_refused_with_the_units_to_write(value: object) -> None:
    """20000 meant as milliseconds must not drain for five and a half hours."""
    text = str(value)
    with pytest.raises(ValueError) as e:
        parse_duration(value)
    message = str(e.value)
    assert message.startswith(f"implausible duration {value!r}: a number without a unit is "
                              "seconds"), message
    assert f"write {text}s if you mean it, or {text}ms" in message
    assert "above the 1h allowed without a unit" in message


def test_unitless_bound_is_per_kind() -> None:
    assert parse_duration(7200, unitless_max=86400) == 7200.0
    with pytest.raises(ValueError, match="above the 24h allowed"):
        parse_duration(90000, unitless_max=86400)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.15, "150ms"),
        (5, "5s"),
        (5.0, "5s"),
        (120, "2m"),
        (90, "90s"),
        (3600, "1h"),
        (5400, "90m"),
        (1.5, "1.5s"),
        (0.00025, "250us"),
        (0.001, "1ms"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf")])
def test_format_duration_rejects(seconds: float) -> None:
    with pytest.raises(ValueError):
        format_duration(seconds)


@given(st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False))
def test_format_duration_round_trips(seconds: float) -> None:
    text = format_duration(seconds)
    if seconds >= 1e-6:
        assert parse_duration(text) == pytest.approx(seconds, rel=1e-9, abs=1e-9)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["us", "ms", "s", "m", "h"]))
def test_format_parse_exact_for_whole_units(n: int, unit: str) -> None:
    seconds = parse_duration(f"{n}{unit}")
    assert parse_duration(format_duration(seconds)) == seconds


# --- HostPort ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port", "loopback"),
    [
        ("127.0.0.1:10000", "127.0.0.1", 10000, True),
        ("127.1.2.3:1", "127.1.2.3", 1, True),
        ("[::1]:10000", "::1", 10000, True),
        ("[::]:80", "::", 80, False),
        ("[::ffff:127.0.0.1]:80", "::ffff:127.0.0.1", 80, True),
        ("localhost:9901", "localhost", 9901, True),
        ("0.0.0.0:0", "0.0.0.0", 0, False),
        ("app.default.svc.cluster.local:8080", "app.default.svc.cluster.local", 8080, False),
    ],
)
def test_hostport_parse(text: str, host: str, port: int, loopback: bool) -> None:
    address = HostPort.parse(text)
    assert (address.host, address.port, address.is_loopback) == (host, port, loopback)
    assert str(address) == text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("127.0.0.1", "expected 'host:port'"),
        (":80", "host is empty"),
        ("::1:80", "IPv6 hosts need brackets"),
        ("[::1]", r"expected '\[IPv6\]:port'"),
        ("[nope]:80", "is not an IPv6 address"),
        ("127.0.0.1:http", "is not a number"),
        ("127.0.0.1:65536", r"port must be 0\.\.65535"),
        ("127.0.0.1:-1", "is not a number"),
        ("999.0.0.1:80", "is not an IPv4 address"),
        ("bad host:80", "is not a valid host name"),
        ("-bad.example:80", "is not a valid host name"),
    ],
)
def test_hostport_parse_errors(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        HostPort.parse(text)


def test_endpoint_port_zero_rejected() -> None:
    with pytest.raises(ValueError, match=r"port must be 1\.\.65535"):
        HostPort.parse("127.0.0.1:0", min_port=1)


# --- the packaged default ----------------------------------------------------------------------


def test_default_config_matches_the_documented_values() -> None:
    config = default_config()
    assert config.admin.address == HostPort("127.0.0.1", 9901)
    assert config.admin.allow_non_loopback is False
    assert config.drain.time == 20.0
    assert config.drain.strategy is Strategy.GRADUAL
    assert config.drain.connection_grace == 5.0
    assert config.shutdown.deadline == 25.0
    assert config.shutdown.min_drain is None  # serve until T (drain.time)
    assert config.shutdown.stop_accepting is StopAccepting.AT_DRAIN_END
    [listener] = config.listeners
    assert listener.name == "ingress"
    assert listener.address == HostPort("127.0.0.1", 10000)
    assert listener.direction is Direction.INBOUND
    assert listener.drain_type is DrainType.DEFAULT
    assert listener.health_check_path == "/health_check.html"
    assert listener.request_headers_timeout == 10.0
    assert listener.idle_timeout == 75.0
    assert listener.max_connection_duration == 0.0  # none
    assert listener.send_timeout == 60.0
    assert listener.request_body_timeout == 30.0
    assert listener.max_requests_per_connection == 0  # none
    assert listener.max_request_headers_kb == 60
    [route] = listener.routes
    assert (route.prefix, route.cluster, route.host, route.timeout) == ("/", "demo", None, 5.0)
    [cluster] = config.clusters
    assert cluster.name == "demo"
    assert [e.address for e in cluster.endpoints] == [HostPort("127.0.0.1", 8080)]
    assert cluster.connect_timeout == 1.0
    assert cluster.max_idle_connections == 256
    assert cluster.idle_timeout == 30.0


def test_model_defaults_equal_the_yaml_defaults() -> None:
    """The model's defaults and default.yaml must not drift apart (the YAML documents them)."""
    config = default_config()
    assert config.admin == AdminConfig()
    assert config.drain == Config().drain
    assert config.shutdown == Config().shutdown
    listener = config.listeners[0]
    minimal = load_config_text(
        "listeners: [{name: ingress, address: 127.0.0.1:10000,"
        " health_check_path: /health_check.html, routes: [{cluster: demo}]}]\n"
        "clusters: [{name: demo, endpoints: [127.0.0.1:8080]}]\n"
    )
    assert minimal == config
    assert minimal.listeners[0] == listener


def test_default_config_is_frozen() -> None:
    config = default_config()
    with pytest.raises(ValidationError):
        config.drain.time = 1.0  # type: ignore[misc]
    assert isinstance(config.listeners, tuple)


def test_every_model_forbids_extra_keys_and_is_frozen() -> None:
    def walk(model: type[BaseModel]) -> list[type[BaseModel]]:
        found = [model]
        for field in model.model_fields.values():
            for candidate in (field.annotation, *getattr(field.annotation, "__args__", ())):
                if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                    found += walk(candidate)
        return found

    models = set(walk(Config))
    assert len(models) == 22
    for model in models:
        assert model.model_config.get("extra") == "forbid", model
        assert model.model_config.get("frozen") is True, model


def test_json_dump_round_trips() -> None:
    config = default_config()
    dumped = config.model_dump(mode="json")
    assert dumped["drain"]["time"] == "20s"
    assert dumped["listeners"][0]["address"] == "127.0.0.1:10000"
    assert dumped["listeners"][0]["idle_timeout"] == "75s"
    assert Config.model_validate(dumped) == config


def test_load_config_from_file(tmp_path: Path) -> None:
    path = tmp_path / "lameduck.yaml"
    path.write_text("drain: {time: 10s, strategy: immediate}\n")
    config = load_config(path)
    assert config.drain.time == 10.0
    assert config.drain.strategy is Strategy.IMMEDIATE
    assert config.listeners == ()
    assert load_config(str(path)) == config


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read"):
        load_config(path)


# --- errors name the field ---------------------------------------------------------------------

VALID = """
admin: {address: 127.0.0.1:9901}
drain: {time: 20s}
shutdown: {deadline: 25s}
listeners:
  - name: ingress
    address: 127.0.0.1:10000
    routes:
      - {prefix: /, cluster: app}
clusters:
  - name: app
    endpoints: [127.0.0.1:8080]
"""


def error_lines(text: str, source: str = "lameduck.yaml") -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(textwrap.dedent(text), source)
    return str(info.value).splitlines()


def test_valid_fixture_loads() -> None:
    config = load_config_text(VALID)
    assert config.listeners[0].routes[0].cluster == "app"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (  # unknown key, with the allowed ones
            "drain: {time: 20s}",
            "drain: {time: 20s, tyme: 3s}",
            "lameduck.yaml: drain.tyme: unknown key (allowed: time, strategy, connection_grace, "
            "idle_close, report_dir)",
        ),
        (  # unknown top-level section
            "drain: {time: 20s}",
            "drain: {time: 20s}\ndrian: {}",
            "lameduck.yaml: drian: unknown key (allowed: admin, drain, shutdown, listeners, "
            "clusters, hot_restart, workers)",
        ),
        (  # workers: a count or auto
            "drain: {time: 20s}",
            "drain: {time: 20s}\nworkers: many",
            "lameduck.yaml: workers: expected a number of worker processes from 1 to 256, or "
            "auto (one per CPU), got 'many'",
        ),
        (
            "drain: {time: 20s}",
            "drain: {time: 20s}\nworkers: 0",
            "lameduck.yaml: workers: expected a number of worker processes from 1 to 256, or "
            "auto (one per CPU), got 0",
        ),
        (  # unknown key inside a list item
            "{prefix: /, cluster: app}",
            "{prefix: /, cluster: app, retries: 3}",
            "lameduck.yaml: listeners[0].routes[0].retries: unknown key (allowed: prefix, "
            "cluster, host, timeout, per_try_idle_timeout)",
        ),
        (  # bad address
            "address: 127.0.0.1:10000",
            "address: 127.0.0.1",
            "lameduck.yaml: listeners[0].address: invalid address '127.0.0.1': expected "
            "'host:port', e.g. 127.0.0.1:10000",
        ),
        (  # bad endpoint
            "endpoints: [127.0.0.1:8080]",
            "endpoints: [127.0.0.1:8080, '127.0.0.1:0']",
            "lameduck.yaml: clusters[0].endpoints[1].address: invalid address '127.0.0.1:0': "
            "port must be 1..65535",
        ),
        (  # bad duration
            "drain: {time: 20s}",
            "drain: {time: 20 seconds}",
            "lameduck.yaml: drain.time: invalid duration '20 seconds': expected a non-negative "
            "duration: a number of seconds (10, 0.5) or a number with a unit (250us, 150ms, 5s, "
            "1.5s, 2m, 1h; units: us, ms, s, m, h)",
        ),
        (  # bad enum, with the offending value
            "drain: {time: 20s}",
            "drain: {time: 20s, strategy: fast}",
            "lameduck.yaml: drain.strategy: Input should be 'gradual' or 'immediate' (got 'fast')",
        ),
        (  # missing required key
            "    address: 127.0.0.1:10000\n",
            "",
            "lameduck.yaml: listeners[0].address: required key is missing",
        ),
        (  # unknown cluster in a route
            "{prefix: /, cluster: app}",
            "{prefix: /, cluster: ap}",
            "lameduck.yaml: listeners[0].routes[0].cluster: unknown cluster 'ap' (clusters: app)",
        ),
        (  # deadline shorter than the drain
            "shutdown: {deadline: 25s}",
            "shutdown: {deadline: 15s}",
            "lameduck.yaml: shutdown.deadline: must be >= drain.time (20s), got 15s: the drain "
            "has to fit before the deadline cuts what is left",
        ),
        (
            "shutdown: {deadline: 25s}",
            "shutdown: {deadline: 25s, min_drain: 30s}",
            "lameduck.yaml: shutdown.min_drain: must be <= shutdown.deadline (25s), got 30s",
        ),
        (  # non-loopback admin without opt-in
            "admin: {address: 127.0.0.1:9901}",
            "admin: {address: 0.0.0.0:9901}",
            "lameduck.yaml: admin.address: 0.0.0.0:9901 is not a loopback address (127.0.0.0/8, "
            "::1, localhost); whoever reaches the admin API can drain or stop the proxy. Set "
            "admin.allow_non_loopback: true to expose it anyway",
        ),
        (
            "- name: ingress",
            "- name: in gress",
            "lameduck.yaml: listeners[0].name: invalid name 'in gress': use only letters, "
            "digits, '_', '.' and '-' (it becomes a stat prefix)",
        ),
        (
            "{prefix: /, cluster: app}",
            "{prefix: api, cluster: app}",
            "lameduck.yaml: listeners[0].routes[0].prefix: invalid path 'api': must start with '/'",
        ),
        (
            "    address: 127.0.0.1:10000",
            "    address: 127.0.0.1:10000\n    health_check_path: health",
            "lameduck.yaml: listeners[0].health_check_path: invalid path 'health': must start "
            "with '/'",
        ),
        (
            "    address: 127.0.0.1:10000",
            "    address: 127.0.0.1:10000\n    max_request_headers_kb: 9000",
            "lameduck.yaml: listeners[0].max_request_headers_kb: Input should be less than or "
            "equal to 8192 (got 9000)",
        ),
        (
            "    routes:\n      - {prefix: /, cluster: app}",
            "    routes: []",
            "lameduck.yaml: listeners[0].routes: at least one route is required",
        ),
        (
            "{prefix: /, cluster: app}",
            "{prefix: /, cluster: app, host: 'example.com:80'}",
            "lameduck.yaml: listeners[0].routes[0].host: invalid host 'example.com:80': leave "
            "the port out (the Host header's port is ignored when matching)",
        ),
        (
            "    routes:\n      - {prefix: /, cluster: app}",
            "    http2: {max_concurrent_streams: 0}\n"
            "    routes:\n      - {prefix: /, cluster: app}",
            "lameduck.yaml: listeners[0].http2.max_concurrent_streams: Input should be greater "
            "than or equal to 1 (got 0)",
        ),
        (
            "    routes:\n      - {prefix: /, cluster: app}",
            "    tls: {certificate: /nonexistent/cert.pem, key: /dev/null}\n"
            "    routes:\n      - {prefix: /, cluster: app}",
            "lameduck.yaml: listeners[0].tls.certificate: cannot read '/nonexistent/cert.pem': "
            "No such file or directory",
        ),
        (
            "endpoints: [127.0.0.1:8080]",
            "endpoints: [127.0.0.1:8080]\n    connect_timeout: 0s",
            "lameduck.yaml: clusters[0].connect_timeout: must be greater than 0s, got 0s",
        ),
    ],
)
def test_error_names_the_field(old: str, new: str, expected: str) -> None:
    assert old in VALID
    assert error_lines(VALID.replace(old, new, 1)) == [expected]


def test_duplicate_listener_name_and_address() -> None:
    lines = error_lines(
        """
        listeners:
          - {name: ingress, address: 127.0.0.1:10000, routes: [{cluster: app}]}
          - {name: ingress, address: 127.0.0.1:10000, routes: [{cluster: app}]}
        clusters:
          - {name: app, endpoints: [127.0.0.1:8080]}
        """
    )
    assert lines == [
        "lameduck.yaml: listeners[1].name: duplicate listener name 'ingress' (also listeners[0])",
        "lameduck.yaml: listeners[1].address: duplicate address 127.0.0.1:10000: also "
        "listener 'ingress' (listeners[0].address)",
    ]


def test_duplicates_are_listed_one_line_each() -> None:
    lines = error_lines(
        """
        listeners:
          - {name: a, address: 127.0.0.1:9901, routes: [{cluster: app}]}
          - {name: b, address: 127.0.0.1:0, routes: [{cluster: app}]}
          - {name: c, address: 127.0.0.1:0, routes: [{cluster: app}]}
        clusters:
          - {name: app, endpoints: [127.0.0.1:8080]}
          - {name: app, endpoints: [127.0.0.1:8081]}
        """,
        "x.yaml",
    )
    assert lines == [
        "x.yaml: clusters[1].name: duplicate cluster name 'app' (also clusters[0])",
        "x.yaml: listeners[0].address: duplicate address 127.0.0.1:9901: also the admin API "
        "(admin.address)",
    ]  # port 0 twice is fine: each bind gets its own ephemeral port


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("0.0.0.0:8080", "127.0.0.1:8080",
         "127.0.0.1:8080 cannot be bound beside listener 'a' (listeners[0].address) on "
         "0.0.0.0:8080: 0.0.0.0 takes port 8080 on every IPv4 address"),
        ("127.0.0.1:8080", "0.0.0.0:8080",
         "0.0.0.0:8080 cannot be bound beside listener 'a' (listeners[0].address) on "
         "127.0.0.1:8080: 0.0.0.0 takes port 8080 on every IPv4 address"),
        ("'[::]:8080'", "127.0.0.1:8080",
         "127.0.0.1:8080 cannot be bound beside listener 'a' (listeners[0].address) on "
         "[::]:8080: [::] takes port 8080 on every IPv6 address and, dual-stack "
         "(net.ipv6.bindv6only=0), every IPv4 one"),
        ("'[::1]:8080'", "'[::]:8080'",
         "[::]:8080 cannot be bound beside listener 'a' (listeners[0].address) on [::1]:8080: "
         "[::] takes port 8080 on every IPv6 address and, dual-stack "
         "(net.ipv6.bindv6only=0), every IPv4 one"),
        ("localhost:8080", "127.0.0.1:8080",
         "duplicate address 127.0.0.1:8080: also listener 'a' (listeners[0].address)"),
        ("'[::ffff:127.0.0.1]:8080'", "127.0.0.1:8080",
         "duplicate address 127.0.0.1:8080: also listener 'a' (listeners[0].address)"),
    ],
)
def test_listeners_that_cannot_both_bind_are_refused_naming_both(first: str, second: str,
                                                                  expected: str) -> None:
    lines = error_lines(
        f"""
        listeners:
          - {{name: a, address: {first}, routes: [{{cluster: app}}]}}
          - {{name: b, address: {second}, routes: [{{cluster: app}}]}}
        clusters:
          - {{name: app, endpoints: [127.0.0.1:9000]}}
        """
    )
    assert lines == [f"lameduck.yaml: listeners[1].address: {expected}"]


@pytest.mark.parametrize(("first", "second"), [
    ("127.0.0.1:8080", "'[::1]:8080'"),  # two families, two specific addresses
    ("127.0.0.1:8080", "127.0.0.2:8080"),
    ("0.0.0.0:8080", "0.0.0.0:8081"),
    ("0.0.0.0:0", "127.0.0.1:0"),  # port 0: each bind gets its own port
])  # fmt: skip
def test_listeners_that_can_both_bind_pass(first: str, second: str) -> None:
    load_config_text(f"""
listeners:
  - {{name: a, address: {first}, routes: [{{cluster: app}}]}}
  - {{name: b, address: {second}, routes: [{{cluster: app}}]}}
clusters:
  - {{name: app, endpoints: [127.0.0.1:9000]}}
""")


def test_a_wildcard_listener_over_the_admin_address_is_refused() -> None:
    lines = error_lines(
        """
        admin: {address: 127.0.0.1:9901}
        listeners:
          - {name: a, address: 0.0.0.0:9901, routes: [{cluster: app}]}
        clusters:
          - {name: app, endpoints: [127.0.0.1:9000]}
        """
    )
    assert lines == ["lameduck.yaml: listeners[0].address: 0.0.0.0:9901 cannot be bound beside "
                     "the admin API (admin.address) on 127.0.0.1:9901: 0.0.0.0 takes port 9901 "
                     "on every IPv4 address"]


def test_several_problems_are_all_reported() -> None:
    lines = error_lines(
        """
        drain: {time: soon, strategy: fast}
        listeners:
          - {name: a, address: nowhere, routes: [{cluster: app}]}
        """
    )
    assert [line.split(": ")[1] for line in lines] == [
        "drain.time",
        "drain.strategy",
        "listeners[0].address",
    ]


def test_non_loopback_admin_with_opt_in() -> None:
    config = load_config_text(
        VALID.replace(
            "admin: {address: 127.0.0.1:9901}",
            "admin: {address: '[::]:9901', allow_non_loopback: true}",
        )
    )
    assert str(config.admin.address) == "[::]:9901"


@pytest.mark.parametrize("address", ["127.0.0.1:9901", "127.9.9.9:1", "[::1]:9901", "localhost:0"])
def test_loopback_admin_addresses(address: str) -> None:
    config = load_config_text(f"admin: {{address: '{address}'}}")
    assert config.admin.address.is_loopback


def test_ipv6_addresses() -> None:
    config = load_config_text(
        """
        listeners:
          - name: v6
            address: "[::1]:10000"
            routes: [{cluster: app, host: "[::1]"}]
        clusters:
          - name: app
            endpoints: ["[::1]:8080", "[2001:db8::1]:80"]
        """
    )
    assert config.listeners[0].address == HostPort("::1", 10000)
    assert str(config.listeners[0].address) == "[::1]:10000"
    assert [str(e.address) for e in config.clusters[0].endpoints] == [
        "[::1]:8080", "[2001:db8::1]:80"]


def test_route_host_is_lowercased() -> None:
    config = load_config_text(VALID.replace("cluster: app}", "cluster: app, host: API.Example}"))
    assert config.listeners[0].routes[0].host == "api.example"


def test_durations_accept_numbers_as_seconds() -> None:
    config = load_config_text("drain: {time: 12, connection_grace: 0.5}\nshutdown: {deadline: 30}")
    assert (config.drain.time, config.drain.connection_grace) == (12.0, 0.5)


def test_durations_accept_numeric_strings_as_seconds() -> None:
    config = load_config_text('drain: {time: "5", connection_grace: "0.5"}')
    assert (config.drain.time, config.drain.connection_grace) == (5.0, 0.5)


@pytest.mark.parametrize("text", ["drain: {time: 20000}", 'drain: {time: "20000"}'])
def test_unitless_drain_time_over_an_hour_is_refused_naming_the_field(text: str) -> None:
    [line] = error_lines(text, "big.yaml")
    assert line.startswith("big.yaml: drain.time: implausible duration "), line
    assert "write 20000s if you mean it, or 20000ms" in line


def test_a_long_drain_with_its_unit_is_taken_as_written() -> None:
    config = load_config_text("drain: {time: 2h}\nshutdown: {deadline: 2h}\n"
                              "hot_restart: {parent_shutdown_time: 7200s}")
    assert (config.drain.time, config.shutdown.deadline) == (7200.0, 7200.0)


def test_persistence_timeout_may_be_hours_without_a_unit() -> None:
    base = ("clusters: [{name: c, endpoints: [127.0.0.1:80], "
            "persistence: {type: source_ip, timeout: %s}}]")
    config = load_config_text(base % "7200")
    assert config.clusters[0].persistence is not None
    assert config.clusters[0].persistence.timeout == 7200.0
    [line] = error_lines(base % "90000", "p.yaml")
    assert line.startswith("p.yaml: clusters[0].persistence.timeout: implausible duration"), line


# --- YAML-level problems -----------------------------------------------------------------------


def test_yaml_syntax_error_has_line_and_column() -> None:
    [line] = error_lines("drain:\n  time: 20s\n   strategy: [gradual\n", "bad.yaml")
    assert line.startswith("bad.yaml: line 3, column ")
    assert "invalid YAML" in line


def test_yaml_duplicate_key_is_an_error() -> None:
    [line] = error_lines("drain: {time: 20s}\ndrain: {time: 5s}\n", "dup.yaml")
    assert line == "dup.yaml: line 2, column 1: invalid YAML: duplicate key 'drain'"


@pytest.mark.parametrize("text", ["", "   \n", "# only a comment\n", "~\n"])
def test_empty_file_is_an_error(text: str) -> None:
    assert error_lines(text, "empty.yaml") == [
        "empty.yaml: config is empty (expected a mapping of sections)"
    ]


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("hello\n", "str")])
def test_non_mapping_top_level_is_an_error(text: str, kind: str) -> None:
    assert error_lines(text, "x.yaml") == [
        f"x.yaml: top level must be a mapping of sections, got {kind}"
    ]


def test_every_problem_is_said_at_once_not_one_stage_per_run() -> None:
    """pydantic runs a model's cross-field rules only on a valid model: the rules across
    sections (unknown cluster, duplicate names, binds, deadline >= drain.time) still run on
    the sections and items that are valid, so one validate says them all."""
    lines = error_lines(textwrap.dedent("""
        drain: {strategy: sudden}
        shutdown: {deadline: 30s}
        hot_restart: {parent_shutdown_time: 1s}
        listeners:
          - {name: a, address: 127.0.0.1:10000, routes: [{cluster: nope}],
             idle_timeout: soon}
          - {name: a, address: 127.0.0.1:10000, routes: [{cluster: app}, {cluster: broken}]}
          - {name: c, address: 127.0.0.1:10001, routes: [{cluster: app}],
             access_log: {path: stdout, format: jsn}}
        clusters:
          - {name: app, endpoints: [127.0.0.1:8080]}
          - {name: broken, endpoints: [127.0.0.1:8080], connect_timeout: 0s}
          - {name: app, endpoints: [127.0.0.1:8081]}
    """), "c.yaml")
    assert lines[:4] == [
        "c.yaml: drain.strategy: Input should be 'gradual' or 'immediate' (got 'sudden')",
        "c.yaml: listeners[0].idle_timeout: invalid duration 'soon': expected a non-negative "
        "duration: a number of seconds (10, 0.5) or a number with a unit (250us, 150ms, 5s, "
        "1.5s, 2m, 1h; units: us, ms, s, m, h)",
        "c.yaml: listeners[2].access_log.format: 'jsn' is neither \"json\" nor a format string "
        "(one with a command operator such as %RESPONSE_CODE%)",
        "c.yaml: clusters[1].connect_timeout: must be greater than 0s, got 0s",
    ]
    # then the rules across sections, on what is valid (the drain section is not: no rule
    # with drain.time, such as hot_restart.parent_shutdown_time's)
    assert sorted(lines[4:]) == sorted([
        "c.yaml: clusters[2].name: duplicate cluster name 'app' (also clusters[0])",
        "c.yaml: listeners[0].routes[0].cluster: unknown cluster 'nope' (clusters: app, "
        "broken)",
        "c.yaml: listeners[1].name: duplicate listener name 'a' (also listeners[0])",
        "c.yaml: listeners[1].address: duplicate address 127.0.0.1:10000: also listener 'a' "
        "(listeners[0].address)",
    ])


def test_config_error_keeps_structured_problems() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text("drain: {tyme: 1s}", "f.yaml")
    assert info.value.source == "f.yaml"
    assert info.value.problems == (
        ("drain.tyme",
         "unknown key (allowed: time, strategy, connection_grace, idle_close, report_dir)"),
    )


def test_models_built_in_code_validate_too() -> None:
    with pytest.raises(ValidationError):
        ClusterConfig(name="c", endpoints=("127.0.0.1:0",))  # type: ignore[arg-type]
    cluster = ClusterConfig(name="c", endpoints=("127.0.0.1:80",))  # type: ignore[arg-type]
    assert cluster.endpoints[0].address == HostPort("127.0.0.1", 80)


def test_issue5_cluster_keys_are_checked_naming_the_field() -> None:
    base = ("listeners: [{name: a, address: 127.0.0.1:0, routes: [{cluster: c}]}]\n"
            "clusters: [{name: c, endpoints: [127.0.0.1:1, 127.0.0.1:2], %s}]\n")
    cases = {
        "outlier_detection: {base_ejection_time: 600s}":
            "clusters[0].outlier_detection.max_ejection_time: must be >= base_ejection_time",
        "persistence: {type: cookie, cookie_name: 'a b'}":
            "clusters[0].persistence.cookie_name: invalid cookie name",
        "lb_policy: random": "clusters[0].lb_policy",
        "endpoints: [127.0.0.1:1, {address: 127.0.0.1:1}]":
            "clusters[0].endpoints[1].address: duplicate endpoint 127.0.0.1:1",
        "endpoints: [{address: 127.0.0.1:1, state: paused}]": "clusters[0].endpoints[0].state",
        "health_check: {rise: 0}": "clusters[0].health_check.rise",
    }
    for extra, expected in cases.items():
        text = base % extra
        if extra.startswith("endpoints:"):
            text = text.replace("endpoints: [127.0.0.1:1, 127.0.0.1:2], ", "")
        with pytest.raises(ConfigError) as err:
            load_config_text(text)
        assert expected in str(err.value), (extra, str(err.value))


def test_tcp_listener_fields() -> None:
    ok = load_config_text(
        "listeners: [{name: t, address: 127.0.0.1:0, protocol: tcp, cluster: c}]\n"
        "clusters: [{name: c, endpoints: [127.0.0.1:1]}]\n")
    assert ok.listeners[0].protocol == "tcp" and ok.listeners[0].quiet_period == 1.0
    for listener, expected in {
        "{name: t, address: 127.0.0.1:0, protocol: tcp}": "listeners[0].cluster: required",
        "{name: t, address: 127.0.0.1:0, protocol: tcp, cluster: x}":
            "listeners[0].cluster: unknown cluster 'x'",
        "{name: t, address: 127.0.0.1:0, protocol: tcp, cluster: c, routes: [{cluster: c}]}":
            "listeners[0].routes: not for protocol: tcp",
        "{name: t, address: 127.0.0.1:0, cluster: c, routes: [{cluster: c}]}":
            "listeners[0].cluster: only for protocol: tcp",
        "{name: t, address: 127.0.0.1:0}": "listeners[0].routes: at least one route",
    }.items():
        with pytest.raises(ConfigError) as err:
            load_config_text(f"listeners: [{listener}]\n"
                             "clusters: [{name: c, endpoints: [127.0.0.1:1]}]\n")
        assert expected in str(err.value), (listener, str(err.value))


# --- warnings: valid, but probably not meant ----------------------------------------------------


@pytest.mark.parametrize(("drain", "warned"), [
    ("{time: 900ms, connection_grace: 300ms}", True),  # G == T/3: the window is empty
    ("{time: 20s, connection_grace: 10s}", True),
    ("{time: 1s, connection_grace: 200ms}", False),
    ("{time: 20s, connection_grace: 5s}", False),  # the default
    ("{time: 0s, connection_grace: 5s, strategy: immediate}", False),  # no window by design
])  # fmt: skip
def test_grace_that_empties_the_proactive_window_is_warned_with_numbers(
        drain: str, warned: bool, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="lameduck.config"):
        load_config_text(f"drain: {drain}", "w.yaml")
    lines = [r.getMessage() for r in caplog.records if r.name == "lameduck.config"]
    if not warned:
        assert lines == []
        return
    [line] = lines
    assert line.startswith("w.yaml: drain.connection_grace: "), line
    assert "is >= drain.time/3" in line and "proactive drain window [2T/3, T - G) is empty" in line


@pytest.mark.parametrize(("shutdown", "warned"), [
    ("{min_drain: 0s}", True),  # reads "no minimum", asks for an exit as soon as idle
    ("{min_drain: 5s}", True),
    ("{min_drain: 20s}", False),  # T: what unset means while accepting until T
    ("{min_drain: 0s, stop_accepting: immediately}", False),  # nobody can connect anyway
    ("{deadline: 30s}", False),  # unset: serve until T
])  # fmt: skip
def test_min_drain_below_t_is_warned_with_what_it_does(
        shutdown: str, warned: bool, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="lameduck.config"):
        load_config_text(f"drain: {{time: 20s}}\nshutdown: {shutdown}", "w.yaml")
    lines = [r.getMessage() for r in caplog.records if r.name == "lameduck.config"]
    if not warned:
        assert lines == []
        return
    [line] = lines
    assert line.startswith("w.yaml: shutdown.min_drain: "), line
    assert "is below drain.time (20s)" in line and "exits before T" in line, line
    assert "ECONNREFUSED" in line and "leave min_drain unset to serve until T" in line, line


@pytest.mark.parametrize(("text", "warned"), [
    ("drain: {time: 20s, idle_close: on_response}\nshutdown: {deadline: 24s}", True),
    ("drain: {time: 20s, idle_close: on_response}\nshutdown: {deadline: 25s}", False),  # T + G
    ("drain: {time: 20s}\nshutdown: {deadline: 21s}", False),  # immediate: done by T
])  # fmt: skip
def test_on_response_with_a_deadline_before_t_plus_g_is_warned(
        text: str, warned: bool, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="lameduck.config"):
        cfg = load_config_text(text, "w.yaml")
    lines = [r.getMessage() for r in caplog.records if r.name == "lameduck.config"]
    assert lines == (["w.yaml: shutdown.deadline: 24s is below drain.time + connection_grace "
                      "(25s) with drain.idle_close: on_response: idle connections no response "
                      "has closed yet are cut at the deadline instead of closed at T + G; "
                      "raise the deadline to 25s or more"] if warned else [])
    assert drain_settings(cfg)[0].idle_close is (
        IdleClose.ON_RESPONSE if "on_response" in text else IdleClose.IMMEDIATE)


@pytest.mark.parametrize(
    ("new", "expected"),
    [
        ("endpoints: [127.0.0.1:8080]\n    max_connecting: -1",
         "lameduck.yaml: clusters[0].max_connecting: Input should be greater than or equal to 0 "
         "(got -1)"),
        ("endpoints: [127.0.0.1:8080]\n"
         "    retry_policy: {retry_back_off: {base_interval: 100ms, max_interval: 50ms}}",
         "lameduck.yaml: clusters[0].retry_policy.retry_back_off.max_interval: must be >= "
         "base_interval (100ms), got 50ms"),
        ("endpoints: [127.0.0.1:8080]\n    retry_policy: {retry_back_off: {base_interval: 0s}}",
         "lameduck.yaml: clusters[0].retry_policy.retry_back_off.base_interval: must be greater "
         "than 0s, got 0s"),
    ],
)
def test_connect_retry_and_max_connecting_keys_name_the_field(new: str, expected: str) -> None:
    assert error_lines(VALID.replace("endpoints: [127.0.0.1:8080]", new, 1)) == [expected]


def test_connect_retry_and_max_connecting_defaults() -> None:
    cluster = default_config().clusters[0]
    assert cluster.max_connecting == 4
    back_off = cluster.retry_policy.retry_back_off
    assert (back_off.base_interval, back_off.cap) == (0.025, 0.25)


# --- drain core settings -----------------------------------------------------------------------


def test_drain_settings_carry_the_drain_and_shutdown_sections() -> None:
    cfg = load_config_text(textwrap.dedent("""
        drain: {time: 12s, strategy: immediate, connection_grace: 2s}
        shutdown: {deadline: 30s, min_drain: 4s, stop_accepting: immediately}
    """))
    drain, shutdown = drain_settings(cfg)
    assert (drain.time, drain.strategy, drain.grace) == (12.0, Strategy.IMMEDIATE, 2.0)
    assert (shutdown.deadline, shutdown.min_drain) == (30.0, 4.0)
    assert shutdown.stop_accepting_at_drain_end is False
    assert drain_settings(default_config())[1].stop_accepting_at_drain_end is True
