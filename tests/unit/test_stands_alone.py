"""The repository stands alone: what it says to a reader (code, docs, CLI text, shipped configs,
tests) cites what a reader can open — RFCs, Envoy, HAProxy, Kubernetes and systemd docs — never
documents or tracker numbers that are not in it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Built from parts so this file does not match itself.
NOT_HERE = re.compile("|".join([
    r"\bseeds?\s*0\d\d\b",  # the source documents the project began from
    "DESIGN" + r"\.md",
    r"(?<![\w/])issue\s*#\d+",  # our tracker (an upstream project's issue is cited by its URL)
    r"\bsee #\d+",
]), re.IGNORECASE)
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".service", ".socket", ".sh", ""}


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [ROOT / name for name in out if Path(name).suffix in SUFFIXES]


def test_no_reference_to_documents_outside_the_repository() -> None:
    found = []
    for path in tracked():
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if NOT_HERE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_the_pattern_finds_what_it_looks_for() -> None:
    for line in ("as seed " + "003 says", "see DESIGN" + ".md §4", "fixed in issue " + "#8"):
        assert NOT_HERE.search(line), line
    for line in ("github.com/envoyproxy/envoy/issues/3837", "random seed=1", "RFC 9110 §9.2.2"):
        assert NOT_HERE.search(line) is None, line
