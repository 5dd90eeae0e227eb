"""The config model: one frozen pydantic tree, validated once at load time.

Every model forbids unknown keys (a typo must not silently fall back to a default) and is frozen
(the running proxy shares one Config; a reload builds a new one). Cross-field rules report the
exact field path so `ConfigError` can say `shutdown.deadline: ...` rather than "invalid config".
Defaults fit Kubernetes' 30 s grace period: drain 20 s, then at most a 5 s route timeout, inside a
25 s shutdown deadline; a 75 s listener idle timeout above a 60 s load balancer idle timeout.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Final, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from lameduck.config.durations import Duration, LongDuration, format_duration
from lameduck.drain.endpoint import AdminState
from lameduck.drain.event import Direction, DrainType, IdleClose, Strategy
from lameduck.drain.policy import WINDOW_EPSILON
from lameduck.drain.prestop import Leave
from lameduck.extras import missing_extra

__all__ = [
    "AdminConfig",
    "ClusterConfig",
    "Config",
    "ConnectConfig",
    "Direction",
    "DrainConfig",
    "DrainType",
    "EndpointAddress",
    "EndpointConfig",
    "HostPort",
    "Http2Config",
    "ListenAddress",
    "ListenerConfig",
    "RouteConfig",
    "ShutdownConfig",
    "StopAccepting",
    "Strategy",
    "TlsConfig",
]


# --- enums -------------------------------------------------------------------------------------


# Strategy, Direction and DrainType are the drain core's own enums (it imports nothing of the
# project, so the config may use them): one definition, no conversion in the wiring.


class StopAccepting(StrEnum):
    """When a shutting-down process closes its listening sockets."""

    AT_DRAIN_END = "at_drain_end"
    IMMEDIATELY = "immediately"


# --- addresses ---------------------------------------------------------------------------------

_LABEL_RE: Final = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?")
_IPV4_LIKE_RE: Final = re.compile(r"[0-9.]+")


@dataclass(frozen=True, slots=True)
class HostPort:
    """A `host:port` socket address; IPv6 hosts are stored bare and printed in brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, *, min_port: int = 0) -> HostPort:
        """Parse "127.0.0.1:10000", "[::1]:10000" or "app.internal:8080"; ValueError says why."""
        bad = f"invalid address {text!r}"
        if text.startswith("["):
            host, sep, port_text = text[1:].partition("]:")
            if not sep:
                raise ValueError(f"{bad}: expected '[IPv6]:port', e.g. [::1]:10000")
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ValueError(f"{bad}: {host!r} is not an IPv6 address") from None
        else:
            host, sep, port_text = text.rpartition(":")
            if not sep:
                raise ValueError(f"{bad}: expected 'host:port', e.g. 127.0.0.1:10000")
            if ":" in host:
                raise ValueError(f"{bad}: IPv6 hosts need brackets, e.g. [::1]:10000")
            _check_host(bad, host)
        if not port_text.isascii() or not port_text.isdigit():
            raise ValueError(f"{bad}: port {port_text!r} is not a number")
        port = int(port_text)
        if not min_port <= port <= 65535:
            raise ValueError(f"{bad}: port must be {min_port}..65535")
        return cls(host, port)

    @property
    def is_loopback(self) -> bool:
        """True for 127.0.0.0/8, ::1 (also IPv4-mapped) and "localhost"."""
        if self.host.lower().rstrip(".") == "localhost":
            return True
        try:
            ip = ipaddress.ip_address(self.host)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            return ip.ipv4_mapped.is_loopback
        return ip.is_loopback


def _check_host(bad: str, host: str) -> None:
    if not host:
        raise ValueError(f"{bad}: host is empty (use 0.0.0.0 or [::] for all interfaces)")
    if _IPV4_LIKE_RE.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{bad}: {host!r} is not an IPv4 address") from None
        return
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL_RE.fullmatch(label) for label in name.split(".")):
        raise ValueError(f"{bad}: {host!r} is not a valid host name")


def _address_validator(min_port: int) -> PlainValidator:
    def validate(value: object) -> HostPort:
        if isinstance(value, HostPort):
            value = str(value)  # re-check: a HostPort built in code may carry port 0
        if not isinstance(value, str):
            raise ValueError(f"expected a 'host:port' string, got {value!r}")
        return HostPort.parse(value, min_port=min_port)

    return PlainValidator(validate)


_ADDRESS_SCHEMA: Final = {"type": "string", "examples": ["127.0.0.1:10000", "[::1]:10000"]}

ListenAddress = Annotated[
    HostPort,
    _address_validator(min_port=0),
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema(_ADDRESS_SCHEMA),
]
"""An address to bind: port 0 asks the kernel for an ephemeral port (tests use it)."""

EndpointAddress = Annotated[
    HostPort,
    _address_validator(min_port=1),
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema(_ADDRESS_SCHEMA),
]
"""An address to connect to: port 0 is meaningless there."""


