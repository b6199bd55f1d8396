"""A discrete-event driver of ``worker_loop``: the real protocol, in virtual time.

Each worker is the protocol's own generator. The engine performs its effects: Compute takes
``compute_time * slowdown`` virtual seconds, a Send arrives ``latency`` plus its link's delay
for ``message_bytes`` later (times the sender's slowdown with ``iteration`` scope:
``heterogeneity.message_delay``, the rule a real worker's inbox follows too; then up to
``jitter`` more), token queues are a ``TokenLedger``. Nothing is decided here that the
protocol decides; the engine only waits, delivers and measures.

While it runs it checks, at every iteration change, what the paper proves:

* Table 1: no pair of workers is ever further apart than its bound (``GapMonitor``);
* Theorem 2's token invariant TokenQ(j->i).size == Iter(j) - Iter(i) + max_ig for every edge;
* the update store never overflows its slots, and holds at most (1 + max_ig) * |N_in| updates
  when token queues are on;
* no deadlock: when nothing is left to happen, every worker has finished.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hopbus.gaps import GapMonitor
from hopbus.heterogeneity import SlowdownModel, SlowdownScope, message_delay
from hopbus.protocol.effects import (
    Advance,
    Apply,
    Compute,
    Finish,
    PublishFloor,
    ReadFloors,
    ReadTokenCounts,
    Recv,
    Reduce,
    Send,
    SendAcks,
    Start,
)
from hopbus.protocol.requirements import AcksFrom, Requirement
from hopbus.protocol.spec import ProtocolSettings, WorkerSpec, plan
from hopbus.protocol.store import Mailbox
from hopbus.protocol.tokens import TokenLedger
from hopbus.protocol.worker import Loop, worker_loop
from hopbus.summary import RunStats
from hopbus.topology import Topology

_RESUME, _UPDATE, _ACK = 0, 1, 2


class _Worker:
    __slots__ = (
        "blocked",
        "blocked_on",
        "box",
        "compute_s",
        "done",
        "finish_t",
        "gen",
        "i",
        "pending_on",
        "since",
        "spec",
        "wait_s",
    )

    def __init__(self, spec: WorkerSpec, loop: Callable[[WorkerSpec], Loop]) -> None:
        self.i = spec.worker
        self.spec = spec
        self.gen = loop(spec)
        self.box: Mailbox = spec.new_mailbox()
        self.blocked: Requirement | Advance | None = None
        self.blocked_on: tuple[int, ...] = ()  # whom it last waited for, in this iteration
        self.pending_on: tuple[int, ...] = ()  # whom it waits for now
        self.since = 0.0
        self.wait_s = 0.0  # waited during the current iteration
        self.compute_s = 0.0  # computed during the current iteration
        self.done = False
        self.finish_t: float | None = None


@dataclass
class Blocked:
    """A worker that could not go on when the simulation ended."""

    worker: int
    iteration: int
    waiting_for: str  # "updates", "acks" or "tokens"
    on: tuple[int, ...]


@dataclass
class SimResult:
    workers: int
    virtual_s: float
    runtime_s: float
    finished: bool
    stopped_at: float | None  # the ``until`` that cut the run short, if any
    stats: RunStats
    monitor: GapMonitor
    blocked: list[Blocked]
    counters: dict[str, int] = field(default_factory=dict)
    store_peak: list[int] = field(default_factory=list)
    store_bound: list[int | None] = field(default_factory=list)
    scheme: dict[str, Any] | None = None  # a related scheme's own report (hopbus/sim/ps.py)
    message_bytes: int | None = None  # what an update was charged on links with a bandwidth

    @property
    def deadlocked(self) -> bool:
        return not self.finished and self.stopped_at is None


class Simulation:
    """Simulate one run. ``on_progress`` receives one record per iteration change, with the
    same fields as a real run's Redis progress stream (virtual seconds in ``t``)."""

    def __init__(
        self,
        topology: Topology,
        settings: ProtocolSettings,
        heterogeneity: SlowdownModel,
        *,
        compute_time: float = 1.0,
        latency: float = 0.05,
        jitter: float = 0.0,
        seed: int = 0,
        scope: SlowdownScope = SlowdownScope.COMPUTE,
        message_bytes: int = 0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        loop: Callable[[WorkerSpec], Loop] = worker_loop,
        audit: bool = False,
    ) -> None:
        """``scope``: what a slowdown factor stretches (``--slowdown-scope``);
        ``message_bytes``: the size of an update on links with a bandwidth (an ACK has none).
        ``loop`` builds each worker's generator (tests wrap ``worker_loop`` to watch it);
        ``audit`` checks after every event that no waiting worker could in fact go on, i.e.
        that no wake-up was missed (slow: for tests)."""
        self.topology = topology
        self.settings = settings
        self.het = heterogeneity
        self.compute_time = compute_time
        self.latency = latency
        self.jitter = jitter
        self.scope = scope
        self.message_bytes = message_bytes
        self._same_delay = not jitter and not heterogeneity.has_link_delays  # one event per Send
        self._rng = random.Random(seed)
        self.on_progress = on_progress
        self.specs = plan(settings, topology)
        self.workers = [_Worker(s, loop) for s in self.specs]
        self.audit = audit
        self.ledger = TokenLedger()
        self.monitor = GapMonitor(topology, settings.gap_setting)
        self.stats = RunStats(topology.n)
        self._iters = [0] * topology.n
        self._floors = [s.policy.floor(0) for s in self.specs]  # as published by each worker
        self._heap: list[tuple] = []
        self._seq = 0
        self._wake: deque[_Worker] = deque()
        self.now = 0.0
        self._unfinished = topology.n
        self._advanced = 0
        self.counters = {
            "messages": 0,
            "sends_skipped": 0,
            "acks": 0,
            "token_invariant_violations": 0,
        }

    # -- scheduling ----------------------------------------------------------------------------
    def _push(self, t: float, kind: int, a: Any, b: Any = None, c: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b, c))

    def _delay(self, src: int, dst: int, iteration: int, nbytes: int) -> float:
        d = message_delay(
            self.het, src, dst, iteration, nbytes, scope=self.scope, base=self.latency
        )
        if self.jitter:
            d *= 1.0 + self.jitter * self._rng.random()
        return d

    def _dispatch(self, kind: int, src: int, iteration: int, targets: tuple[int, ...]) -> None:
        """Schedule one message to each target; targets sharing a delay share one event."""
        if not targets:
            return
        nbytes = self.message_bytes if kind == _UPDATE else 0
        if self._same_delay:  # no link differs: the sender's factor at most, the same for all
            d = self._delay(src, targets[0], iteration, nbytes)
            self._push(self.now + d, kind, src, iteration, targets)
            return
        for j in targets:
            d = self._delay(src, j, iteration, nbytes)
            self._push(self.now + d, kind, src, iteration, (j,))

    # -- performing effects ----------------------------------------------------------------------
    def _step(self, w: _Worker, value: Any) -> None:
        """Run ``w``'s loop until it has to wait for something."""
        send = w.gen.send
        while True:
            try:
                eff = send(value)
            except StopIteration:
                return
            value = None
            kind = type(eff)
            if kind is Send:
                self.counters["messages"] += len(eff.to)
                self.counters["sends_skipped"] += len(w.spec.out_peers) - len(eff.to)
                self._dispatch(_UPDATE, w.i, eff.iteration, eff.to)
            elif kind is Compute:
                dur = self.compute_time * self.het.factor(w.i, eff.iteration)
                w.compute_s += dur
                self._push(self.now + dur, _RESUME, w)
                return
            elif kind is Recv:
                req = eff.requirement
                if req.ready(w.box):
                    value = req.take(w.box)
                else:
                    self._park(w, req)
                    return
            elif kind is Reduce or kind is Apply:
                pass  # no parameters in a simulation
            elif kind is ReadFloors:
                floors = self._floors
                value = {j: floors[j] for j in eff.of}
            elif kind is PublishFloor:
                self._floors[w.i] = eff.floor
            elif kind is Advance:
                if not self._advance(w, eff):
                    self._park(w, eff)
                    return
            elif kind is ReadTokenCounts:
                size = self.ledger.size
                value = {j: size(j, w.i) for j in eff.of}
            elif kind is SendAcks:
                self.counters["acks"] += len(eff.to)
                self._dispatch(_ACK, w.i, eff.iteration, eff.to)
            elif kind is Start:
                self._put_tokens(w.i, eff.put_to, eff.count)
            elif kind is Finish:
                w.done = True
                w.finish_t = self.now
                self._unfinished -= 1
            else:  # pragma: no cover - a new effect the engine does not know yet
                raise TypeError(f"simulator cannot perform {eff!r}")

    def _park(self, w: _Worker, what: Requirement | Advance) -> None:
        w.blocked = what
        w.since = self.now
        if self.on_progress is not None:
            w.pending_on = self._waiting_on(w)

    def _waiting_on(self, w: _Worker) -> tuple[int, ...]:
        what = w.blocked
        if what is None:
            return ()
        if type(what) is Advance:
            return self.ledger.short(what.take_from, w.i, what.count)
        return what.missing(w.box)

    def _unpark(self, w: _Worker) -> None:
        w.blocked = None
        if self.now > w.since:  # a wait that ended the instant it began blamed nobody
            w.wait_s += self.now - w.since
            w.blocked_on = w.pending_on

    def _put_tokens(self, owner: int, takers: tuple[int, ...], count: int) -> None:
        """Put ``count`` tokens into TokenQ(owner->j) for each j; wake those waiting for them."""
        for j in takers:
            self.ledger.put(owner, j, count)
            other = self.workers[j]
            blocked = other.blocked
            if type(blocked) is Advance and owner in blocked.take_from:
                self._wake.append(other)

    def _advance(self, w: _Worker, adv: Advance) -> bool:
        i, count, ledger = w.i, adv.count, self.ledger
        if adv.take_from:
            if not ledger.can_take(adv.take_from, i, count):
                return False
            ledger.take(adv.take_from, i, count)
        self._iters[i] = adv.to
        self._advanced += count
        self._put_tokens(i, adv.put_to, count)
        self.monitor.enter(i, adv.to)
        self.stats.enter(i, adv.to, self.now)
        if self.settings.max_ig:
            self._check_tokens(w)
        if self.on_progress is not None:
            self.on_progress(
                {
                    "t": self.now,
                    "worker": i,
                    "iter": adv.to,
                    "jump": count if count > 1 else 0,
                    "compute_s": w.compute_s,
                    "wait_s": w.wait_s,
                    "blocked_on": list(w.blocked_on),
                }
            )
        w.compute_s = w.wait_s = 0.0
        w.blocked_on = ()
        return True

    def _check_tokens(self, w: _Worker) -> None:
        """Theorem 2's invariant on every edge of the worker that just moved."""
        it, size, i = self._iters, self.ledger.size, w.i
        base = self.settings.max_ig - it[i]
        bad = 0
        for j in w.spec.out_peers:  # TokenQ(j->i), taken by i
            if size(j, i) != it[j] + base:
                bad += 1
        base = self.settings.max_ig + it[i]
        for j in w.spec.in_peers:  # TokenQ(i->j), put by i
            if size(i, j) != base - it[j]:
                bad += 1
        if bad:
            self.counters["token_invariant_violations"] += bad

    # -- events --------------------------------------------------------------------------------
    def _on_message(self, kind: int, src: int, iteration: int, targets: tuple[int, ...]) -> None:
        for j in targets:
            w = self.workers[j]
            if kind == _UPDATE:
                w.box.deliver_update(src, iteration)
            else:
                w.box.deliver_ack(src, iteration)
            req = w.blocked
            if req is not None and type(req) is not Advance and req.ready(w.box):
                self._unpark(w)
                self._step(w, req.take(w.box))

    def _retry_advance(self, w: _Worker) -> None:
        adv = w.blocked
        if type(adv) is Advance and self.ledger.can_take(adv.take_from, w.i, adv.count):
            self._unpark(w)
            self._advance(w, adv)
            self._step(w, None)

    def run(
        self, until: float | None = None, progress: Callable[[float], None] | None = None
    ) -> SimResult:
        """Run to the end (or to virtual time ``until``). ``progress`` gets the fraction of all
        iterations done, now and then."""
        started = time.perf_counter()
        total = self.topology.n * self.settings.iterations
        for w in self.workers:
            self._step(w, None)
        heap, wake = self._heap, self._wake
        stopped_at = None
        events = 0
        while True:
            while wake:
                self._retry_advance(wake.popleft())
            if not heap:
                break
            if until is not None and heap[0][0] > until:
                stopped_at = until
                self.now = until
                break
            t, _, kind, a, b, c = heapq.heappop(heap)
            self.now = t
            if kind == _RESUME:
                self._step(a, b)
            else:
                self._on_message(kind, a, b, c)
            events += 1
            if self.audit:
                while wake:
                    self._retry_advance(wake.popleft())
                self._audit()
            if progress is not None and not events % 65536:
                progress(self._advanced / total)
        if progress is not None:
            progress(self._advanced / total)
        return self._result(stopped_at, time.perf_counter() - started)

    def _audit(self) -> None:
        """No worker may wait for something that is already there."""
        for w in self.workers:
            what = w.blocked
            if what is None:
                continue
            if type(what) is Advance:
                stuck = self.ledger.can_take(what.take_from, w.i, what.count)
            else:
                stuck = what.ready(w.box)
            if stuck:
                raise AssertionError(f"t={self.now}: worker {w.i} still waits for {what!r}")

    def _result(self, stopped_at: float | None, runtime: float) -> SimResult:
        blocked = []
        for w in self.workers:
            if w.done:
                continue
            what = w.blocked
            if what is None:
                kind = "compute"
            elif type(what) is Advance:
                kind = "tokens"
            else:
                kind = "acks" if isinstance(what, AcksFrom) else "updates"
            blocked.append(Blocked(w.i, self._iters[w.i], kind, self._waiting_on(w)))
        stores = [w.box.updates for w in self.workers]
        bounds = [w.spec.store_bound for w in self.workers]
        counters = dict(self.counters)
        counters["stale_dropped"] = sum(s.stale_dropped for s in stores)
        counters["duplicates"] = sum(s.duplicates for s in stores)
        counters["store_overflow"] = sum(s.overflow for s in stores)
        counters["store_bound_exceeded"] = sum(  # workers that ever held more than (1+max_ig)|N_in|
            b is not None and s.peak > b for s, b in zip(stores, bounds, strict=True)
        )
        return SimResult(
            workers=self.topology.n,
            virtual_s=max(w.finish_t for w in self.workers) if self._unfinished == 0 else self.now,
            runtime_s=runtime,
            finished=self._unfinished == 0,
            stopped_at=stopped_at,
            stats=self.stats,
            monitor=self.monitor,
            blocked=blocked,
            counters=counters,
            store_peak=[s.peak for s in stores],
            store_bound=bounds,
            message_bytes=self.message_bytes or None,
        )
