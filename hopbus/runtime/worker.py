"""One worker process: ``worker_loop`` driven with ZeroMQ, Redis and a model.

The driver performs the protocol's effects and decides nothing the protocol decides (see
hopbus/protocol/effects.py for what each effect asks):

| effect | performed with |
| --- | --- |
| Start | Lua: SET iter 0 (or the resumed iteration), RPUSH the initial tokens |
| PublishFloor / ReadFloors | SET / MGET ``floor:I`` |
| Send, SendAcks | encode once, PUSH the same frames to every target (zero-copy) |
| Compute | real gradient, then sleep to the emulated compute time |
| Recv | wait on the mailbox the inbox thread fills, until the requirement is ready |
| Reduce, Apply | new parameter arrays (never in place) |
| ReadTokenCounts | LLEN of each TokenQ(j->self), pipelined |
| Advance | BLPOP the tokens queue by queue, then Lua: INCRBY, XADD progress, RPUSH tokens |

After entering every --checkpoint-every'th iteration the worker saves a checkpoint (parameters,
momentum, minibatch position: hopbus/runtime/checkpoint.py); with --resume-from C it loads its
checkpoint of C and the loop starts in iteration C.

Every wait has a deadline (``timeout``) and ends, when it runs out, in one line naming what the
worker waited for; a neighbour whose heartbeat is gone is reported as soon as that is seen.
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis

from hopbus.coord.control import RunControl, StateLostError
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
from hopbus.protocol.membership import live, survivable
from hopbus.protocol.requirements import AcksFrom, Requirement
from hopbus.protocol.spec import WorkerSpec, plan
from hopbus.protocol.store import Outcome, Update
from hopbus.protocol.worker import worker_loop
from hopbus.runtime import checkpoint
from hopbus.runtime.compute import Trainer
from hopbus.runtime.node import LOOK_S, Node, advertised, log
from hopbus.transport import (
    KIND_UPDATE,
    Message,
    Validator,
    encode_ack,
    encode_update,
    hwm_for,
    layout_of,
)

T = TypeVar("T")


class Worker(Node):
    """Hop worker ``node`` of run ``run``: ``worker_loop`` with ZeroMQ, Redis and a model."""

    def __init__(
        self,
        run: str,
        worker: int,
        redis_url: str,
        *,
        checkpoint_dir: str | Path | None = None,
        resume_from: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(run, worker, redis_url, **kw)
        self.worker = worker
        # checkpoints (hopbus/runtime/checkpoint.py): where, and the iteration to resume from
        self._ckpt_flag = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.resume_from = resume_from
        self.start_at = 0
        self.counters = {"messages": 0, "sends_skipped": 0, "acks": 0, "received": 0}
        self._floor: int | None = None  # to publish with the next Advance
        self._floors: dict[int, int] | None = None  # out-neighbours' floors, read at Advance
        self.dead: frozenset[int] = frozenset()  # the run's dead workers, as last read
        self.iteration = 0  # the iteration this worker is in (entered), for _restore
        self._rebuild: set[int] = set()  # owners whose TokenQ(j->self) awaits a rebuild
        self._grace_until = 0.0  # after a restore: peers not back yet are not dead
        self._started = False  # once its counter is in Redis (Start)

    # -- setting up -------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg, topo = self.cfg, self.topo
        with warnings.catch_warnings():  # the launcher shows the run's warnings once
            warnings.simplefilter("ignore")
            specs = plan(cfg.protocol_settings(), topo)
        self.spec: WorkerSpec = specs[self.worker]
        self.trainer = Trainer(cfg, self.worker, self.het)
        self._setup_checkpoints()
        self.box = self.spec.new_mailbox(self.start_at)
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
                lambda: live(req.missing(box), self.dead),
                f"{what} of iteration {req.iteration}",
            )
            return req.take(box), waited, on

    def _advance(self, eff: Advance, fields: dict[str, Any]) -> None:
        """Enter ``eff.to``: one Lua call when the tokens are there; otherwise wait for the
        short queue's next token (BLPOP, looking around every LOOK_S) and try again. Time spent
        waiting for tokens is added to the progress entry's ``wait_s``. A dead owner's queue no
        longer binds (protocol/membership.py): the Lua call skips it once it is declared."""
        need = dict.fromkeys(eff.take_from, eff.count)
        floors_of = self.spec.out_peers if self.spec.settings.send_check else ()
        waited = 0.0
        while True:
            fields["t"] = time.time()
            fields["wait_s"] = round(fields["wait_s"] + waited, 6)
            owner = self._rebuild_tokens()
            if owner is None:
                owner, self.dead = self.control.try_advance(
                    eff.start, eff.to, need, eff.put_to, fields, floor=self._floor,
                    floors_of=floors_of,
                )  # fmt: skip
            if owner is None:
                self._floor = None
                self._floors = self.control.floors if floors_of else None
                return
            fields["blocked_on"] = [owner]
            t0 = time.monotonic()
            while True:
                if owner in self._rebuild:  # after a restore: its counter is not back yet
                    if self._rebuild_tokens() is None:
                        break  # rebuilt: try again, having taken nothing
                    time.sleep(0.05)  # polling for the owner to put its counter back
                elif self.tokens.pop_one(owner, self.worker, LOOK_S):
                    need[owner] -= 1
                    break
                spent = time.monotonic() - t0
                self._check_threads()
                if self._check_alive([owner], f"a token to enter iteration {eff.to}"):
                    break  # declared dead: its queue no longer binds
                if spent > self.timeout:
                    raise RunFailure(
                        f"worker {self.worker} waited {spent:.0f} s for a token from worker "
                        f"{owner} to enter iteration {eff.to} (alive, but it did not advance; "
                        "raise --timeout for slow models)"
                    )
            waited = time.monotonic() - t0

    def _lose(self, dead: Sequence[int], what: str) -> bool:
        """Neighbours ``dead`` lost their heartbeat while this worker waited for ``what``:
        declare them dead and go on without them if the protocol can (membership.survivable);
        otherwise stop the whole run, naming them. Right after a restarted Redis, a peer that
        has not put its state back yet is not dead: wait for it (up to --timeout). (Whether
        Redis lost this worker's own counter was checked just before, by _check_threads.)"""
        declared = [j for j in dead if self.control.declare_dead(j)]
        if not declared and time.monotonic() < self._grace_until:
            return False
        self.dead = self.control.dead()
        reason = survivable(self.spec.settings, self.topo, self.dead)
        if reason is None:
            return True
        return super()._lose(dead, f"{what} ({reason})")

    def _drive(self) -> dict[str, Any]:
        s, t, ctl = self.spec, self.trainer, self.control
        assert self.outbox is not None
        gen = worker_loop(s, start=self.start_at)
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
                to = live(eff.to, self.dead) if self.dead else eff.to
                if to:
                    frames = encode_update(self.keys.run, self.worker, eff.iteration, t.params)
                    self.send(to, frames)
                self.counters["messages"] += len(to)
                self.counters["sends_skipped"] += len(s.out_peers) - len(to)
            elif kind is Compute:
                spent, _ = t.gradient(eff.iteration)
                compute_s += spent
                self._compute_total += spent
            elif kind is Recv:
                req = eff.requirement
                got, waited, on = self._with_redis(lambda: self._recv(req))  # noqa: B023
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
                self._with_redis(lambda: self._advance(eff, fields), advancing=eff)  # noqa: B023
                self.iteration = eff.to
                self._checkpoint(eff.to)
                compute_s = wait_s = 0.0
                blocked_on = ()
            elif kind is PublishFloor:
                self._floor = eff.floor  # rides on the next Advance: late only costs a drop
            elif kind is ReadFloors:
                cached, self._floors = self._floors, None  # read back by the last Advance
                if cached is None:
                    cached = self._with_redis(lambda: ctl.read_floors(eff.of))  # noqa: B023
                value = cached
            elif kind is ReadTokenCounts:
                of = live(eff.of, self.dead)
                value = self._with_redis(lambda: self.tokens.sizes(of, self.worker))  # noqa: B023
            elif kind is SendAcks:
                if eff.to:
                    self.send(eff.to, encode_ack(self.keys.run, self.worker, eff.iteration))
                self.counters["acks"] += len(eff.to)
            elif kind is Start:
                ctl.start(eff.put_to, eff.count, at=eff.at)
                ctl.event("start", endpoint=self.endpoint)
                self.iteration = eff.at
                self._started = True
            elif kind is Finish:
                return self._with_redis(lambda: self._finish(eff.iterations))  # noqa: B023
            else:  # pragma: no cover - a new effect without a driver is a bug
                raise AssertionError(f"no driver for {eff!r}")

    # -- a restarted broker (docs/faults.md) ------------------------------------------------------
    def _with_redis(self, op: Callable[[], T], advancing: Advance | None = None) -> T | None:
        """``op()``, riding out a Redis that goes away: reconnect with backoff (up to
        --timeout), put back what a restart lost (``_restore``), and do ``op`` again. Returns
        None, without redoing it, if ``advancing`` had been entered before the line broke."""
        while True:
            try:
                return op()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._reconnect(exc)
            except StateLostError:
                pass
            if self._restore(advancing):
                return None

    def _check_threads(self) -> None:
        """Also, while waiting: has a restarted Redis lost this worker's counter? Then the
        peers it waits for may be waiting for it to put its state back."""
        super()._check_threads()
        if self._started and not self.r.exists(self.keys.iter(self.worker)):
            raise StateLostError("Redis lost this worker's counter")

    def _restore(self, advancing: Advance | None) -> bool:
        """After reconnecting: whether ``advancing`` went through; and if Redis lost this
        worker's state (a restart without persistence), put it back: counter, heartbeat,
        endpoint, the run's config, the dead it knows; the token queues it takes from are
        rebuilt from the invariant once each owner has put its counter back."""
        own = self.r.get(self.keys.iter(self.worker))
        if advancing is not None and own is not None and int(own) == advancing.to:
            self.iteration = advancing.to
            return True
        if own is not None and int(own) == self.iteration:
            return False  # a broken connection, nothing lost
        self.control.restore(
            self.iteration,
            heartbeat_ms=self.heartbeat.ttl_ms if self.heartbeat else 1000,
            endpoint=self.endpoint,
            config=json.dumps(self.cfg.public()),
            dead=sorted(self.dead),
        )
        if self.spec.settings.max_ig > 0:
            self._rebuild = set(live(self.spec.out_peers, self.dead))
        self._grace_until = time.monotonic() + self.heartbeat_s + LOOK_S
        self.counters["broker_restores"] = self.counters.get("broker_restores", 0) + 1
        log(f"{self.who}: Redis lost the run's state; put back iteration {self.iteration}")
        return False

    def _rebuild_tokens(self) -> int | None:
        """Rebuild the queues still waiting for it; the first owner whose counter is not back
        yet (None: all done)."""
        for j in sorted(self._rebuild):
            if not self.control.rebuild_tokens(j, self.spec.settings.max_ig):
                return j
            self._rebuild.discard(j)
        return None

    # -- checkpoints ------------------------------------------------------------------------------
    def _setup_checkpoints(self) -> None:
        """Where this worker's checkpoints go (--checkpoint-dir, else runs/RUN/checkpoints),
        how many it keeps, and, with --resume-from C, load checkpoint C to start there."""
        cfg = self.cfg
        self.ckpt_dir = self._ckpt_flag or Path("runs") / self.keys.run / "checkpoints"
        self._ckpt_keep: int | None = None
        if cfg.checkpoint_every:
            bound = self.topo.table1(cfg.gap_setting())["any_pair"]
            self._ckpt_keep = checkpoint.keep_for(bound, cfg.checkpoint_every)
        c = self.resume_from
        if c is None:
            return
        if not 0 <= c <= cfg.iterations:
            raise ConfigError(
                f"--resume-from {c}: run {self.keys.run} has iterations 0..{cfg.iterations}"
            )
        got = checkpoint.load(self.ckpt_dir, self.worker, c, layout_of(self.trainer.params))
        self.trainer.load_state(got.state)
        self.start_at = c

    def _checkpoint(self, k: int) -> None:
        """On entering iteration ``k``, write this worker's checkpoint if ``k`` is a multiple
        of --checkpoint-every (not the last iteration: nothing would be left to resume). A jump
        over a multiple writes nothing, so that every set holds one iteration for all."""
        every = self.cfg.checkpoint_every
        if not every or k % every or k >= self.cfg.iterations:
            return
        try:
            checkpoint.save(
                self.ckpt_dir,
                self.worker,
                k,
                self.trainer.state(),
                run=self.keys.run,
                model=self.cfg.model,
            )
            checkpoint.prune(self.ckpt_dir, self.worker, self._ckpt_keep)
        except OSError as exc:
            raise RunFailure(
                f"worker {self.worker} could not write its checkpoint of iteration {k} in "
                f"{self.ckpt_dir}: {exc.strerror or exc}"
            ) from None

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
