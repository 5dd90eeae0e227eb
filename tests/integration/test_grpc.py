"""gRPC through lameduck with grpcio on both ends: h2c to lameduck, ``protocol: h2`` to the
servers. Unary, server-streaming and bidi calls with metadata and trailers; gRPC statuses for
what lameduck answers itself; and a drain under load that fails no unary call.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.procs import (
    Lameduck,
    _env,
    _read_lines,
    base_config,
    refusing_port,
    stop,
    wait_until,
)

PEER = Path(__file__).resolve().parents[1] / "grpcpeer.py"


class Peer:
    def __init__(self, name: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(PEER), "--port", "0", "--name", name],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=_env())
        lines = _read_lines(self.proc, 1, 15)
        if not lines or not lines[0].startswith("listening on 127.0.0.1:"):
            stop(self.proc)
            raise RuntimeError(f"grpc peer did not start: {lines!r}")
        self.port = int(lines[0].rsplit(":", 1)[1])


@pytest.fixture
def peers() -> Iterator[Callable[[str], Peer]]:
    made: list[Peer] = []

    def make(name: str) -> Peer:
        p = Peer(name)
        made.append(p)
        return p

    yield make
    for p in made:
        stop(p.proc)


def h2_config(port: int, **over: Any) -> dict[str, Any]:
    return base_config(port, cluster={"protocol": "h2"}, **over)


# What a gRPC client is told to do with UNAVAILABLE (https://grpc.io/docs/guides/retry/):
# a stream sent in the instant the final GOAWAY is on its way is refused unprocessed, and
# grpc-core retries that transparently only while the call is not yet committed.
SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "test.Echo"}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
}]})


def channel(*ports: int, retry: bool = True) -> grpc.Channel:
    target = "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in ports)
    # One authority for the service, not the list of addresses grpc would make of the target.
    options = [("grpc.lb_policy_name", "round_robin"), ("grpc.enable_retries", 1),
               ("grpc.default_authority", "echo.test")]
    if retry:
        options.append(("grpc.service_config", SERVICE_CONFIG))
    return grpc.insecure_channel(target, options=options)


def test_unary_streaming_bidi_with_metadata_and_trailers(
    peers: Callable[[str], Peer], lameduck: Callable[..., Lameduck],
) -> None:
    peer = peers("p1")
    ld = lameduck(h2_config(peer.port))
    with channel(ld.port) as ch:
        unary = ch.unary_unary("/test.Echo/Unary")
        reply, call = unary.with_call(b"ping", metadata=(("x-meta", "m1"),), timeout=10)
        assert reply == b"ping"
        assert ("x-origin", "p1") in call.initial_metadata()
        assert ("x-trail", "m1") in call.trailing_metadata()
        assert call.code() is grpc.StatusCode.OK
        stream = ch.unary_stream("/test.Echo/Stream")
        assert list(stream(b"5,10", timeout=10)) == [b"0", b"1", b"2", b"3", b"4"]
        bidi = ch.stream_stream("/test.Echo/Bidi")
        assert list(bidi(iter([b"a", b"b", b"c"]), timeout=10)) == [b"a", b"b", b"c"]
    assert ld.stat("cluster.app.upstream_rq_2xx") >= 3


@pytest.mark.parametrize(("where", "code", "detail"), [
    ("no healthy upstream", grpc.StatusCode.UNAVAILABLE, "upstream connect error"),
    ("no route", grpc.StatusCode.UNIMPLEMENTED, "no route"),
])
def test_local_answers_are_grpc_statuses(
    lameduck: Callable[..., Lameduck], where: str, code: grpc.StatusCode, detail: str,
) -> None:
    """Not "Received http2 header with status: 502": the status a gRPC client can act on."""
    dead = refusing_port()  # nothing listens there for as long as this test runs
    over: dict[str, Any] = {}
    if where == "no route":
        over["route"] = {"prefix": "/other"}
    ld = lameduck(h2_config(dead, **over))
    with channel(ld.port, retry=False) as ch, pytest.raises(grpc.RpcError) as info:
        ch.unary_unary("/test.Echo/Unary")(b"x", timeout=10)
    err = info.value
    assert err.code() is code, (err.code(), err.details())
    assert detail in (err.details() or "")


def test_drain_under_load_fails_no_unary_call(
    peers: Callable[[str], Peer], lameduck: Callable[..., Lameduck],
) -> None:
    """Two lameducks, the client's round_robin over both (no retry policy: only gRPC's own
    transparent retry of a stream the server did not process), one SIGTERMed under steady
    unary load and server streams: no unary call fails; a stream longer than the deadline ends
    with UNAVAILABLE (14), one that fits finishes."""
    peer = peers("p1")
    drain = {"time": "2s", "strategy": "gradual", "connection_grace": "500ms"}
    a = lameduck(h2_config(peer.port, drain=drain, shutdown={"deadline": "4s"}))
    b = lameduck(h2_config(peer.port, drain=drain))
    results: list[tuple[float, str]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 60
    halt = threading.Event()  # set however the test ends: no load thread outlives it
    with channel(a.port, b.port, retry=False) as ch:
        unary = ch.unary_unary("/test.Echo/Unary")
        stream = ch.unary_stream("/test.Echo/Stream")
        assert unary(b"warm", timeout=10) == b"warm"

        def load() -> None:
            for i in range(100_000):  # bounded in count as well as in time
                if halt.is_set() or time.monotonic() >= stop_at:
                    return
                try:
                    ok = unary(b"%d" % i, timeout=10) == b"%d" % i
                    out = "ok" if ok else "wrong reply"
                except grpc.RpcError as e:
                    out = f"{e.code()}: {e.details()}"
                with lock:
                    results.append((time.monotonic(), out))

        long_streams: list[Any] = []
        short_streams: list[Any] = []
        for _ in range(4):  # round robin: two of each on each lameduck
            long_streams.append(stream(b"60,100", timeout=30))  # 6 s: past A's deadline
        for _ in range(4):
            short_streams.append(stream(b"10,100", timeout=30))  # 1 s: fits
        threads = [threading.Thread(target=load) for _ in range(6)]
        for t in threads:
            t.start()
        try:
            assert wait_until(lambda: len(results) >= 100, 10), "the load did not start"
            t0 = time.monotonic()
            a.signal(signal.SIGTERM)
            stop_at = t0 + 5.0  # past A's deadline: it has exited by then
            exit_code = a.wait(timeout=15)
        except BaseException:
            halt.set()  # a failed start or wait: the load stops now, not 60 s from now
            raise
        finally:
            for t in threads:
                t.join(timeout=30)
        short = [list(s) for s in short_streams]
        long_codes = []
        for s in long_streams:
            try:
                long_codes.append((len(list(s)), grpc.StatusCode.OK))
            except grpc.RpcError as e:
                long_codes.append((-1, e.code()))
                assert e.details() == "going away: cut at the drain deadline"
    failed = [r for _, r in results if r != "ok"]
    print("first failures at", [round(at - t0, 3) for at, r in results if r != "ok"][:10])
    during = [r for at, r in results if at >= t0]
    rate = len(during) / 5.0
    print(f"unary calls: {len(results)} ({len(during)} in the 5 s after SIGTERM, "
          f"{rate:.0f}/s); long streams: {long_codes}")
    assert failed == [], f"{len(failed)} of {len(results)} unary calls failed: {failed[:5]}"
    assert exit_code == 3, a.log()  # the long streams on it were cut
    assert len(during) >= 200, f"too little load during the drain: {len(during)}"
    assert all(s == [b"%d" % i for i in range(10)] for s in short)
    # Those on A were cut at its deadline with UNAVAILABLE; those on B ran to the end.
    assert all(code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE) for _, code in long_codes)
    assert any(code is grpc.StatusCode.UNAVAILABLE for _, code in long_codes), long_codes
    assert "deadline: cutting" in a.log()


def test_a_static_address_list_is_the_authority_and_every_call_is_ok(
    peers: Callable[[str], Peer], lameduck: Callable[..., Lameduck],
) -> None:
    """grpcio given ``ipv4:127.0.0.1:p,127.0.0.1:q`` with round_robin (and no default
    authority) sends that whole list as :authority. lameduck forwards it, as HAProxy and nginx
    do, and routes by its first host: each lameduck's one route names host 127.0.0.1, so a
    call routed by the whole value would be 404 (UNIMPLEMENTED)."""
    peer = peers("p1")
    a = lameduck(h2_config(peer.port, route={"host": "127.0.0.1"}))
    b = lameduck(h2_config(peer.port, route={"host": "127.0.0.1"}))
    target = f"ipv4:127.0.0.1:{a.port},127.0.0.1:{b.port}"
    with grpc.insecure_channel(target, options=[("grpc.lb_policy_name", "round_robin")]) as ch:
        unary = ch.unary_unary("/test.Echo/Unary")
        codes = []
        for i in range(20):
            try:
                _, call = unary.with_call(b"%d" % i, timeout=10)
                codes.append(call.code())
            except grpc.RpcError as e:
                codes.append(e.code())
        stream = ch.unary_stream("/test.Echo/Stream")
        assert list(stream(b"3,10", timeout=10)) == [b"0", b"1", b"2"]
    assert codes == [grpc.StatusCode.OK] * 20, codes
    # round_robin: both lameducks took calls
    assert a.stat("cluster.app.upstream_rq_2xx") >= 1 and b.stat("cluster.app.upstream_rq_2xx") >= 1
