"""The pieces of HTTP/3's hot restart that need no process: the generation mark, the
forwarded datagram's framing, and what a forwarding socket does once its reader is gone."""

from __future__ import annotations

import socket
from typing import Any

import pytest

pytest.importorskip("aioquic")

from lameduck.listeners.quic import (
    forward_pair,
    generation_mark,
    live_routes,
    pack_forwarded,
    route,
    still_read,
    unpack_forwarded,
)


@pytest.mark.parametrize("addr", [("127.0.0.1", 50123), ("::1", 443, 0, 0),
                                  ("fe80::1", 8443, 5, 2)])
def test_a_forwarded_datagram_keeps_its_address_as_asyncio_gave_it(addr):
    """aioquic compares a path's address with the one a datagram came from: the tuple must
    come out as it went in, IPv6's flow info and scope id too."""
    data = bytes(range(256)) * 5
    assert unpack_forwarded(pack_forwarded(addr, data)) == (addr, data)


def test_a_route_whose_reader_has_exited_is_dropped_at_the_next_handover():
    """Each handover passes on every route to an older process: without dropping those
    whose process has exited, a chain of restarts piles descriptors up (a route per worker
    per generation) until the handover itself fails."""
    gone_in, gone_out = forward_pair()
    live_in, live_out = forward_pair()
    kept = live_in.dup()  # another copy of the reader: it still lives while one is open
    try:
        assert still_read(gone_out) and still_read(live_out)
        gone_in.close()
        live_in.close()
        assert not still_read(gone_out) and still_read(live_out)
        assert live_routes({1: gone_out, 2: live_out}) == {2: live_out}
        assert gone_out.fileno() == -1  # closed, not leaked
    finally:
        for s in (gone_out, live_out, kept):
            s.close()


def test_the_mark_is_the_epoch_in_one_byte():
    assert [generation_mark(e) for e in (0, 1, 255, 256, 257)] == [0, 1, 255, 0, 1]


def test_a_forwarding_socket_fails_once_its_reader_has_exited():
    """The newest process learns that an older one has gone from its send failing (only the
    older process holds the reading end), and forgets it."""
    inbox, outlet = forward_pair()
    outlet.send(pack_forwarded(("127.0.0.1", 1), b"x"))
    assert unpack_forwarded(inbox.recv(65536)) == (("127.0.0.1", 1), b"x")
    inbox.close()
    with pytest.raises(BrokenPipeError):
        outlet.send(b"y", socket.MSG_NOSIGNAL)
    outlet.close()


# -- a connection in its handshake at the handover -------------------------------------------

@pytest.fixture(scope="module")
def server_pem(tmp_path_factory: pytest.TempPathFactory) -> str:
    import trustme

    path = tmp_path_factory.mktemp("h3fwd") / "server.pem"
    trustme.CA().issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(path))
    return str(path)


def _client(odcid: bytes | None = None):
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    from lameduck.http3 import H3_ALPN

    cfg = QuicConfiguration(is_client=True, alpn_protocols=list(H3_ALPN),
                            server_name="localhost", verify_mode=0)
    client = QuicConnection(configuration=cfg)
    if odcid is not None:  # the id a client picks for its first Initial (RFC 9000 §7.2)
        client._peer_cid.cid = odcid
        client._original_destination_connection_id = odcid
    client.connect(("10.0.0.2", 443), now=1000.0)
    return client


def _newer_endpoint(server_pem: str, older_mark: int, older_workers: int = 1):
    """The endpoint of the process after generation ``older_mark``, forwarding the packets
    of that one's worker 0 to a socketpair (returned: the end the older process would read)
    and those of its other workers (``older_workers``) to others (``endpoint.inboxes``);
    ``_new`` only records what it would have taken as a new connection."""
    from types import SimpleNamespace

    from aioquic.quic.configuration import QuicConfiguration

    from lameduck.http3 import H3_ALPN
    from lameduck.listeners.quic import QuicEndpoint

    qc = QuicConfiguration(is_client=False, alpn_protocols=list(H3_ALPN))
    qc.load_cert_chain(server_pem, server_pem)
    listener = SimpleNamespace(cfg=SimpleNamespace(http2=SimpleNamespace(
        max_concurrent_streams=100)), max_request_headers=0, name="h3")
    pairs = [forward_pair() for _ in range(older_workers)]
    inbox = pairs[0][0]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    endpoint = QuicEndpoint(listener, qc, udp, older_mark + 1,  # type: ignore[arg-type]
                            {route(older_mark, w): out for w, (_, out) in enumerate(pairs)})
    endpoint.inboxes = [i for i, _ in pairs]  # type: ignore[attr-defined]
    udp.close()
    taken: list[bytes] = []
    endpoint._new = lambda *a: taken.append(a[0])  # type: ignore[method-assign]
    return endpoint, inbox, taken


