"""What a worker asks its driver to do. The worker loop yields these; drivers perform them.

A driver sends back into the generator the value listed under "returns" (None otherwise). The
simulator performs them in virtual time; the runtime with ZeroMQ, Redis and a model. Neither
decides anything the protocol should decide: that is why both can run the same loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hopbus.protocol.requirements import Requirement
    from hopbus.protocol.store import Update


@dataclass(frozen=True, slots=True)
class Start:
    """Join the run in iteration ``at``: Iter(self) = ``at``, then put ``count`` tokens into
    TokenQ(self->j) for every j in ``put_to`` (Fig. 7 lines 3-10: max_ig - 1 at initialisation
    and one at the start of iteration 0). ``count`` is 0 without token queues. ``at`` is 0
    except in a run resumed from a checkpoint set, where every worker starts at the same
    ``at``, so the token invariant holds as it does at iteration 0."""

    put_to: tuple[int, ...]
    count: int
    at: int = 0


@dataclass(frozen=True, slots=True)
class PublishFloor:
    """Announce the oldest update iteration this worker still accepts (its store's floor), so
    that senders can leave out what it would only drop (Sec. 6.2)."""

    floor: int


@dataclass(frozen=True, slots=True)
class ReadFloors:
    """The floor each listed worker last published. Returns ``dict[worker, floor]``."""

    of: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Send:
    """Send the current parameters, tagged ``iteration``, to each listed worker (non-blocking)."""

    iteration: int
    to: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Compute:
    """Compute gradients at the current parameters on a fresh batch (takes compute time)."""

    iteration: int


@dataclass(frozen=True, slots=True)
class Recv:
    """Block until ``requirement.ready(mailbox)``, then return ``requirement.take(mailbox)``:
    the ``list[Update]`` to reduce. The driver re-checks on every delivery and may report
    ``requirement.missing(mailbox)`` as whom it is blocked on."""

    requirement: Requirement


@dataclass(frozen=True, slots=True)
class Reduce:
    """Parameters := self_weight * own + sum(weight * update.payload). Weights sum to 1."""

    iteration: int
    self_weight: float
    terms: tuple[tuple[Update, float], ...]


@dataclass(frozen=True, slots=True)
class Apply:
    """Parameters -= learning rate * the gradients of this iteration's Compute."""

    iteration: int


@dataclass(frozen=True, slots=True)
class SendAcks:
    """Notify-ack (Sec. 3.3): tell each listed in-neighbour its update of ``iteration`` was used."""

    iteration: int
    to: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReadTokenCounts:
    """Size of TokenQ(j->self) for each listed out-neighbour j. Returns ``dict[j, size]``."""

    of: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Advance:
    """Enter iteration ``to`` from ``start``: take ``to - start`` tokens from TokenQ(j->self) for
    every j in ``take_from`` (blocking), set Iter(self) = ``to``, then put ``to - start`` tokens
    into TokenQ(self->j) for every j in ``put_to``. ``to - start > 1`` is a jump (Sec. 5).

    Setting the counter and putting the tokens form one step, so the token invariant holds
    whenever the worker is not waiting for tokens."""

    start: int
    to: int
    take_from: tuple[int, ...]
    put_to: tuple[int, ...]

    @property
    def count(self) -> int:
        return self.to - self.start


@dataclass(frozen=True, slots=True)
class Finish:
    """All iterations done; Iter(self) is ``iterations``."""

    iterations: int


Effect = (
    Start
    | PublishFloor
    | ReadFloors
    | Send
    | Compute
    | Recv
    | Reduce
    | Apply
    | SendAcks
    | ReadTokenCounts
    | Advance
    | Finish
)
