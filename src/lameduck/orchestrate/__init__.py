"""The orchestrator: what runs around the proxy rather than inside it (DESIGN.md §1, §4).

It may import ``config`` and ``drain``; nothing imports it but ``cli``.
"""
