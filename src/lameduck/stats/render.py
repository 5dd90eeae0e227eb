"""Renderers: pure functions from a snapshot to the text the admin API serves.

Formats follow Envoy's admin so existing scripts and dashboards work unchanged: `/stats` text
(`name: value`, then histograms as `name: P0(interval,cumulative) ... P100(...)`),
`/stats?format=json` (histograms in a `histograms` element), and `/stats/prometheus` with Envoy's
tag extraction and histograms as `_bucket{le=...}`/`_sum`/`_count`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Final

import re2  # type: ignore[import-untyped]

from lameduck.stats.help import help_text
from lameduck.stats.histogram import BUCKETS, QUANTILES, HistogramValue
from lameduck.stats.process import ProcessMetric
from lameduck.stats.registry import HISTOGRAM, Stat

__all__ = [
    "escape_label_value",
    "prometheus_name",
    "render_json",
    "render_process",
    "render_prometheus",
    "render_text",
    "select",
]

# (stat name prefix, Prometheus family prefix, label holding the scope's name), as Envoy does.
_TAGGED: Final = (
    ("http.", "envoy_http_", "envoy_http_conn_manager_prefix"),
    ("cluster.", "envoy_cluster_", "envoy_cluster_name"),
    ("tcp.", "envoy_tcp_", "envoy_tcp_prefix"),
    # workers: N: what each worker took (Envoy's per-worker listener stats are tagged
    # envoy_worker_id)
    ("worker.", "envoy_worker_", "envoy_worker_id"),
    # Envoy's listener scope, tagged envoy.listener_address (Envoy extracts it from an address
    # such as 0.0.0.0_8080; a lameduck listener's scope is its name, tagged alike)
    ("listener.", "envoy_listener_", "envoy_listener_address"),
)
# A cluster's sub-scopes, whose names are part of the family in Envoy
# (envoy_cluster_health_check_attempt{envoy_cluster_name="app"}).
_CLUSTER_SUBSCOPES: Final = (".health_check", ".outlier_detection")
_INVALID_METRIC_CHARS: Final = re.compile(r"[^a-zA-Z0-9_:]")
_CODE_CLASS: Final = re.compile(r"_rq_(\d)xx$")  # Envoy's RESPONSE_CODE_CLASS extractor
# A client's filter is matched with RE2, in time linear in the name, so no pattern can hold the
# event loop that also serves traffic (Python's backtracking ``re`` can, for hours). RE2 also
# bounds the compiled program's memory; the length cap bounds the compile itself.
FILTER_MAX_LEN: Final = 1024
_RE2_OPTIONS: Final = re2.Options()
_RE2_OPTIONS.max_mem = 1 << 20
_RE2_OPTIONS.log_errors = False  # an invalid filter is the client's error, answered 400
# RE2 reads a repeat count too large to parse as the literal text "{99999999999}"; PCRE and
# Python refuse it: refuse it too, rather than silently match something else.
_REPEAT: Final = re.compile(r"(?<!\\)(?:\\\\)*\{(\d+)(?:,(\d*))?\}")
_MAX_REPEAT: Final = 1000  # RE2's own limit for a count it parses


def select(stats: Iterable[Stat], filter: str | None = None) -> list[Stat]:
    """The stats whose name matches `filter` (an RE2 regex, searched), sorted by name.

    Raises ValueError for an invalid or too costly regex so the admin API can answer 400.
    """
    ordered = sorted(stats, key=_by_name)
    if not filter:
        return ordered
    pattern = compile_filter(filter)
    return [stat for stat in ordered if pattern.search(stat.name)]


def compile_filter(filter: str) -> re2._Regexp:
    """Compile a client's filter with RE2 (no backreferences or lookaround, linear time)."""
    if len(filter) > FILTER_MAX_LEN:
        raise ValueError(f"invalid filter regex: {len(filter)} characters, at most "
                         f"{FILTER_MAX_LEN}")
    for match in _REPEAT.finditer(filter):
        if any(n and int(n) > _MAX_REPEAT for n in match.groups()):
            raise ValueError(f"invalid filter regex {filter!r}: repeat count "
                             f"{match.group(0)} above {_MAX_REPEAT}")
    try:
        return re2.compile(filter, _RE2_OPTIONS)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(f"invalid filter regex {filter!r} (RE2 syntax): {reason}") from None


