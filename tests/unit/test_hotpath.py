"""src/lameduck/hot.txt is the one list of the modules compiled with mypyc: `make fast` reads
it (and setup.py, whose wheel tests/integration/test_shipped.py checks module by module), and
every path in it is a module of the tree."""

from __future__ import annotations

import re
import subprocess

from lameduck.hotpath import hot_modules
from tests.procs import ROOT, SRC


def test_every_hot_module_exists() -> None:
    mods = hot_modules()
    assert mods and len(set(mods)) == len(mods)
    for name in mods:
        assert (SRC / (name.replace(".", "/") + ".py")).is_file(), name


def test_the_makefile_compiles_the_list_it_reads() -> None:
    text = (ROOT / "Makefile").read_text()
    assert "HOT_LIST := src/lameduck/hot.txt" in text
    assert not re.search(r"^\s*lameduck/\S+\.py", text, re.M), "a module listed in the Makefile"
    db = subprocess.run(["make", "-C", str(ROOT), "-pn", "pure"], capture_output=True,
                        text=True, timeout=60, check=True).stdout
    [hot] = re.findall(r"^HOT := (.*)$", db, re.M)
    assert [p.removesuffix(".py").replace("/", ".") for p in hot.split()] == hot_modules()
