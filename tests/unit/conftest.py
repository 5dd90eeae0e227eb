"""Fixtures shared by the unit tests."""

from tests.benchmod import bench  # noqa: F401  (bench/run.py as a module)
