"""Process handover: hot restart (``hot``) and systemd readiness and socket activation."""

from lameduck.restart.systemd import Notifier, PassedSocket, listen_fds, match_listeners

__all__ = ["Notifier", "PassedSocket", "listen_fds", "match_listeners"]
