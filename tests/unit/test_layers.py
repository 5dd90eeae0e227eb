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
    # what a missing optional dependency says (the extra to install): a leaf
    "extras": set(),
    "config": {"drain", "extras"},
    "upstream": {"stats", "config", "drain"},
    "proxy": {"tunnel", "upstream", "drain", "stats", "config"},
    "http1": {"proxy", "tunnel", "upstream", "drain", "stats", "config"},
    "http2": {"proxy", "tunnel", "upstream", "drain", "stats", "config"},
    # the HTTP/3 codec and its connection shell: as http2's, and the extra its absence names
    "http3": {"proxy", "upstream", "drain", "stats", "config", "extras"},
    "tunnel": {"drain"},
    "admin": {"stats", "config", "drain"},
    "listeners": {"http1", "http2", "http3", "extras", "proxy", "tunnel", "upstream", "drain",
                  "stats", "config"},
    "demo": {"resume"},
    "resume": {"drain", "extras"},
    "client": {"resume", "drain", "extras"},
    "restart": {"config"},
    "orchestrate": {"config", "drain"},
    # the simulator drives the drain core; it reads configs and budget's pod timers, never the
    # I/O shell
    "sim": {"drain", "config", "orchestrate"},
    "server": {"admin", "listeners", "http1", "http2", "proxy", "upstream", "restart", "drain",
               "stats", "config"},
    # which hot path runs (hot.txt): it looks the modules up by name, it imports none
    "hotpath": set(),
    "cli": {"server", "restart", "orchestrate", "sim", "upstream", "config", "demo", "hotpath"},
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


def _exchange_fields() -> set[str]:
    """The fields of ``proxy.exchange.Exchange``: its class body's names and what its methods
    assign on ``self``."""
    tree = ast.parse((PKG / "proxy" / "exchange.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Exchange")
    fields: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            fields.add(node.target.id)
        elif isinstance(node, ast.Assign):
            fields.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(cls):
        for target in _targets(node):
            if isinstance(target.value, ast.Name) and target.value.id == "self":
                fields.add(target.attr)
    return fields


def _targets(node: ast.AST) -> list[ast.Attribute]:
    """The attribute targets an assignment statement writes (``a.b = ``, ``a.b += ``, tuples)."""
    if isinstance(node, ast.Assign):
        raw: list[ast.expr] = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        raw = [node.target]
    else:
        return []
    found: list[ast.Attribute] = []
    while raw:
        t = raw.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            raw.extend(t.elts)
        elif isinstance(t, ast.Attribute):
            found.append(t)
    return found


# The codec modules that handle exchanges: all but HTTP/2's frame layer, whose streams
# (``_Stream.unacked``) are its own and never an exchange.
CODECS = sorted(p for part in ("http1", "http2", "listeners", "tunnel")
                for p in (PKG / part).glob("*.py")
                if p.relative_to(PKG).as_posix() not in ("http2/connection.py",))


@pytest.mark.parametrize("path", CODECS, ids=lambda p: str(p.relative_to(PKG)))
def test_codecs_never_write_the_exchanges_fields(path: Path) -> None:
    """An exchange records its own status, flags, stats and books (``Exchange`` methods); a
    codec only tells it what happened. A codec's own per-request state lives in its subclass
    of ``Exchange`` (``H1Exchange``, ``H2Stream``) under names the exchange does not have; a
    codec object's writes to its own fields (``self.x = ``) are its own business."""
    fields = _exchange_fields()
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        for target in _targets(node):
            own = isinstance(target.value, ast.Name) and target.value.id == "self"
            if not own and target.attr in fields:
                bad.append(f"line {target.lineno}: {ast.unparse(target)}")
    assert not bad, f"{path.relative_to(PKG)} writes an exchange's fields: {bad}"


def test_codec_exchange_subclasses_add_fields_of_their_own() -> None:
    """``H1Exchange`` and ``H2Stream`` keep what only their protocol needs, never a field of
    the exchange under the same name."""
    fields = _exchange_fields()
    for path, name in ((PKG / "http1" / "downstream.py", "H1Exchange"),
                       (PKG / "http2" / "downstream.py", "H2Stream")):
        cls = next(n for n in ast.parse(path.read_text()).body
                   if isinstance(n, ast.ClassDef) and n.name == name)
        own = {t.target.id for t in cls.body
               if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
        own |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
        own |= {t.attr for n in ast.walk(cls) for t in _targets(n)
                if isinstance(t.value, ast.Name) and t.value.id == "self"}
        assert own and not own & fields, (name, own & fields)


def test_no_server_class_subclasses_another() -> None:
    """The process model is composed, not inherited: the worker pool is a data plane the
    one lifecycle drives, and a worker composes the in-process plane, never a ``Server``
    with methods overridden (a class of ``lameduck.server`` that subclassed another would
    split one behaviour over two)."""
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
