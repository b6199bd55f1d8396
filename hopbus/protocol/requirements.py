"""What a blocked Recv waits for. Each requirement answers three questions about a mailbox:
is it satisfied (``ready``), who is it still waiting on (``missing``), and what does it take
(``take``, only once ready; it also raises the store's floor for the next iteration). And
one about time (``settled``): would a later take, once ready, take the same updates? Only
then may a driver take them before Compute ends (runtime/session.py's overlap): the paper's
Recv follows Compute, and whatever arrives meanwhile joins the Reduce."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hopbus.protocol.store import Mailbox, Update


class Requirement(Protocol):
    iteration: int

    def ready(self, box: Mailbox) -> bool: ...

    def missing(self, box: Mailbox) -> tuple[int, ...]: ...

    def take(self, box: Mailbox) -> list[Update]: ...

    @property
    def settled(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class SameIteration:
    """``need`` updates of exactly this iteration, plus any others of it already there.

    Standard (Fig. 4 line 13, need = all in-neighbours) and backup workers (Fig. 8 lines 3-5,
    need = |N_in| - N_buw).
    """

    iteration: int
    sources: tuple[int, ...]
    need: int
    next_floor: int

    def ready(self, box: Mailbox) -> bool:
        return box.updates.size(self.iteration) >= self.need

    def missing(self, box: Mailbox) -> tuple[int, ...]:
        store = box.updates
        return tuple(s for s in self.sources if not store.size(self.iteration, s))

    def take(self, box: Mailbox) -> list[Update]:
        store = box.updates
        taken = store.dequeue(store.size(self.iteration), iteration=self.iteration) or []
        store.advance(self.next_floor)
        return taken

    @property
    def settled(self) -> bool:
        """Waiting for every source: once ready, each has sent its one update of the
        iteration. With backup workers a later take finds the late ones too."""
        return self.need >= len(self.sources)


@dataclass(frozen=True, slots=True)
class Fresh:
    """From ``need`` in-neighbours, an update no older than ``oldest`` (Fig. 9).

    A neighbour counts if its newest update, taken now or in an earlier iteration, is at least
    ``oldest`` = k - s; only updates taken now join the Reduce. Bounded staleness needs every
    in-neighbour; hybrid all but N_buw.
    """

    iteration: int
    sources: tuple[int, ...]
    need: int
    oldest: int
    next_floor: int

    def _fresh(self, box: Mailbox, src: int) -> bool:
        store = box.updates
        held = store.newest_held(src)
        newest = store.newest_taken.get(src, -1)  # -1: the common start p0 (Fig. 9's init)
        return (held if held is not None and held > newest else newest) >= self.oldest

    def ready(self, box: Mailbox) -> bool:
        fresh = 0
        for s in self.sources:
            if self._fresh(box, s):
                fresh += 1
                if fresh >= self.need:
                    return True
        return fresh >= self.need

    def missing(self, box: Mailbox) -> tuple[int, ...]:
        return tuple(s for s in self.sources if not self._fresh(box, s))

    def take(self, box: Mailbox) -> list[Update]:
        store = box.updates
        taken: list[Update] = []
        for s in self.sources:
            held = store.newest_held(s)
            if held is not None and held >= self.oldest:
                got = store.dequeue(store.size(w_id=s), w_id=s) or []
                taken.append(max(got, key=lambda u: u.iteration))
        store.advance(self.next_floor)
        return taken

    @property
    def settled(self) -> bool:
        """Never: a later take finds newer updates (fresher than k - s) of the same sources."""
        return False


@dataclass(frozen=True, slots=True)
class AcksFrom:
    """Notify-ack (Sec. 3.3): every listed out-neighbour has ACKed ``iteration``."""

    iteration: int
    sources: tuple[int, ...]

    def ready(self, box: Mailbox) -> bool:
        acks = box.acks
        return all(acks.get(s, -1) >= self.iteration for s in self.sources)

    def missing(self, box: Mailbox) -> tuple[int, ...]:
        acks = box.acks
        return tuple(s for s in self.sources if acks.get(s, -1) < self.iteration)

    def take(self, box: Mailbox) -> list[Update]:
        return []

    @property
    def settled(self) -> bool:
        """Always: it takes nothing."""
        return True
