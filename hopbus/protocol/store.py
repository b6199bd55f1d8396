"""UpdateQ(i): the updates a worker has received and not yet used (Sec. 4.1, Sec. 6.1).

Updates are kept in rotating per-iteration slots, slot ``iter mod n_slots``, as in Sec. 6.1, so
taking the updates of one iteration never touches those of later ones. The store only accepts
iterations in the window ``[floor, floor + n_slots)``:

* below the floor an update is stale (its receiver no longer needs it, Sec. 6.2) and is dropped
  and counted;
* at or beyond ``floor + n_slots`` it cannot be stored without losing another; with a correctly
  sized store (Table 1 bounds how far an in-neighbour can be ahead) this never happens, so it is
  counted as ``overflow`` and a checker treats it as a protocol violation.

The caller raises the floor (``advance``) once an iteration's Recv is done; slots left behind are
emptied and their updates counted as stale. With ``supersede`` (bounded staleness), a newer update
from a sender replaces its older one on arrival, because Fig. 9 only ever uses a sender's newest.

Pure data: no locks, no I/O. The runtime guards it with its own lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Outcome(IntEnum):
    """What ``enqueue`` did with an update."""

    ACCEPTED = 0
    STALE = 1  # older than anything the worker can still use: dropped
    DUPLICATE = 2  # same sender and iteration already held: dropped
    OVERFLOW = 3  # too far ahead for the store: dropped (a bound was broken)


@dataclass(slots=True)
class Update:
    """One received parameter snapshot, tagged (iter, w_id) as in Sec. 4.1."""

    src: int
    iteration: int
    payload: Any = None
    seq: int = 0  # arrival order, for FIFO dequeue across slots


@dataclass(slots=True)
class _Slot:
    iteration: int
    entries: dict[int, Update] = field(default_factory=dict)  # src -> update, arrival order


class UpdateStore:
    """Received updates of a window of iterations, with the Sec. 4.1 operations."""

    def __init__(self, n_slots: int, *, supersede: bool = False) -> None:
        if n_slots < 1:
            raise ValueError("an update store needs at least one slot")
        self.n_slots = n_slots
        self.supersede = supersede
        self.floor = 0
        self.held = 0
        self.peak = 0
        self.stale_dropped = 0
        self.duplicates = 0
        self.overflow = 0
        self._slots: dict[int, _Slot] = {}  # slot index -> slot; only non-empty slots are kept
        self._seq = 0
        self._held_iter: dict[int, int] = {}  # supersede: src -> iteration of its held update
        self._newest_seen: dict[int, int] = {}  # supersede: src -> newest iteration ever seen
        # src -> newest iteration dequeued: iter_rcv of Fig. 9. A sender never heard from counts as
        # -1 there: every worker starts from the same p0, as good as an update of iteration -1.
        self.newest_taken: dict[int, int] = {}

    # -- Sec. 4.1: enqueue ---------------------------------------------------------------------
    def enqueue(self, src: int, iteration: int, payload: Any = None) -> Outcome:
        if iteration < self.floor:
            self.stale_dropped += 1
            return Outcome.STALE
        if iteration >= self.floor + self.n_slots:
            self.overflow += 1
            return Outcome.OVERFLOW
        if self.supersede:
            seen = self._newest_seen.get(src, -1)
            if iteration <= seen:
                if iteration == seen:
                    self.duplicates += 1
                    return Outcome.DUPLICATE
                self.stale_dropped += 1
                return Outcome.STALE
            self._newest_seen[src] = iteration
            old = self._held_iter.get(src)
            if old is not None:
                self._remove(old, src)
                self.stale_dropped += 1
            self._held_iter[src] = iteration
        index = iteration % self.n_slots
        slot = self._slots.get(index)
        if slot is None:
            slot = self._slots[index] = _Slot(iteration)
        # Both iterations lie in the window, so sharing a slot index means they are equal.
        if src in slot.entries:
            self.duplicates += 1
            return Outcome.DUPLICATE
        self._seq += 1
        slot.entries[src] = Update(src, iteration, payload, self._seq)
        self.held += 1
        self.peak = max(self.peak, self.held)
        return Outcome.ACCEPTED

    # -- Sec. 4.1: size ------------------------------------------------------------------------
    def size(self, iteration: int | None = None, w_id: int | None = None) -> int:
        if iteration is not None:
            slot = self._slot_of(iteration)
            if slot is None:
                return 0
            return len(slot.entries) if w_id is None else int(w_id in slot.entries)
        if w_id is not None:
            return sum(w_id in s.entries for s in self._slots.values())
        return self.held

    # -- Sec. 4.1: dequeue (non-blocking; waiting is the driver's job) --------------------------
    def dequeue(
        self, m: int, iteration: int | None = None, w_id: int | None = None
    ) -> list[Update] | None:
        """Take the first ``m`` updates tagged (iteration, w_id), oldest arrival first.

        Returns None, taking nothing, if fewer than ``m`` match: the caller blocks and retries.
        """
        if iteration is not None:
            slot = self._slot_of(iteration)
            found = (
                []
                if slot is None
                else [u for u in slot.entries.values() if w_id is None or u.src == w_id]
            )
        else:
            found = sorted(
                (
                    u
                    for s in self._slots.values()
                    for u in s.entries.values()
                    if w_id is None or u.src == w_id
                ),
                key=lambda u: u.seq,
            )
        if len(found) < m:
            return None
        taken = found[:m]
        for u in taken:
            self._remove(u.iteration, u.src)
            if u.iteration > self.newest_taken.get(u.src, -1):
                self.newest_taken[u.src] = u.iteration
        return taken

    # -- what the staleness rule asks -----------------------------------------------------------
    def newest_held(self, src: int) -> int | None:
        """Iteration of the newest update held from ``src`` (None: none). Needs ``supersede``."""
        assert self.supersede, "newest_held is kept only for superseding stores"
        return self._held_iter.get(src)

    # -- the caller's progress -----------------------------------------------------------------
    def advance(self, floor: int) -> None:
        """Raise the floor to ``floor``: everything older is stale and leaves the store."""
        if floor <= self.floor:
            return
        self.floor = floor
        for index, slot in list(self._slots.items()):
            if slot.iteration < floor:
                n = len(slot.entries)
                self.stale_dropped += n
                self.held -= n
                for src in slot.entries:
                    self._held_iter.pop(src, None)
                del self._slots[index]

    # -- internals -----------------------------------------------------------------------------
    def _slot_of(self, iteration: int) -> _Slot | None:
        slot = self._slots.get(iteration % self.n_slots)
        return slot if slot is not None and slot.iteration == iteration else None

    def _remove(self, iteration: int, src: int) -> None:
        index = iteration % self.n_slots
        slot = self._slots[index]
        del slot.entries[src]
        self.held -= 1
        if self.supersede and self._held_iter.get(src) == iteration:
            del self._held_iter[src]
        if not slot.entries:
            del self._slots[index]


class Mailbox:
    """Everything a worker has received: updates and, for notify-ack, ACKs.

    Drivers hand every arriving message to ``deliver`` and nothing else; requirements read it.
    """

    def __init__(self, store: UpdateStore) -> None:
        self.updates = store
        self.acks: dict[int, int] = {}  # src -> newest iteration it ACKed (ACKs are cumulative)

    def deliver_update(self, src: int, iteration: int, payload: Any = None) -> Outcome:
        return self.updates.enqueue(src, iteration, payload)

    def deliver_ack(self, src: int, iteration: int) -> None:
        if iteration > self.acks.get(src, -1):
            self.acks[src] = iteration
