"""``lameduck simulate`` end to end on small scenarios: the figures, the JSON/CSV/PNG it
writes, ``--compare`` on one random generator, and ``--solve``'s answer checked by simulating
it and one second less."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from lameduck.cli import main
from lameduck.config import parse_duration
from lameduck.sim.fleet import simulate
from lameduck.sim.report import summary
from lameduck.sim.scenario import load_scenario

TINY: dict[str, Any] = {
    "name": "tiny",
    "pod": {"kind": "Pod", "spec": {"terminationGracePeriodSeconds": 30,
                                    "containers": [{"name": "lameduck"}]}},
    "lameduck": {"drain": {"time": "6s", "connection_grace": "1s"},
                 "shutdown": {"deadline": "8s"}},
    "lb": {"kind": "endpoints", "propagation": {"median": "300ms", "p99": "1s"}, "nodes": 2},
    "fleet": {"replicas": 4, "capacity": 50},
    "clients": [{"count": 400, "protocol": "http1", "rate": 2, "duration": "20ms"},
                {"count": 40, "protocol": "websocket", "reconnect": "backoff"}],
    "rollout": {"at": "5s", "max_surge": 1, "max_unavailable": 0, "readiness": "1s"},
    "duration": "50s",
}


def write(tmp: Path, name: str, data: dict[str, Any]) -> Path:
    p = tmp / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_writes_json_csv_and_a_png_that_is_not_blank(tmp_path: Path, capsys: Any) -> None:
    sc = write(tmp_path, "tiny.yaml", TINY)
    out = tmp_path / "o"
    code = main(["simulate", str(sc), "--json", f"{out}.json", "--csv", f"{out}.csv",
                 "--png", f"{out}.png", "--instances-csv", f"{out}-pods.csv", "--no-progress"])
    assert code == 0
    text = capsys.readouterr().out
    assert "reconnects/100ms peak" in text and "tiny" in text
    s = json.loads(Path(f"{out}.json").read_text())
    assert s["scenario"] == "tiny" and s["failed"] == 0
    assert len(s["drains"]) == 4 and s["rollout_end"] is not None
    assert s["reconnects_per_100ms"]["peak"] > 0
    rows = list(csv.DictReader(Path(f"{out}.csv").read_text().splitlines()))
    assert len(rows) == 501 and sum(float(r["reconnects"]) for r in rows) == \
        s["reconnects_per_100ms"]["total"]
    pods = list(csv.reader(Path(f"{out}-pods.csv").read_text().splitlines()))
    assert pods[0][:2] == ["t", "pod0"] and len(pods[0]) == 1 + 8  # 4 old + 4 new
    from matplotlib.image import imread

    img = imread(f"{out}.png")
    assert img.shape[0] > 400 and img.shape[1] > 600
    rgb = img[..., :3].reshape(-1, 3)
    assert (rgb.std(axis=0) > 0.05).all()  # lines, not one colour
    assert (rgb.min(axis=1) < 0.9).mean() > 0.02  # something drawn on the white


def test_json_to_stdout_is_the_json_alone(tmp_path: Path, capsys: Any) -> None:
    sc = write(tmp_path, "tiny.yaml", TINY)
    assert main(["simulate", str(sc), "--json", "-", "--no-progress"]) == 0
    s = json.loads(capsys.readouterr().out)  # no table before it
    assert s["scenario"] == "tiny"


def test_compare_runs_both_on_the_same_generator(tmp_path: Path, capsys: Any) -> None:
    a = write(tmp_path, "gradual.yaml", {**TINY, "name": "gradual"})
    b = write(tmp_path, "immediate.yaml", {
        **TINY, "name": "immediate",
        "lameduck": {**TINY["lameduck"], "drain": {"time": "6s", "connection_grace": "1s",
                                                    "strategy": "immediate"}}})
    assert main(["simulate", str(a), str(b), "--no-progress"]) == 2  # needs --compare
    out = tmp_path / "c.json"
    assert main(["simulate", "--compare", str(a), str(b), "--json", str(out),
                 "--no-progress"]) == 0
    both = json.loads(out.read_text())["compare"]
    assert [s["scenario"] for s in both] == ["gradual", "immediate"]
    # the same generator: the same warm-up (nothing differs before the rollout at 5 s): the
    # same connects at the same times to the same pods, the same load; another seed differs
    ra, rb = (simulate(load_scenario(p), record=True) for p in (a, b))
    rc = simulate(load_scenario(a), seed=2, record=True)

    def before(r: Any) -> tuple[Any, Any, Any]:
        assert r.connect_log is not None
        t, pod = r.connect_log
        return t[t < 5.0], pod[t < 5.0], r.load[r.sample_t < 5.0]

    (ta, pa, la), (tb, pb, lb), (tc, _, lc) = before(ra), before(rb), before(rc)
    assert len(ta) > 100 and np.nansum(la) > 0  # something to compare (NaN: no pod yet)
    assert np.array_equal(ta, tb) and np.array_equal(pa, pb)
    assert np.array_equal(la, lb, equal_nan=True)
    assert not (np.array_equal(ta, tc) and np.array_equal(la, lc, equal_nan=True))
    # immediate drains every connection at its first response: a higher reconnect peak
    assert both[1]["reconnects_per_100ms"]["peak"] > both[0]["reconnects_per_100ms"]["peak"]


def test_bad_scenario_exits_2_naming_the_field(tmp_path: Path, capsys: Any) -> None:
    bad = write(tmp_path, "bad.yaml", {**TINY, "fleet": {"replicas": "many"}})
    assert main(["simulate", str(bad), "--no-progress"]) == 2
    assert "bad.yaml: fleet.replicas: expected a whole number" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_solve_finds_the_smallest_drain_time(tmp_path: Path, capsys: Any) -> None:
    """Behind an LB that needs 2 s x 3 checks to notice, new connections find a closed port
    when T is shorter; --solve finds the T where none does, and one second less fails."""
    data = {**TINY, "name": "solve",
            "lameduck": {"drain": {"time": "2s", "connection_grace": "200ms"},
                         "shutdown": {"deadline": "4s"}},
            "lb": {"kind": "health_check", "interval": "2s", "fall": 3, "buffer": "0s",
                   "balance": "round_robin"},
            "fleet": {"replicas": 2, "capacity": 1000},
            "clients": [{"count": 30, "protocol": "once", "rate": 4, "duration": "5ms"}],
            "rollout": None, "drain": {"at": "5s", "instances": 1}, "duration": "30s",
            "max_request": "1s"}
    path = write(tmp_path, "solve.yaml", data)
    out = tmp_path / "solve.json"
    assert main(["simulate", str(path), "--solve", "--max-reconnects", "1000",
                 "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    t = parse_duration(got["lameduck"]["drain"]["time"])
    md = parse_duration(got["lameduck"]["shutdown"]["min_drain"])
    assert 4.0 <= t <= 8.0 and 0.0 <= md <= t, got
    grace = got["pod"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= t + 1.0 + 5.0  # deadline (T + the longest request) + the exit margin
    sc = load_scenario(path)
    from lameduck.sim.solve import _variant

    assert summary(simulate(_variant(sc, t, md)))["failed"] == 0
    assert summary(simulate(_variant(sc, t - 1.0, None)))["failed"] > 0
