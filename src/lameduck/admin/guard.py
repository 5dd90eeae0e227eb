"""Who may talk to the admin API: not a web page, and with ``admin.token_file`` only a holder of
the token.

A page in a browser on the same host can send requests to 127.0.0.1:9901 (a cross-site POST,
CSRF) or, by DNS rebinding, make its own name resolve there and read the answers. Both carry
what a browser cannot leave out: a ``Host`` naming the page's site (RFC 9110 §7.2) and, on any
cross-origin request and any POST, ``Origin`` (RFC 6454 §7, Fetch) or ``Sec-Fetch-Site``. The
admin API's own clients (curl, ``lameduck prestop``, probes, HAProxy's ``option httpchk``) send
neither a foreign Host nor an Origin.
"""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path

from lameduck.config import HostPort

WILDCARDS = ("0.0.0.0", "::", "")


def read_token(path: str) -> bytes:
    """The token in ``path`` (surrounding whitespace dropped). OSError names the file."""
    try:
        token = Path(path).read_bytes().strip()
    except OSError as e:
        raise OSError(f"admin.token_file {path}: {e.strerror or e}") from e
    if not token:
        raise OSError(f"admin.token_file {path}: empty: write the token into it")
    return token


def _host_name(value: str) -> str:
    """``Host``'s host, without port or brackets, lower case, no trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class AdminGuard:
    """Checks one request's ``Host``, ``Origin``, ``Sec-Fetch-Site`` and ``Authorization``."""

    def __init__(self, host: str, token: bytes | None = None) -> None:
        self.token = token or None
        configured = _host_name(host)
        # Loopback names always; a non-loopback admin address adds its own host. A wildcard
        # address has no name of its own: any IP literal (rebinding needs a DNS name).
        self.wildcard = configured in WILDCARDS
        self.extra = "" if self.wildcard or HostPort(configured, 0).is_loopback else configured

    def host_allowed(self, value: str) -> bool:
        name = _host_name(value)
        if name == self.extra or HostPort(name, 0).is_loopback:
            return True
        return self.wildcard and _is_ip(name)

    def refuse(self, headers: dict[bytes, bytes]) -> tuple[int, bytes] | None:
        """(status, reason) to answer instead of the request, or None to serve it."""
        host = headers.get(b"host")
        # No Host at all is an HTTP/1.0 client (HAProxy's httpchk), never a browser.
        if host is not None and not self.host_allowed(host.decode("latin-1")):
            return 403, (b"forbidden: Host %s is not this admin API's address (a DNS "
                         b"rebinding page?); use 127.0.0.1 or localhost\n" % host[:200])
        if b"origin" in headers:
            return 403, b"forbidden: a request with Origin comes from a web page\n"
        site = headers.get(b"sec-fetch-site")
        if site is not None and site.lower() not in (b"none", b"same-origin"):
            return 403, b"forbidden: Sec-Fetch-Site %s: sent by a web page\n" % site[:50]
        if self.token is not None:
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            # constant time: how much of a guess matched must not show in the answer's timing
            if not (hmac.compare_digest(given.strip(), self.token)
                    and scheme.lower() == b"bearer"):
                return 401, b"unauthorized: send Authorization: Bearer <admin.token_file>\n"
        return None
