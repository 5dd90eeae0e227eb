"""The drain core: sans-IO, no asyncio, no sockets. Clock and randomness are the caller's."""

from lameduck.drain.connection import ConnAction, ConnectionDrain, ConnState, DrainedBy
from lameduck.drain.event import Cause, Direction, DrainEvent, DrainType, IdleClose, Strategy
from lameduck.drain.ledger import Ledger
from lameduck.drain.listener import ListenerDrain
from lameduck.drain.policy import Rng, proactive_moment, proactive_window, response_drains
from lameduck.drain.process import (
    DrainSettings,
    LeaveStep,
    ProcessDrain,
    ServerState,
    ShutdownSettings,
    Step,
)

__all__ = [
    "Cause",
    "ConnAction",
    "ConnState",
    "ConnectionDrain",
    "Direction",
    "DrainEvent",
    "DrainSettings",
    "DrainType",
    "DrainedBy",
    "IdleClose",
    "LeaveStep",
    "Ledger",
    "ListenerDrain",
    "ProcessDrain",
    "Rng",
    "ServerState",
    "ShutdownSettings",
    "Step",
    "Strategy",
    "proactive_moment",
    "proactive_window",
    "response_drains",
]
