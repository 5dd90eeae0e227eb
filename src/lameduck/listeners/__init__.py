"""Listeners: a bound socket, its routes (HTTP) or cluster (TCP), and its connections."""

from lameduck.config.schema import FORMAT_CHECKS
from lameduck.listeners.base import Listener
from lameduck.listeners.http import HttpListener, open_upstream
from lameduck.listeners.tcp import TcpListener
from lameduck.proxy.accesslog import compile_format

# validate refuses an access-log format the listener would refuse (not from proxy.accesslog
# itself: compiled, it would pull the configuration's pydantic into the wheel's build)
FORMAT_CHECKS.append(compile_format)

__all__ = ["HttpListener", "Listener", "TcpListener", "open_upstream"]
