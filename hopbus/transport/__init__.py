"""The data plane: ZeroMQ inboxes and outboxes and the frame codec between them."""

from hopbus.transport.codec import (
    ALLOWED_DTYPES,
    DROP_REASONS,
    KIND_ACK,
    KIND_ACTIVATE,
    KIND_CONTRIB,
    KIND_GRAD,
    KIND_PARAMS,
    KIND_PHASE,
    KIND_SUM,
    KIND_UPDATE,
    WIRE_VERSION,
    FrameError,
    Layout,
    Message,
    Params,
    Validator,
    encode,
    encode_ack,
    encode_update,
    layout_of,
)
from hopbus.transport.curve import CurveKeys
from hopbus.transport.errors import TransportError
from hopbus.transport.inbox import UNAUTHENTICATED, Inbox, hwm_for
from hopbus.transport.outbox import Outbox

__all__ = [
    "ALLOWED_DTYPES",
    "DROP_REASONS",
    "KIND_ACK",
    "KIND_ACTIVATE",
    "KIND_CONTRIB",
    "KIND_GRAD",
    "KIND_PARAMS",
    "KIND_PHASE",
    "KIND_SUM",
    "KIND_UPDATE",
    "UNAUTHENTICATED",
    "WIRE_VERSION",
    "CurveKeys",
    "FrameError",
    "Inbox",
    "Layout",
    "Message",
    "Outbox",
    "Params",
    "TransportError",
    "Validator",
    "encode",
    "encode_ack",
    "encode_update",
    "hwm_for",
    "layout_of",
]
