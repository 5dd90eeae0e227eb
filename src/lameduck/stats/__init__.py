"""Stats: plain ints bumped on the hot path, named like Envoy's, rendered only on demand.

A leaf package: it imports nothing else of lameduck, so every layer may depend on it.
"""

from lameduck.stats.histogram import BUCKETS, QUANTILES, Histogram, HistogramValue, quantile
from lameduck.stats.process import ProcessMetric, process_metrics
from lameduck.stats.registry import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    Stat,
    StatKind,
    StatsRegistry,
    merge,
    of_type,
    used_only,
)
from lameduck.stats.render import (
    escape_label_value,
    prometheus_name,
    render_json,
    render_process,
    render_prometheus,
    render_text,
    select,
)
from lameduck.stats.scopes import (
    SCOPE_CLASSES,
    ClusterStats,
    ConnectionStats,
    DrainStats,
    HealthCheckStats,
    Http2Stats,
    Http3Stats,
    HttpStats,
    ListenerManagerStats,
    ListenerStats,
    OutlierStats,
    ServerStats,
    TcpStats,
    stat_fields,
)

__all__ = [
    "BUCKETS",
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "QUANTILES",
    "SCOPE_CLASSES",
    "ClusterStats",
    "ConnectionStats",
    "DrainStats",
    "HealthCheckStats",
    "Histogram",
    "HistogramValue",
    "Http2Stats",
    "Http3Stats",
    "HttpStats",
    "ListenerManagerStats",
    "ListenerStats",
    "OutlierStats",
    "ProcessMetric",
    "ServerStats",
    "Stat",
    "StatKind",
    "StatsRegistry",
    "TcpStats",
    "escape_label_value",
    "merge",
    "of_type",
    "process_metrics",
    "prometheus_name",
    "quantile",
    "render_json",
    "render_process",
    "render_prometheus",
    "render_text",
    "select",
    "stat_fields",
    "used_only",
]