def _second_initial(server_pem: str, prefix: bytes) -> list[bytes]:
    """A client's datagrams after a server whose ids begin with ``prefix`` answered its first
    Initial: the first of them an Initial addressed to the id that server chose."""
    from aioquic.quic.configuration import QuicConfiguration

    from lameduck.http3 import H3_ALPN, H3Server

    client = _client()
    first = client.datagrams_to_send(1000.0)
    scfg = QuicConfiguration(is_client=False, alpn_protocols=list(H3_ALPN))
    scfg.load_cert_chain(server_pem, server_pem)
    server = H3Server(scfg, client._original_destination_connection_id, cid_prefix=prefix)
    for data, _ in first:
        server.receive_datagram(data, ("10.0.0.1", 4433), 1000.0)
    for data, _ in server.quic.datagrams_to_send(1000.0):
        client.receive_datagram(data, ("10.0.0.2", 443), 1000.0)
    second = [data for data, _ in client.datagrams_to_send(1000.0)]
    assert second and second[0][0] & 0x30 == 0  # long header, Initial (RFC 9000 §17.2.2)
    return second


def test_a_handshake_in_flight_at_the_handover_goes_on_in_the_older_process(server_pem):
    """The client's Initial packets after the server's first flight name the id the server
    chose (RFC 9000 §7.2), and its Handshake packet rides in the same datagram behind one:
    the newer process must hand that datagram to the older one, not take it for a new
    connection (which would then capture every later packet of that id)."""
    second = _second_initial(server_pem, b"\x05\x00")

    endpoint, inbox, taken = _newer_endpoint(server_pem, 5)
    try:
        endpoint.datagram_received(second[0], ("10.0.0.1", 4433))
        assert taken == []
        assert unpack_forwarded(inbox.recv(65536)) == (("10.0.0.1", 4433), second[0])
        assert endpoint.stats.packets_forwarded == 1
    finally:
        endpoint.close()
        inbox.close()


def test_a_packet_goes_to_the_worker_its_connection_id_names(server_pem):
    """With workers, an id's second byte names the worker that issued it: a 1-RTT packet of
    an older process's worker 1 goes to that worker, not to its worker 0."""
    endpoint, inbox, taken = _newer_endpoint(server_pem, 5, older_workers=2)
    one_rtt = bytes((0x40,)) + b"\x05\x01" + bytes(range(6)) + b"\x00" * 40  # RFC 9000 §17.3.1
    try:
        endpoint.datagram_received(one_rtt, ("10.0.0.1", 4433))
        assert taken == []
        with pytest.raises(BlockingIOError):
            inbox.recv(65536)  # worker 0's
        assert unpack_forwarded(endpoint.inboxes[1].recv(65536)) == (("10.0.0.1", 4433),
                                                                     one_rtt)
        assert endpoint.stats.packets_forwarded == 1
    finally:
        endpoint.close()
        for i in endpoint.inboxes:
            i.close()


def test_an_initial_addressed_to_another_processes_id_opens_no_connection(server_pem):
    """During a handover both processes read the socket a moment: a client's second Initial,
    addressed to the id the other process chose (RFC 9000 §7.2), may reach the one that has
    no such connection and nowhere to forward it. It does not open under keys drawn from
    that id (RFC 9001 §5.2), so it opens no connection (which could never decrypt a packet,
    and would hold a draining process to its idle timeout): dropped, and resent by the
    client."""
    second = _second_initial(server_pem, b"\x09\x00")
    endpoint, inbox, _ = _newer_endpoint(server_pem, 5)
    del endpoint._new  # the real one
    try:
        endpoint.datagram_received(second[0], ("10.0.0.1", 4433))
        assert endpoint.conns == {}
        assert endpoint.stats.packets_forwarded == 0
    finally:
        endpoint.close()
        inbox.close()


