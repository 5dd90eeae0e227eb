"""Admission, once for every protocol: a request head as a codec read it, in; the head sent
upstream (or the local answer that refuses it), out.

One pure function holds the rules that decide what the upstream sees and whether the request
may go at all, so HTTP/1.1 and HTTP/2 cannot drift apart on one:

- hop-by-hop fields (RFC 9110 §7.6.1) and those ``Connection`` nominates are not forwarded
  (``proxy.fields.HOP_BY_HOP``, the one set); the codec re-frames the body;
- ``Host`` / ``:authority`` (RFC 9110 §7.2, RFC 9113 §8.3.1): one authority, valid as a
  host[:port], else 400; HTTP/1.1 and HTTP/2 requests must name one (RFC 9112 §3.2);
- ``X-Forwarded-For`` gets the client's address appended and ``X-Forwarded-Proto`` is this
  listener's scheme (as Envoy's connection manager and HAProxy's ``option forwardfor`` do);
- ``x-request-id`` is passed on, or generated when absent (Envoy's default);
- retry safety (RFC 9110 §9.2.2): an idempotent method, or ``Idempotency-Key`` /
  ``Resume-Seq``, which the application applies once;
- the body's framing: ``Content-Length`` goes on when there is content or the method defines
  one; content of unknown length is sent chunked to an HTTP/1.1 upstream;
- a WebSocket (RFC 6455 §4.1 ``Upgrade``, or RFC 8441's extended CONNECT), ``TE: trailers``,
  ``Expect``, gRPC.

The persistence key (``persistence_key``) is read from the same prepared head once the route
names a cluster.
"""

from __future__ import annotations

from typing import Final

from lameduck.drain.retry import IDEMPOTENT_METHODS, REPLAY_SAFE_FIELDS
from lameduck.proxy.accesslog import new_request_id
from lameduck.proxy.fields import (
    HOP_BY_HOP,
    accepts_trailers,
    cookie_value,
    drop_nominated_fields,
    valid_authority,
)
from lameduck.proxy.local import is_grpc
from lameduck.proxy.message import HTTP10, LocalAnswer, RequestHead
from lameduck.upstream.connector import Fields

# The fields admission looks at; every other one is forwarded as it came.
SPECIAL: Final = HOP_BY_HOP | REPLAY_SAFE_FIELDS | {
    b"host", b"x-forwarded-for", b"x-forwarded-proto", b"expect", b"x-request-id",
    b"content-type", b"content-length",
}
# Methods whose semantics anticipate no content (RFC 9110 §8.6): no Content-Length without it.
_NO_CONTENT_METHODS: Final = frozenset({b"GET", b"HEAD"})
QUERY: Final = 63  # "?", as a byte value: ``in`` looks for it with memchr

MISSING_HOST: Final = b"missing or repeated host\n"
BAD_AUTHORITY: Final = b"bad authority\n"


class Client:
    """What admission adds for a downstream connection: its peer's address, the
    X-Forwarded-For and -Proto fields that name it and the listener's scheme, and whether the
    listener makes request ids. The same for every connection from one address to listeners
    alike: they share one (``client_for``)."""

    def __init__(self, host: str, scheme: bytes, generate_request_id: bool) -> None:
        self.host = host  # the address as text: what the health-check path's trackers key on
        peer = self.peer = host.encode()  # as X-Forwarded-For names it
        self.for_field = (b"x-forwarded-for", peer)
        self.proto_field = (b"x-forwarded-proto", scheme)
        self.generate_request_id = generate_request_id  # (Envoy's default: when absent)
        # The two fields as an upstream codec that writes text formats them (and the head's
        # end after them), kept here by that codec at its first use: every request of the
        # connection sends the same pair, last.
        self.formatted = b""


# The Client of each recent peer address. A client opens many connections (a browser's six, a
# load balancer's pool from its few addresses), and an idle keep-alive connection otherwise
# holds its own copy of these facts (~350 bytes with the two field tuples, the address and the
# formatted pair). Emptied when it reaches CLIENTS_KEPT addresses: a connection keeps the one
# it took.
_CLIENTS: Final[dict[str, Client]] = {}
CLIENTS_KEPT: Final = 1024


