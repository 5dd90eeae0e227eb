"""``lameduck report FILE --png OUT``: a drain report drawn as the picture an operator attaches
to an incident. matplotlib (the ``report`` extra) is imported here only, with the Agg backend:
no display is needed, and the proxy itself never loads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ReportError(Exception):
    """The file is not a drain report this version can draw."""


def load_report(path: str | Path) -> dict[str, Any]:
    """A report as written to ``drain.report_dir``, or ``GET /drain_report``'s answer (its
    newest report)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: {e}") from None
    if isinstance(data, dict) and isinstance(data.get("reports"), list):
        if not data["reports"]:
            raise ReportError(f"{path}: no drain report in it (no drain has ended yet)")
        data = data["reports"][0]
    if not isinstance(data, dict) or data.get("version") != 1 or "timeline" not in data:
        raise ReportError(f"{path}: not a lameduck drain report (version 1)")
    return data


def ramp(t: float, time: float, strategy: str) -> float:
    """The chance a response drains its connection t seconds in (docs/drain.md): gradual
    rises linearly from 0 to 1 at T/2; immediate is 1 throughout."""
    if strategy != "gradual" or time <= 0:
        return 1.0
    return min(1.0, max(0.0, t / (time / 2.0)))


def draw(report: dict[str, Any], out: str | Path) -> Path:
    """In flight over time above; closes per sample by kind, stacked, against the ramp below;
    the proactive window shaded, T - G, T and the deadline as lines, refused and cut marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = report["timeline"]
    cols = {name: i for i, name in enumerate(tl["columns"])}
    rows = tl["samples"]
    period = float(tl["period"])

    def col(name: str) -> list[float]:
        return [r[cols[name]] for r in rows]

    t = col("t")
    cfg = report["config"]
    T, G = float(cfg["time"]), float(cfg["connection_grace"])
    deadline = cfg.get("deadline")
    end = max(t[-1] if t else 0.0, T, deadline or 0.0) + 2 * period

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(11, 7),
                                      gridspec_kw={"height_ratios": [1, 1.2]})
    top.plot(t, col("connections"), color="tab:blue", label="connections open")
    top.plot(t, col("requests"), color="tab:orange", label="requests in flight")
    if any(col("upgrades")):
        top.plot(t, col("upgrades"), color="tab:purple", label="tunnels / upgrades")
    top.set_ylabel("in flight")
    top.set_ylim(bottom=0)

    left = [x - period for x in t]
    by_response, proactive, at_end = col("drained_by_response"), col("proactive"), col("at_end")
    bottom.bar(left, by_response, width=period, align="edge", color="tab:green",
               label="drained by a response")
    bottom.bar(left, proactive, width=period, align="edge", bottom=by_response,
               color="tab:cyan", label="drained proactively")
    stacked = [a + b for a, b in zip(by_response, proactive, strict=True)]
    bottom.bar(left, at_end, width=period, align="edge", bottom=stacked, color="tab:gray",
               label="closed at the end")
    refused, cut = col("refused"), col("cut")
    marks = [(refused, "refused (503 going away)", "v", "tab:red"),
             (cut, "cut at the deadline", "X", "black")]
    for values, label, marker, color in marks:
        xs = [x for x, v in zip(t, values, strict=True) if v]
        ys = [v for v in values if v]
        if xs:
            bottom.scatter(xs, ys, marker=marker, color=color, zorder=5,
                           label=f"{label}: {sum(ys)}")
    tallest = max([a + b for a, b in zip(stacked, at_end, strict=True)] + refused + cut + [1])
    bottom.set_ylim(0, tallest * 1.1)
    bottom.set_ylabel(f"per {int(period * 1000)} ms")
    bottom.set_xlabel("seconds since the drain started")

    prob = bottom.twinx()
    steps = [i * end / 400 for i in range(401)]
    prob.plot(steps, [ramp(x, T, cfg["strategy"]) for x in steps], color="tab:olive",
              linestyle="--", label=f"P(response drains), {cfg['strategy']}")
    prob.set_ylim(0, 1.05)
    prob.set_ylabel("close probability of a response")

    window = cfg.get("proactive_window")
    for ax in (top, bottom):
        if window:
            ax.axvspan(window[0], window[1], color="gold", alpha=0.2,
                       label="proactive window [2T/3, T-G)" if ax is top else None)
        if T - G > 0:
            ax.axvline(T - G, color="tab:brown", linestyle=":",
                       label=f"T-G = {T - G:g}s" if ax is top else None)
        ax.axvline(T, color="tab:red", linestyle="--", label=f"T = {T:g}s" if ax is top else None)
        if deadline is not None:
            ax.axvline(deadline, color="black", linewidth=1.5,
                       label=f"deadline = {deadline:g}s" if ax is top else None)
        ax.set_xlim(0, end)
        ax.grid(alpha=0.3)
    if G > 0 and T - G > 0:
        y = top.get_ylim()[1] * 0.92
        top.annotate("", xy=(T, y), xytext=(T - G, y),
                     arrowprops={"arrowstyle": "<->", "color": "tab:brown"})
        top.text(T - G / 2, y, f"G = {G:g}s", ha="center", va="bottom", color="tab:brown")

    top.legend(loc="upper right", fontsize=8)
    handles, labels = bottom.get_legend_handles_labels()
    h2, l2 = prob.get_legend_handles_labels()
    bottom.legend(handles + h2, labels + l2, loc="upper left", fontsize=8)

    c = report["counts"]
    fig.suptitle(
        f"lameduck drain ({report['cause']}), pid {report['pid']}, started {report['started']}"
        f" — {report['duration']:g}s\n"
        f"requests completed={c['completed']} refused={c['refused']} cut={c['cut']}; "
        f"connections by response={c['cx_drained_by_response']} "
        f"proactively={c['cx_drained_proactive']} at end={c['cx_closed_at_end']} "
        f"reset in accept queue={c['cx_reset_listener_close']}",
        fontsize=10)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
