"""The process: ``build`` makes what the config describes (no sockets); ``Server`` binds it,
serves (here, or in worker processes), drains and exits; ``boot`` starts it for
``lameduck run``."""

from lameduck.server.build import Built, build
from lameduck.server.lifecycle import EXIT_CUT, EXIT_OK
from lameduck.server.server import Server

__all__ = ["EXIT_CUT", "EXIT_OK", "Built", "Server", "build"]
