"""lameduck: a drain-aware HTTP proxy.

``make fast`` compiles the per-request modules with mypyc in place (``*.so`` beside the
sources, which Python then prefers). A compiled module older than its source would run stale
code, so that is refused here, before any of them is imported, rather than silently ignored.
Only in a source tree (``src/lameduck`` beside ``pyproject.toml``): an installed wheel's
modules were built together from the same source, and pip gives its files the time they were
unpacked, in no particular order, so their times say nothing there.
"""

from pathlib import Path

__version__ = "0.1.0"


def _refuse_stale_builds() -> None:
    here = Path(__file__).parent
    if not (here.parent.name == "src" and (here.parents[1] / "pyproject.toml").exists()):
        return
    for built in here.rglob("*.so"):
        src = built.with_name(built.name.split(".", 1)[0] + ".py")
        if src.exists() and built.stat().st_mtime < src.stat().st_mtime:
            raise ImportError(
                f"{built.relative_to(built.parents[2])} is older than {src.name}: run "
                "`make fast` to rebuild the compiled hot path, or `make pure` to run it as "
                "plain Python")


_refuse_stale_builds()
