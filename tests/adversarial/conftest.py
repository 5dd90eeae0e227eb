"""Shared fixtures for the adversarial corpora: one capture origin and one lameduck per
module (a process start costs most of a second), stopped by pid, its log checked for a
Traceback at module end: a handler crash is a defect even if every client saw an answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.capture import CaptureOrigin
from tests.procs import Lameduck, base_config


@pytest.fixture(scope="module")
def capture() -> Iterator[CaptureOrigin]:
    origin = CaptureOrigin()
    yield origin
    origin.close()


@pytest.fixture(scope="module")
def proxy(capture: CaptureOrigin, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Lameduck]:
    # generate_request_id off: what the origin receives is compared byte for byte
    ld = Lameduck(base_config(capture.port, listener={"generate_request_id": False}),
                  tmp_path_factory.mktemp("adv")).start()
    yield ld
    ld.kill()
    assert "Traceback" not in ld.log(), ld.log()
