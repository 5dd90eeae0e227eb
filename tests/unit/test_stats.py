"""lameduck.stats: scopes, registry snapshots, merge, and the three admin renderings."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import fields

import pytest

from lameduck.stats import (
    SCOPE_CLASSES,
    ClusterStats,
    DrainStats,
    HealthCheckStats,
    Histogram,
    Http2Stats,
    Http3Stats,
    HttpStats,
    ListenerManagerStats,
    ListenerStats,
    OutlierStats,
    ServerStats,
    Stat,
    StatsRegistry,
    TcpStats,
    merge,
    prometheus_name,
    render_json,
    render_prometheus,
    render_text,
)


def make_registry() -> tuple[StatsRegistry, HttpStats, ClusterStats, DrainStats]:
    registry = StatsRegistry()
    http = registry.add("http.ingress", HttpStats())
    cluster = registry.add("cluster.app", ClusterStats())
    registry.add("server", ServerStats())
    drain = registry.add("server.drain", DrainStats())
    registry.add("listener_manager", ListenerManagerStats())
    return registry, http, cluster, drain


# --- scopes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", SCOPE_CLASSES)
def test_scope_fields_are_zero_ints_and_gauges_are_fields(cls: type) -> None:
    scope = cls()
    names = [f.name for f in fields(scope)]
    assert names, cls
    histograms = getattr(cls, "HISTOGRAMS", frozenset())
    assert all(getattr(scope, name) == 0 for name in names if name not in histograms)
    assert all(type(getattr(scope, name)) is Histogram and getattr(scope, name).count == 0
               for name in histograms)
    assert set(names) >= cls.GAUGES | histograms
    assert not cls.GAUGES & histograms
    # each instance its own: a shared default would mix listeners' distributions
    assert all(getattr(scope, name) is not getattr(cls(), name) for name in histograms)
    assert not hasattr(scope, "__dict__")  # slotted: no per-instance dict on the hot path


def test_scope_field_names_match_envoy() -> None:
    http = {f.name for f in fields(HttpStats)}
    assert {"downstream_rq_active", "downstream_cx_drain_close", "downstream_rq_going_away"} <= http
    assert {
        "downstream_cx_active",
        "downstream_cx_http1_active",
        "downstream_cx_http2_active",
        "downstream_cx_http3_active",
        "downstream_cx_upgrades_active",
        "downstream_rq_active",
    } == HttpStats.GAUGES
    assert {"goaway_sent", "rx_reset", "tx_reset"} <= {f.name for f in fields(Http2Stats)}
    assert {"upstream_cx_active", "upstream_rq_active", "upstream_rq_pending_active",
            "membership_total", "membership_healthy", "membership_excluded",
            "lb_persistence_records"} == ClusterStats.GAUGES
    assert {"live", "state", "uptime", "total_connections", "hot_restart_epoch",
            "parent_connections", "prestop_state"} == ServerStats.GAUGES
    assert {"active"} == DrainStats.GAUGES
    assert {f.name for f in fields(DrainStats)} == {
        "active",
        "completed",
        "refused",
        "cut",
        "cut_before_response",
        "cut_reset",
        "cx_drained_by_response",
        "cx_drained_proactive",
        "cx_closed_at_end",
        "cx_reset_listener_close",
    }
    assert {"total_listeners_active", "total_listeners_draining"} == ListenerManagerStats.GAUGES


def test_slotted_scope_rejects_typos() -> None:
    http = HttpStats()
    with pytest.raises(AttributeError):
        http.downstream_rq_totl = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("status", "field"),
    [(100, "1xx"), (101, "1xx"), (200, "2xx"), (204, "2xx"), (302, "3xx"), (404, "4xx"),
     (499, "4xx"), (500, "5xx"), (503, "5xx"), (599, "5xx")],
)  # fmt: skip
def test_count_status(status: int, field: str) -> None:
    http, cluster = HttpStats(), ClusterStats()
    http.count_status(status)
    cluster.count_status(status)
    for klass in ("1xx", "2xx", "3xx", "4xx", "5xx"):
        expected = 1 if klass == field else 0
        assert getattr(http, f"downstream_rq_{klass}") == expected
        assert getattr(cluster, f"upstream_rq_{klass}") == expected


@pytest.mark.parametrize("status", [0, 99, 600, 999, -1])
def test_count_status_ignores_out_of_range(status: int) -> None:
    http = HttpStats()
    http.count_status(status)
    assert http == HttpStats()


# --- registry ----------------------------------------------------------------------------------


def test_snapshot_names_kinds_values_sorted() -> None:
    registry, http, cluster, drain = make_registry()
    http.downstream_rq_total += 3
    http.downstream_rq_active += 1
    cluster.upstream_rq_active += 2
    drain.cut += 1
    snapshot = registry.snapshot()
    names = [s.name for s in snapshot]
    assert names == sorted(names)
    assert len(names) == len(set(names))
    by_name = {s.name: s for s in snapshot}
    assert by_name["http.ingress.downstream_rq_total"] == Stat(
        "http.ingress.downstream_rq_total", 3, "counter"
    )
    assert by_name["http.ingress.downstream_rq_active"] == Stat(
        "http.ingress.downstream_rq_active", 1, "gauge"
    )
    assert by_name["cluster.app.upstream_rq_active"].value == 2
    assert by_name["server.drain.cut"] == Stat("server.drain.cut", 1, "counter")
    assert by_name["server.drain.active"].kind == "gauge"
    assert by_name["server.state"].kind == "gauge"
    assert by_name["listener_manager.total_listeners_draining"].kind == "gauge"


def test_snapshot_is_a_copy() -> None:
    registry, http, _, _ = make_registry()
    before = registry.snapshot()
    http.downstream_rq_total += 1
    after = registry.snapshot()
    name = "http.ingress.downstream_rq_total"
    assert {s.name: s.value for s in before}[name] == 0
    assert {s.name: s.value for s in after}[name] == 1


def test_gauge_fn_is_read_at_snapshot_time() -> None:
    registry = StatsRegistry()
    value = [5]
    registry.add_gauge_fn("cluster.app.membership_total", lambda: value[0])
    assert registry.snapshot() == [Stat("cluster.app.membership_total", 5, "gauge")]
    value[0] = 7
    assert registry.snapshot()[0].value == 7
    registry.remove_gauge_fn("cluster.app.membership_total")
    assert registry.snapshot() == []


def test_registry_rejects_duplicates_and_bad_prefixes() -> None:
    registry = StatsRegistry()
    registry.add("http.ingress", HttpStats())
    with pytest.raises(ValueError, match="already registered"):
        registry.add("http.ingress", HttpStats())
    with pytest.raises(ValueError, match="already registered"):
        registry.add_gauge_fn("http.ingress.downstream_rq_active", lambda: 0)
    for prefix in ("", ".x", "x."):
        with pytest.raises(ValueError, match="invalid stats prefix"):
            registry.add(prefix, HttpStats())
    with pytest.raises(TypeError):
        registry.add("cluster.app", object())


def test_remove_frees_the_names() -> None:
    registry = StatsRegistry()
    registry.add("cluster.app", ClusterStats())
    registry.remove("cluster.app")
    registry.remove("cluster.never")  # ignored
    assert registry.snapshot() == []
    registry.add("cluster.app", ClusterStats())  # may be registered again


def test_merge_sums_by_name() -> None:
    a = [
        Stat("http.l.downstream_rq_active", 2, "gauge"),
        Stat("http.l.downstream_rq_total", 5, "counter"),
    ]
    b = [
        Stat("http.l.downstream_rq_total", 7, "counter"),
        Stat("http.l.downstream_rq_active", 1, "gauge"),
        Stat("cluster.c.upstream_rq_total", 1, "counter"),
    ]
    assert merge([a, b, []]) == [
        Stat("cluster.c.upstream_rq_total", 1, "counter"),
        Stat("http.l.downstream_rq_active", 3, "gauge"),
        Stat("http.l.downstream_rq_total", 12, "counter"),
    ]
    assert merge([]) == []


def test_merge_rejects_kind_mismatch() -> None:
    with pytest.raises(ValueError, match="counter"):
        merge([[Stat("x", 1, "counter")], [Stat("x", 1, "gauge")]])


# --- text and JSON -----------------------------------------------------------------------------


SAMPLE = [
    Stat("http.ingress.downstream_rq_active", 3, "gauge"),
    Stat("cluster.app.upstream_rq_active", 2, "gauge"),
    Stat("http.ingress.downstream_rq_total", 10, "counter"),
    Stat("server.drain.cut", 0, "counter"),
    Stat("cluster.app.upstream_rq_5xx", 4, "counter"),
]


def test_render_text_sorted_name_value_lines() -> None:
    assert render_text(SAMPLE, None) == (
        "cluster.app.upstream_rq_5xx: 4\n"
        "cluster.app.upstream_rq_active: 2\n"
        "http.ingress.downstream_rq_active: 3\n"
        "http.ingress.downstream_rq_total: 10\n"
        "server.drain.cut: 0\n"
    )
    assert render_text([], None) == ""


def test_render_text_drain_sh_filter() -> None:
    # The exact query of the usual Envoy drain.sh preStop script:
    # ?filter=downstream_rq_active|upstream_rq_active
    text = render_text(SAMPLE, "downstream_rq_active|upstream_rq_active")
    assert text == "cluster.app.upstream_rq_active: 2\nhttp.ingress.downstream_rq_active: 3\n"


def test_filter_is_a_search_not_a_full_match() -> None:
    assert render_text(SAMPLE, r"drain\.") == "server.drain.cut: 0\n"
    assert render_text(SAMPLE, "^server") == "server.drain.cut: 0\n"
    assert render_text(SAMPLE, "no_such_stat") == ""
    assert render_text(SAMPLE, "") == render_text(SAMPLE, None)


@pytest.mark.parametrize("render", [render_text, render_json, render_prometheus])
def test_invalid_filter_regex_is_a_clear_value_error(render: Callable[..., str]) -> None:
    with pytest.raises(ValueError, match=r"invalid filter regex '\(unclosed'"):
        render(SAMPLE, "(unclosed")


def test_render_json_envoy_shape() -> None:
    data = json.loads(render_json(SAMPLE, None))
    assert list(data) == ["stats"]
    assert data["stats"][0] == {"name": "cluster.app.upstream_rq_5xx", "value": 4}
    assert [s["name"] for s in data["stats"]] == sorted(s.name for s in SAMPLE)
    filtered = json.loads(render_json(SAMPLE, "downstream_rq_active|upstream_rq_active"))
    assert filtered == {
        "stats": [
            {"name": "cluster.app.upstream_rq_active", "value": 2},
            {"name": "http.ingress.downstream_rq_active", "value": 3},
        ]
    }
    assert json.loads(render_json([], None)) == {"stats": []}


# --- Prometheus --------------------------------------------------------------------------------

_METRIC = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
_SAMPLE_RE = re.compile(rf"({_METRIC})(\{{{_LABEL}(?:,{_LABEL})*\}})? ({_NUMBER})")
_TYPE_RE = re.compile(rf"# TYPE ({_METRIC}) (counter|gauge|histogram|untyped)")
_HELP_RE = re.compile(rf"# HELP ({_METRIC}) (\S.*)")
_LABEL_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def parse_prometheus(text: str) -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    """A strict little 0.0.4 parser: family -> (type, {labels: value}); fails on anything odd.

    Every family has a HELP line right before its TYPE line; a histogram's samples are keyed by
    their suffixed name as a pseudo-label ("__name__") so buckets, sum and count all show."""
    assert text.endswith("\n")
    families: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]] = {}
    current: str | None = None
    helped: str | None = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            match = _HELP_RE.fullmatch(line)
            assert match, line
            helped = match.group(1)
            continue
        if line.startswith("#"):
            match = _TYPE_RE.fullmatch(line)
            assert match, line
            family, kind = match.groups()
            assert family not in families, f"second TYPE line for {family}"
            assert helped == family, f"no HELP line right before TYPE {family}"
            families[family] = (kind, {})
            current = family
            continue
        match = _SAMPLE_RE.fullmatch(line)
        assert match, line
        family, labels, value = match.groups()
        pairs = tuple(
            (k, v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\"))
            for k, v in _LABEL_PAIR_RE.findall(labels or "")
        )
        if current is not None and families[current][0] == "histogram" and family != current:
            suffix = family[len(current):]
            assert family.startswith(current) and suffix in _HISTOGRAM_SUFFIXES, line
            pairs = (("__name__", family), *pairs)
            family = current
        assert family == current, f"{family} sample outside its TYPE group"
        assert pairs not in families[family][1], f"duplicate series {line}"
        families[family][1][pairs] = float(value)
    return families


def test_prometheus_envoy_tag_extraction() -> None:
    assert prometheus_name("http.ingress.downstream_rq_active") == (
        "envoy_http_downstream_rq_active",
        (("envoy_http_conn_manager_prefix", "ingress"),),
    )
    assert prometheus_name("http.ingress.http2.goaway_sent") == (
        "envoy_http2_goaway_sent", (("envoy_http_conn_manager_prefix", "ingress"),))
    assert prometheus_name("cluster.app.upstream_cx_total") == (
        "envoy_cluster_upstream_cx_total",
        (("envoy_cluster_name", "app"),),
    )
    # a cluster's sub-scopes are part of the family, as in Envoy
    assert prometheus_name("cluster.app.health_check.attempt") == (
        "envoy_cluster_health_check_attempt", (("envoy_cluster_name", "app"),))
    assert prometheus_name("cluster.app.outlier_detection.ejections_active") == (
        "envoy_cluster_outlier_detection_ejections_active", (("envoy_cluster_name", "app"),))
    assert prometheus_name("tcp.db.downstream_cx_total") == (
        "envoy_tcp_downstream_cx_total", (("envoy_tcp_prefix", "db"),))
    assert prometheus_name("server.drain.cut") == ("envoy_server_drain_cut", ())
    assert prometheus_name("listener_manager.total_listeners_draining") == (
        "envoy_listener_manager_total_listeners_draining",
        (),
    )
    # Envoy's RESPONSE_CODE_CLASS extractor: *_rq_<N>xx -> *_rq_xx{envoy_response_code_class=N}
    assert prometheus_name("cluster.app.upstream_rq_5xx") == (
        "envoy_cluster_upstream_rq_xx",
        (("envoy_response_code_class", "5"), ("envoy_cluster_name", "app")),
    )
    # Names with dots keep their whole name: the stat field itself never has a dot.
    assert prometheus_name("http.api.v2.downstream_rq_total") == (
        "envoy_http_downstream_rq_total",
        (("envoy_http_conn_manager_prefix", "api.v2"),),
    )
    # Not the tagged forms: plain.
    assert prometheus_name("http.foo") == ("envoy_http_foo", ())
    assert prometheus_name("cluster_manager.active_clusters")[1] == ()


def test_prometheus_sanitizes_metric_names() -> None:
    family, labels = prometheus_name("server.weird-name/x")
    assert family == "envoy_server_weird_name_x"
    assert labels == ()
    family, labels = prometheus_name("http.my-listener.downstream_rq_total")
    assert family == "envoy_http_downstream_rq_total"
    assert labels == (("envoy_http_conn_manager_prefix", "my-listener"),)


def test_prometheus_full_registry_parses_with_one_type_per_family() -> None:
    registry = StatsRegistry()
    for name in ("ingress", "egress"):
        registry.add(f"http.{name}", HttpStats()).downstream_rq_total += len(name)
    registry.add("cluster.app", ClusterStats()).count_status(503)
    registry.add("cluster.db", ClusterStats()).upstream_rq_active = 4
    registry.add("server", ServerStats()).live = 1
    registry.add("server.drain", DrainStats())
    registry.add("listener_manager", ListenerManagerStats())
    text = render_prometheus(registry.snapshot())
    families = parse_prometheus(text)
    assert text.count("# TYPE envoy_http_downstream_rq_total ") == 1
    kind, samples = families["envoy_http_downstream_rq_total"]
    assert kind == "counter"
    assert samples == {
        (("envoy_http_conn_manager_prefix", "egress"),): 6,
        (("envoy_http_conn_manager_prefix", "ingress"),): 7,
    }
    assert families["envoy_cluster_upstream_rq_active"] == (
        "gauge",
        {(("envoy_cluster_name", "app"),): 0, (("envoy_cluster_name", "db"),): 4},
    )
    kind, samples = families["envoy_cluster_upstream_rq_xx"]
    assert kind == "counter"
    assert samples[(("envoy_response_code_class", "5"), ("envoy_cluster_name", "app"))] == 1
    assert len(samples) == 10  # 5 classes x 2 clusters
    assert families["envoy_server_live"] == ("gauge", {(): 1})
    assert families["envoy_server_drain_cut"] == ("counter", {(): 0})
    assert families["envoy_listener_manager_total_listeners_active"][0] == "gauge"
    # Families come out sorted, every sample right under its own TYPE line.
    type_lines = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert type_lines == sorted(type_lines)


def test_prometheus_label_escaping() -> None:
    name = 'we\\ird"na\nme'
    text = render_prometheus([Stat(f"cluster.{name}.upstream_rq_total", 1, "counter")])
    assert text == (
        "# HELP envoy_cluster_upstream_rq_total Requests sent upstream.\n"
        "# TYPE envoy_cluster_upstream_rq_total counter\n"
        'envoy_cluster_upstream_rq_total{envoy_cluster_name="we\\\\ird\\"na\\nme"} 1\n'
    )
    families = parse_prometheus(text)
    assert families["envoy_cluster_upstream_rq_total"][1] == {(("envoy_cluster_name", name),): 1}


def test_prometheus_never_emits_duplicate_series_or_mixed_types() -> None:
    stats = [
        Stat("server.a-b", 1, "counter"),
        Stat("server.a_b", 2, "counter"),  # same family after sanitizing: first wins
        Stat("server.c", 1, "counter"),
        Stat("server.c-", 0, "gauge"),  # sanitizes to a different name: its own family
        Stat("server.m-x", 1, "counter"),
        Stat("server.m_x", 1, "gauge"),  # same family, mixed kinds -> untyped
    ]
    families = parse_prometheus(render_prometheus(stats))
    assert families["envoy_server_a_b"] == ("counter", {(): 1})
    assert families["envoy_server_c"] == ("counter", {(): 1})
    assert families["envoy_server_c_"] == ("gauge", {(): 0})
    assert families["envoy_server_m_x"][0] == "untyped"


def test_prometheus_filter_and_empty() -> None:
    assert render_prometheus([]) == ""
    text = render_prometheus(SAMPLE, "drain")
    assert text == ("# HELP envoy_server_drain_cut Requests still in flight at the drain "
                    "deadline, cut.\n"
                    "# TYPE envoy_server_drain_cut counter\nenvoy_server_drain_cut 0\n")


# --- histograms -----------------------------------------------------------------------------


def histogram_registry() -> tuple[StatsRegistry, HttpStats, ClusterStats]:
    registry = StatsRegistry()
    http = registry.add("http.ingress", HttpStats())
    cluster = registry.add("cluster.app", ClusterStats())
    registry.add("tcp.db", TcpStats())
    for ms in (3.0, 120.0, 130.0, 200.0):
        http.downstream_rq_time.record(ms)
    cluster.upstream_cx_connect_ms.record(0.25)
    return registry, http, cluster


def test_histograms_are_a_third_kind_and_never_carried_over() -> None:
    registry, _, _ = histogram_registry()
    snap = {s.name: s for s in registry.snapshot()}
    rq = snap["http.ingress.downstream_rq_time"]
    assert (rq.kind, rq.value) == ("histogram", 4)
    assert rq.hist is not None and rq.hist.sum == 453.0
    assert snap["tcp.db.downstream_cx_drain_time"].kind == "histogram"
    assert "http.ingress.downstream_rq_time" not in registry.counters()


def test_a_tcp_scope_publishes_only_envoy_tcp_proxy_names() -> None:
    """A TCP connection is one exchange (its books are an HttpStats), but /stats shows only
    the names of Envoy's tcp_proxy and of a connection."""
    registry = StatsRegistry()
    tcp = registry.add("tcp.db", TcpStats())
    tcp.downstream_rq_active = 1  # the exchange's books: counted, not published
    names = {s.name for s in registry.snapshot()}
    assert {n for n in names if n.startswith("tcp.db.")} == {
        "tcp.db.downstream_cx_total", "tcp.db.downstream_cx_active",
        "tcp.db.downstream_cx_drain_close", "tcp.db.downstream_cx_drain_time",
        "tcp.db.downstream_cx_no_route", "tcp.db.downstream_cx_cut",
        "tcp.db.upstream_connect_fail"}


