"""The orchestrator: what runs around the proxy rather than inside it.

It may import ``config`` and ``drain``; nothing imports it but ``cli``.
"""
