"""HTTP/1.1 codecs: the downstream and upstream protocols.

``make fast`` compiles wire, upstream and downstream with mypyc (see the stale-build check in
``lameduck/__init__.py``).
"""