def test_merge_sums_histograms_bucket_by_bucket() -> None:
    a, _, _ = histogram_registry()
    b, _, _ = histogram_registry()
    merged = {s.name: s for s in merge([a.snapshot(), b.snapshot()])}
    rq = merged["http.ingress.downstream_rq_time"]
    assert rq.value == 8 and rq.hist is not None and rq.hist.total == 8
    assert rq.hist.sum == 906.0


def test_render_text_histograms_as_envoy_quantiles() -> None:
    registry, _, _ = histogram_registry()
    lines = render_text(registry.snapshot()).splitlines()
    first = next(i for i, line in enumerate(lines)
                 if line.startswith("cluster.app.upstream_cx_connect_ms:"))
    assert all(": P0(" in line or "No recorded values" in line for line in lines[first:])
    assert all(line.split(": ")[1].lstrip("-").isdigit() for line in lines[:first])
    rq = next(line for line in lines if line.startswith("http.ingress.downstream_rq_time: "))
    quantiles = rq.split(": ")[1].split(" ")
    assert [q.split("(")[0] for q in quantiles] == [
        "P0", "P25", "P50", "P75", "P90", "P95", "P99", "P99.5", "P99.9", "P100"]
    p50 = float(quantiles[2].split(",")[1].rstrip(")"))
    assert 100 <= p50 <= 250
    assert "cluster.app.upstream_rq_time: No recorded values" in lines