def test_a_new_connection_whose_id_looks_like_an_older_generation_is_taken_here(server_pem):
    """A client picks its first destination id at random (RFC 9000 §7.2): one beginning with
    an older process's mark still opens a connection in the newest one, which alone takes
    new connections."""
    client = _client(odcid=b"\x05\x00" + bytes(range(2, 8)))
    first = client.datagrams_to_send(1000.0)[0][0]
    endpoint, inbox, taken = _newer_endpoint(server_pem, 5)
    try:
        endpoint.datagram_received(first, ("10.0.0.1", 4433))
        assert taken == [first]
        with pytest.raises(BlockingIOError):
            inbox.recv(65536)
    finally:
        endpoint.close()
        inbox.close()


async def _serving_endpoint(server_pem: str) -> tuple[Any, tuple[str, int], list[bytes]]:
    """A QuicEndpoint of generation 0 serving a UDP socket on the running loop, as a listener
    would start it; what it reads is kept (in order) instead of handled."""
    import asyncio
    from types import SimpleNamespace

    from aioquic.quic.configuration import QuicConfiguration

    from lameduck.http3 import H3_ALPN
    from lameduck.listeners.quic import QuicEndpoint

    loop = asyncio.get_running_loop()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    qc = QuicConfiguration(is_client=False, alpn_protocols=list(H3_ALPN))
    qc.load_cert_chain(server_pem, server_pem)
    listener = SimpleNamespace(cfg=SimpleNamespace(http2=SimpleNamespace(
        max_concurrent_streams=100)), max_request_headers=0, name="h3", loop=loop)
    ep = QuicEndpoint(listener, qc, udp, 0)  # type: ignore[arg-type]
    got: list[bytes] = []
    ep.datagram_received = lambda data, addr: got.append(data)  # type: ignore[method-assign]
    await loop.create_datagram_endpoint(lambda: ep, sock=udp)
    return ep, udp.getsockname(), got


def test_the_old_process_reads_its_socket_again_once_no_newer_one_forwards(server_pem):
    """The newest process may exit (stopped, crashed) while an older one still drains: with
    nobody left to forward its packets, the older one reads the UDP socket again rather than
    leave its connections to die at their idle timeout."""
    import asyncio

    async def main() -> None:
        ep, where, got = await _serving_endpoint(server_pem)
        ep.conns[b"\x00" * 8] = object()  # type: ignore[assignment]  # one still draining
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            _, forward = ep.handover()
            successors = forward[route(0, 0)].dup()  # its copy, as SCM_RIGHTS gave it
            ep.handed_over()
            assert ep.transport is None  # the successor reads the socket now
            successors.close()  # ... until it exits
            for _ in range(100):
                client.sendto(b"after", where)
                await asyncio.sleep(0.01)
                if got:
                    break
            assert got and got[0] == b"after"
            assert ep.sock is not None  # and it still sends from its copy
        finally:
            client.close()
            ep.conns.clear()
            ep.close()
            await asyncio.sleep(0)

    asyncio.run(main())


