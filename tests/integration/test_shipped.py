"""What the repository ships works as shipped: the embedded default, deploy/systemd/ and
deploy/kubernetes/ pass `lameduck budget` with the load balancer values written beside them;
`make install` puts lameduck where the systemd unit's ExecStart looks (checked by
`systemd-analyze verify`, which fails on an ExecStart that does not exist); the Dockerfile and
the Kubernetes manifests agree with each other and with the config; `python -m build` makes a
wheel with the hot path compiled by mypyc that installs into a fresh venv and runs compiled
(`lameduck --version`), and without a C compiler a pure-Python one.

The install and wheel tests need the package index (dependencies come from it, as with
`make run`) and a C compiler: without a network they fail, they do not skip. The module
compiles once (the wheel `make install WHEEL=` installs too), at gcc -O0 (BUILD_TIMEOUT)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lameduck import __version__
from lameduck.config import load_config
from lameduck.config.durations import parse_duration
from lameduck.hotpath import hot_modules
from tests.procs import _env

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "deploy" / "systemd"
KUBE = ROOT / "deploy" / "kubernetes"
DEFAULT_YAML = ROOT / "src" / "lameduck" / "config" / "default.yaml"

# The load balancer each shipped config says it assumes (HAProxy's default checks, inter 2s
# fall 3; a 5 s buffer; AWS ALB's 60 s idle timeout; clients idle up to 30 s). Each config's
# header comment names these flags, and they are what the check runs with.
LB_FLAGS = ("--lb-interval", "2s", "--lb-fall", "3", "--lb-buffer", "5s",
            "--lb-idle", "60s", "--client-idle", "30s")
INSTALL_TIMEOUT = 240  # a venv and the dependencies from the index; ~15 s here
# the same, and the hot path compiled with mypyc: ~2 min at -O0 here, under 5 min with the
# machine's two cores loaded seven times over
BUILD_TIMEOUT = 900
COMPILED = "(compiled: mypyc)"
# The tests that build a wheel: the first to run pays the module's one compile (pytest-timeout
# counts a test's fixtures in its time).
SLOW = pytest.mark.timeout(BUILD_TIMEOUT)


def run(cmd: list[str | Path], timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, check=False, **kw)


def outside() -> dict[str, str]:
    """The environment without PYTHONPATH: pip must not find this checkout's lameduck already
    "installed", and an installed command must run only what was installed."""
    return {k: v for k, v in _env().items() if k != "PYTHONPATH"}


def building() -> dict[str, str]:
    """``outside()`` for a build that compiles the hot path (setup.py): at gcc -O0, which
    compiles it in a fraction of -O3's time. What these tests check is that the installed
    modules are the compiled ones, not how fast they run (``make bench`` measures that)."""
    return {**outside(), "LAMEDUCK_MYPYC_OPT": "0"}


def kubernetes_default_pod(path: Path) -> Path:
    """A Deployment with Kubernetes' defaults: no terminationGracePeriodSeconds (30 s), no
    preStop hook — what the embedded default says it fits."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"template": {"spec": {"containers": [{"name": "lameduck",
                                                         "image": "lameduck:0.1.0"}]}}}}))
    return path


