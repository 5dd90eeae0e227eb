"""Which hot path this lameduck runs: the modules of hot.txt compiled by mypyc (extension
modules) or the same source as plain Python. `lameduck --version` says it, because the figures
in the README are the compiled one's, and an install can silently be the other (a wheel built
without a C compiler is pure Python)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from importlib import resources


def hot_modules() -> list[str]:
    """The dotted names of the modules in hot.txt (paths relative to src/)."""
    text = resources.files("lameduck").joinpath("hot.txt").read_text()
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line.removesuffix(".py").replace("/", ".") for line in lines if line]


def compiled_modules() -> list[str]:
    """Those of them loaded from an extension module (found, not run: find_spec imports only
    their packages)."""
    out = []
    for name in hot_modules():
        spec = importlib.util.find_spec(name)
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            out.append(name)
    return out


def build_kind() -> str:
    """``compiled: mypyc``, ``pure Python``, or, for a mix (a module added to hot.txt and not
    yet rebuilt), how many of them are compiled."""
    hot, compiled = hot_modules(), compiled_modules()
    if not compiled:
        return "pure Python"
    if len(compiled) == len(hot):
        return "compiled: mypyc"
    return f"partly compiled: mypyc, {len(compiled)} of {len(hot)} hot modules"