def render_text(stats: Iterable[Stat], filter: str | None = None) -> str:
    """Envoy's /stats text: one `name: value` line per counter and gauge, sorted by name, then
    one line per histogram with its quantiles as `P<q>(interval,cumulative)`.

    lameduck has no stats flush interval, so the interval half is always `nan` (what Envoy
    prints for an interval without samples); a histogram with no value at all reads
    `No recorded values`, as in Envoy."""
    chosen = select(stats, filter)
    lines = [f"{stat.name}: {stat.value}\n" for stat in chosen if stat.kind != HISTOGRAM]
    for stat in chosen:
        if stat.kind == HISTOGRAM and stat.hist is not None:
            if stat.value == 0:
                lines.append(f"{stat.name}: No recorded values\n")
                continue
            parts = " ".join(f"P{_num(q * 100)}(nan,{_num(v)})"
                             for q, v in zip(QUANTILES, stat.hist.quantiles(), strict=True))
            lines.append(f"{stat.name}: {parts}\n")
    return "".join(lines)


def render_json(stats: Iterable[Stat], filter: str | None = None) -> str:
    """Envoy's /stats?format=json: {"stats": [{"name": ..., "value": ...}, ..., {"histograms":
    {"supported_quantiles": [...], "computed_quantiles": [{"name": ..., "values":
    [{"interval": null, "cumulative": ...}, ...]}]}}]}: the histograms element only when there
    are histograms, `null` for a quantile with no value (as Envoy)."""
    chosen = select(stats, filter)
    out: list[dict[str, object]] = [
        {"name": stat.name, "value": stat.value} for stat in chosen if stat.kind != HISTOGRAM
    ]
    computed = [
        {"name": stat.name,
         "values": [{"interval": None, "cumulative": None if v != v else v}
                    for v in stat.hist.quantiles()]}
        for stat in chosen if stat.kind == HISTOGRAM and stat.hist is not None
    ]
    if computed:
        out.append({"histograms": {"supported_quantiles": [q * 100 for q in QUANTILES],
                                   "computed_quantiles": computed}})
    return json.dumps({"stats": out})


def _num(value: float) -> str:
    """A number as Envoy prints one: integral values without a fraction, others shortest."""
    if value != value:
        return "nan"
    return str(int(value)) if value == int(value) else repr(round(value, 6))


