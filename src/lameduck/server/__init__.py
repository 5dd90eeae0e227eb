"""The process: ``build`` makes what the config describes (no sockets); ``Server`` binds it,
serves, drains and exits."""

from lameduck.server.build import Built, build
from lameduck.server.server import EXIT_CUT, EXIT_OK, Server

__all__ = ["EXIT_CUT", "EXIT_OK", "Built", "Server", "build"]