def test_render_json_histograms_section() -> None:
    registry, _, _ = histogram_registry()
    stats = json.loads(render_json(registry.snapshot()))["stats"]
    hist = stats[-1]["histograms"]
    assert hist["supported_quantiles"] == [0, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 100]
    by_name = {h["name"]: h["values"] for h in hist["computed_quantiles"]}
    # P0: the lower edge of the lowest bucket holding a value (3 ms is in 1-5)
    assert by_name["http.ingress.downstream_rq_time"][0] == {"interval": None, "cumulative": 1.0}
    assert by_name["cluster.app.upstream_rq_time"][2]["cumulative"] is None
    assert all("value" in s for s in stats[:-1])


def test_prometheus_histograms_buckets_sum_count() -> None:
    registry, _, _ = histogram_registry()
    families = parse_prometheus(render_prometheus(registry.snapshot()))
    kind, samples = families["envoy_http_downstream_rq_time"]
    assert kind == "histogram"
    label = ("envoy_http_conn_manager_prefix", "ingress")
    bucket = "envoy_http_downstream_rq_time_bucket"
    assert samples[(("__name__", bucket), label, ("le", "100"))] == 1
    assert samples[(("__name__", bucket), label, ("le", "250"))] == 4
    assert samples[(("__name__", bucket), label, ("le", "+Inf"))] == 4
    assert samples[(("__name__", "envoy_http_downstream_rq_time_count"), label)] == 4
    assert samples[(("__name__", "envoy_http_downstream_rq_time_sum"), label)] == 453
    les = [dict(k)["le"] for k in samples if dict(k)["__name__"] == bucket]
    assert les == ["0.5", "1", "5", "10", "25", "50", "100", "250", "500", "1000", "2500",
                   "5000", "10000", "30000", "60000", "300000", "600000", "1800000",
                   "3600000", "+Inf"]


