"""Listeners: a bound socket, its routes, and the connections it accepted."""

from lameduck.listeners.http import HttpListener, open_upstream

__all__ = ["HttpListener", "open_upstream"]