def client_for(host: str, scheme: bytes, generate_request_id: bool) -> Client:
    """The Client for a connection from ``host`` (its peer address, as the socket gives it) to a
    listener with this scheme and request-id setting: one shared with the connections before
    it from there, or a new one."""
    client = _CLIENTS.get(host)
    if (client is not None and client.proto_field[1] == scheme
            and client.generate_request_id == generate_request_id):
        return client
    if len(_CLIENTS) >= CLIENTS_KEPT:
        _CLIENTS.clear()
    client = _CLIENTS[host] = Client(host, scheme, generate_request_id)
    return client


def prepare(head: RequestHead, client: Client) -> RequestHead:
    """The head to send upstream for ``head`` from ``client``: ``head`` itself, prepared in
    place (a codec hands each head over once; the list of fields it read is left as read, for
    the access log). Its ``refused`` is set when the request is answered here instead (the
    facts it carries, such as ``grpc``, still shape that answer)."""
    method = head.method
    out: Fields = []
    has_body = head.has_body
    keep_length = has_body or method not in _NO_CONTENT_METHODS
    length_seen = False
    host: bytes | None = None
    hosts = 0
    xff: bytes | None = None
    tokens = b""
    upgrade: bytes | None = None
    retryable = method in IDEMPOTENT_METHODS
    for field in head.fields:  # the fields as read: ``out`` replaces them below
        n = field[0].lower()
        if n not in SPECIAL:
            out.append(field)
            continue
        value = field[1]
        if n in HOP_BY_HOP:
            if n == b"connection":
                tokens += b"," + value.lower()
            elif n == b"upgrade":
                upgrade = value
            elif n == b"te" and accepts_trailers(value):
                head.te_trailers = True
            # keep-alive, proxy-connection, transfer-encoding: this hop's own
        elif n == b"host":
            hosts += 1
            if host is None:
                host = value
        elif n == b"x-forwarded-for":
            xff = value if xff is None else xff + b", " + value  # one list (RFC 9110 §5.3)
        elif n == b"content-length":
            if keep_length:
                length_seen = True
                out.append(field)
        elif n != b"x-forwarded-proto":  # that one is replaced below
            if n in REPLAY_SAFE_FIELDS:
                retryable = True
            elif n == b"expect":
                head.expect = True
            elif n == b"x-request-id":
                head.request_id = value
            elif n == b"content-type":
                head.grpc = is_grpc(value)
            out.append(field)
    head.fields = out
    head.chunked = has_body and not length_seen
    if head.protocol is not None:
        head.websocket = head.protocol == b"websocket"
    elif (upgrade is not None and method == b"GET" and upgrade.strip().lower() == b"websocket"
          and b"upgrade" in [t.strip() for t in tokens.split(b",")]):
        head.websocket = True
    if tokens:
        out = head.fields = drop_nominated_fields(out, tokens)
    # A WebSocket is not sent twice: its 101 hands the connection over.
    head.retryable = retryable and not head.websocket
    authority = head.authority
    if authority is None:  # not in the request line / :authority: the Host field names it
        authority = host
    head.authority = authority
    if not head.request_id and client.generate_request_id:
        head.request_id = rid = new_request_id()
        out.append((b"x-request-id", rid))
    if xff:
        head.forwarded_for = sent = xff + b", " + client.peer
        out.append((b"x-forwarded-for", sent))
        out.append(client.proto_field)
    else:
        head.forwarded_for = client.peer
        head.client = client  # the last two fields are the connection's own pair
        out.append(client.for_field)
        out.append(client.proto_field)
    if hosts > 1:
        head.refused = LocalAnswer(400, MISSING_HOST, malformed=True)
    elif authority is None:
        if head.version == HTTP10:
            head.authority = b""  # RFC 9112 §3.2: an empty Host where no authority was named
        else:
            head.refused = LocalAnswer(400, MISSING_HOST, malformed=True)
    elif not valid_authority(authority):
        # routed and forwarded by it: one that could mean two things is refused
        head.refused = LocalAnswer(400, BAD_AUTHORITY, malformed=True)
    return head


def route_path(path: bytes) -> bytes:
    """The part of a target a route matches: the path without its query."""
    return path.partition(b"?")[0] if QUERY in path else path  # one memchr, no tuple


def persistence_key(fields: Fields, peer: bytes, by_cookie: bool,
                    cookie_name: bytes) -> str | None:
    """The key a persistent cluster keeps its record under: the client's address, or the value
    of its persistence cookie (None: the client has none yet)."""
    if not by_cookie:
        return peer.decode()
    for name, value in fields:
        if len(name) == 6 and name.lower() == b"cookie":
            found = cookie_value(value, cookie_name)
            if found is not None:
                return found
    return None
