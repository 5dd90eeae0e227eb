"""lameduck's build: the hot path (src/lameduck/hot.txt) compiled with mypyc's ``mypycify``, as
mypy and black ship mypyc-compiled wheels; everything else is in pyproject.toml.

Compiled when it can be: ``LAMEDUCK_MYPYC=auto`` (the default) compiles when a C compiler and
the interpreter's headers (Python.h) are there, and builds the pure-Python wheel
(``py3-none-any``) with a warning when not; ``1`` compiles or fails; ``0`` never compiles.
``LAMEDUCK_MYPYC_OPT``: the C optimisation level (default 3, as `make fast`).
The mypy that compiles and the libraries whose types the hot path is compiled against come from
``[build-system] requires`` (setuptools' docs: "Build System Support", PEP 518).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

HOT_LIST = Path("src", "lameduck", "hot.txt")


def hot_modules() -> list[str]:
    """The hot path's source files, relative to the project root."""
    lines = (line.split("#", 1)[0].strip() for line in HOT_LIST.read_text().splitlines())
    return [str(Path("src", line)) for line in lines if line]


def cannot_compile() -> str | None:
    """Why this machine cannot build the extensions (None: it can)."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    if shutil.which(shlex.split(cc)[0]) is None:
        return f"no C compiler ({cc})"
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        return f"no Python headers ({include}/Python.h; Debian: python3-dev)"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (mypy)"
    return None


# The commands that build the extensions. The others a build runs this file for (egg_info and
# dist_info for the metadata, sdist) need none, and mypycify type-checks and writes the C
# sources each time it is called.
BUILDS = {"build", "build_ext", "bdist_wheel", "bdist", "install"}


def ext_modules() -> list:
    want = os.environ.get("LAMEDUCK_MYPYC", "auto")
    if want not in ("auto", "0", "1"):
        sys.exit(f"LAMEDUCK_MYPYC={want}: auto, 0 or 1")
    if want == "0" or not BUILDS & set(sys.argv[1:]):
        return []
    why = cannot_compile()
    if why is not None:
        if want == "1":
            sys.exit(f"LAMEDUCK_MYPYC=1 but the hot path cannot be compiled: {why}")
        print(f"WARNING: lameduck's hot path is not compiled ({why}): building the pure-Python "
              "wheel", file=sys.stderr)
        return []
    from mypyc.build import mypycify

    return mypycify(hot_modules(), opt_level=os.environ.get("LAMEDUCK_MYPYC_OPT", "3"))


setup(ext_modules=ext_modules())
