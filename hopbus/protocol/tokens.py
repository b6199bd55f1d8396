"""Token queues (Sec. 4.2, Fig. 7), in memory: the reference the Redis lists must behave like.

``TokenQ(i->j)`` lives at worker ``i`` and holds the tokens its in-neighbour ``j`` must take to
enter new iterations. ``i`` puts one token per iteration it enters; ``j`` takes one per iteration it
enters. Hence the invariant of Theorem 2, whenever neither worker is half-way through entering an
iteration::

    TokenQ(j->i).size() == Iter(j) - Iter(i) + max_ig

Each queue has exactly one taker, so a worker that holds some of the tokens it needs while waiting
for others can never starve anybody: taking them one queue at a time cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Iterable


class TokenLedger:
    """All token queues of a run. Values are the iterations they were put for (Fig. 7, line 10);
    only their number matters to the protocol, so the ledger keeps counts."""

    def __init__(self) -> None:
        self._size: dict[tuple[int, int], int] = {}

    def put(self, owner: int, taker: int, count: int = 1) -> None:
        """``owner`` puts ``count`` tokens into TokenQ(owner->taker)."""
        key = (owner, taker)
        self._size[key] = self._size.get(key, 0) + count

    def can_take(self, owners: Iterable[int], taker: int, count: int = 1) -> bool:
        size = self._size
        return all(size.get((o, taker), 0) >= count for o in owners)

    def take(self, owners: Iterable[int], taker: int, count: int = 1) -> None:
        """``taker`` takes ``count`` tokens from TokenQ(o->taker) for every o, all or nothing:
        if some queue holds too few, raises ValueError and takes none."""
        size = self._size
        owners = list(owners)
        for o in owners:
            have = size.get((o, taker), 0)
            if have < count:
                raise ValueError(f"TokenQ({o}->{taker}) holds {have} tokens, {count} needed")
        for o in owners:
            size[(o, taker)] = size.get((o, taker), 0) - count

    def size(self, owner: int, taker: int) -> int:
        return self._size.get((owner, taker), 0)

    def short(self, owners: Iterable[int], taker: int, count: int = 1) -> tuple[int, ...]:
        """The owners whose queue for ``taker`` holds fewer than ``count`` tokens."""
        return tuple(o for o in owners if self._size.get((o, taker), 0) < count)