# The lint findings promtool may report, all from Envoy's stat names (docs/admin.md says why
# they stay): anything else (a parse error, a missing HELP, ...) fails the test.
_ENVOY_NAME_LINTS = (
    'counter metrics should have "_total" suffix',
    'non-counter metrics should not have "_total" suffix',
    "metric names should not contain abbreviated units",
)


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian package prometheus)")
def test_promtool_check_metrics_finds_no_errors() -> None:
    registry, _, _, _ = make_registry()
    registry.add("http.ingress.http2", Http2Stats())
    registry.add("tcp.db", TcpStats())
    registry.add("cluster.app.health_check", HealthCheckStats())
    registry.add("cluster.app.outlier_detection", OutlierStats())
    registry.add("listener.ingress", ListenerStats())
    # what a main process with workers adds (docs/workers.md)
    registry.add_gauge_fn("server.workers", lambda: 1)
    for name in ("server.workers_replaced", "server.worker_lost_requests"):
        registry.add_counter_fn(name, lambda: 1)
    extra = [Stat(f"worker.{i}.downstream_{x}_total", 3, "counter") for i in (0, 1)
             for x in ("cx", "rq")]
    text = render_prometheus(sorted([*registry.snapshot(), *extra]))
    assert 'envoy_worker_downstream_rq_total{envoy_worker_id="1"} 3' in text
    done = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                          capture_output=True, timeout=60, check=False)
    out = (done.stdout + done.stderr).decode()
    assert done.returncode in (0, 3), out  # 3: lint findings only; 1: an error
    findings = [line for line in out.splitlines() if line.strip()]
    assert all(line.endswith(_ENVOY_NAME_LINTS) for line in findings), out
    assert "no help text" not in out


