"""bench/run.py's response-shape matrix: the pure parts (the raw-response parser that checks
what each origin sends, the shape checks, the nginx config, the matrix rows and their
saturation rule). The bench itself is run by `make bench`, not here."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest


def head(*fields: str, status: str = "200 OK") -> bytes:
    return ("\r\n".join([f"HTTP/1.1 {status}", *fields]) + "\r\n\r\n").encode()


def test_content_length_response_and_its_size_on_the_wire(bench):
    raw = head("content-length: 6", "content-type: text/plain") + b"hello\n"
    r = bench.parse_wire_response(raw + b"HTTP/1.1 200 OK\r\n")  # the next one's start
    assert (r.status, r.body, r.chunked, r.size) == (200, b"hello\n", False, len(raw))
    assert r.fields == [("content-length", "6"), ("content-type", "text/plain")]
    assert r.values("Content-Length") == ["6"]


def test_incomplete_responses_are_none(bench):
    raw = head("Content-Length: 6") + b"hello\n"
    for cut in (10, len(raw) - 1):
        assert bench.parse_wire_response(raw[:cut]) is None
    chunked = head("Transfer-Encoding: chunked") + b"3\r\nhel\r\n3;x=y\r\nlo\n\r\n0\r\n\r\n"
    for cut in range(len(chunked) - 10, len(chunked)):
        assert bench.parse_wire_response(chunked[:cut]) is None


def test_chunked_body_is_joined_and_framing_reported(bench):
    raw = head("Transfer-Encoding: chunked") + b"3\r\nhel\r\n3;ext=1\r\nlo\n\r\n0\r\n\r\n"
    r = bench.parse_wire_response(raw)
    assert (r.body, r.chunked, r.size) == (b"hello\n", True, len(raw))


@pytest.mark.parametrize("raw", [
    head("Content-Type: text/plain") + b"hello\n",  # ends at the close: no keep-alive shape
    b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    head("Content-Length 6") + b"hello\n",
    head("Transfer-Encoding: chunked") + b"zz\r\nhello\n\r\n0\r\n\r\n",
    head("Transfer-Encoding: chunked") + b"6\r\nhello\nXX0\r\n\r\n",
    head("Transfer-Encoding: chunked") + b"0\r\nX-Trailer: 1\r\n\r\n",
])
def test_malformed_or_close_framed_responses_are_refused(bench, raw):
    with pytest.raises(bench.BenchError):
        bench.parse_wire_response(raw)


def shape(bench, label):
    return next(s for s in bench.SHAPES if s.label == label)


def test_each_shape_accepts_what_its_origin_sends(bench):
    nginx = ["Server: nginx/1.22.1", "Date: Thu, 03 Dec 2026 01:59:47 GMT",
             "Content-Type: text/plain"]
    sent = {
        "plain": head("content-length: 6", "content-type: text/plain") + b"hello\n",
        "keep-alive": head(*nginx, "Content-Length: 6", "Connection: keep-alive") + b"hello\n",
        "chunked": head(*nginx, "Transfer-Encoding: chunked", "Connection: keep-alive")
        + b"6\r\nhello\n\r\n0\r\n\r\n",
        "16k": head(*nginx, "Content-Length: 16384", "Connection: keep-alive")
        + bench.SHAPE_16K,
        "30 fields": head(*nginx, "Content-Length: 6", "Connection: keep-alive",
                          *(f"{n}: {v}" for n, v in bench.SHAPE_FIELDS)) + b"hello\n",
    }
    assert sorted(sent) == sorted(s.label for s in bench.SHAPES)
    for label, raw in sent.items():
        r = bench.parse_wire_response(raw)
        assert bench.wire_problems(shape(bench, label), r) == [], label
    summary = bench.wire_summary(bench.parse_wire_response(sent["plain"]))
    assert summary.endswith("content-length, content-type, (no Connection header)")


def test_a_response_of_the_wrong_shape_is_named(bench):
    keep_alive = bench.parse_wire_response(
        head("Content-Length: 6", "Connection: keep-alive") + b"hello\n")
    plain = shape(bench, "plain")
    assert any("expected no Connection" in p for p in bench.wire_problems(plain, keep_alive))
    assert any("expected chunked" in p
               for p in bench.wire_problems(shape(bench, "chunked"), keep_alive))
    assert any("header fields, expected 30" in p
               for p in bench.wire_problems(shape(bench, "30 fields"), keep_alive))
    assert any("expected 200" in p for p in bench.wire_problems(shape(bench, "16k"), keep_alive))


def test_the_nginx_config_serves_every_nginx_shape(bench):
    cfg = bench.nginx_shapes_cfg(8080, Path("/tmp/x"), "proxy_temp_path /tmp/x/proxy;")
    for s in bench.SHAPES:
        assert (f"location = {s.path} {{" in cfg) == (s.origin == "nginx"), s.label
    assert cfg.count("add_header ") == len(bench.SHAPE_FIELDS) == 25
    assert "sub_filter" in cfg
    no_sub = bench.nginx_shapes_cfg(8080, Path("/tmp/x"), "", chunked=False)
    assert "location = /chunked" not in no_sub
    assert bench._nginx_quote('a "b" c') == '"a \\"b\\" c"'
    with pytest.raises(ValueError):
        bench._nginx_quote("$host")


def sample(bench, proxy, label, cpu_us, proxy_pct, rps=10_000.0):
    return bench.Sample(proxy=proxy, round=1, requests=int(rps * 3), rps=rps, p50_ms=1.0,
                        p99_ms=2.0, errors=0, cpu_us_per_req=cpu_us,
                        proxy_cpu_pct=proxy_pct, cpu_pct={0: 99.0, 1: 50.0}, shape=label)


def test_matrix_rows_print_a_ratio_only_where_both_were_saturated(bench):
    args = argparse.Namespace(shapes_names=["lameduck", "haproxy"], load_cpu=1)
    part = bench.ShapesPart()
    for s in bench.SHAPES:
        saturated = s.label != "chunked"
        part.samples += [sample(bench, "lameduck", s.label, 40.0, 99.0, 5_000.0),
                         sample(bench, "haproxy", s.label, 20.0, 99.0 if saturated else 60.0)]
    part.samples.append(sample(bench, bench.FLOOR, "keep-alive", 16.0, 99.0, 12_500.0))
    part.fail("lameduck", shape(bench, "16k"), "pre-check: boom; no rounds")
    rows, info, notes, failures = bench.summarize_shapes(part, args)
    by = {(r[0], r[1]): r for r in rows}
    headers = bench.SHAPES_HEADERS
    col = headers.index("vs HAProxy req/s")
    assert by["keep-alive", "lameduck"][col] == "0.50x"
    assert by["keep-alive", bench.FLOOR][col] == "1.25x"
    assert by["chunked", "lameduck"][col] == "n/s"
    assert by["16k", "lameduck"][headers.index("µs/req")] == "FAILED"
    assert by["30 fields", "lameduck"][headers.index("HAProxy µs/req")] == "20.0"
    assert len(rows) == len(bench.SHAPES) + 1
    assert failures == ["lameduck shape 16k: pre-check: boom; no rounds"]
    assert any(n.startswith("chunked: n/s = not saturated: haproxy 60%") for n in notes)
    assert any("+24.0 µs over the floor (2.50x)" in x for x in info)
