"""The environment of a worker process, named once.

``hopbus launch`` and ``hopbus worker -- COMMAND`` start a user's script with these variables
set, ``hopbus.join()`` reads them, and the CLI's flags of the same meaning read them too
(``hopbus worker --run`` is ``HOPBUS_RUN``), so a script and a built-in worker are configured
the same way, on one machine or in a container.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

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
# set to 1 for a script started as a worker (hopbus launch, hopbus worker -- COMMAND) only:
# HOPBUS_RUN alone is no sign, users export it for hopbus top, inspect and watch
SCRIPT = "HOPBUS_SCRIPT"
# the launcher that started this process tree: passed on to everything below it (not one of
# WORKER_VARS, which hopbus worker sets afresh), so that reaper.marked finds what is left
LAUNCH = "HOPBUS_LAUNCH"
# 0: hopbus train and launch start each worker as a fresh interpreter, not forked from one
# that imported hopbus once (runtime/forkserver.py): for a profiler or debugger that wraps
# the interpreter, or to rule the fork out when a worker misbehaves
FORKSERVER = "HOPBUS_FORKSERVER"

WORKER_VARS = (RUN, REDIS, ID, BIND, ADVERTISE, TIMEOUT, CURVE, DEVICE, CHECKPOINT_DIR,
               RESUME_FROM, REJOIN, TENSORBOARD, MODEL, DATA, SCRIPT)  # fmt: skip
"""What a launcher sets for its workers (and clears from its own environment first)."""


def flag(value: str | None) -> bool:
    """A boolean variable: 1, true, yes or on (any case)."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""The thread pools of the math libraries under numpy and PyTorch (OpenMP, OpenBLAS, MKL)."""


def thread_share(copies: int, environ: Mapping[str, str]) -> dict[str, str]:
    """What each of ``copies`` processes started on this machine is given for its math
    libraries' thread pools: its share of the cores this process may run on, as torchrun
    does. Each library starts one thread per core, and threads that spin while they wait
    turn N copies into N times too many (PyTorch's step here: 13x slower with 4 copies on 2
    cores). Nothing when the user set any of these to a value (they know their machine; an
    empty one means unset to the libraries too), nor for one copy. TensorFlow's own pools do
    not spin, and are left as they are."""
    if copies <= 1 or any(environ.get(name, "").strip() for name in THREAD_VARS):
        return {}
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return dict.fromkeys(THREAD_VARS, str(max(1, cores // copies)))
