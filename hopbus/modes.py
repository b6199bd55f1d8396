"""The names of the run's settings that choose what to run, shared by every layer that uses them.

``Mode`` names Hop's Recv rules and, next to them, the related schemes hopbus runs on the same
engine so that users can compare (hopbus/baselines): a parameter server in four flavours,
ElasticBSP, WAGMA-SGD, and the ring all-reduce of Horovod and PyTorch DDP.
"""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    """Which engine runs a mode: Hop's worker loop, a parameter server, WAGMA's groups, or a
    torch.distributed ring all-reduce."""

    HOP = "hop"
    PS = "ps"
    WAGMA = "wagma"
    ALLREDUCE = "allreduce"


class Mode(StrEnum):
    """Which Recv rule a worker follows (Sec. 3.3 - 4.4), or which related scheme runs."""

    STANDARD = "standard"  # Fig. 4 / Fig. 7: every in-neighbour's update of this iteration
    NOTIFY_ACK = "notify-ack"  # Sec. 3.3: standard, plus ACKs that hold senders back
    BACKUP = "backup"  # Fig. 8: all but N_buw in-neighbours' updates of this iteration
    STALENESS = "staleness"  # Fig. 9: each in-neighbour's newest update, at most s iterations old
    HYBRID = "hybrid"  # backup + staleness: all but N_buw in-neighbours, each at most s old
    PS_BSP = "ps-bsp"  # parameter server: every step waits for every worker's gradient
    PS_SSP = "ps-ssp"  # parameter server: the fastest at most --staleness ahead of the slowest
    PS_ASP = "ps-asp"  # parameter server: every gradient applied on arrival, nobody waits
    PS_BACKUP = "ps-backup"  # Chen et al.: each step takes the first N of N+b gradients
    PS_ELASTIC = "ps-elastic"  # ElasticBSP: barriers where ZipLine predicts the least waiting
    WAGMA = "wagma"  # WAGMA-SGD: wait-avoiding group averaging, global average every tau
    ALLREDUCE = "allreduce"  # synchronous SGD, gradients summed by gloo's ring all-reduce

    @property
    def family(self) -> Family:
        if self is Mode.WAGMA:
            return Family.WAGMA
        if self is Mode.ALLREDUCE:
            return Family.ALLREDUCE
        return Family.PS if self.value.startswith("ps-") else Family.HOP

    @property
    def is_hop(self) -> bool:
        return self.family is Family.HOP

    @property
    def uses_backup(self) -> bool:
        """Hop's backup workers (N_buw per worker); ps-backup counts its own --backup."""
        return self in (Mode.BACKUP, Mode.HYBRID)

    @property
    def uses_staleness(self) -> bool:
        """Hop's bounded staleness; ps-ssp uses --staleness as its own bound."""
        return self in (Mode.STALENESS, Mode.HYBRID)


HOP_MODES = tuple(m for m in Mode if m.is_hop)


class Approach(StrEnum):
    """Where Send sits in an iteration (Sec. 3.2, Fig. 2)."""

    PARALLEL = "parallel"  # Send(x_k) and Compute(x_k) overlap; Reduce then Apply (Hop's choice)
    SERIAL = "serial"  # Compute, Apply, then Send the new parameters; Recv; Reduce
