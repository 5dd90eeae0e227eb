"""Latency histograms over loopback: a real lameduck in front of the demo origin."""

from __future__ import annotations

import re
from typing import Any

import httpx

N = 6
SLEEP_MS = 120  # in Envoy's (100, 250] bucket


def quantiles(ld: Any) -> dict[str, list[float | None]]:
    stats = ld.admin("GET", "/stats?format=json").json()["stats"]
    hist = stats[-1]["histograms"]
    assert hist["supported_quantiles"][2] == 50 and hist["supported_quantiles"][4] == 90
    return {h["name"]: [v["cumulative"] for v in h["values"]]
            for h in hist["computed_quantiles"]}


def test_request_times_and_connect_times(lameduck) -> None:
    ld = lameduck()
    with httpx.Client(timeout=10) as client:
        for _ in range(N):
            assert client.get(ld.url(f"/sleep?ms={SLEEP_MS}")).status_code == 200
    q = quantiles(ld)
    for name in ("http.ingress.downstream_rq_time", "cluster.app.upstream_rq_time"):
        p50, p90 = q[name][2], q[name][4]
        assert p50 is not None and p90 is not None, name
        assert 100 <= p50 <= 250 and 100 <= p90 <= 250, (name, q[name])
    text = ld.admin("GET", "/stats?filter=rq_time").text
    assert re.search(r"^http\.ingress\.downstream_rq_time: P0\(nan,100\) P25\(", text, re.M), text
    prom = ld.admin("GET", "/stats/prometheus").text
    count = re.search(r'^envoy_http_downstream_rq_time_count\{envoy_http_conn_manager_prefix='
                      r'"ingress"\} (\d+)$', prom, re.M)
    assert count is not None and int(count.group(1)) == N
    connects = re.search(r'^envoy_cluster_upstream_cx_connect_ms_count\{envoy_cluster_name='
                         r'"app"\} (\d+)$', prom, re.M)
    assert connects is not None
    assert int(connects.group(1)) == ld.stat("cluster.app.upstream_cx_total") >= 1


def test_prometheus_has_help_and_type_for_every_family(lameduck) -> None:
    ld = lameduck()
    assert httpx.get(ld.url("/"), timeout=10).status_code == 200
    prom = ld.admin("GET", "/stats/prometheus").text
    helped = re.findall(r"^# HELP (\S+) \S", prom, re.M)
    typed = re.findall(r"^# TYPE (\S+) (?:counter|gauge|histogram|untyped)$", prom, re.M)
    assert helped == typed and len(typed) == len(set(typed)) > 10
    families = set(typed)
    for line in prom.splitlines():
        if not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line)
            assert name is not None, line
            base = re.sub(r"_(bucket|sum|count)$", "", name.group(0))
            assert name.group(0) in families or base in families, line
