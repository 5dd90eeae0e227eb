"""`lameduck run`'s start-up text: the stop advice names the process that must get the signal.
Under `lameduck supervise` that is the supervisor: a child sent SIGTERM alone drains, exits and
is started again, so `kill -TERM <child>` would restart it, not stop it."""

from __future__ import annotations

import os

import pytest

from lameduck.config import default_config
from lameduck.restart.supervisor import SUPERVISOR_ENV
from lameduck.server.boot import banner, supervisor_pid


def test_a_plain_run_says_to_signal_itself() -> None:
    text = banner(default_config(), False, "127.0.0.1:9901", {}, 4242)
    assert "kill -TERM 4242 (drains, then exits)" in text
    assert "kill -HUP 4242" in text


def test_a_supervised_child_says_to_signal_the_supervisor() -> None:
    text = banner(default_config(), False, "127.0.0.1:9901", {}, 4242, supervisor=1)
    assert "kill -TERM 4242" not in text and "kill -HUP 4242" not in text
    assert "kill -TERM 1" in text and "kill -HUP 1" in text
    assert "docker stop" in text
    assert "child 4242 of lameduck supervise (pid 1)" in text


def test_the_supervisor_counts_only_while_it_is_the_parent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SUPERVISOR_ENV, str(os.getppid()))
    assert supervisor_pid() == os.getppid()
    # inherited by something the child started, whose parent is not the supervisor
    monkeypatch.setenv(SUPERVISOR_ENV, str(os.getppid() + 1))
    assert supervisor_pid() is None
    monkeypatch.setenv(SUPERVISOR_ENV, "")
    assert supervisor_pid() is None
    monkeypatch.delenv(SUPERVISOR_ENV)
    assert supervisor_pid() is None
