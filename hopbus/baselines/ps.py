"""The parameter server's decisions, as a pure state machine (no sockets, no clock, no numpy).

A worker pushes the gradient of its iteration ``clock``, computed on parameter version
``tag``, and then waits for the server's reply: the parameters, and the iteration it enters
next. The server core decides, for every push, whether the gradient is kept, which kept
gradients to average and apply now (one new version), and which workers to answer. The driver
(hopbus/runtime/ps_server.py, or a simulator) holds the gradients and the parameters, timestamps
each push with its own clock, and does what the decision says, in that order:

    d = core.push(worker, clock, tag, now)
    if d.accept: keep the gradient under ``worker``
    if d.apply: params = step(params, mean of the kept gradients of d.apply); version += 1
    for worker, iteration in d.release: send params (and version) to worker

Schemes:

* ``SyncCore`` (ps-bsp, ps-backup; Chen et al., "Revisiting distributed synchronous SGD"): a
  step applies the first ``need`` gradients tagged with the current version; a gradient of an
  older version is dropped (counted) and its worker gets the current parameters at once. With
  ``need`` = all workers this is BSP. Workers' iterations are versions: a worker that missed
  versions jumps to the current one.
* ``StaleCore`` (ps-asp, ps-ssp; Ho et al. SSP): every gradient is applied on arrival; a worker
  may start iteration c only while c - min(every worker's pushed gradients) <= staleness
  (None: never held, ASP).
* ``ElasticCore`` (ps-elastic; Zhao et al. ElasticBSP): asynchronous like ASP between barriers;
  once every worker has pushed twice since the last barrier (the monitoring phase), it predicts
  each worker's next R push times from its last interval and asks ZipLine for the barrier with
  the least waiting; each worker waits after its chosen push until all have arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hopbus.baselines.spec import SchemeSettings
from hopbus.baselines.zipline import predict, zipline
from hopbus.modes import Mode


@dataclass(frozen=True)
class Decision:
    """What the driver does with one push (see the module docstring)."""

    accept: bool
    apply: tuple[int, ...] = ()
    release: tuple[tuple[int, int], ...] = ()  # (worker, iteration it enters next)


@dataclass
class Counters:
    """The scheme's own figures, reported in the summary's ``scheme`` object."""

    applied_gradients: int = 0
    dropped_gradients: int = 0  # ps-backup: gradients of an older version
    versions: int = 0  # parameter updates applied
    barriers: int = 0  # synchronous steps (ps-bsp, ps-backup) or ElasticBSP barriers
    barrier_wait_s: float = 0.0  # summed over every worker at every barrier
    barrier_waits: int = 0  # (worker, barrier) pairs
    held: int = 0  # ps-ssp: times a worker was held at the staleness bound
    held_s: float = 0.0

    def report(self) -> dict[str, float | int | None]:
        return {
            "applied_gradients": self.applied_gradients,
            "dropped_gradients": self.dropped_gradients,
            "versions": self.versions,
            "barriers": self.barriers,
            "mean_barrier_wait_s": (
                self.barrier_wait_s / self.barrier_waits if self.barrier_waits else None
            ),
            "held": self.held,
            "mean_held_s": self.held_s / self.held if self.held else None,
        }


@dataclass
class _Core:
    n: int
    iterations: int
    counters: Counters = field(default_factory=Counters)
    finished: set[int] = field(default_factory=set)

    @property
    def done(self) -> bool:
        """Every worker has been told to enter the last iteration: nothing more will come."""
        return len(self.finished) == self.n

    def _release(self, worker: int, iteration: int) -> tuple[int, int]:
        iteration = min(iteration, self.iterations)
        if iteration >= self.iterations:
            self.finished.add(worker)
        return worker, iteration

    def _check(self, worker: int) -> None:
        if not 0 <= worker < self.n:
            raise ValueError(f"worker {worker} is not in 0..{self.n - 1}")
        if worker in self.finished:
            raise ValueError(f"worker {worker} pushed after it was told to finish")

    def push(self, worker: int, clock: int, tag: int, now: float) -> Decision:
        raise NotImplementedError


@dataclass
class SyncCore(_Core):
    """ps-bsp (``need == n``) and ps-backup (``need == n - b``)."""

    need: int = 0
    version: int = 0
    arrived: dict[int, float] = field(default_factory=dict)  # kept this version: worker -> t

    def push(self, worker: int, clock: int, tag: int, now: float) -> Decision:
        self._check(worker)
        c = self.counters
        if tag != self.version or self.version >= self.iterations:
            c.dropped_gradients += 1  # computed on an older version: useless now
            return Decision(False, release=(self._release(worker, self.version),))
        if worker in self.arrived:
            raise ValueError(f"worker {worker} pushed twice for version {tag}")
        self.arrived[worker] = now
        if len(self.arrived) < self.need:
            return Decision(True)
        members = tuple(self.arrived)
        c.barrier_wait_s += sum(now - t for t in self.arrived.values())
        c.barrier_waits += len(members)
        c.barriers += 1
        c.versions += 1
        c.applied_gradients += len(members)
        self.arrived = {}
        self.version += 1
        return Decision(True, members, tuple(self._release(w, self.version) for w in members))


@dataclass
class StaleCore(_Core):
    """ps-asp (``staleness`` None) and ps-ssp."""

    staleness: int | None = None
    pushed: list[int] = field(default_factory=list)  # gradients pushed by each worker
    waiting: dict[int, float] = field(default_factory=dict)  # held worker -> since

    def __post_init__(self) -> None:
        self.pushed = [0] * self.n

    def _may_go(self, worker: int) -> bool:
        return self.staleness is None or self.pushed[worker] - min(self.pushed) <= self.staleness

    def push(self, worker: int, clock: int, tag: int, now: float) -> Decision:
        self._check(worker)
        if worker in self.waiting:
            raise ValueError(f"worker {worker} pushed while held")
        c = self.counters
        self.pushed[worker] = clock + 1
        c.applied_gradients += 1
        c.versions += 1
        release = []
        if self._may_go(worker):
            release.append(self._release(worker, clock + 1))
        else:
            self.waiting[worker] = now
            c.held += 1
        for w, since in list(self.waiting.items()):  # the slowest may have moved
            if w != worker and self._may_go(w):
                del self.waiting[w]
                c.held_s += now - since
                release.append(self._release(w, self.pushed[w]))
        return Decision(True, (worker,), tuple(release))


@dataclass
class ElasticCore(_Core):
    """ps-elastic: ASP between barriers, barriers where ZipLine predicts the least waiting."""

    lookahead: int = 15
    pushed: list[int] = field(default_factory=list)
    last: list[float | None] = field(default_factory=list)  # last push time
    interval: list[float | None] = field(default_factory=list)  # between the last two pushes
    since_barrier: list[int] = field(default_factory=list)  # pushes since the last barrier
    target: dict[int, int] | None = None  # planned barrier: worker -> pushes to wait after
    arrived: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pushed = [0] * self.n
        self.last = [None] * self.n
        self.interval = [None] * self.n
        self.since_barrier = [0] * self.n

    def push(self, worker: int, clock: int, tag: int, now: float) -> Decision:
        self._check(worker)
        c = self.counters
        self.pushed[worker] = clock + 1
        last = self.last[worker]
        self.interval[worker] = None if last is None else now - last
        self.last[worker] = now
        self.since_barrier[worker] += 1
        c.applied_gradients += 1
        c.versions += 1
        if self.target is None:
            self._plan()
        target = self.target
        if target is None or target.get(worker) != self.pushed[worker]:
            return Decision(True, (worker,), (self._release(worker, clock + 1),))
        self.arrived[worker] = now  # at its barrier: wait for the others
        if len(self.arrived) < len(target):
            return Decision(True, (worker,))
        c.barriers += 1
        c.barrier_wait_s += sum(now - t for t in self.arrived.values())
        c.barrier_waits += len(self.arrived)
        members = tuple(self.arrived)
        self.arrived = {}
        self.target = None
        self.since_barrier = [0] * self.n
        return Decision(True, (worker,), tuple(self._release(w, self.pushed[w]) for w in members))

    def _plan(self) -> None:
        """Monitoring phase over (every unfinished worker pushed twice since the last barrier):
        predict and pick the next barrier."""
        live = [w for w in range(self.n) if self.pushed[w] < self.iterations]
        if len(live) < 2 or any(self.since_barrier[w] < 2 for w in live):
            return
        rows = []
        for w in live:
            left = self.iterations - self.pushed[w]
            last, gap = self.last[w], self.interval[w]
            assert last is not None and gap is not None
            rows.append(predict(last, gap, min(self.lookahead, left)))
        best = zipline(rows)
        self.target = {w: self.pushed[w] + i + 1 for w, i in zip(live, best.choice, strict=True)}


def make_core(s: SchemeSettings) -> SyncCore | StaleCore | ElasticCore:
    """The server core of ``s.mode``."""
    n, k = s.workers, s.iterations
    if s.mode in (Mode.PS_BSP, Mode.PS_BACKUP):
        return SyncCore(n, k, need=s.needed)
    if s.mode is Mode.PS_SSP:
        return StaleCore(n, k, staleness=s.staleness)
    if s.mode is Mode.PS_ASP:
        return StaleCore(n, k, staleness=None)
    if s.mode is Mode.PS_ELASTIC:
        return ElasticCore(n, k, lookahead=s.lookahead)
    raise ValueError(f"{s.mode} is not a parameter-server mode")


Core = SyncCore | StaleCore | ElasticCore
