"""The drain core's settings from a validated config, one mapping for every caller.

The server and the simulator both build a ``ProcessDrain`` from the ``drain`` and ``shutdown``
sections; building the settings here keeps the two from drifting apart.
"""

from __future__ import annotations

from lameduck.config.schema import Config, StopAccepting
from lameduck.drain.process import DrainSettings, ShutdownSettings


def drain_settings(cfg: Config) -> tuple[DrainSettings, ShutdownSettings]:
    """The ``(DrainSettings, ShutdownSettings)`` a process configured by ``cfg`` drains with."""
    drain = DrainSettings(cfg.drain.time, cfg.drain.strategy, cfg.drain.connection_grace,
                          cfg.drain.idle_close)
    shutdown = ShutdownSettings(cfg.shutdown.deadline, cfg.shutdown.min_drain,
                                cfg.shutdown.stop_accepting is StopAccepting.AT_DRAIN_END,
                                cfg.shutdown.leave)
    return drain, shutdown
