"""What an optional dependency's absence says: the extra that installs it, not a bare
ModuleNotFoundError naming a module the user never asked for (PEP 508 extras; the names are
pyproject.toml's [project.optional-dependencies])."""

from __future__ import annotations

__all__ = ["MissingExtra", "missing_extra"]


class MissingExtra(ModuleNotFoundError):
    """A ModuleNotFoundError (code that catches ImportError still does) that names the extra."""


def missing_extra(extra: str, feature: str, error: ModuleNotFoundError) -> MissingExtra:
    """``raise missing_extra("resume", "RedisStore", e) from e`` in an ``except
    ModuleNotFoundError as e`` around an optional import."""
    return MissingExtra(
        f"{feature} needs {error.name or 'a module that is not installed'}, an optional "
        f"dependency: pip install 'lameduck[{extra}]'", name=error.name)
