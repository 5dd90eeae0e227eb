"""Shared fixtures for the adversarial corpora: one capture origin and one lameduck per
module (a process start costs most of a second), stopped by pid, its log checked for a
Traceback at module end: a handler crash is a defect even if every client saw an answer.

A module with its own origin (a scripted responder, a WebSocket server) overrides ``capture``
or defines its own, and starts its lameduck with ``run_proxy``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.capture import CaptureOrigin
from tests.procs import Lameduck, base_config


def serve(origin: CaptureOrigin) -> Iterator[CaptureOrigin]:
    """A module fixture's body: ``origin`` for the module, closed after it."""
    yield origin
    origin.close()


def run_proxy(cfg: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
              name: str) -> Iterator[Lameduck]:
    """A module fixture's body: lameduck on ``cfg`` for the module, then killed (its children
    too) and its log checked for a Traceback."""
    ld = Lameduck(cfg, tmp_path_factory.mktemp(name)).start()
    try:
        yield ld
    finally:
        ld.kill()
    assert "Traceback" not in ld.log(), ld.log()


@pytest.fixture(scope="module")
def capture() -> Iterator[CaptureOrigin]:
    yield from serve(CaptureOrigin())


@pytest.fixture(scope="module")
def proxy(capture: CaptureOrigin, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Lameduck]:
    # generate_request_id off: what the origin receives is compared byte for byte
    yield from run_proxy(base_config(capture.port, listener={"generate_request_id": False}),
                         tmp_path_factory, "adv")
