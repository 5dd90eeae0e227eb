"""server/limits.py: the soft RLIMIT_NOFILE goes up to the hard limit, and what cannot be
raised is said, not fatal. The system calls are replaced (this process's limits stay)."""

from __future__ import annotations

import logging
import resource
from pathlib import Path

import pytest

from lameduck.server import limits


class FakeLimits:
    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.soft, self.hard, self.refuse = soft, hard, refuse
        self.set: list[tuple[int, int]] = []

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, which: int, value: tuple[int, int]) -> None:
        if self.refuse:
            raise ValueError("not allowed to raise maximum limit")
        self.set.append(value)
        self.soft = value[0]


def _fake(monkeypatch: pytest.MonkeyPatch, fake: FakeLimits) -> FakeLimits:
    monkeypatch.setattr(limits.resource, "getrlimit", fake.getrlimit)
    monkeypatch.setattr(limits.resource, "setrlimit", fake.setrlimit)
    return fake


def test_the_soft_limit_goes_to_the_hard_one(monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    fake = _fake(monkeypatch, FakeLimits(1024, 524288))
    with caplog.at_level(logging.INFO, "lameduck"):
        assert limits.raise_nofile() == (1024, 524288)
    assert fake.set == [(524288, 524288)]
    assert "soft limit raised from 1024 to 524288 open files (the hard limit)" in caplog.text


def test_nothing_to_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake(monkeypatch, FakeLimits(4096, 4096))
    assert limits.raise_nofile() == (4096, 4096)
    assert fake.set == []


def test_an_unlimited_hard_limit_means_what_the_kernel_takes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """setrlimit(2) refuses RLIMIT_NOFILE above fs.nr_open (EPERM), even for an unlimited
    hard limit: take nr_open."""
    nr_open = tmp_path / "nr_open"
    nr_open.write_text("1048576\n")
    monkeypatch.setattr(limits, "NR_OPEN", str(nr_open))
    fake = _fake(monkeypatch, FakeLimits(1024, resource.RLIM_INFINITY))
    assert limits.raise_nofile() == (1024, 1048576)
    assert fake.set == [(1048576, resource.RLIM_INFINITY)]


def test_a_refused_raise_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    _fake(monkeypatch, FakeLimits(1024, 4096, refuse=True))
    with caplog.at_level(logging.INFO, "lameduck"):
        assert limits.raise_nofile() == (1024, 1024)
    assert "cannot raise the soft limit 1024 to the hard limit 4096" in caplog.text
