"""A missing optional dependency names the extra that installs it (pyproject.toml's
[project.optional-dependencies]), not a bare ModuleNotFoundError for a module the user never
asked for. Each case runs in a fresh interpreter where the module cannot be imported (a
meta-path finder refuses it), so this process's imports are untouched."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BLOCK = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Refuse())
"""


def _run(blocked: set[str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK.format(blocked=blocked) + code],
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=ROOT)


@pytest.mark.parametrize("blocked", [{"httpx"}, {"websockets"}])
def test_lameduck_client_names_the_client_extra(blocked: set[str]) -> None:
    out = _run(blocked, "import lameduck.client")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    (name,) = blocked
    assert last == (f"lameduck.extras.MissingExtra: lameduck.client needs {name}, an optional "
                    "dependency: pip install 'lameduck[client]'"), out.stderr


def test_redis_store_names_the_resume_extra() -> None:
    code = """
from lameduck.resume import open_store
try:
    open_store("redis://127.0.0.1:6379/0")
except ModuleNotFoundError as e:  # still one: code that catches ImportError keeps working
    print(e, e.name)
"""
    out = _run({"redis"}, code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("RedisStore needs redis, an optional dependency: "
                                  "pip install 'lameduck[resume]' redis")


@pytest.mark.parametrize("blocked", [{"aioquic"}, {"pylsqpack"}])
def test_lameduck_http3_names_the_http3_extra(blocked: set[str]) -> None:
    out = _run(blocked, "import lameduck.http3")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    (name,) = blocked
    assert last == (f"lameduck.extras.MissingExtra: lameduck.http3 needs {name}, an optional "
                    "dependency: pip install 'lameduck[http3]'"), out.stderr


def test_the_proxy_runs_without_the_http3_extra() -> None:
    """No listener serves HTTP/3 yet: the command and the server never import aioquic."""
    out = _run({"aioquic", "pylsqpack"},
               "import sys, lameduck.cli, lameduck.server.boot, lameduck.listeners.http\n"
               "assert not [m for m in sys.modules if m.startswith('aioquic')]")
    assert out.returncode == 0, out.stderr


def test_the_sqlite_store_needs_no_extra(tmp_path: Path) -> None:
    out = _run({"redis", "httpx", "websockets"},
               f"from lameduck.resume import open_store; open_store('sqlite:///{tmp_path}/s.db')")
    assert out.returncode == 0, out.stderr


def test_the_extras_named_are_the_ones_declared() -> None:
    """The extras the messages and docs name exist, with the modules they stand for."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["resume"]] == ["redis"]
    assert sorted(d.split(">")[0] for d in extras["client"]) == ["httpx", "websockets"]
    assert [d.split(">")[0] for d in extras["http3"]] == ["aioquic"]
    docs = (ROOT / "docs" / "resume.md").read_text()
    assert "pip install 'lameduck[resume]'" in docs and "pip install 'lameduck[client]'" in docs


def test_the_license_is_an_spdx_string_with_its_file() -> None:
    """PEP 639: project.license an SPDX expression, the text in the file license-files
    names; the table form ({text = ...}) is deprecated by setuptools."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "Apache-2.0"
    assert meta["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
