"""A short coverage-guided run of each fuzz target, and a replay of its committed corpus: any
crash, or a breach of a target's invariants (unbounded growth included), fails the test.
``make fuzz`` runs the same targets for longer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz import run

SECONDS = 5


@pytest.mark.parametrize("target", sorted(run.TARGETS))
def test_corpus_replays(target: str) -> None:
    """Every committed input still passes (they include inputs that once failed)."""
    fn = run.load(target, source=False)
    inputs = run.seeds(target)
    assert inputs, f"no seeds in tests/fuzz/corpus/{target}"
    for data in inputs:
        fn(data)


@pytest.mark.parametrize("target", sorted(run.TARGETS))
def test_short_fuzz_run(target: str, tmp_path: Path) -> None:
    """New inputs go to a temporary corpus: ``make test`` leaves the committed one as it is."""
    rc, summary = run.fuzz(target, SECONDS, tmp_path / target, quiet=True)
    assert rc == 0, summary
