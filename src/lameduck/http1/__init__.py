"""HTTP/1.1 codecs: the downstream and upstream protocols.

``make fast`` compiles wire, upstream and downstream with mypyc in place (``*.so`` beside the
sources, which Python then prefers). A compiled module older than its source would run stale
code, so that is refused here rather than silently ignored.
"""

from __future__ import annotations

from pathlib import Path


def _refuse_stale_builds() -> None:
    here = Path(__file__).parent
    for src in here.glob("*.py"):
        for built in here.glob(src.stem + ".*.so"):
            if built.stat().st_mtime < src.stat().st_mtime:
                raise ImportError(
                    f"{built.name} is older than {src.name}: run `make fast` to rebuild the "
                    "compiled HTTP/1 path, or `make pure` to run it as plain Python")


_refuse_stale_builds()