def unit(name: str) -> dict[str, str]:
    """The [Service]/[Socket] keys of a shipped unit (last value wins, as in systemd)."""
    section: dict[str, str] = {}
    for line in (SYSTEMD / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            section[key.strip()] = value.strip()
    return section


# --- lameduck budget ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["embedded default", "systemd", "kubernetes"])
def test_shipped_config_passes_the_budget(name: str, tmp_path: Path) -> None:
    config, pod = {
        "embedded default": (DEFAULT_YAML, kubernetes_default_pod(tmp_path / "pod.yaml")),
        "systemd": (SYSTEMD / "lameduck.yaml", SYSTEMD / "budget-pod.yaml"),
        "kubernetes": (KUBE / "lameduck.yaml", KUBE / "deployment.yaml"),
    }[name]
    text = config.read_text()
    for flag, value in zip(LB_FLAGS[::2], LB_FLAGS[1::2], strict=True):
        assert f"{flag} {value}" in text, f"{config}: does not say it assumes {flag} {value}"
    # The embedded default is checked as packaged (no -c), the others by file.
    args = ["budget", "--pod", pod, *LB_FLAGS, "--json", "--solve"]
    if config != DEFAULT_YAML:
        args += ["-c", config]
    out = run([sys.executable, "-m", "lameduck", *args], timeout=30, env=_env())
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["ok"]
    assert [q["name"] for q in report["inequalities"] if q["holds"]] == [
        "grace", "keepalive-client", "keepalive-lb", "deadline", "lb-detection"]
    # Already the smallest consistent values: --solve would change nothing.
    cfg = load_config(config)
    prop = report["proposal"]
    assert parse_duration(prop["lameduck"]["drain"]["time"]) == cfg.drain.time
    assert parse_duration(prop["lameduck"]["shutdown"]["deadline"]) == cfg.shutdown.deadline
    assert "listeners" not in prop["lameduck"] and "load_balancer" not in prop


def test_systemd_budget_pod_is_the_units_stop_timers() -> None:
    """budget-pod.yaml stands for the unit: its grace period is TimeoutStopSec, and systemd
    sends SIGTERM at once (no preStop)."""
    pod = yaml.safe_load((SYSTEMD / "budget-pod.yaml").read_text())
    stop = parse_duration(unit("lameduck.service")["TimeoutStopSec"])
    assert pod["spec"]["terminationGracePeriodSeconds"] == stop
    assert all("lifecycle" not in c for c in pod["spec"]["containers"])


# --- make install and systemd-analyze verify ------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the source tree, so building and installing write nothing into the checkout
    (and no stale build/ of it gets packed)."""
    dst = tmp_path_factory.mktemp("source") / "lameduck"
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "__pycache__", "*.so", "*.egg-info", ".*_cache",
        ".hypothesis", "bench"))
    return dst


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m build` (an sdist, then the wheel from it): a platform wheel, the hot path
    compiled (a C compiler is here). Built once for the module: the compile is most of its
    time."""
    where = tmp_path_factory.mktemp("wheel")
    out = run([sys.executable, "-m", "build", "--outdir", where / "dist", source],
              timeout=BUILD_TIMEOUT, env=building())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    [whl] = (where / "dist").glob("lameduck-*.whl")
    # lameduck-0.1.0-cp311-cp311-linux_x86_64.whl: this interpreter's tags, not py3-none-any
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert whl.name.startswith(f"lameduck-{__version__}-{tag}-{tag}-"), whl.name
    return whl


@pytest.fixture(scope="module")
def prefix(source: Path, wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make install PREFIX=...` into a temporary prefix, with this interpreter's Python and
    the wheel built above (WHEEL=: the same setup.py builds it; one compile per module)."""
    where = tmp_path_factory.mktemp("prefix")
    out = run(["make", "-s", "-C", source, "install", f"PREFIX={where}",
               f"PYTHON={sys.executable}", f"WHEEL={wheel}"], timeout=INSTALL_TIMEOUT,
              env=outside())
    assert out.returncode == 0, out.stdout + out.stderr
    # Its last line says which hot path it installed.
    assert out.stdout.rstrip().endswith(COMPILED), out.stdout + out.stderr
    return where


@SLOW
def test_make_install_puts_lameduck_in_prefix_bin(prefix: Path) -> None:
    exe = prefix / "bin" / "lameduck"
    assert exe.is_symlink()
    assert exe.resolve() == (prefix / "lib" / "lameduck" / "bin" / "lameduck").resolve()
    # What the unit's ExecStartPre runs, without this checkout on the path.
    out = run([exe, "validate", "-c", SYSTEMD / "lameduck.yaml"], cwd=prefix, env=outside())
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout
    where = run([prefix / "lib" / "lameduck" / "bin" / "python", "-c",
                 "import lameduck; print(lameduck.__file__)"], cwd=prefix, env=outside())
    assert where.stdout.startswith(str(prefix)), where.stdout + where.stderr
    # The installed hot path is the compiled one (a wheel built by the venv's Python).
    version = run([exe, "--version"], cwd=prefix, env=outside())
    assert version.stdout.strip() == f"lameduck {__version__} {COMPILED}", version.stdout
    # The unit runs what the default PREFIX installs.
    default = re.search(r"^PREFIX \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert default is not None
    for key in ("ExecStartPre", "ExecStart"):
        assert unit("lameduck.service")[key].startswith(f"{default[1]}/bin/lameduck "), key


def _verify(tmp_path: Path, exe: str) -> subprocess.CompletedProcess[str]:
    """systemd-analyze verify on copies of the shipped units, ExecStart pointing at ``exe``."""
    for name in ("lameduck.service", "lameduck.socket"):
        text = (SYSTEMD / name).read_text().replace("/usr/local/bin/lameduck", exe)
        (tmp_path / name).write_text(text)
    return run(["systemd-analyze", "verify", tmp_path / "lameduck.service"], timeout=30)


@SLOW
def test_systemd_analyze_verifies_the_unit_against_the_install(prefix: Path,
                                                               tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    ok = _verify(tmp_path, str(prefix / "bin" / "lameduck"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "lameduck" not in ok.stderr, ok.stderr  # no warning about our units
    # The check is real: an ExecStart that nothing installed fails it.
    missing = _verify(tmp_path, str(prefix / "bin" / "not-installed"))
    assert missing.returncode != 0
    assert "not-installed" in missing.stderr


# --- the Dockerfile and the Kubernetes manifests --------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def final_stage() -> list[tuple[str, str]]:
    steps = dockerfile()
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last:]


def manifests() -> dict[str, dict[str, Any]]:
    """The kustomization's resources by kind, each parsed as YAML."""
    kust = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    docs = [d for r in kust["resources"] for d in yaml.safe_load_all((KUBE / r).read_text())]
    for gen in kust.get("configMapGenerator", []):
        for f in gen["files"]:
            assert (KUBE / f).is_file(), f
    return {d["kind"]: d for d in docs}


def lameduck_container() -> dict[str, Any]:
    [c] = [c for c in manifests()["Deployment"]["spec"]["template"]["spec"]["containers"]
           if c["name"] == "lameduck"]
    return c


def test_dockerfile_builds_from_source_runs_supervise_as_non_root() -> None:
    steps = dockerfile()
    assert all(args.split()[0] == "python:3.12-slim" for word, args in steps if word == "FROM")
    last = final_stage()
    users = [args for word, args in last if word == "USER"]
    assert users, "the final stage runs as root"
    assert users[-1].split(":")[0] not in ("root", "0")
    [entry] = [json.loads(args) for word, args in last if word == "ENTRYPOINT"]
    assert entry[:2] == ["lameduck", "supervise"]
    [cmd] = [json.loads(args) for word, args in last if word == "CMD"]
    [health] = [args for word, args in last if word == "HEALTHCHECK"]
    assert "urllib" in health and "/ready" in health and "curl" not in health
    # The healthcheck reads the admin address from the file supervise is told to write.
    path = entry[entry.index("--admin-address-path") + 1]
    assert f"open('{path}')" in health
    # The config CMD names is the one the image copies in, and EXPOSE is its listener's port.
    config_path = cmd[cmd.index("-c") + 1]
    [copied] = [args.split() for word, args in last
                if word == "COPY" and args.split()[-1] == config_path]
    cfg = load_config(ROOT / copied[0])
    exposed = {int(p.split("/")[0]) for word, args in last if word == "EXPOSE"
               for p in args.split()}
    assert exposed == {ls.address.port for ls in cfg.listeners}
    # The wheel stage builds from the tree, compiled or failing (gcc there only); the image
    # installs that wheel and checks it runs the compiled hot path.
    builder = steps[:len(steps) - len(last)]
    assert any(word == "RUN" and "LAMEDUCK_MYPYC=1 python -m build" in args
               for word, args in builder)
    assert any(word == "RUN" and "gcc" in args for word, args in builder)
    assert not any("gcc" in args for word, args in last)
    assert any(word == "COPY" and "setup.py" in args.split() for word, args in builder)
    assert any(word == "RUN" and ".whl" in args and f'lameduck --version | grep -F "{COMPILED}"'
               in args for word, args in last)


def test_dockerignore_keeps_the_context_small_but_buildable() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv"} <= ignored
    copied = {args.split()[0] for word, args in dockerfile()
              if word == "COPY" and "--from" not in args}
    for path in copied:  # what the Dockerfile copies from the context is not ignored
        assert path.split("/")[0] not in ignored, path


def test_kubernetes_service_selects_the_deployment_and_reaches_the_listener() -> None:
    kinds = manifests()
    assert set(kinds) == {"Deployment", "Service", "PodDisruptionBudget"}
    dep, svc = kinds["Deployment"], kinds["Service"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    c = lameduck_container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    cfg = load_config(KUBE / "lameduck.yaml")
    listener_ports = {ls.address.port for ls in cfg.listeners}
    for sp in svc["spec"]["ports"]:
        target = sp["targetPort"]
        port = ports[target] if isinstance(target, str) else target
        assert port in listener_ports, (sp, listener_ports)
    assert set(ports.values()) <= listener_ports


def test_deployment_runs_the_image_entrypoint_with_the_mounted_config() -> None:
    """The container's args follow the image's ENTRYPOINT (`lameduck supervise ...`) and name
    the config where the ConfigMap is mounted."""
    c = lameduck_container()
    args = c["args"]
    assert "supervise" not in args  # the ENTRYPOINT says it already
    config = Path(args[args.index("-c") + 1])
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "lameduck-config"]
    assert config.parent == Path(mount["mountPath"])
    assert config.name == "lameduck.yaml"
    # The same path the image's own CMD uses, so the ConfigMap replaces the baked-in config.
    [cmd] = [json.loads(args) for word, args in final_stage() if word == "CMD"]
    assert cmd[cmd.index("-c") + 1] == str(config)


# --- the wheel ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel installed into a fresh venv."""
    whl = wheel
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    out = run([sys.executable, "-m", "venv", venv], timeout=60, env=outside())
    assert out.returncode == 0, out.stderr
    out = run([venv / "bin" / "python", "-m", "pip", "install", "-q", whl],
              timeout=INSTALL_TIMEOUT, env=outside())
    assert out.returncode == 0, out.stdout + out.stderr
    yield venv


@SLOW
def test_wheel_installs_and_validates_the_default_config(wheel_venv: Path,
                                                          tmp_path: Path) -> None:
    exe = wheel_venv / "bin" / "lameduck"
    env = outside()  # and cwd elsewhere: only the installed wheel can answer
    out = run([exe, "validate"], cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout
    where = run([wheel_venv / "bin" / "python", "-c",
                 "import lameduck; print(lameduck.__file__)"], cwd=tmp_path, env=env)
    assert where.stdout.startswith(str(wheel_venv)), where.stdout + where.stderr
    # The packaged default is the file in the tree, and the budget check runs from the wheel.
    out = run([exe, "budget", "--pod", KUBE / "deployment.yaml", "-c", KUBE / "lameduck.yaml",
               *LB_FLAGS], cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("drain: {time: soon}\n")
    out = run([exe, "validate", "-c", bad], cwd=tmp_path, env=env)
    assert out.returncode == 2 and "drain.time" in out.stderr


@SLOW
def test_the_wheel_runs_the_compiled_hot_path(wheel_venv: Path, tmp_path: Path) -> None:
    out = run([wheel_venv / "bin" / "lameduck", "--version"], cwd=tmp_path, env=outside())
    assert out.stdout.strip() == f"lameduck {__version__} {COMPILED}", out.stdout + out.stderr
    # every module of hot.txt from an extension module of the venv, none from this tree
    where = run([wheel_venv / "bin" / "python", "-c",
                 "import importlib, sys\n"
                 "from lameduck.hotpath import hot_modules\n"
                 "for m in hot_modules(): print(importlib.import_module(m).__file__)"],
                cwd=tmp_path, env=outside())
    files = where.stdout.split()
    assert len(files) == len(hot_modules()) > 0, where.stdout + where.stderr
    assert all(f.startswith(str(wheel_venv)) and f.endswith(".so") for f in files), files


@SLOW
def test_without_a_compiler_the_wheel_is_pure_python(source: Path, tmp_path: Path) -> None:
    """The fallback: no C compiler (CC names none), a py3-none-any wheel of the same source,
    with a warning; installed, it says so."""
    out = run([sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", source],
              timeout=BUILD_TIMEOUT, env={**outside(), "CC": str(tmp_path / "no-cc")})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "hot path is not compiled (no C compiler" in out.stdout + out.stderr
    [whl] = (tmp_path / "dist").glob("lameduck-*.whl")
    assert whl.name == f"lameduck-{__version__}-py3-none-any.whl"
    # Unpacked alone (its dependencies are this interpreter's): nothing compiled in it.
    target = tmp_path / "site"
    out = run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
               whl], timeout=INSTALL_TIMEOUT, env=outside())
    assert out.returncode == 0, out.stdout + out.stderr
    assert not list(target.rglob("*.so"))
    out = run([sys.executable, "-m", "lameduck", "--version"], cwd=tmp_path,
              env={**outside(), "PYTHONPATH": str(target)})
    assert out.stdout.strip() == f"lameduck {__version__} (pure Python)", out.stdout + out.stderr
