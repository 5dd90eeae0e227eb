"""Answers lameduck gives itself, the same on every protocol."""

from __future__ import annotations

from typing import Final

# On a 503 that another instance could serve now (no healthy upstream, going away): a client
# may try again after a second (RFC 9110 §10.2.3), by then on another endpoint.
RETRY_AFTER: Final = ((b"retry-after", b"1"),)
