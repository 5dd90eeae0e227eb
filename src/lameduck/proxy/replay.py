"""How much of a request an exchange keeps to send it again, on any protocol."""

from __future__ import annotations

from typing import Final

# Request bytes kept while a request rides a reused pooled connection (or a stream) and no
# response byte has come back, so a connection the upstream had already closed, or a refused
# stream, can be retried on a fresh one without asking the client to send it again.
REPLAY_LIMIT: Final = 64 * 1024