@pytest.mark.parametrize("busy", [True, False], ids=["with-connections", "idle"])
def test_with_two_older_processes_left_the_newer_reads_and_forwards_to_the_oldest(server_pem,
                                                                                  busy):
    """Generations 0 and 1 drain, and generation 2 (the only reader) exits: generation 1
    reads the UDP socket again and forwards generation 0's packets to it, as 2 did;
    generation 0 sees no end of file (1 still holds its socket), so it does not read the
    UDP socket too, where it would take 1's packets and drop them. Once 1 has exited, 0
    reads it. ``idle``: generation 1 (or, with workers, one of its workers) has no
    connection left, and still keeps its endpoint for 0's sake: with workers, its process
    lives on while its other workers drain, and nobody else would read its sockets."""
    import asyncio

    from aioquic.quic.configuration import QuicConfiguration

    from lameduck.http3 import H3_ALPN
    from lameduck.listeners.quic import QuicEndpoint

    async def main() -> None:
        loop = asyncio.get_running_loop()
        a, where, got_a = await _serving_endpoint(server_pem)
        a.conns[b"\x00" * 8] = object()  # type: ignore[assignment]  # one still draining
        udp_a, fwd_a = a.handover()
        qc = QuicConfiguration(is_client=False, alpn_protocols=list(H3_ALPN))
        qc.load_cert_chain(server_pem, server_pem)
        udp_b = udp_a.dup()  # as SCM_RIGHTS gives it
        b = QuicEndpoint(a.listener, qc, udp_b, 1,
                         {r: out.dup() for r, out in fwd_a.items()})
        if busy:
            b.conns[b"\x01" + b"\x00" * 7] = object()  # type: ignore[assignment]
        await loop.create_datagram_endpoint(lambda: b, sock=udp_b)
        a.handed_over()
        _, fwd_b = b.handover()
        newest = [out.dup() for out in fwd_b.values()]  # generation 2's copies
        b.handed_over()
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        one_rtt = bytes((0x40,)) + b"\x00\x00" + bytes(range(6)) + b"\x00" * 40
        try:
            assert a.transport is None and b.transport is None  # generation 2 reads
            for out in newest:
                out.close()  # generation 2 exits
            for _ in range(300):
                client.sendto(one_rtt, where)
                await asyncio.sleep(0.01)
                if got_a:
                    break
            assert got_a and got_a[0] == one_rtt  # by way of generation 1
            assert b.transport is not None and b.stats.packets_forwarded >= 1
            assert a.transport is None and a.inbox is not None  # 0 reads only its inbox
            b.conns.clear()
            b.close()  # generation 1 exits
            for _ in range(300):
                await asyncio.sleep(0.01)
                if a.transport is not None:
                    break
            assert a.transport is not None  # now 0 reads the socket itself
        finally:
            client.close()
            a.conns.clear()
            a.close()
            b.close()
            await asyncio.sleep(0)

    asyncio.run(main())


def test_a_successor_that_dies_before_its_drain_changes_nothing(server_pem):
    """Handed the sockets, the new process may die before it is ready: the old one never got
    "drain", goes on reading the UDP socket itself, and the next successor gets a fresh
    forwarding pair (the first one's closed, not leaked)."""
    import asyncio

    async def main() -> None:
        ep, where, got = await _serving_endpoint(server_pem)
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            _, forward = ep.handover()
            first = ep.inbox
            forward[0].dup().close()  # the successor's copy, gone with it
            client.sendto(b"still ours", where)
            for _ in range(100):
                await asyncio.sleep(0.01)
                if got:
                    break
            assert got == [b"still ours"] and ep.transport is not None
            ep.handover()  # the next would-be successor
            assert first is not None and first.fileno() == -1
        finally:
            client.close()
            ep.close()
            await asyncio.sleep(0)

    asyncio.run(main())


def test_a_refused_client_reads_connection_refused_from_the_servers_initial():
    """The refusal is a server Initial sealed with the keys of the client's own first id, so
    a real client (aioquic's) decrypts it and ends with CONNECTION_REFUSED at once."""
    from aioquic.buffer import Buffer
    from aioquic.quic import events as qe
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection
    from aioquic.quic.packet import QuicErrorCode, pull_quic_header

    from lameduck.listeners.quic import refusal

    client = QuicConnection(configuration=QuicConfiguration(is_client=True, alpn_protocols=["h3"]))
    server = ("127.0.0.1", 443)
    client.connect(server, now=1.0)
    first = client.datagrams_to_send(1.0)[0][0]
    reply = refusal(pull_quic_header(Buffer(data=first), host_cid_length=8))
    assert len(reply) < len(first)  # no amplification (RFC 9000 §8)
    client.receive_datagram(reply, server, now=1.01)
    events = []
    while (ev := client.next_event()) is not None:
        events.append(ev)
    ended = [e for e in events if isinstance(e, qe.ConnectionTerminated)]
    if not ended:  # aioquic reports the end after its draining period (RFC 9000 §10.2.2)
        client.handle_timer(client.get_timer() or 2.0)
        ended = [e for e in iter(client.next_event, None)
                 if isinstance(e, qe.ConnectionTerminated)]
    assert ended and ended[0].error_code == QuicErrorCode.CONNECTION_REFUSED, events