def test_a_counter_kept_outside_a_scope_is_carried_and_reset_as_any_counter() -> None:
    """``add_counter_fn``: the main process's counts of its workers (``workers_replaced``)
    are counters for Prometheus, a successor carries them, /reset_counters zeroes them."""
    replaced = [2]
    registry = StatsRegistry()
    registry.add_counter_fn("server.workers_replaced", lambda: replaced[0])
    registry.carried = {"server.workers_replaced": 3}  # counted by the processes before
    [stat] = registry.snapshot()
    assert stat == Stat("server.workers_replaced", 5, "counter")
    assert registry.counters() == {"server.workers_replaced": 5}
    registry.reset_counters()
    replaced[0] = 4
    assert registry.snapshot()[0].value == 2
    with pytest.raises(ValueError, match="already registered"):
        registry.add_gauge_fn("server.workers_replaced", lambda: 0)


# --- every family labelled by scope, with a HELP that says something, parsed by the client ----

# Where each scope class is registered (server/build.py, server/pool.py), with two names for the
# scopes there are several of, so a family that carries a name in it shows as two families.
_SCOPES = {
    HttpStats: ("http.ingress", "http.api"), Http2Stats: ("http.ingress.http2", "http.api.http2"),
    Http3Stats: ("http.ingress.http3", "http.api.http3"),
    ClusterStats: ("cluster.app", "cluster.db"), TcpStats: ("tcp.db", "tcp.mq"),
    HealthCheckStats: ("cluster.app.health_check", "cluster.db.health_check"),
    OutlierStats: ("cluster.app.outlier_detection", "cluster.db.outlier_detection"),
    ServerStats: ("server",), DrainStats: ("server.drain",),
    ListenerManagerStats: ("listener_manager",),
    ListenerStats: ("listener.ingress", "listener.api"),
}


