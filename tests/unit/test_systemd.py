"""The sd_notify and sd_listen_fds halves, on real sockets in this process."""

from __future__ import annotations

import os
import socket

import pytest

from lameduck.config import ListenerConfig
from lameduck.restart.systemd import Notifier, PassedSocket, listen_fds, match_listeners


def _listener(name: str, address: str) -> ListenerConfig:
    return ListenerConfig.model_validate(
        {"name": name, "address": address, "routes": [{"prefix": "/", "cluster": "c"}]})


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def test_notifier_is_off_without_notify_socket_and_takes_the_variable_away() -> None:
    env = {"NOTIFY_SOCKET": "/run/x.sock", "OTHER": "1"}
    n = Notifier(env)
    assert n.enabled and n.address == "/run/x.sock"
    assert env == {"OTHER": "1"}  # children must not report for us
    assert not Notifier({}).enabled
    assert not Notifier({"NOTIFY_SOCKET": "vsock:2:1"}).enabled
    assert Notifier({"NOTIFY_SOCKET": "@abc"}).address == "\0abc"


def test_notifier_sends_one_datagram(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "n.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind(path)
        n = Notifier({"NOTIFY_SOCKET": path})
        assert n.send("READY=1", "STATUS=x")
        assert rx.recv(100) == b"READY=1\nSTATUS=x"
    os.unlink(path)
    assert not n.send("STOPPING=1")  # gone: a warning, never an exception


def test_listen_fds_ignores_what_is_not_for_this_pid_and_unsets_the_variables() -> None:
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "a"}
    assert listen_fds(env) == []
    assert env == {}
    assert listen_fds({}) == []


@pytest.mark.parametrize("env", [
    {"LISTEN_PID": "x", "LISTEN_FDS": "1"},
    {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "-1"},
])
def test_listen_fds_rejects_garbage(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="not numbers"):
        listen_fds(env)


def test_match_by_name_first_then_by_address_and_close_the_rest() -> None:
    a, b, c = _listening(), _listening(), _listening()
    b_port = b.getsockname()[1]
    passed = [PassedSocket(3, "unknown", b), PassedSocket(4, "edge", a),
              PassedSocket(5, "unknown", c)]
    out = match_listeners([_listener("edge", "127.0.0.1:1"),
                           _listener("inner", f"127.0.0.1:{b_port}")], passed)
    assert out == {"edge": a, "inner": b}
    assert c.fileno() == -1  # nobody's: closed
    a.close()
    b.close()


def test_a_dual_stack_wildcard_stands_for_the_ipv4_wildcard() -> None:
    """systemd's ListenStream=PORT is [::]:PORT, dual-stack: a listener at 0.0.0.0:PORT
    takes it (else lameduck would close it and fail to bind the port systemd holds)."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")  # not a failure being hidden: no v6 at all
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", 0))
    s.listen(1)
    port = s.getsockname()[1]
    out = match_listeners([_listener("any", f"0.0.0.0:{port}")],
                          [PassedSocket(3, "unknown", s)])
    assert out == {"any": s}
    v6only = socket.socket(socket.AF_INET6)
    v6only.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    v6only.bind(("::", 0))
    v6only.listen(1)
    port2 = v6only.getsockname()[1]
    assert match_listeners([_listener("any", f"0.0.0.0:{port2}")],
                           [PassedSocket(3, "unknown", v6only)]) == {}
    s.close()


def test_default_rendezvous_is_per_admin_address_and_none_for_an_ephemeral_port() -> None:
    from lameduck.restart.hot import default_path

    assert default_path("127.0.0.1", 0) is None
    a = default_path("127.0.0.1", 9901)
    assert a is not None and a.endswith("restart-127.0.0.1-9901.sock")
    assert default_path("127.0.0.2", 9901) != a
    assert "/" not in os.path.basename(default_path("::1", 9901) or "")
