"""Listeners: a bound socket, its routes (HTTP) or cluster (TCP), and its connections."""

from lameduck.listeners.base import Listener
from lameduck.listeners.http import HttpListener, open_upstream
from lameduck.listeners.tcp import TcpListener

__all__ = ["HttpListener", "Listener", "TcpListener", "open_upstream"]
