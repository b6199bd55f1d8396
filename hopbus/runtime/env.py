"""The environment of a worker process, named once.

``hopbus launch`` and ``hopbus worker -- COMMAND`` start a user's script with these variables
set, ``hopbus.join()`` reads them, and the CLI's flags of the same meaning read them too
(``hopbus worker --run`` is ``HOPBUS_RUN``), so a script and a built-in worker are configured
the same way, on one machine or in a container.
"""

from __future__ import annotations

RUN = "HOPBUS_RUN"  # the run id
REDIS = "HOPBUS_REDIS"  # the Redis URL (may hold a password: never on a command line)
ID = "HOPBUS_ID"  # this worker's id (none: take the run's next one)
BIND = "HOPBUS_BIND"  # the inbox's ZeroMQ address
ADVERTISE = "HOPBUS_ADVERTISE"  # the host peers reach it at (auto: this host's address)
TIMEOUT = "HOPBUS_TIMEOUT"  # seconds any wait may take (default: the run's --timeout)
CURVE = "HOPBUS_CURVE"  # the run's CURVE key folder
DEVICE = "HOPBUS_DEVICE"  # this worker's TensorFlow device
CHECKPOINT_DIR = "HOPBUS_CHECKPOINT_DIR"  # the built-in models' checkpoint folder
RESUME_FROM = "HOPBUS_RESUME_FROM"  # resume in this iteration from its checkpoint
REJOIN = "HOPBUS_REJOIN"  # a replacement for dead worker ID
TENSORBOARD = "HOPBUS_TENSORBOARD"  # the run's TensorBoard folder (worker-I/ under it)
MODEL = "HOPBUS_MODEL"  # the run's --model MODULE:FUNCTION this node may run (own_code.py)
DATA = "HOPBUS_DATA"  # the run's --data MODULE:FUNCTION this node may run

WORKER_VARS = (RUN, REDIS, ID, BIND, ADVERTISE, TIMEOUT, CURVE, DEVICE, CHECKPOINT_DIR,
               RESUME_FROM, REJOIN, TENSORBOARD, MODEL, DATA)  # fmt: skip
"""What a launcher sets for its workers (and clears from its own environment first)."""


def flag(value: str | None) -> bool:
    """A boolean variable: 1, true, yes or on (any case)."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")
