"""A config built into what a process runs, with no socket opened: the wiring can be looked at
(and tested) apart from the process that binds and serves it."""

from __future__ import annotations

import asyncio
import random

from lameduck.config import load_config_text
from lameduck.config.load import default_config
from lameduck.listeners import HttpListener, TcpListener
from lameduck.server import build

CONFIG = """
listeners:
  - name: web
    address: 127.0.0.1:0
    routes:
      - {prefix: /api, cluster: api, timeout: 2s}
      - {prefix: /, cluster: h2app}
  - name: l4
    address: 127.0.0.1:0
    protocol: tcp
    cluster: api
clusters:
  - name: api
    endpoints: ["127.0.0.1:9001", "127.0.0.1:9002"]
    persistence: {type: cookie}
    outlier_detection: {}
    health_check: {path: /healthz}
    retry_policy: {num_retries: 1}
  - name: h2app
    protocol: h2
    endpoints: ["127.0.0.1:9003"]
"""


def test_a_config_builds_without_a_socket() -> None:
    loop = asyncio.new_event_loop()  # never run: nothing here may need it to
    try:
        changes: list[int] = []
        built = build(load_config_text(CONFIG), loop, random.random, lambda: changes.append(1))
        web, l4 = built.listeners
        assert isinstance(web, HttpListener) and isinstance(l4, TcpListener)
        assert web.server is None and l4.server is None  # bound only when the process starts
        assert set(built.process.listeners) == {"web", "l4"}
        api, h2app = built.clusters["api"], built.clusters["h2app"]
        assert [ep.address for ep in api.endpoints] == ["127.0.0.1:9001", "127.0.0.1:9002"]
        assert api.by_cookie and api.persistence is not None and api.outlier is not None
        assert api.num_retries == 1
        assert api.connector is None and h2app.connector is not None  # an HTTP/2 pool
        assert len(built.checkers) == 1  # api's active health check, not started
        names = {s.name for s in built.registry.snapshot()}
        assert {"server.drain.cut_reset", "http.web.downstream_rq_total",
                "http.web.http2.goaway_sent", "tcp.l4.downstream_cx_total",
                "cluster.api.upstream_rq_retry",
                "cluster.api.outlier_detection.ejections_enforced_total",
                "cluster.api.health_check.attempt"} <= names
        assert changes == []
    finally:
        loop.close()


def test_the_embedded_default_builds() -> None:
    loop = asyncio.new_event_loop()
    try:
        built = build(default_config(), loop, random.random, lambda: None)
        assert built.listeners and built.clusters
    finally:
        loop.close()


def test_idle_close_on_response_reaches_http_listeners_not_tcp_ones() -> None:
    """drain.idle_close is an HTTP rule (a response tells the client); a relayed TCP
    connection keeps the default."""
    loop = asyncio.new_event_loop()
    try:
        cfg = load_config_text("drain: {idle_close: on_response}\n" + CONFIG)
        built = build(cfg, loop, random.random, lambda: None)
        drains = built.process.listeners
        assert drains["web"].idle_close_on_response is True
        assert drains["l4"].idle_close_on_response is False
    finally:
        loop.close()