def prometheus_name(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Map a stat name to its Prometheus family and labels, with Envoy's default tag extraction.

    `http.<L>.X` -> envoy_http_X{envoy_http_conn_manager_prefix="<L>"} (`http.<L>.http2.X` ->
    envoy_http2_X with the same label, likewise http3); `cluster.<C>.X` ->
    envoy_cluster_X{envoy_cluster_name="<C>"} (`cluster.<C>.health_check.X` ->
    envoy_cluster_health_check_X, likewise outlier_detection); `tcp.<L>.X` ->
    envoy_tcp_X{envoy_tcp_prefix="<L>"}; `worker.<i>.X` -> envoy_worker_X{envoy_worker_id="<i>"};
    `listener.<L>.X` -> envoy_listener_X{envoy_listener_address="<L>"};
    `*_rq_<N>xx` -> `*_rq_xx` with
    envoy_response_code_class="<N>" (so Envoy dashboards' `envoy_cluster_upstream_rq_xx` work);
    anything else -> envoy_<name, dots as _>. Stat fields never contain dots, so <L>/<C> is all up
    to the last dot: a listener named "api.v2" keeps its whole name (Envoy would split it).
    """
    labels: list[tuple[str, str]] = []
    match = _CODE_CLASS.search(name)
    if match is not None:
        labels.append(("envoy_response_code_class", match.group(1)))
        name = name[: match.start(1)] + name[match.end(1) :]
    family = ""
    for prefix, family_prefix, label in _TAGGED:
        if name.startswith(prefix):
            scope, dot, stat = name[len(prefix) :].rpartition(".")
            if dot and scope and stat:
                if prefix == "http." and scope.endswith((".http2", ".http3")):
                    # a listener's HTTP/2 (HTTP/3) codec stats: Envoy's envoy_http2_* families
                    codec = scope[-5:]
                    scope, family_prefix = scope[:-6], f"envoy_{codec}_"
                elif prefix == "cluster.":
                    for sub in _CLUSTER_SUBSCOPES:
                        if scope.endswith(sub):
                            scope = scope[: -len(sub)]
                            stat = sub[1:] + "_" + stat
                            break
                labels.append((label, scope))
                family = family_prefix + stat
                break
    if not family:
        family = "envoy_" + name.replace(".", "_")
    return _INVALID_METRIC_CHARS.sub("_", family), tuple(labels)


def render_prometheus(stats: Iterable[Stat], filter: str | None = None) -> str:
    """Prometheus text exposition 0.0.4, shaped like Envoy's /stats/prometheus.

    One `# HELP` (Envoy writes none; lameduck does, from stats/help.py) and one `# TYPE` line per
    family with all its samples under it. A histogram is `<family>_bucket{...,le="<bound>"}`
    (cumulative, through `le="+Inf"`), `_sum` and `_count`, as Envoy writes it. A family that
    mixes kinds is typed `untyped` (a histogram then keeps only its count); a sample that
    repeats a family and labels is dropped (the first wins), since a duplicate series would make
    Prometheus reject the whole scrape.
    """
    families: dict[str, tuple[str, str, dict[str, Stat]]] = {}
    for stat in select(stats, filter):
        family, labels = prometheus_name(stat.name)
        rendered = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
        kind, first, samples = families.setdefault(family, (stat.kind, stat.name, {}))
        if kind != stat.kind:
            families[family] = ("untyped", first, samples)
        samples.setdefault(rendered, stat)
    lines: list[str] = []
    for family in sorted(families):
        kind, first, samples = families[family]
        lines.append(f"# HELP {family} {_escape_help(help_text(family, first, kind))}\n")
        lines.append(f"# TYPE {family} {kind}\n")
        for rendered in sorted(samples):
            stat = samples[rendered]
            if kind == HISTOGRAM and stat.hist is not None:
                _histogram_lines(lines, family, rendered, stat.hist)
            else:
                lines.append(f"{family}{{{rendered}}} {stat.value}\n" if rendered
                             else f"{family} {stat.value}\n")
    return "".join(lines)


_LE: Final = (*(_num(bound) for bound in BUCKETS), "+Inf")


def render_process(metrics: Iterable[ProcessMetric]) -> str:
    """The ``process_*`` families (stats/process.py), as the Prometheus client libraries write
    them: unlabelled, a HELP and a TYPE line each."""
    lines: list[str] = []
    for m in metrics:
        lines.append(f"# HELP {m.name} {_escape_help(m.help)}\n")
        lines.append(f"# TYPE {m.name} {m.kind}\n")
        lines.append(f"{m.name} {_num(float(m.value))}\n")
    return "".join(lines)


def _histogram_lines(lines: list[str], family: str, labels: str, hist: HistogramValue) -> None:
    sep = "," if labels else ""
    seen = 0
    for le, n in zip(_LE, hist.counts, strict=True):
        seen += n
        lines.append(f'{family}_bucket{{{labels}{sep}le="{le}"}} {seen}\n')
    braces = f"{{{labels}}}" if labels else ""
    lines.append(f"{family}_sum{braces} {_num(hist.sum)}\n")
    lines.append(f"{family}_count{braces} {seen}\n")


def _escape_help(text: str) -> str:
    """HELP text escapes only backslash and newline (exposition format 0.0.4)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label_value(value: str) -> str:
    """Escape a label value per the exposition format: backslash, double quote, newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _by_name(stat: Stat) -> str:
    return stat.name
