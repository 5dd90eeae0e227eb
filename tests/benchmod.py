"""bench/run.py as a module, for the unit tests of its pure parts (it is a script, not a
package: loaded by file path)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

RUN = Path(__file__).resolve().parents[1] / "bench" / "run.py"


@pytest.fixture(scope="module")
def bench(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """bench/run.py, loaded once per test module under a name of that module's own."""
    name = f"bench_run_under_{request.module.__name__.rpartition('.')[2]}"
    spec = importlib.util.spec_from_file_location(name, RUN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while being built
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
