"""Imports flow one way: cli -> server -> admin/listeners/http1/upstream ->
drain, stats, config. Checked on the source, so an upward import fails the suite."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "src" / "lameduck"

# part -> the parts of lameduck it may import
ALLOWED: dict[str, set[str]] = {
    "drain": set(),
    "stats": set(),
    "config": {"drain"},
    "upstream": {"stats", "config", "drain"},
    "proxy": {"tunnel", "upstream", "drain", "stats", "config"},
    "http1": {"proxy", "tunnel", "upstream", "drain", "stats", "config"},
    "http2": {"proxy", "tunnel", "upstream", "drain", "stats", "config"},
    "tunnel": {"drain"},
    "admin": {"stats", "config", "drain"},
    "listeners": {"http1", "http2", "proxy", "tunnel", "upstream", "drain", "stats",
                  "config"},
    "demo": {"resume"},
    "resume": {"drain"},
    "client": {"resume", "drain"},
    "restart": {"config"},
    "orchestrate": {"config", "drain"},
    # the simulator drives the drain core; it reads configs and budget's pod timers, never the
    # I/O shell
    "sim": {"drain", "config", "orchestrate"},
    "server": {"admin", "listeners", "http1", "http2", "proxy", "upstream", "restart", "drain",
               "stats", "config"},
    "cli": {"server", "restart", "orchestrate", "sim", "upstream", "config", "demo"},
}


def _part(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py") if rel.parts else ""


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "lameduck" and len(parts) > 1:
                found.add(parts[1])
    return found


SOURCES = sorted(p for p in PKG.rglob("*.py") if _part(p) in ALLOWED)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_flow_one_way(path: Path) -> None:
    part = _part(path)
    bad = _imports(path) - ALLOWED[part] - {part}
    assert not bad, f"{path.relative_to(PKG)} ({part}) imports {sorted(bad)}"


def test_every_part_is_covered() -> None:
    parts = {_part(p) for p in PKG.rglob("*.py")} - {"__init__", "__main__"}
    assert parts <= set(ALLOWED), f"parts without a layer rule: {sorted(parts - set(ALLOWED))}"


def _all_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("path", sorted((PKG / "drain").glob("*.py")), ids=lambda p: p.name)
def test_drain_core_is_sans_io(path: Path) -> None:
    """The core gets its clock and randomness from the caller and never touches a socket."""
    assert not _all_imports(path) & {"asyncio", "socket", "time", "random", "selectors",
                                     "threading", "uvloop"}


def test_no_server_class_subclasses_another() -> None:
    """The process model is composed, not inherited: a worker pool or a worker is not a
    ``Server`` with methods overridden, but a data plane the one lifecycle drives (a class
    of ``lameduck.server`` that subclassed another would split one behaviour over two)."""
    import importlib
    import inspect
    import pkgutil

    import lameduck.server

    found = []
    for info in pkgutil.iter_modules(lameduck.server.__path__, "lameduck.server."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            found.append(cls)
            for base in cls.__mro__[1:]:
                assert not base.__module__.startswith("lameduck.server"), (
                    f"{cls.__module__}.{cls.__qualname__} subclasses "
                    f"{base.__module__}.{base.__qualname__}")
    assert len(found) > 10  # the check saw the package's classes
