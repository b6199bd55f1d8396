"""From run settings and a topology to what each worker runs, refusing what cannot work.

The rules that reject a configuration live here, next to the protocol they protect, so the
simulator, the runtime and the CLI all refuse the same things with the same words.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from hopbus.errors import ConfigError
from hopbus.modes import Approach, Mode
from hopbus.protocol.policy import Policy
from hopbus.protocol.store import Mailbox, UpdateStore
from hopbus.topology import GapSetting, Topology


class ProtocolWarning(UserWarning):
    """A setting that is legal but will not do what its name suggests."""


@dataclass(frozen=True)
class ProtocolSettings:
    """Run-wide protocol knobs. Each one's meaning and when to change it:

    mode: the Recv rule. ``standard`` unless workers are unequally fast; then ``backup`` against
        random slowdowns, ``staleness`` to let workers drift apart a bounded amount, ``hybrid``
        for both; ``notify-ack`` is the older scheme, for comparison.
    iterations: iterations every worker runs.
    backup: N_buw, the in-neighbours' updates a worker may go without each iteration (backup and
        hybrid); one value for all workers or one per worker. Raise it with more stragglers, but
        each worker must still wait for at least one neighbour.
    staleness: s, how many iterations old a neighbour's update may be (staleness and hybrid).
    max_ig: token queues' bound on how far a worker may run ahead of an out-neighbour; 0 turns
        them off (not allowed with backup workers, Sec. 4.3). Larger values absorb longer
        slowdowns but each worker may hold up to (1 + max_ig) updates per in-neighbour.
    skip_max: most iterations one jump may advance (Sec. 5); 0 or 1 never jump. Use against a
        worker that is slow every iteration.
    skip_trigger: jump only when more than this many iterations behind the slowest out-neighbour.
    approach: parallel (Send overlaps Compute, Hop's choice) or serial (Sec. 3.2).
    send_check: publish each worker's store floor and leave out updates a receiver would only
        drop (Sec. 6.2). Not a flag: turn it off through this API only to measure what it saves.
    """

    mode: Mode = Mode.STANDARD
    iterations: int = 100
    backup: int | tuple[int, ...] = 1
    staleness: int = 5
    max_ig: int = 5
    skip_max: int = 0
    skip_trigger: int = 1
    approach: Approach = Approach.PARALLEL
    send_check: bool = True

    @property
    def gap_setting(self) -> GapSetting:
        return GapSetting(self.mode, staleness=self.staleness, max_ig=self.max_ig)

    @property
    def skipping(self) -> bool:
        return self.skip_max >= 2

    def backup_of(self, worker: int) -> int:
        if not self.mode.uses_backup:
            return 0
        return self.backup if isinstance(self.backup, int) else self.backup[worker]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything worker ``worker`` needs to run the protocol, and nothing about I/O."""

    worker: int
    settings: ProtocolSettings
    in_peers: tuple[int, ...]
    out_peers: tuple[int, ...]
    policy: Policy
    store_slots: int

    def new_mailbox(self, start: int = 0) -> Mailbox:
        """An empty mailbox for a worker starting in iteration ``start``: its store's window
        begins at that iteration's floor, so the first updates are neither stale nor beyond."""
        box = Mailbox(UpdateStore(self.store_slots, supersede=self.settings.mode.uses_staleness))
        box.updates.advance(self.policy.floor(start))
        return box

    @property
    def store_bound(self) -> int | None:
        """Most updates the store may ever hold: (1 + max_ig) * |N_in| with token queues
        (Sec. 4.2, self-loop not counted since own parameters are never stored); None without."""
        if self.settings.max_ig <= 0:
            return None
        return (1 + self.settings.max_ig) * len(self.in_peers)


def _check_settings(s: ProtocolSettings, topo: Topology) -> None:
    if s.iterations < 1:
        raise ConfigError(f"--iterations must be at least 1 (got {s.iterations})")
    if s.staleness < 0:
        raise ConfigError(f"--staleness must be 0 or more (got {s.staleness})")
    if s.max_ig < 0:
        raise ConfigError(f"--max-ig must be 0 (no token queues) or more (got {s.max_ig})")
    if s.skip_max < 0:
        raise ConfigError(f"--skip-max must be 0 (never jump) or more (got {s.skip_max})")
    if s.skip_trigger < 0:
        raise ConfigError(f"--skip-trigger must be 0 or more (got {s.skip_trigger})")
    if s.mode.uses_backup and s.max_ig < 1:
        raise ConfigError(
            f"--mode {s.mode} needs token queues (--max-ig 1 or more): with backup workers a "
            "slow worker's neighbours could otherwise run arbitrarily far ahead (Sec. 4.3)"
        )
    if s.skipping and s.max_ig < 1:
        raise ConfigError(
            "--skip-max needs token queues (--max-ig 1 or more): a straggler finds out how far "
            "behind it is from its out-neighbours' token queues (Sec. 5)"
        )
    if s.mode.uses_backup:
        _check_backup(s.backup, topo)


def _check_backup(backup: int | Sequence[int], topo: Topology) -> None:
    values = [backup] * topo.n if isinstance(backup, int) else list(backup)
    if len(values) != topo.n:
        raise ConfigError(
            f"--backup lists {len(values)} values but the topology has {topo.n} workers"
        )
    for i, b in enumerate(values):
        if b < 0:
            raise ConfigError(f"--backup must be 0 or more (got {b} for worker {i})")
        deg = topo.in_degree(i)
        if b >= deg:
            raise ConfigError(
                f"--backup {b} must be smaller than worker {i}'s in-degree ({deg} in-neighbours "
                f"in {topo.name!r}): every worker must wait for at least one neighbour"
            )


def _warn_useless_skipping(s: ProtocolSettings, topo: Topology) -> None:
    if not s.skipping:
        return
    # How far the slowest out-neighbour can ever be ahead of worker i (Table 1), capped by the
    # token queues; a jump needs more than the trigger and at least 2.
    gap = s.gap_setting
    reach = max(
        min(s.max_ig, *(topo.neighbour_bound(j, i, gap) for j in topo.out_peers[i]))
        for i in range(topo.n)
    )
    if reach < 2 or s.skip_trigger >= reach:
        if s.mode in (Mode.STANDARD, Mode.NOTIFY_ACK):
            fix = "use --mode backup, staleness or hybrid"
        else:
            fix = "raise --max-ig or lower --skip-trigger"
        warnings.warn(
            f"skipping will never trigger: in {s.mode} mode with --max-ig {s.max_ig} no worker "
            f"falls more than {int(reach)} iteration(s) behind its out-neighbours, and a jump "
            f"needs at least 2 and more than --skip-trigger {s.skip_trigger}; {fix}",
            ProtocolWarning,
            stacklevel=3,
        )


def plan(settings: ProtocolSettings, topo: Topology) -> list[WorkerSpec]:
    """Validate ``settings`` against ``topo`` and build every worker's spec.

    Raises ConfigError for what cannot work; warns (ProtocolWarning) for what will not help.
    """
    _check_settings(settings, topo)
    _warn_useless_skipping(settings, topo)
    gap = settings.gap_setting
    specs = []
    for i in range(topo.n):
        ins, outs = topo.in_peers[i], topo.out_peers[i]
        ahead = max(topo.neighbour_bound(j, i, gap) for j in ins)  # how far j can lead i
        assert not math.isinf(ahead), "unbounded gap with a finite store: checked above"
        slots = 1 + int(ahead) + (settings.staleness if settings.mode.uses_staleness else 0)
        policy = Policy(
            mode=settings.mode,
            worker=i,
            in_peers=ins,
            need=len(ins) - settings.backup_of(i),
            staleness=settings.staleness if settings.mode.uses_staleness else 0,
            self_weight=topo.weight(i, i),
            in_weights={j: topo.weight(j, i) for j in ins},
        )
        specs.append(WorkerSpec(i, settings, ins, outs, policy, slots))
    return specs