def _every_stat() -> list[Stat]:
    """One of every stat lameduck registers, for every scope class and the workers' stats."""
    assert set(_SCOPES) == set(SCOPE_CLASSES)
    registry = StatsRegistry()
    for cls, prefixes in _SCOPES.items():
        for prefix in prefixes:
            registry.add(prefix, cls())
    registry.add_gauge_fn("server.workers", lambda: 2)
    for name in ("server.workers_replaced", "server.worker_lost_requests"):
        registry.add_counter_fn(name, lambda: 0)
    extra = [Stat(f"worker.{i}.downstream_{x}_total", 1, "counter") for i in (0, 1)
             for x in ("cx", "rq")]
    return sorted([*registry.snapshot(), *extra])


def test_a_listeners_name_is_a_label_so_its_families_sum() -> None:
    """Envoy's listener scope is tagged envoy_listener_address: one family for every
    listener, which sum() adds up, not one family per listener name."""
    assert prometheus_name("listener.ingress.downstream_global_cx_overflow") == (
        "envoy_listener_downstream_global_cx_overflow",
        (("envoy_listener_address", "ingress"),))
    families = parse_prometheus(render_prometheus(_every_stat()))
    names = {"ingress", "api", "app", "db", "mq"}
    assert not [f for f in families if names & set(f.split("_"))], families.keys()
    kind, samples = families["envoy_listener_downstream_global_cx_overflow"]
    assert kind == "counter"
    assert set(samples) == {(("envoy_listener_address", "ingress"),),
                            (("envoy_listener_address", "api"),)}


