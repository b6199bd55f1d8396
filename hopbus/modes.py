"""The names of the decentralized protocol's settings, shared by every layer that uses them."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """Which Recv rule a worker follows (Sec. 3.3 - 4.4)."""

    STANDARD = "standard"  # Fig. 4 / Fig. 7: every in-neighbour's update of this iteration
    NOTIFY_ACK = "notify-ack"  # Sec. 3.3: standard, plus ACKs that hold senders back
    BACKUP = "backup"  # Fig. 8: all but N_buw in-neighbours' updates of this iteration
    STALENESS = "staleness"  # Fig. 9: each in-neighbour's newest update, at most s iterations old
    HYBRID = "hybrid"  # backup + staleness: all but N_buw in-neighbours, each at most s old

    @property
    def uses_backup(self) -> bool:
        return self in (Mode.BACKUP, Mode.HYBRID)

    @property
    def uses_staleness(self) -> bool:
        return self in (Mode.STALENESS, Mode.HYBRID)


class Approach(StrEnum):
    """Where Send sits in an iteration (Sec. 3.2, Fig. 2)."""

    PARALLEL = "parallel"  # Send(x_k) and Compute(x_k) overlap; Reduce then Apply (Hop's choice)
    SERIAL = "serial"  # Compute, Apply, then Send the new parameters; Recv; Reduce
