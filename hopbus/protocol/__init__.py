"""The pure protocol core: no sockets, no Redis, no clock, no sleep.

``worker_loop`` is Hop's worker as a generator of effects; ``UpdateStore``, ``TokenLedger`` and
the policies are the rules it follows. Drivers (the simulator, the runtime) perform the effects.
"""

from hopbus.protocol.effects import (
    Advance,
    Apply,
    Compute,
    Effect,
    Finish,
    PublishFloor,
    ReadFloors,
    ReadTokenCounts,
    Recv,
    Reduce,
    Send,
    SendAcks,
    Start,
)
from hopbus.protocol.policy import Policy
from hopbus.protocol.requirements import AcksFrom, Fresh, Requirement, SameIteration
from hopbus.protocol.skipping import jump_length, lag_behind
from hopbus.protocol.spec import ProtocolSettings, ProtocolWarning, WorkerSpec, plan
from hopbus.protocol.store import Mailbox, Outcome, Update, UpdateStore
from hopbus.protocol.tokens import TokenLedger
from hopbus.protocol.worker import worker_loop

__all__ = [
    "AcksFrom",
    "Advance",
    "Apply",
    "Compute",
    "Effect",
    "Finish",
    "Fresh",
    "Mailbox",
    "Outcome",
    "Policy",
    "ProtocolSettings",
    "ProtocolWarning",
    "PublishFloor",
    "ReadFloors",
    "ReadTokenCounts",
    "Recv",
    "Reduce",
    "Requirement",
    "SameIteration",
    "Send",
    "SendAcks",
    "Start",
    "TokenLedger",
    "Update",
    "UpdateStore",
    "WorkerSpec",
    "jump_length",
    "lag_behind",
    "plan",
    "worker_loop",
]
