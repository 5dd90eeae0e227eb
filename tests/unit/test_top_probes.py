"""``lameduck top`` shows each health-check path's probers and top talkers."""

from __future__ import annotations

from rich.console import Console

from lameduck.drain.probers import ProbeSettings, ProbeTracker
from lameduck.orchestrate.top import History, Sample, render


def test_top_shows_probers_and_talkers() -> None:
    t = ProbeTracker(ProbeSettings(fall=2))
    for at in (0.0, 1.0, 2.0):
        t.probe(at, "10.0.0.9", 503)
    t.probe(0.0, "2001:db8::5", 200)
    t.request(2.5, "10.0.0.7")
    listener = {"name": "ingress", "address": "127.0.0.1:1", "accepting": True,
                "draining": False, "connections": 0, "lb_probes": t.view(3.0)}
    s = Sample(0.0, {"state": "LIVE", "listeners": [listener]}, {}, [], {})
    out = Console(width=160, record=True)
    out.print(render("127.0.0.1:9901", s, History()))
    text = out.export_text()
    assert "probers and top talkers" in text
    row = next(line for line in text.splitlines() if "10.0.0.9" in line)
    assert "DOWN" in row and "3/2" in row
    assert "UP" in next(line for line in text.splitlines() if "2001:db8::5" in line)
    assert "1 rq, 0 cx" in next(line for line in text.splitlines() if "10.0.0.7" in line)


def test_top_without_a_health_check_path_has_no_probers_table() -> None:
    listener = {"name": "ingress", "address": "127.0.0.1:1", "accepting": True,
                "draining": False, "connections": 0}  # no health-check path: no lb_probes
    s = Sample(0.0, {"state": "LIVE", "listeners": [listener]}, {}, [], {})
    out = Console(width=160, record=True)
    out.print(render("127.0.0.1:9901", s, History()))
    text = out.export_text()
    assert "ingress" in text and "probers" not in text
