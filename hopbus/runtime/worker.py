"""One worker process: ``worker_loop`` driven with ZeroMQ, Redis and a model.

The driver performs the protocol's effects and decides nothing the protocol decides (see
hopbus/protocol/effects.py for what each effect asks):

| effect | performed with |
| --- | --- |
| Start | Lua: SET iter 0, RPUSH the initial tokens |
| PublishFloor / ReadFloors | SET / MGET ``floor:I`` |
| Send, SendAcks | encode once, PUSH the same frames to every target (zero-copy) |
| Compute | real gradient, then sleep to the emulated compute time |
| Recv | wait on the mailbox the inbox thread fills, until the requirement is ready |
| Reduce, Apply | new parameter arrays (never in place) |
| ReadTokenCounts | LLEN of each TokenQ(j->self), pipelined |
| Advance | BLPOP the tokens queue by queue, then Lua: INCRBY, XADD progress, RPUSH tokens |

Every wait has a deadline (``timeout``) and ends, when it runs out, in one line naming what the
worker waited for; a neighbour whose heartbeat is gone is reported as soon as that is seen.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any

import redis

from hopbus.coord.control import RunControl
from hopbus.coord.keys import RunKeys
from hopbus.coord.tokens import RedisTokenQueues
from hopbus.errors import ConfigError, RunFailure
from hopbus.modes import Mode
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
from hopbus.protocol.spec import WorkerSpec, plan
from hopbus.protocol.store import Outcome, Update
from hopbus.protocol.worker import worker_loop
from hopbus.runtime.compute import Trainer
from hopbus.runtime.node import LOOK_S, Node, advertised
from hopbus.transport import (
    KIND_UPDATE,
    Message,
    Validator,
    encode_ack,
    encode_update,
    hwm_for,
    layout_of,
)


class Worker(Node):
    """Hop worker ``node`` of run ``run``: ``worker_loop`` with ZeroMQ, Redis and a model."""

    def __init__(self, run: str, worker: int, redis_url: str, **kw: Any) -> None:
        super().__init__(run, worker, redis_url, **kw)
        self.worker = worker
        self.counters = {"messages": 0, "sends_skipped": 0, "acks": 0, "received": 0}
        self._floor: int | None = None  # to publish with the next Advance
        self._floors: dict[int, int] | None = None  # out-neighbours' floors, read at Advance

    # -- setting up -------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg, topo = self.cfg, self.topo
        with warnings.catch_warnings():  # the launcher shows the run's warnings once
            warnings.simplefilter("ignore")
            specs = plan(cfg.protocol_settings(), topo)
        self.spec: WorkerSpec = specs[self.worker]
        self.box = self.spec.new_mailbox()
        self.trainer = Trainer(cfg, self.worker, self.het)
        self.tokens = RedisTokenQueues(self.r, self.keys)
        self.acks = cfg.mode is Mode.NOTIFY_ACK
        s = self.spec
        validator = Validator(
            self.keys.run,
            topo.n,
            update_from=s.in_peers,
            ack_from=s.out_peers if self.acks else (),
            layout=layout_of(self.trainer.params),
            max_iteration=cfg.iterations,
        )
        peers = sorted(set(s.out_peers) | (set(s.in_peers) if self.acks else set()))
        self._open(
            validator,
            self._deliver,
            hwm=hwm_for(s.store_slots, acks=self.acks),
            peers=peers,
            out_hwm=hwm_for(s.store_slots),
        )

    # -- the receiver thread's side ---------------------------------------------------------------
    def _deliver(self, msg: Message) -> None:
        with self.cond:
            if msg.kind == KIND_UPDATE:
                if self.box.deliver_update(msg.src, msg.iteration, msg.payload) is Outcome.ACCEPTED:
                    self.counters["received"] += 1
            else:
                self.box.deliver_ack(msg.src, msg.iteration)
            self.cond.notify_all()

    def stats(self) -> dict[str, int]:
        out = super().stats()
        if hasattr(self, "box"):
            store = self.box.updates
            out.update(
                stale_dropped=store.stale_dropped,
                duplicates=store.duplicates,
                store_overflow=store.overflow,
                max_update_queue=store.peak,
            )
        return out

    # -- performing effects -----------------------------------------------------------------------
    def _recv(self, req: Requirement) -> tuple[list[Update], float, tuple[int, ...]]:
        box = self.box
        what = "ACKs" if isinstance(req, AcksFrom) else "updates"
        with self.cond:
            on = () if req.ready(box) else req.missing(box)
            waited = self.wait_for(
                lambda: req.ready(box),
                lambda: req.missing(box),
                f"{what} of iteration {req.iteration}",
            )
            return req.take(box), waited, on

    def _advance(self, eff: Advance, fields: dict[str, Any]) -> None:
        """Enter ``eff.to``: one Lua call when the tokens are there; otherwise wait for the
        short queue's next token (BLPOP, looking around every LOOK_S) and try again. Time spent
        waiting for tokens is added to the progress entry's ``wait_s``."""
        need = dict.fromkeys(eff.take_from, eff.count)
        floors_of = self.spec.out_peers if self.spec.settings.send_check else ()
        waited = 0.0
        while True:
            fields["t"] = time.time()
            fields["wait_s"] = round(fields["wait_s"] + waited, 6)
            res = self.control.try_advance(
                eff.start, eff.to, need, eff.put_to, fields, floor=self._floor, floors_of=floors_of
            )
            if isinstance(res, tuple):
                self._floor = None
                self._floors = res[1] if floors_of else None
                return
            owner = res
            fields["blocked_on"] = [owner]
            t0 = time.monotonic()
            while not self.tokens.pop_one(owner, self.worker, LOOK_S):
                spent = time.monotonic() - t0
                self._check_threads()
                self._check_alive([owner], f"a token to enter iteration {eff.to}")
                if spent > self.timeout:
                    raise RunFailure(
                        f"worker {self.worker} waited {spent:.0f} s for a token from worker "
                        f"{owner} to enter iteration {eff.to} (alive, but it did not advance; "
                        "raise --timeout for slow models)"
                    )
            need[owner] -= 1
            waited = time.monotonic() - t0

    def _drive(self) -> dict[str, Any]:
        s, t, ctl = self.spec, self.trainer, self.control
        assert self.outbox is not None
        gen = worker_loop(s)
        self._cpu0 = time.process_time()
        self._compute_total = 0.0
        value: Any = None
        compute_s = wait_s = 0.0
        blocked_on: tuple[int, ...] = ()
        while True:
            eff = gen.send(value)
            value = None
            kind = type(eff)
            if kind is Send:
                if eff.to:
                    frames = encode_update(self.keys.run, self.worker, eff.iteration, t.params)
                    self.send(eff.to, frames)
                self.counters["messages"] += len(eff.to)
                self.counters["sends_skipped"] += len(s.out_peers) - len(eff.to)
            elif kind is Compute:
                spent, _ = t.gradient(eff.iteration)
                compute_s += spent
                self._compute_total += spent
            elif kind is Recv:
                got, waited, on = self._recv(eff.requirement)
                wait_s += waited
                if on:
                    blocked_on = on
                value = got
            elif kind is Reduce:
                t.reduce(eff.self_weight, [(u.payload, w) for u, w in eff.terms])
            elif kind is Apply:
                t.apply()
            elif kind is Advance:
                self.faults.before_iteration(eff.to)
                fields = self.progress_fields(eff.start, eff.to, compute_s, wait_s, blocked_on)
                self._advance(eff, fields)
                compute_s = wait_s = 0.0
                blocked_on = ()
            elif kind is PublishFloor:
                self._floor = eff.floor  # rides on the next Advance: late only costs a drop
            elif kind is ReadFloors:
                cached, self._floors = self._floors, None  # read back by the last Advance
                value = cached if cached is not None else ctl.read_floors(eff.of)
            elif kind is ReadTokenCounts:
                value = self.tokens.sizes(eff.of, self.worker)
            elif kind is SendAcks:
                if eff.to:
                    self.send(eff.to, encode_ack(self.keys.run, self.worker, eff.iteration))
                self.counters["acks"] += len(eff.to)
            elif kind is Start:
                ctl.start(eff.put_to, eff.count)
                ctl.event("start", endpoint=self.endpoint)
            elif kind is Finish:
                return self._finish(eff.iterations)
            else:  # pragma: no cover - a new effect without a driver is a bug
                raise AssertionError(f"no driver for {eff!r}")

    def _finish(self, iterations: int) -> dict[str, Any]:
        if self._floor is not None:
            self.control.publish_floor(self._floor)
        return self.finish_worker(iterations, self._cpu0, self._compute_total)


def report_failure(redis_url: str, run: str, worker: int, message: str) -> None:
    """Best effort: put a worker's failure on the run's events stream for ``hopbus inspect``."""
    with contextlib.suppress(redis.RedisError, ConfigError, OSError):
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=1, socket_timeout=1)
        keys = RunKeys(run)
        if client.exists(keys.meta):  # never create keys for a run that does not exist
            RunControl(client, keys, worker).event("error", message=message)
        client.close()


__all__ = ["Worker", "advertised", "report_failure"]
