"""HTTP/2 frame corpus against lameduck listening h2c with prior knowledge (RFC 9113 §3.3):
each row is an attack sent on a raw connection (tests/h2raw.py), with the error RFC 9113 asks
for (a GOAWAY code, or a RST_STREAM code for a stream error), a bound on the CPU time the
lameduck process spent on it (utime + stime from /proc/<pid>/stat), a bound on its resident
memory (VmRSS), and a legitimate client on another connection, opened before the attack and
asking after it, that must be served.

Rapid reset is CVE-2023-44487, the CONTINUATION flood the CVE-2024-27316 class, the control
and empty-frame floods CVE-2019-9512/9513/9518 (Envoy's http2_protocol_options and
its "max_outbound_control_frames" / "max_consecutive_inbound_frames_with_empty_payload"
give the same answer: GOAWAY ENHANCE_YOUR_CALM).
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from tests.adversarial.conftest import run_proxy, serve
from tests.capture import CaptureOrigin, echo_request_line
from tests.h2raw import RawH2
from tests.procs import Lameduck, base_config, rss_kb, wait_until
from tests.unit.test_h2_errors import raw_frame  # for what hyperframe refuses to serialize

NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED = 0x0, 0x1, 0x3, 0x5
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB
MAX_WINDOW = 2**31 - 1
BIG = 48 << 20  # a response far larger than any buffer lameduck should keep
STUCK_RSS_KB = 16 << 10
CPU_BOUND_S = 4.0  # per attack: generous on a shared 2-core machine, far below a hang
RSS_BOUND_KB = 96 << 10  # growth per attack


def respond(head: bytes) -> bytes:
    if head.startswith(b"GET /big "):
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (BIG, b"b" * BIG)
    return echo_request_line(head)


@pytest.fixture(scope="module")
def capture() -> Iterator[CaptureOrigin]:
    yield from serve(CaptureOrigin(respond))


@pytest.fixture(scope="module")
def proxy(capture: CaptureOrigin, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Lameduck]:
    yield from run_proxy(base_config(capture.port), tmp_path_factory, "adv-h2")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (proc(5): fields 14 and 15, in clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def headers(c: RawH2, sid: int, path: str = "/", end_stream: bool = True,
            end_headers: bool = True) -> bytes:
    hf = HeadersFrame(sid, c.enc.encode([(":method", "GET" if end_stream else "POST"),
                                         (":scheme", "http"), (":authority", c.authority),
                                         (":path", path)]))
    if end_headers:
        hf.flags.add("END_HEADERS")
    if end_stream:
        hf.flags.add("END_STREAM")
    return hf.serialize()


def send(c: RawH2, data: bytes) -> None:
    """Send, tolerating the server closing mid-flood (that is one of the answers)."""
    with contextlib.suppress(OSError):
        c.send(data)


def wait(c: RawH2, pred: Callable[[], bool], timeout: float = 8.0) -> bool:
    try:
        return c.wait(pred, timeout)
    except OSError:  # an ACK we owed could not be sent: the server closed
        return pred()


# -- the attacks: each sends on ``c`` and returns what to wait for ----------------------------


def rapid_reset(c: RawH2) -> None:
    out = bytearray()
    for i in range(1000):
        sid = 2 * i + 1
        out += headers(c, sid, "/rr") + RstStreamFrame(sid, error_code=8).serialize()
    send(c, bytes(out))


def continuation_flood(c: RawH2) -> None:
    send(c, headers(c, 1, "/cont", end_headers=False))
    block = c.enc.encode([("x-pad", "a" * 8000)])
    send(c, b"".join(ContinuationFrame(1, block).serialize() for _ in range(400)))


def empty_continuation_flood(c: RawH2) -> None:
    send(c, headers(c, 1, "/cont", end_headers=False))
    send(c, ContinuationFrame(1, b"").serialize() * 5000)


def settings_flood(c: RawH2) -> None:
    send(c, SettingsFrame(0).serialize() * 5000)


def ping_flood(c: RawH2) -> None:
    send(c, PingFrame(0, b"12345678").serialize() * 5000)


def empty_data_flood(c: RawH2) -> None:
    send(c, headers(c, 1, "/upload", end_stream=False))
    send(c, DataFrame(1, b"").serialize() * 5000)


def hpack_bomb(c: RawH2) -> None:
    """A 4 KiB field put in the dynamic table, then a block of one-octet references to it: 1
    KiB on the wire decoding to 4 MiB (RFC 7541 §7.3, RFC 9113 §10.5.1)."""
    hf = HeadersFrame(1, c.enc.encode([(":method", "GET"), (":scheme", "http"),
                                       (":authority", "a"), (":path", "/seed"),
                                       ("x-big", "v" * 4096)]))
    hf.flags.add("END_HEADERS")
    hf.flags.add("END_STREAM")
    bomb = HeadersFrame(3, b"\x82\x86\x84" + b"\xbe" * 1000)
    bomb.flags.add("END_HEADERS")
    bomb.flags.add("END_STREAM")
    send(c, hf.serialize() + bomb.serialize())


def hpack_garbage(c: RawH2) -> None:
    send(c, raw_frame(0x1, 0x5, 1, b"\xff\xff\xff\xff\xff\xff"))


def connection_window_overflow(c: RawH2) -> None:
    # RawH2 already credited the connection up to 2^30 (RFC 9113 §6.9.1)
    send(c, WindowUpdateFrame(0, window_increment=MAX_WINDOW).serialize())


def initial_window_too_large(c: RawH2) -> None:
    send(c, raw_frame(0x4, 0x0, 0, struct.pack(">HI", 0x4, 2**31)))  # RFC 9113 §6.5.2


def window_update_zero(c: RawH2) -> None:
    send(c, raw_frame(0x8, 0x0, 0, struct.pack(">I", 0)))  # RFC 9113 §6.9


def stream_id_reuse(c: RawH2) -> None:
    c.request(1, "/first")
    wait(c, lambda: c.done(1))
    send(c, headers(c, 1, "/again"))


def stream_id_backwards(c: RawH2) -> None:
    send(c, headers(c, 5, "/five") + headers(c, 3, "/three"))


def even_stream_id(c: RawH2) -> None:
    send(c, headers(c, 2, "/even"))


@dataclass(frozen=True)
class Conn:
    """A connection error: GOAWAY with one of ``codes``."""

    codes: tuple[int, ...]


CORPUS = [
    pytest.param(rapid_reset, Conn((ENHANCE_YOUR_CALM,)), id="rapid-reset-CVE-2023-44487"),
    pytest.param(continuation_flood, Conn((ENHANCE_YOUR_CALM,)),
                 id="continuation-flood-CVE-2024-27316"),
    pytest.param(empty_continuation_flood, Conn((ENHANCE_YOUR_CALM,)),
                 id="empty-continuation-flood"),
    pytest.param(settings_flood, Conn((ENHANCE_YOUR_CALM,)), id="settings-flood"),
    pytest.param(ping_flood, Conn((ENHANCE_YOUR_CALM,)), id="ping-flood"),
    pytest.param(empty_data_flood, Conn((ENHANCE_YOUR_CALM,)), id="empty-data-flood"),
    pytest.param(hpack_bomb, Conn((ENHANCE_YOUR_CALM, COMPRESSION_ERROR)), id="hpack-bomb"),
    pytest.param(hpack_garbage, Conn((COMPRESSION_ERROR,)), id="hpack-garbage"),
    pytest.param(connection_window_overflow, Conn((FLOW_CONTROL_ERROR,)),
                 id="window-update-overflow-connection"),
    pytest.param(initial_window_too_large, Conn((FLOW_CONTROL_ERROR,)),
                 id="settings-initial-window-too-large"),
    pytest.param(window_update_zero, Conn((PROTOCOL_ERROR,)), id="window-update-zero"),
    pytest.param(stream_id_reuse, Conn((PROTOCOL_ERROR, STREAM_CLOSED)), id="stream-id-reuse"),
    pytest.param(stream_id_backwards, Conn((PROTOCOL_ERROR,)), id="stream-id-backwards"),
    pytest.param(even_stream_id, Conn((PROTOCOL_ERROR,)), id="stream-id-even"),
]


@pytest.fixture
def bounded(proxy: Lameduck) -> Iterator[RawH2]:
    """The legitimate client, connected before the attack; after it: served, and the
    process alive within its CPU and memory bounds."""
    assert proxy.proc is not None
    legit = RawH2(proxy.port)
    cpu0, rss0 = cpu_seconds(proxy.pid), rss_kb(proxy.pid)
    yield legit
    assert proxy.proc.poll() is None
    legit.request(1, "/legit")
    assert legit.wait(lambda: legit.done(1), 8)
    assert legit.streams[1].status == 200
    assert bytes(legit.streams[1].body) == b"GET /legit HTTP/1.1\n"
    legit.close()
    spent = cpu_seconds(proxy.pid) - cpu0
    grown = rss_kb(proxy.pid) - rss0
    assert spent < CPU_BOUND_S, f"{spent:.2f} s of CPU"
    assert grown < RSS_BOUND_KB, f"RSS grew by {grown} KiB"


@pytest.mark.parametrize(("attack", "expect"), CORPUS)
def test_attack_gets_goaway(proxy: Lameduck, bounded: RawH2,
                            attack: Callable[[RawH2], None], expect: Conn) -> None:
    c = RawH2(proxy.port)
    attack(c)
    assert wait(c, lambda: bool(c.goaways)), [type(f).__name__ for f in c.frames]
    assert c.goaways[-1][1] in expect.codes, c.goaways
    assert wait(c, lambda: c.eof)  # and the connection is closed after it
    c.close()


def test_stream_window_overflow_resets_the_stream(proxy: Lameduck, bounded: RawH2) -> None:
    """RFC 9113 §6.9.1: a stream window past 2^31-1 is a stream error FLOW_CONTROL_ERROR; the
    connection serves on."""
    c = RawH2(proxy.port)
    send(c, headers(c, 1, "/open", end_stream=False))
    send(c, WindowUpdateFrame(1, window_increment=MAX_WINDOW).serialize())
    assert wait(c, lambda: c.done(1) or bool(c.goaways))
    if c.goaways:
        assert c.goaways[-1][1] == FLOW_CONTROL_ERROR
    else:
        assert c.streams[1].reset == FLOW_CONTROL_ERROR
        c.request(3, "/same-connection")
        assert wait(c, lambda: c.done(3)) and c.streams[3].status == 200
    c.close()


def test_priority_flood_is_cheap(proxy: Lameduck, bounded: RawH2) -> None:
    """PRIORITY is deprecated (RFC 9113 §5.3.2) but still parsed: a flood of them on idle
    streams must cost little and open nothing; answered, or ENHANCE_YOUR_CALM."""
    c = RawH2(proxy.port)
    send(c, b"".join(PriorityFrame(2 * i + 1, depends_on=0, stream_weight=16).serialize()
                     for i in range(20000)))
    c.send(PingFrame(0, b"afterall").serialize())
    assert wait(c, lambda: bool(c.goaways) or any(
        isinstance(f, PingFrame) and f.opaque_data == b"afterall" for f in c.frames))
    if c.goaways:
        assert c.goaways[-1][1] == ENHANCE_YOUR_CALM
    c.close()


def test_zero_window_large_response_is_bounded(proxy: Lameduck, bounded: RawH2) -> None:
    """A client that opens no window (SETTINGS_INITIAL_WINDOW_SIZE 0) to a 48 MiB response:
    lameduck must stop reading the upstream rather than buffer it (RSS bound), and the
    stream does not move until credit comes."""
    c = RawH2(proxy.port)
    rss0 = rss_kb(proxy.pid)
    send(c, raw_frame(0x4, 0x0, 0, struct.pack(">HI", 0x4, 0)))
    c.request(1, "/big")
    assert wait(c, lambda: c.streams[1].status is not None)
    assert c.streams[1].status == 200 and len(c.streams[1].body) == 0
    # while the stream is stuck, lameduck's memory stays bounded (a negative check: bounded)
    assert not wait_until(lambda: rss_kb(proxy.pid) - rss0 > STUCK_RSS_KB, 1.0, 0.05)
    assert not c.goaways
    c.close()