MAX_WORKERS: Final = 256


def _workers(value: object) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise ValueError(f"expected a number of worker processes from 1 to {MAX_WORKERS}, or "
                         f"auto (one per CPU), got {value!r}")
    return value


Workers = Annotated[int | str, PlainValidator(_workers),
                    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1,
                                               "maximum": MAX_WORKERS},
                                              {"const": "auto"}]})]
"""``workers``: how many data-plane processes (``auto``: one per CPU)."""


# --- field helpers -----------------------------------------------------------------------------

_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.-]+")
T = TypeVar("T")


def _check_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid name {value!r}: use only letters, digits, '_', '.' and '-' "
            "(it becomes a stat prefix)"
        )
    return value


def _check_path(value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise ValueError(f"invalid path {value!r}: must start with '/'")
    return value


def _check_route_host(value: str | None) -> str | None:
    if value is None:
        return None
    host = value.strip().lower()
    if not host or any(c.isspace() or c in "/?#@" for c in host):
        raise ValueError(f"invalid host {value!r}: expected a host name such as example.com")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(
            f"invalid host {value!r}: leave the port out (the Host header's port is ignored "
            "when matching)"
        )
    return host


_TOKEN_RE: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _check_cookie_name(value: str) -> str:
    if not _TOKEN_RE.fullmatch(value):
        raise ValueError(f"invalid cookie name {value!r}: must be an RFC 6265 token")
    return value


def _positive(value: float) -> float:
    if value <= 0:
        raise ValueError(f"must be greater than 0s, got {format_duration(value)}")
    return value


def _non_empty(what: str) -> Callable[[tuple[T, ...]], tuple[T, ...]]:
    """min_length, but checked only once the items are valid (no second error for one bad item)."""

    def check(value: tuple[T, ...]) -> tuple[T, ...]:
        if not value:
            raise ValueError(f"at least one {what} is required")
        return value

    return check


Name = Annotated[str, AfterValidator(_check_name)]
PositiveDuration = Annotated[Duration, AfterValidator(_positive)]


def _fail(title: str, problems: list[tuple[tuple[str | int, ...], str, object]]) -> None:
    """Raise one ValidationError carrying each cross-field problem at its own field path."""
    if problems:
        raise ValidationError.from_exception_data(
            title,
            [
                InitErrorDetails(
                    type=PydanticCustomError("config_rule", "{detail}", {"detail": message}),
                    loc=loc,
                    input=value,
                )
                for loc, message, value in problems
            ],
        )


# --- sections ----------------------------------------------------------------------------------


class AdminConfig(BaseModel):
    """The admin API endpoint; it can drain and kill the process, so loopback unless opted out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: ListenAddress = HostPort("127.0.0.1", 9901)
    allow_non_loopback: bool = False
    # a file holding a bearer token every admin request must send (docs/admin.md); read at
    # start, so the config (and `config dump`) holds the path, never the secret
    token_file: str | None = None

    @model_validator(mode="after")
    def _loopback_only(self) -> Self:
        if not self.allow_non_loopback and not self.address.is_loopback:
            _fail(
                "AdminConfig",
                [
                    (
                        ("address",),
                        f"{self.address} is not a loopback address (127.0.0.0/8, ::1, "
                        "localhost); whoever reaches the admin API can drain or stop the proxy. "
                        "Set admin.allow_non_loopback: true to expose it anyway",
                        str(self.address),
                    )
                ],
            )
        return self


class DrainConfig(BaseModel):
    """Drain event parameters: T (`time`), the strategy, and G (`connection_grace`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    time: Duration = 20.0
    strategy: Strategy = Strategy.GRADUAL
    connection_grace: Duration = 5.0
    # When an idle keep-alive connection is closed by the drain: immediate (its proactive
    # moment, then G) or on_response (only after its next response, or at T + G).
    idle_close: IdleClose = IdleClose.IMMEDIATE
    # A directory each drain's report (its counts, settings and 100 ms timeline) is written to
    # as JSON at the drain's end; None: kept in memory only (GET /drain_report).
    report_dir: str | None = None


def drain_warnings(drain: DrainConfig) -> list[tuple[str, str]]:
    """(field, message) for a drain that validates but does less than it seems to: G >= T/3
    leaves the proactive window [2T/3, T - G) empty, so idle keep-alive connections are not
    spread over the last third of T but closed together at the end (a reconnect herd). Not
    refused: a short T with a long G for WebSocket close handshakes is a choice; T = 0 is the
    plain graceful-drain recipe, with no window by design."""
    t, g = drain.time, drain.connection_grace
    if t <= 0 or t / 3.0 - g > WINDOW_EPSILON:
        return []
    return [("drain.connection_grace",
             f"{format_duration(g)} is >= drain.time/3 ({format_duration(t)}/3): the proactive "
             f"drain window [2T/3, T - G) is empty, so idle keep-alive connections get no close "
             f"spread over the last third of T: they are left to the end and close together; "
             f"for a proactive drain keep "
             f"connection_grace below {format_duration(round(t / 3.0, 3))} or drain.time above "
             f"{format_duration(round(3.0 * g, 3))}")]


def shutdown_warnings(shutdown: ShutdownConfig, drain: DrainConfig) -> list[tuple[str, str]]:
    """(field, message) for a ``min_drain`` below T while the listeners accept until T: it
    reads like "no minimum" (``0s``), but it asks for an exit as soon as the process is
    idle after it, before T, closing the listeners under clients that have not yet seen the
    endpoint removal (Kubernetes removes a terminating pod's endpoints while it still runs).
    Unset, an idle process serves until T (docs/drain.md, Shutdown). And a deadline
    before T + G with ``drain.idle_close: on_response``, which keeps idle connections until
    then: the deadline ends them first."""
    out = []
    end = drain.time + drain.connection_grace
    if drain.idle_close is IdleClose.ON_RESPONSE and shutdown.deadline < end:
        out.append(("shutdown.deadline",
                    f"{format_duration(shutdown.deadline)} is below drain.time + "
                    f"connection_grace ({format_duration(end)}) with drain.idle_close: "
                    f"on_response: idle connections no response has closed yet are cut at the "
                    f"deadline instead of closed at T + G; raise the deadline to "
                    f"{format_duration(end)} or more"))
    md, t = shutdown.min_drain, drain.time
    if md is None or md >= t or shutdown.stop_accepting is not StopAccepting.AT_DRAIN_END:
        return out
    return [*out, ("shutdown.min_drain",
             f"{format_duration(md)} is below drain.time ({format_duration(t)}): from "
             f"{format_duration(md)} after SIGTERM an idle lameduck (no request in flight, no "
             f"connection open) exits before T and closes its listeners, so a client that has "
             f"not yet seen it leave the load balancer is refused (ECONNREFUSED); leave "
             f"min_drain unset to serve until T (0 after a completed preStop)")]


class LbProbesConfig(BaseModel):
    """What a listener's health-check path tells about the balancer that probes it
    (``leave: confirm``): HAProxy ``fall`` / Envoy ``unhealthy_threshold``, the probe interval
    (null: learned per prober), the quiet window (null: two intervals), a bound on the source
    addresses tracked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fall: int = Field(3, ge=1)
    interval: PositiveDuration | None = None
    quiet: Duration | None = None
    max_peers: int = Field(1024, ge=1)


class ShutdownConfig(BaseModel):
    """Process exit: the hard deadline (below the supervisor's kill timeout) and when to stop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deadline: Duration = 25.0
    # None: serve until T while accepting until T (0 with stop_accepting: immediately, or
    # after a completed preStop); a number asks for an exit as soon as idle after it.
    min_drain: Duration | None = None
    stop_accepting: StopAccepting = StopAccepting.AT_DRAIN_END
    # confirm: the not-ready phase ends once the load balancer is seen to stop (probers on
    # the health-check paths have fallen, traffic is quiet), bounded by min_drain (or T)
    leave: Leave = Leave.TIMER

    @model_validator(mode="after")
    def _min_drain_fits(self) -> Self:
        if self.min_drain is not None and self.min_drain > self.deadline:
            _fail(
                "ShutdownConfig",
                [
                    (
                        ("min_drain",),
                        f"must be <= shutdown.deadline ({format_duration(self.deadline)}), "
                        f"got {format_duration(self.min_drain)}",
                        format_duration(self.min_drain),
                    )
                ],
            )
        return self


class RouteConfig(BaseModel):
    """A prefix (and optional Host) match sending requests to a cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix: Annotated[str, AfterValidator(_check_path)] = "/"
    cluster: str
    host: Annotated[str | None, AfterValidator(_check_route_host)] = None
    # From the end of the request to the end of the response (Envoy's route timeout); 0 = none
    timeout: Duration = 5.0
    per_try_idle_timeout: Duration = 0.0  # no upstream byte for this long: cut; 0 = none


def _readable_file(value: str) -> str:
    try:
        with open(value, "rb"):
            pass
    except OSError as e:
        raise ValueError(f"cannot read {value!r}: {e.strerror or e}") from None
    return value


ReadableFile = Annotated[str, AfterValidator(_readable_file)]


class TlsConfig(BaseModel):
    """Downstream TLS: a certificate chain and its key (PEM); ALPN picks h2 or http/1.1."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    certificate: ReadableFile
    key: ReadableFile
    alpn: tuple[Literal["h2", "http/1.1"], ...] = ("h2", "http/1.1")

    @model_validator(mode="after")
    def _loads(self) -> Self:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.certificate, self.key)
        except (ssl.SSLError, OSError) as e:
            _fail("TlsConfig", [(("certificate",), f"cannot load the certificate and key: {e}",
                                 self.certificate)])
        return self


class Http2Config(BaseModel):
    """HTTP/2 settings and the limits that keep a hostile client bounded (Envoy's
    http2_protocol_options where a name exists; floods are counted per `flood_window`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrent_streams: int = Field(100, ge=1, le=2**31 - 1)
    initial_stream_window_size: int = Field(1 << 20, ge=65535, le=2**31 - 1)
    initial_connection_window_size: int = Field(1 << 24, ge=65535, le=2**31 - 1)
    max_resets: int = Field(200, ge=1)  # client stream resets per flood_window (rapid reset)
    max_pings: int = Field(100, ge=1)
    max_settings: int = Field(100, ge=1)
    max_empty_frames: int = Field(100, ge=1)
    flood_window: PositiveDuration = 10.0


class Http3Config(BaseModel):
    """HTTP/3 (RFC 9114 over QUIC, RFC 9000) on a TLS listener's address and port, over UDP.
    Its stream and header limits are the listener's `http2` and `max_request_headers_kb`;
    its QUIC idle timeout is the listener's `idle_timeout`. Needs the `http3` extra."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The max-age of the Alt-Svc the TCP listener's responses advertise h3 with (RFC 7838
    # §3 "ma"): how long a client may remember that HTTP/3 is on offer here.
    alt_svc_max_age: Duration = 86400.0


class UpstreamHttp2Config(BaseModel):
    """HTTP/2 to a `protocol: h2` cluster (Envoy's cluster http2_protocol_options names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Streams opened per connection at most; the upstream's own SETTINGS may lower it.
    max_concurrent_streams: int = Field(100, ge=1, le=2**31 - 1)
    initial_stream_window_size: int = Field(1 << 20, ge=65535, le=2**31 - 1)
    initial_connection_window_size: int = Field(1 << 24, ge=65535, le=2**31 - 1)


class ConnectConfig(BaseModel):
    """CONNECT tunnels (HTTP/1.1 CONNECT, HTTP/2 :method CONNECT): only to the listed
    destinations; anything else is answered 403. Empty (the default): no tunnels at all."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: tuple[EndpointAddress, ...] = ()
    connect_timeout: PositiveDuration = 5.0


# The access log's format compiler, registered by the data plane (``lameduck.listeners`` appends
# ``proxy.accesslog.compile_format`` when imported; the configuration imports nothing above
# it). Every command that reads a config (validate, run, supervise) has it loaded by then.
FORMAT_CHECKS: list[Callable[[str | None], object]] = []


def _access_log_format(value: str | None) -> str | None:
    """Compiled as the listener compiles it (``compile_format``), so what validate accepts is
    what run writes: an operator lameduck does not write, a bad argument or a value that is no
    format (a misspelt "json") is refused here, by validate and run alike."""
    for check in FORMAT_CHECKS:
        check(value)  # a FormatError is a ValueError: pydantic's value_error at the field
    return value


def _writable_log(value: str) -> str:
    """A file the listener can open for appending (run opens it before serving), checked
    without creating it: the file writable, or its directory if it does not exist yet."""
    if value == "stdout":
        return value
    if not value:
        raise ValueError('a file path, or "stdout"')
    if os.path.isdir(value):
        raise ValueError(f"{value!r} is a directory")
    target = value if os.path.exists(value) else os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(target) and target != value:
        raise ValueError(f"cannot write {value!r}: no directory {target!r}")
    if not os.access(target, os.W_OK):
        raise ValueError(f"cannot write {value!r}: permission denied")
    return value


class AccessLogConfig(BaseModel):
    """A listener's access log (docs/access-log.md): Envoy's format operators and flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Annotated[str, AfterValidator(_writable_log)]  # "stdout", or a file (appended;
    # reopened on SIGUSR1)
    # An Envoy format string (it says where the newline goes), "json" (JSON lines), or
    # null: Envoy's default format.
    format: Annotated[str | None, AfterValidator(_access_log_format)] = None


class ListenerConfig(BaseModel):
    """A downstream listening socket and its HTTP connection manager settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    address: ListenAddress
    direction: Direction = Direction.INBOUND
    drain_type: DrainType = DrainType.DEFAULT
    health_check_path: Annotated[str | None, AfterValidator(_check_path)] = None
    lb_probes: LbProbesConfig = LbProbesConfig()  # read with health_check_path (leave: confirm)
    request_headers_timeout: Duration = 10.0  # 0 = none
    idle_timeout: Duration = 75.0  # downstream keep-alive idle timeout; 0 = none
    # Envoy's common_http_protocol_options: from then (or at that request) a connection
    # drains (HTTP/1.1 Connection: close, HTTP/2 GOAWAY), it is not reset; 0 = none.
    max_connection_duration: Duration = 0.0
    # no byte of a request body for this long: 408 (or a reset once the response began);
    # HTTP/1.1; 0 = none
    request_body_timeout: Duration = 30.0
    # a client that takes no byte of what we send for this long is reset; 0 = none
    send_timeout: Duration = 60.0
    max_requests_per_connection: int = Field(0, ge=0)
    max_request_headers_kb: int = Field(60, ge=1, le=8192)
    tls: TlsConfig | None = None
    http2: Http2Config = Http2Config()
    http3: Http3Config | None = None  # off; `http3: {}` serves HTTP/3 too (needs `tls`)
    connect: ConnectConfig = ConnectConfig()
    # http: HTTP/1.1 and HTTP/2 through `routes`; tcp: bytes relayed to `cluster` (Layer 4:
    # persistence by source IP, drain stop does not apply).
    protocol: Literal["http", "tcp"] = "http"
    routes: tuple[RouteConfig, ...] = ()
    cluster: str | None = None  # protocol: tcp only
    # protocol: tcp only. From its proactive drain moment a connection closes once it has
    # carried no byte either way for this long (it has no requests to tell idle by).
    quiet_period: PositiveDuration = 1.0
    access_log: AccessLogConfig | None = None  # off
    # x-request-id (128 random bits, hex) added when the request has none, passed upstream
    generate_request_id: bool = True
    # Envoy's router option: true leaves x-envoy-upstream-service-time (the ms the upstream
    # took, added to every proxied response, in place of one the upstream sent) out
    suppress_envoy_headers: bool = False
    # With workers > 1: a listening socket per worker in one SO_REUSEPORT group, over which
    # the kernel spreads new connections (Envoy's enable_reuse_port); false: one socket every
    # worker accepts on, which a burst of connections can leave on one worker.
    reuse_port: bool = True

    @model_validator(mode="after")
    def _protocol_fields(self) -> Self:
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        if self.protocol == "http":
            if not self.routes:
                problems.append((("routes",), "at least one route is required", []))
            if self.cluster is not None:
                problems.append((("cluster",), "only for protocol: tcp (an HTTP listener "
                                 "names its clusters in routes)", self.cluster))
        else:
            if self.cluster is None:
                problems.append((("cluster",), "required for protocol: tcp", None))
            if self.routes:
                problems.append((("routes",), "not for protocol: tcp (bytes go to `cluster`)",
                                 "..."))
            if self.tls is not None:
                problems.append((("tls",), "not supported for protocol: tcp", "..."))
        if self.http3 is not None:
            if self.protocol != "http" or self.tls is None:
                problems.append((("http3",), "needs `tls` on an HTTP listener (QUIC is "
                                 "always encrypted, RFC 9001)", "..."))
            elif importlib.util.find_spec("aioquic") is None:
                problems.append((("http3",), str(missing_extra("http3", "listeners[].http3",
                                 ModuleNotFoundError(name="aioquic"))), "..."))
        _fail("ListenerConfig", problems)
        return self


class EndpointConfig(BaseModel):
    """One upstream endpoint: written as "host:port", or as a mapping for weight, initial
    admin state and an HAProxy agent-check port."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: EndpointAddress
    # Relative share of new sessions (Envoy's load_balancing_weight range); an agent's
    # "N%" scales it at run time.
    weight: int = Field(1, ge=1, le=128)
    # The admin state it starts in (HAProxy's words); the admin API and agents change it.
    state: AdminState = AdminState.READY
    # A TCP port on the endpoint's host where a feedback agent answers one line of HAProxy
    # agent-check words (ready, drain, maint, up, down, N%, maxconn:N); null = no agent.
    agent_port: int | None = Field(None, ge=1, le=65535)

    @property
    def host(self) -> str:
        return self.address.host

    @property
    def port(self) -> int:
        return self.address.port


def _endpoint_mapping(value: object) -> object:
    return {"address": value} if isinstance(value, (str, HostPort)) else value


Endpoint = Annotated[EndpointConfig, BeforeValidator(_endpoint_mapping)]


class PersistenceConfig(BaseModel):
    """Session persistence: a record per client key → endpoint, in a table per
    cluster, expiring `timeout` after its last use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # source_ip: the client's address (HTTP and TCP listeners); cookie: a cookie the proxy
    # inserts (HTTP listeners only; a TCP listener falls back to the source IP).
    type: Literal["source_ip", "cookie"]
    timeout: Annotated[LongDuration, AfterValidator(_positive)] = 1800.0  # unitless: up to 1 day
    cookie_name: Annotated[str, AfterValidator(_check_cookie_name)] = "lameduck"
    max_records: int = Field(100_000, ge=1)


class HealthCheckConfig(BaseModel):
    """Active HTTP health checks (Envoy's health_check names, HAProxy's rise/fall): `fall`
    failures in a row take an endpoint out, `rise` successes bring it back. A 503 carrying
    `x-envoy-immediate-health-check-fail` takes it out at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Annotated[str, AfterValidator(_check_path)] = "/health"
    host: str | None = None  # the Host header sent; null = the endpoint's address
    interval: PositiveDuration = 5.0
    timeout: PositiveDuration = 1.0
    rise: int = Field(2, ge=1)  # Envoy's healthy_threshold
    fall: int = Field(3, ge=1)  # Envoy's unhealthy_threshold
    expected_statuses: Annotated[tuple[Annotated[int, Field(ge=100, le=599)], ...],
                                 AfterValidator(_non_empty("status"))] = (200,)


class AgentCheckConfig(BaseModel):
    """How often endpoints with an `agent_port` are asked for their words."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval: PositiveDuration = 2.0
    timeout: PositiveDuration = 1.0


class OutlierDetectionConfig(BaseModel):
    """Passive ejection (Envoy's outlier_detection): an endpoint that fails this many requests
    in a row is taken out for base_ejection_time x (times ejected), at most max_ejection_time.
    Connect failures, resets and timeouts count as gateway failures. 0 disables a detector."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    consecutive_5xx: int = Field(5, ge=0)
    consecutive_gateway_failure: int = Field(5, ge=0)
    base_ejection_time: PositiveDuration = 30.0
    max_ejection_time: PositiveDuration = 300.0
    max_ejection_percent: int = Field(10, ge=0, le=100)

    @model_validator(mode="after")
    def _times(self) -> Self:
        if self.max_ejection_time < self.base_ejection_time:
            _fail("OutlierDetectionConfig", [(
                ("max_ejection_time",),
                f"must be >= base_ejection_time ({format_duration(self.base_ejection_time)}), "
                f"got {format_duration(self.max_ejection_time)}",
                format_duration(self.max_ejection_time))])
        return self


class RetryBudgetConfig(BaseModel):
    """Envoy's retry_budget: retries in flight at most budget_percent of the requests in
    flight, but always min_retry_concurrency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget_percent: float = Field(20.0, ge=0, le=100)
    # Envoy's default is 3; lameduck's is higher because an endpoint that dies (or is cut by a
    # drain stop) fails all its requests at once, and each of those retries is a safe one.
    min_retry_concurrency: int = Field(10, ge=0)


class RetryBackOffConfig(BaseModel):
    """Envoy's retry_back_off: the wait before a never-sent request is tried again on the same
    endpoint, uniform in [0, (2^n - 1) x base_interval] for retry n, at most max_interval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_interval: PositiveDuration = 0.025
    max_interval: PositiveDuration | None = None  # null: 10 x base_interval (Envoy's default)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.max_interval is not None and self.max_interval < self.base_interval:
            _fail("RetryBackOffConfig", [(("max_interval",), "must be >= base_interval "
                                          f"({format_duration(self.base_interval)}), got "
                                          f"{format_duration(self.max_interval)}",
                                          format_duration(self.max_interval))])
        return self

    @property
    def cap(self) -> float:
        return self.max_interval if self.max_interval is not None else 10 * self.base_interval


class RetryPolicyConfig(BaseModel):
    """Retries, only when safe: never sent, idempotent method, Idempotency-Key, or refused
    unprocessed by HTTP/2. A never-sent request with no other endpoint to go to is tried on
    the same one after retry_back_off (HAProxy's `retries`). 0 retries: none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_retries: int = Field(2, ge=0, le=10)
    retry_budget: RetryBudgetConfig = RetryBudgetConfig()
    retry_back_off: RetryBackOffConfig = RetryBackOffConfig()


class ClusterConfig(BaseModel):
    """A named set of upstream endpoints, how new sessions are spread over them, and how each
    one is drained, checked and retried around."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    endpoints: Annotated[tuple[Endpoint, ...], AfterValidator(_non_empty("endpoint"))]
    connect_timeout: PositiveDuration = 1.0
    max_idle_connections: int = Field(256, ge=0)  # per endpoint; 0 = no pooling
    # New connections per endpoint still in their handshake at once (0 = no cap); more requests
    # wait for the first free connection. A connect dropped anyway (an accept queue filled by
    # finished handshakes) is what the same-endpoint retry is for.
    max_connecting: int = Field(4, ge=0, le=1024)
    idle_timeout: Duration = 30.0  # pooled upstream connection idle timeout; 0 = none
    # "http1": a keep-alive pool, one request per connection at a time; "h2": HTTP/2 with
    # prior knowledge (h2c), many streams per connection (Envoy's explicit http2 config).
    protocol: Literal["http1", "h2"] = "http1"
    http2: UpstreamHttp2Config = UpstreamHttp2Config()
    # Envoy's lb_policy names: round_robin (weighted) or least_request (power of two choices).
    lb_policy: Literal["round_robin", "least_request"] = "round_robin"
    # An endpoint set to DRAIN keeps its persistent clients (HTTP listeners) this long;
    # 0s = drop its connections at once (Kemp LoadMaster's L7 Connection Drain Time 0).
    drain_stop: Duration = 30.0
    drop_at_drain_end: bool = False  # sever a DRAIN endpoint's connections when drain_stop ends
    clear_persistence_on_drain: bool = False  # a DRAIN endpoint's records are not honoured
    persistence: PersistenceConfig | None = None
    health_check: HealthCheckConfig | None = None
    agent_check: AgentCheckConfig = AgentCheckConfig()
    outlier_detection: OutlierDetectionConfig | None = None
    retry_policy: RetryPolicyConfig = RetryPolicyConfig()

    @model_validator(mode="after")
    def _distinct_endpoints(self) -> Self:
        seen: dict[HostPort, int] = {}
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        for i, ep in enumerate(self.endpoints):
            if ep.address in seen:
                problems.append((("endpoints", i, "address"), f"duplicate endpoint "
                                 f"{ep.address} (also endpoints[{seen[ep.address]}])",
                                 str(ep.address)))
            else:
                seen[ep.address] = i
        _fail("ClusterConfig", problems)
        return self


class HotRestartConfig(BaseModel):
    """Hot restart: a new `lameduck run --hot-restart` (SIGHUP, `lameduck supervise`) takes
    the running one's sockets over a Unix socket."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The rendezvous socket; null = lameduck-<uid>/restart-<admin port>.sock in the temp dir.
    socket: str | None = None
    # The old process drains for drain.time and exits by this time at the latest (Envoy's
    # --parent-shutdown-time-s).
    parent_shutdown_time: PositiveDuration = 30.0


def _bind_key(a: HostPort) -> tuple[int, str | None]:
    """(IP version, address) a bind takes; address None: every address of that version.
    An IPv4-mapped IPv6 address is its IPv4 address; a host name binds IPv4 (as bind() does)."""
    host = a.host.lower().rstrip(".")
    if host == "localhost":
        return 4, "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return 4, host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.version, None if ip.is_unspecified else str(ip)


def _bind_overlaps(a: HostPort, b: HostPort) -> bool:
    """Whether both cannot be bound at once on Linux: the same port and address, or a
    wildcard beside an address it covers. [::] covers IPv4 too (a dual-stack socket:
    net.ipv6.bindv6only=0, the default); SO_REUSEADDR does not let listening sockets share."""
    if a.port != b.port or a.port == 0:
        return False
    (va, xa), (vb, xb) = _bind_key(a), _bind_key(b)
    if (va == 6 and xa is None) or (vb == 6 and xb is None):
        return True
    return va == vb and (xa is None or xb is None or xa == xb)


def _name_once(kind: str, i: int, name: str, seen: dict[str, int],
               problems: list[tuple[tuple[str | int, ...], str, object]]) -> None:
    """A cluster's or listener's name is its key (routes, stats, the admin API): the first
    takes it, a later one is a problem naming both."""
    if name in seen:
        problems.append(((f"{kind}s", i, "name"),
                         f"duplicate {kind} name {name!r} (also {kind}s[{seen[name]}])", name))
    else:
        seen[name] = i


def _bind_clash(a: HostPort, b: HostPort, who: str) -> str:
    """Why ``a`` cannot be bound beside ``b`` (which ``who`` binds)."""
    (va, xa), (vb, xb) = _bind_key(a), _bind_key(b)
    if xa is not None and xb is not None:
        return f"duplicate address {a}: also {who}"
    wild, v = (a, va) if xa is None else (b, vb)
    covers = ("every IPv4 address" if v == 4 else
              "every IPv6 address and, dual-stack (net.ipv6.bindv6only=0), every IPv4 one")
    return (f"{a} cannot be bound beside {who} on {b}: {wild.host if v == 4 else '[::]'} "
            f"takes port {a.port} on {covers}")


class Config(BaseModel):
    """The whole config file. Cross-section rules live here because they need both sections."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    admin: AdminConfig = AdminConfig()
    drain: DrainConfig = DrainConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    listeners: tuple[ListenerConfig, ...] = ()
    clusters: tuple[ClusterConfig, ...] = ()
    hot_restart: HotRestartConfig = HotRestartConfig()
    # Data-plane worker processes (nginx's worker_processes, Envoy's --concurrency): 1 serves
    # in the one process; "auto" is the number of CPUs this process may run on.
    workers: Workers = 1

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        _fail("Config", cross_problems(self.admin, self.drain, self.shutdown, self.hot_restart,
                                       list(enumerate(self.listeners)),
                                       list(enumerate(self.clusters))))
        return self



Problem = tuple[tuple[str | int, ...], str, object]  # (field path, message, the value)


def cross_problems(admin: AdminConfig | None, drain: DrainConfig | None,
                   shutdown: ShutdownConfig | None, hot_restart: HotRestartConfig | None,
                   listeners: list[tuple[int, ListenerConfig]],
                   clusters: list[tuple[int, ClusterConfig]],
                   other_cluster_names: frozenset[str] = frozenset()) -> list[Problem]:
    """The rules across sections, on the sections that are valid (None, or an item left out:
    invalid, its own problems said; a rule that needs it is skipped). ``other_cluster_names``:
    the names of clusters left out, which routes may still name. Called by ``Config`` on a
    valid tree, and by ``partial_problems`` on the rest of a tree with errors, so one
    ``validate`` says every problem instead of one stage at a time."""
    problems: list[Problem] = []
    if shutdown is not None and drain is not None and shutdown.deadline < drain.time:
        problems.append(
            (
                ("shutdown", "deadline"),
                f"must be >= drain.time ({format_duration(drain.time)}), got "
                f"{format_duration(shutdown.deadline)}: the drain has to fit before "
                "the deadline cuts what is left",
                format_duration(shutdown.deadline),
            )
        )
    if hot_restart is not None and drain is not None \
            and hot_restart.parent_shutdown_time < drain.time:
        pst = hot_restart.parent_shutdown_time
        problems.append(
            (
                ("hot_restart", "parent_shutdown_time"),
                f"must be >= drain.time ({format_duration(drain.time)}), got "
                f"{format_duration(pst)}: the old process has to drain before it is cut",
                format_duration(pst),
            )
        )
    cluster_seen: dict[str, int] = {}
    for i, cluster in clusters:
        _name_once("cluster", i, cluster.name, cluster_seen, problems)
    known_names = set(cluster_seen) | other_cluster_names
    names: dict[str, int] = {}
    # What binds so far: (address, who) — port 0 is left out, each bind gets its own port.
    bound: list[tuple[HostPort, str]] = []
    if admin is not None and admin.address.port != 0:
        bound.append((admin.address, "the admin API (admin.address)"))
    for i, listener in listeners:
        _name_once("listener", i, listener.name, names, problems)
        if listener.address.port != 0:
            clash = next((_bind_clash(listener.address, addr, who)
                          for addr, who in bound if _bind_overlaps(listener.address, addr)),
                         None)
            if clash is not None:
                problems.append((("listeners", i, "address"), clash, str(listener.address)))
            else:
                bound.append((listener.address,
                              f"listener {listener.name!r} (listeners[{i}].address)"))
        if listener.cluster is not None and listener.cluster not in known_names:
            known = ", ".join(sorted(known_names)) or "none defined"
            problems.append((("listeners", i, "cluster"),
                             f"unknown cluster {listener.cluster!r} (clusters: {known})",
                             listener.cluster))
        for j, route in enumerate(listener.routes):
            if route.cluster not in known_names:
                known = ", ".join(sorted(known_names)) or "none defined"
                problems.append(
                    (
                        ("listeners", i, "routes", j, "cluster"),
                        f"unknown cluster {route.cluster!r} (clusters: {known})",
                        route.cluster,
                    )
                )
    return problems


M = TypeVar("M", bound=BaseModel)


def _valid_or_none(model: type[M], value: object) -> M | None:
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def _valid_without_bad_keys(model: type[M], value: object) -> M | None:
    """A listener or cluster as if its invalid keys were left out (their defaults), when that
    validates: its name, address and routes still take part in the rules across items. The
    keys those rules read are required or checked against each other (a listener without
    routes, a tcp one without a cluster, is invalid), so a default never stands in for them."""
    try:
        return model.model_validate(value)
    except ValidationError as e:
        if not isinstance(value, dict):
            return None
        bad = {err["loc"][0] for err in e.errors() if err["loc"]}
        return _valid_or_none(model, {k: v for k, v in value.items() if k not in bad})


def partial_problems(data: dict[str, object]) -> list[Problem]:
    """The cross-section rules of a config that failed validation, on its sections and items
    that validate alone (what pydantic leaves unchecked when any field fails: an ``after``
    validator runs only on a valid model)."""
    def section(model: type[M], key: str) -> M | None:
        return _valid_or_none(model, data[key]) if key in data else model()

    def items(model: type[M], key: str) -> list[tuple[int, M | None]]:
        raw = data.get(key)
        if not isinstance(raw, list):
            return []
        return [(i, _valid_without_bad_keys(model, item)) for i, item in enumerate(raw)]

    clusters = items(ClusterConfig, "clusters")
    raw_clusters = data.get("clusters")
    others = frozenset(
        item["name"] for i, c in clusters if c is None
        for item in [raw_clusters[i]]  # type: ignore[index]
        if isinstance(item, dict) and isinstance(item.get("name"), str))
    return cross_problems(
        section(AdminConfig, "admin"), section(DrainConfig, "drain"),
        section(ShutdownConfig, "shutdown"), section(HotRestartConfig, "hot_restart"),
        [(i, x) for i, x in items(ListenerConfig, "listeners") if x is not None],
        [(i, c) for i, c in clusters if c is not None], others)
