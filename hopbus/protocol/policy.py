"""The per-mode rules of one worker: what Recv(k) waits for, how Reduce weighs what it got, and
which iterations of a neighbour's updates are still worth sending or keeping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hopbus.modes import Mode
from hopbus.protocol.requirements import AcksFrom, Fresh, Requirement, SameIteration
from hopbus.protocol.store import Update


@dataclass(frozen=True)
class Policy:
    """Recv and Reduce for worker ``worker``.

    ``need`` is how many in-neighbours' updates Recv waits for: all of them, or all but N_buw
    with backup workers. ``self_weight`` and ``in_weights`` are the worker's column of W.
    """

    mode: Mode
    worker: int
    in_peers: tuple[int, ...]
    need: int
    staleness: int
    self_weight: float
    in_weights: Mapping[int, float]
    stale_ok: bool = field(init=False)  # mode.uses_staleness, read on every message

    def __post_init__(self) -> None:
        object.__setattr__(self, "stale_ok", self.mode.uses_staleness)

    def floor(self, k: int) -> int:
        """Oldest update iteration a worker in iteration ``k`` can still use (Sec. 4.3, 4.4)."""
        return k - self.staleness if self.stale_ok else k

    def requirement(self, k: int) -> Requirement:
        """What Recv(k) waits for (Fig. 4, 8, 9)."""
        if self.stale_ok:
            return Fresh(
                k, self.in_peers, self.need, oldest=k - self.staleness, next_floor=self.floor(k + 1)
            )
        return SameIteration(k, self.in_peers, self.need, next_floor=self.floor(k + 1))

    @staticmethod
    def acks_requirement(k: int, out_peers: tuple[int, ...]) -> AcksFrom:
        """Notify-ack: before Send(k+1), ACK(k) from every out-neighbour (Sec. 3.3)."""
        return AcksFrom(k, out_peers)

    def reduction(
        self, k: int, updates: Sequence[Update], own_iteration: int | None = None
    ) -> tuple[float, tuple[tuple[Update, float], ...]]:
        """Weights of Reduce after Recv(k): own parameters and each update taken.

        Every term weighs W_ji times a staleness factor, normalised to sum to 1:

        * standard / notify-ack: factor 1 and every in-neighbour present, so this is exactly
          Fig. 1 line 3 with W;
        * backup: factor 1 over the updates received, i.e. Fig. 8's plain average when W is
          eq. (1);
        * staleness / hybrid: factor Iter(u) - (k - s) + 1, eq. (2) when W is eq. (1). The
          worker's own parameters are of ``own_iteration``: k normally, so they weigh s + 1;
          older when it is about to jump (Sec. 5), and then they weigh less, nothing at all once
          older than k - s. If nothing at all is left to weigh, it keeps its own parameters.
        """
        if self.stale_ok:
            base = k - self.staleness - 1
            mine = k if own_iteration is None else own_iteration
            own = self.self_weight * max(0, mine - base)
            raw = [self.in_weights[u.src] * (u.iteration - base) for u in updates]
        else:
            own = self.self_weight
            raw = [self.in_weights[u.src] for u in updates]
        total = own + sum(raw)
        if total <= 0:
            return 1.0, tuple((u, 0.0) for u in updates)
        return own / total, tuple((u, r / total) for u, r in zip(updates, raw, strict=True))
