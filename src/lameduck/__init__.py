"""lameduck: a drain-aware HTTP proxy."""

__version__ = "0.1.0"
