"""Process handover: systemd readiness and socket activation (hot restart comes next)."""

from lameduck.restart.systemd import Notifier, PassedSocket, listen_fds, match_listeners

__all__ = ["Notifier", "PassedSocket", "listen_fds", "match_listeners"]