def test_every_family_has_a_help_line_of_its_own() -> None:
    """No family falls back to the generic line, and no HELP just repeats the name."""
    from lameduck.stats.help import HELP

    families = {prometheus_name(s.name)[0] for s in _every_stat()}
    assert families <= set(HELP), sorted(families - set(HELP))
    text = render_prometheus(_every_stat())
    helps = [line.split(" ", 3) for line in text.splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(families)
    for _, _, family, words in helps:
        assert words == HELP[family], family
        stem = family.removeprefix("envoy_").replace("_", " ")
        assert len(words) > 15 and words.rstrip(".").lower() != stem, (family, words)


def test_the_exposition_parses_with_the_prometheus_client() -> None:
    """prometheus_client's own text parser (what its tests and many exporters use) reads every
    family, with its type, HELP and labels, and the process_* families after them."""
    from prometheus_client.parser import text_string_to_metric_families

    from lameduck.stats import process_metrics, render_process

    text = render_prometheus(_every_stat()) + render_process(process_metrics())
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    ours = parse_prometheus(text)
    # the client drops a counter's _total from the family name
    assert {n for n in ours} == {n if n in ours else n + "_total" for n in parsed}
    proc = {n: f for n, f in parsed.items() if n.startswith("process_")}
    assert set(proc) == {"process_cpu_seconds", "process_virtual_memory_bytes",
                         "process_resident_memory_bytes", "process_start_time_seconds",
                         "process_open_fds", "process_max_fds"}
    assert proc["process_cpu_seconds"].type == "counter"
    value = {n: f.samples[0].value for n, f in proc.items()}
    assert 0 < value["process_open_fds"] <= value["process_max_fds"]
    assert value["process_resident_memory_bytes"] > 1 << 20
    # this process started before the test, after the machine booted
    assert time.time() - 86400 * 365 < value["process_start_time_seconds"] <= time.time()
    assert abs(value["process_start_time_seconds"] - _ps_start(os.getpid())) < 2
    for f in parsed.values():
        assert f.documentation and f.documentation != f.name, f.name


def _ps_start(pid: int) -> float:
    """The process's start time as ps(1) computes it (/proc/stat's btime + starttime)."""
    with open("/proc/stat", encoding="ascii") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        stat = f.read()
    return btime + int(stat[stat.rindex(")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
