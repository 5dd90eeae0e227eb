"""bench/run.py's ``--proxy-quota``: a proxy capped by a CFS quota gets no more CPU than its
share, its forks are capped with it, and the cgroups are gone after the run."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

SPIN = "import os, time\nos.fork()\nend = time.time() + 60\nwhile time.time() < end: pass\n"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _quota(run):
    try:
        return run.CpuQuota(30)
    except run.BenchError as e:
        pytest.skip(f"no writable cgroup cpu controller here: {e}")


def test_a_capped_proxy_and_its_fork_share_the_quota(bench, tmp_path: Path) -> None:
    quota = _quota(bench)
    procs = bench.Procs(tmp_path)
    procs.quota, procs.quota_cpu = quota, 0
    try:
        proc = procs.start("spinner", 0, [sys.executable, "-c", SPIN])
        members: list[str] = []
        deadline = time.monotonic() + 30
        while len(members) < 2 and time.monotonic() < deadline:  # the parent and its fork
            members = (quota.root / "spinner" / "cgroup.procs").read_text().split()
            time.sleep(0.05)
        assert str(proc.pid) in members and len(members) == 2
        used0, t0 = sum(_cpu_seconds(int(p)) for p in members), time.monotonic()
        time.sleep(3)
        used = sum(_cpu_seconds(int(p)) for p in members) - used0
        # Two spinners on one CPU: uncapped they would take ~100 % of it; capped, 30 % at
        # most (a busy machine gives them less, never more; a tick's rounding allowed).
        assert used / (time.monotonic() - t0) <= 0.30 + 0.05
    finally:
        for p in (quota.root / "spinner" / "cgroup.procs").read_text().split():
            os.kill(int(p), 9)
        procs.stop_all()
        deadline = time.monotonic() + 10
        while (quota.root / "spinner" / "cgroup.procs").read_text().split():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        quota.remove()
    assert not quota.root.exists()


def test_quota_outside_10_to_100_is_refused(bench, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench.main(["--proxy-quota", "5"])
    assert e.value.code == 2
    assert "--proxy-quota" in capsys.readouterr().err
