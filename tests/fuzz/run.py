"""Run one fuzz target under atheris (libFuzzer's coverage-guided engine for Python) and print
executions per second and coverage (edges of the instrumented Python bytecode).

    python -m tests.fuzz.run h1|h2|ws [--seconds N] [--corpus DIR]

New interesting inputs go to ``--corpus`` (default tests/fuzz/corpus/<target>/, where the
committed seeds are); a crashing input to tests/fuzz/crashes/<target>/. The exit status is
libFuzzer's: 0 when the time ran out with no crash.

lameduck's modules are imported from their ``.py`` sources even when ``make fast`` compiled
them: atheris instruments Python bytecode, so a mypyc module would give no coverage signal.
Without atheris (no wheel for this platform) a plain mutation loop runs instead, with no
coverage guidance; it still finds what the targets' invariants catch, only more slowly.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TARGETS = {"h1": "tests.fuzz.h1_request", "h2": "tests.fuzz.h2_frames",
           "ws": "tests.fuzz.ws_frames"}


class SourceFirst(importlib.abc.MetaPathFinder):
    """Find ``lameduck`` modules as ``.py`` only, never a compiled extension beside them."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "lameduck" and not name.startswith("lameduck."):
            return None
        finder = importlib.machinery.PathFinder
        spec = finder.find_spec(name, path)
        if spec is None or spec.origin is None or spec.origin.endswith(".py"):
            return spec
        source = Path(spec.origin).with_name(name.rpartition(".")[2] + ".py")
        return importlib.util.spec_from_file_location(name, source)


def source_first() -> None:
    """Before atheris hooks the import system, so that it instruments what this finds."""
    if not any(isinstance(f, SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFirst())


def load(target: str, source: bool = True) -> Callable[[bytes], None]:
    """The target's function; ``source=False`` in a process that must not change how it
    imports lameduck (a test worker: mixing compiled and source classes would break it)."""
    if source:
        source_first()
    module = importlib.import_module(TARGETS[target])
    fn: Callable[[bytes], None] = module.fuzz_one
    return fn


def seeds(target: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((HERE / "corpus" / target).glob("*")) if p.is_file()]


def plain_loop(target: str, seconds: float) -> int:
    """Mutate the committed corpus at random for ``seconds``: the fallback without atheris
    (it keeps no new inputs: without coverage none is more interesting than another)."""
    fn = load(target)
    pool = seeds(target) or [b""]
    rng = random.Random(0)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        data = bytearray(rng.choice(pool))
        for _ in range(rng.randint(1, 8)):
            op = rng.randrange(3)
            i = rng.randint(0, len(data))
            if op == 0:
                data[i:i] = bytes([rng.randrange(256)])
            elif op == 1 and data:
                del data[min(i, len(data) - 1)]
            elif data:
                data[min(i, len(data) - 1)] = rng.randrange(256)
        try:
            fn(bytes(data))
        except Exception:
            crash = HERE / "crashes" / target
            crash.mkdir(parents=True, exist_ok=True)
            (crash / f"crash-{n}").write_bytes(bytes(data))
            raise
        n += 1
    print(f"#{n}\tDONE   cov: 0 exec/s: {n / seconds:.0f}", file=sys.stderr)
    return 0


def child(target: str, libfuzzer_args: list[str]) -> None:
    """Run in the process the parent started: instrument, then hand over to libFuzzer."""
    try:
        import atheris
    except ImportError:
        seconds = float(next(a.split("=")[1] for a in libfuzzer_args
                             if a.startswith("-max_total_time=")))
        sys.exit(plain_loop(target, seconds))
    source_first()
    with atheris.instrument_imports(include=["lameduck", "tests.fuzz", "tests.playbook"]):
        fn = load(target)
    atheris.Setup([sys.argv[0], *libfuzzer_args], fn)
    atheris.Fuzz()


def fuzz(target: str, seconds: float, corpus: Path, quiet: bool = False) -> tuple[int, str]:
    """Fuzz ``target`` for ``seconds`` in a child process; (exit status, summary line)."""
    corpus.mkdir(parents=True, exist_ok=True)
    crashes = HERE / "crashes" / target
    crashes.mkdir(parents=True, exist_ok=True)
    before = len(list(corpus.iterdir()))
    args = [f"-max_total_time={int(seconds)}", "-timeout=10", "-rss_limit_mb=2048",
            "-max_len=4096", "-print_final_stats=1", f"-artifact_prefix={crashes}/",
            str(corpus), str(HERE / "corpus" / target)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tests.fuzz.run", "--child", target, "--", *args],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace",
                          timeout=seconds + 120)
    log = proc.stdout
    done = re.findall(r"#(\d+)\s+\w+\s+cov: (\d+)", log)
    execs = re.search(r"stat::number_of_executed_units: (\d+)", log)
    rate = re.search(r"stat::average_exec_per_sec:\s+(\d+)", log) or re.search(
        r"exec/s: (\d+)", log.rsplit("DONE", 1)[-1])
    cov = done[-1][1] if done else "?"
    new = len(list(corpus.iterdir())) - before
    summary = (f"{target}: {execs.group(1) if execs else done[-1][0] if done else '?'} execs in "
               f"{seconds:.0f} s, {rate.group(1) if rate else '?'} exec/s, coverage {cov} "
               f"edges, {new} new corpus inputs, exit {proc.returncode}")
    if proc.returncode != 0 and not quiet:
        print(log[-8000:], file=sys.stderr)
    return proc.returncode, summary if proc.returncode == 0 else summary + "\n" + log[-8000:]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--corpus", type=Path)
    a = ap.parse_args(argv)
    rc, summary = fuzz(a.target, a.seconds, a.corpus or HERE / "corpus" / a.target)
    print(summary.splitlines()[0], flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
