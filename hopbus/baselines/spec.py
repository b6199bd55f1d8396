"""The related schemes' settings, and the rules that refuse what cannot work.

One place for them, as ``hopbus.protocol.spec`` is for Hop's: the CLI, the launcher and every
process of a run refuse the same settings with the same words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hopbus.errors import ConfigError
from hopbus.modes import Family, Mode


def is_power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def default_group_size(workers: int) -> int:
    """WAGMA's S when not given: the smallest power of two at or above sqrt(P) (the paper's
    S ~ sqrt(P): 4 for 8 or 16 workers, 8 for 64)."""
    return 2 ** math.ceil(math.log2(max(workers, 1)) / 2)


@dataclass(frozen=True)
class SchemeSettings:
    """Knobs of the related schemes. Each one's meaning and when to change it:

    mode: ps-bsp, ps-ssp, ps-asp, ps-backup, ps-elastic, wagma or allreduce.
    workers: worker processes; for ps-backup all N+b of them. The parameter server is one more
        process (``hopbus ps``).
    iterations: ps-bsp and ps-backup: parameter versions (global steps); the others: each
        worker's own iterations.
    backup: ps-backup's b, gradients each step goes without (Chen et al.): 1 or 2 absorb
        random slowdowns; 0 is ps-bsp.
    staleness: ps-ssp's bound: the fastest worker at most this many iterations ahead of the
        slowest; 0 is BSP, larger waits less but mixes older gradients.
    lookahead: ps-elastic's R, future iterations per worker ZipLine considers for the next
        barrier; the paper uses 15. Larger finds barriers with less waiting, further apart.
    group_size: wagma's S, workers averaged together each iteration (a power of two, at most
        the workers); 1 is local SGD, the workers is a global average every iteration.
    sync_period: wagma's tau, iterations between blocking global averages; the paper uses 10.
    """

    mode: Mode
    workers: int
    iterations: int
    backup: int = 1
    staleness: int = 3
    lookahead: int = 15
    group_size: int = 4
    sync_period: int = 10

    @property
    def needed(self) -> int:
        """Gradients a synchronous step applies: N of the N+b (all for ps-bsp)."""
        return self.workers - (self.backup if self.mode is Mode.PS_BACKUP else 0)


def check(s: SchemeSettings) -> None:
    """Raise ConfigError, one line naming the flag, for settings the scheme cannot run."""
    if s.mode.family is Family.HOP:
        raise ValueError(f"{s.mode} is one of Hop's modes, not a related scheme")
    if s.workers < 2:
        raise ConfigError(f"--workers must be at least 2 with --mode {s.mode} (got {s.workers})")
    if s.mode is Mode.PS_BACKUP:
        if s.backup < 0:
            raise ConfigError(f"--backup must be 0 or more (got {s.backup})")
        if s.backup >= s.workers:
            raise ConfigError(
                f"--backup {s.backup} must be smaller than --workers {s.workers}: with "
                "--mode ps-backup --workers counts all N+b workers and each step needs at least "
                "one gradient"
            )
    if s.mode is Mode.PS_ELASTIC and s.lookahead < 1:
        raise ConfigError(f"--lookahead must be at least 1 (got {s.lookahead})")
    if s.mode is Mode.WAGMA:
        if not is_power_of_two(s.workers):
            raise ConfigError(
                f"--mode wagma needs a power-of-two number of workers (got --workers "
                f"{s.workers}): its groups follow a butterfly"
            )
        if not is_power_of_two(s.group_size):
            raise ConfigError(f"--group-size must be a power of two (got {s.group_size})")
        if s.group_size > s.workers:
            raise ConfigError(f"--group-size {s.group_size} is larger than the {s.workers} workers")
        if s.sync_period < 1:
            raise ConfigError(f"--sync-period must be at least 1 (got {s.sync_period})")
