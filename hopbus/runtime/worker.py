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

With --rejoin it replaces a dead worker of a backup or hybrid run (docs/faults.md): it joins
(its in-neighbours send to it again), holds what they send, and enters the newest iteration
``membership.rejoin_iteration`` allows with the parameters that came with it; one Lua call
then rebuilds its token queues and makes it live again. The loop starts there.

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

from hopbus.coord.control import Heartbeat, RunControl, StateLostError
from hopbus.coord.keys import RunKeys
from hopbus.coord.tokens import RedisTokenQueues
from hopbus.errors import ConfigError, DeclaredDead, RejoinFailed, RunFailure, RunStopped
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
from hopbus.protocol.membership import live, rejoin_iteration, survivable
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
        rejoin: bool = False,
        **kw: Any,
    ) -> None:
        super().__init__(run, worker, redis_url, **kw)
        self.worker = worker
        self.rejoin = rejoin  # a replacement for this dead worker (hopbus worker --rejoin)
        self._joined = False  # once begin_rejoin let it in: what to undo if it fails
        # checkpoints (hopbus/runtime/checkpoint.py): where, and the iteration to resume from
        self._ckpt_flag = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.resume_from = resume_from
        self.start_at = 0
        self.counters = {"messages": 0, "sends_skipped": 0, "acks": 0, "received": 0}
        self._floor: int | None = None  # to publish with the next Advance
        self._floors: dict[int, int] | None = None  # out-neighbours' floors, read at Advance
        self.dead: frozenset[int] = frozenset()  # the run's dead workers, as last read
        self.joining: frozenset[int] = frozenset()  # dead ones whose replacement is joining
        self._relink: set[int] = set()  # peers seen dead: check their endpoint before sending
        # a replacement, until it rejoins: in-neighbour -> iteration -> payload of what it sent
        self._held: dict[int, dict[int, Any]] | None = {} if rejoin else None
        self.iteration = 0  # the iteration this worker is in (entered), for _restore
        self._rebuild: set[int] = set()  # owners whose TokenQ(j->self) awaits a rebuild
        self._grace_until = 0.0  # after a restore: peers not back yet are not dead
        self._started = False  # once its counter is in Redis (Start)

    # -- setting up -------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg, topo = self.cfg, self.topo
        if self.rejoin and not cfg.mode.uses_backup:
            raise RejoinFailed(
                f"--rejoin: run {self.keys.run} is --mode {cfg.mode}, which stops when a worker "
                "dies; only backup and hybrid runs go on without one and take a replacement"
            )
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
            if self._held is not None:  # a replacement, joining: hold, newest store_slots
                if msg.kind == KIND_UPDATE:
                    mine = self._held.setdefault(msg.src, {})
                    mine[msg.iteration] = msg.payload
                    if len(mine) > self.spec.store_slots:
                        del mine[min(mine)]
                self.cond.notify_all()
                return
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
                owner, dead = self.control.try_advance(
                    eff.start, eff.to, need, eff.put_to, fields, floor=self._floor,
                    floors_of=floors_of,
                )  # fmt: skip
                self._set_dead(dead, self.control.joining)
            if owner is None:
                self._floor = None
                self._floors = self.control.floors if floors_of else None
                return
            fields["blocked_on"] = [owner]
            t0 = time.monotonic()
            while True:
                self._check_threads()  # before taking any token
                if owner in self._rebuild:  # after a restore: its counter is not back yet
                    if self._rebuild_tokens() is None:
                        break  # rebuilt: try again, having taken nothing
                    time.sleep(0.05)  # polling for the owner to put its counter back
                elif self.tokens.pop_one(owner, self.worker, LOOK_S):
                    need[owner] -= 1
                    break
                spent = time.monotonic() - t0
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
        self._set_dead(self.control.dead(), self.joining)
        reason = survivable(self.spec.settings, self.topo, self.dead)
        if reason is None:
            return True
        return super()._lose(dead, f"{what} ({reason})")

    def _drive(self) -> dict[str, Any]:
        s, t, ctl = self.spec, self.trainer, self.control
        assert self.outbox is not None
        if self.rejoin:
            self._join()
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
                self._send_update(eff)
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
                if not self.rejoin:  # a replacement's commit_rejoin did it, differently
                    ctl.start(eff.put_to, eff.count, at=eff.at)
                    ctl.event("start", endpoint=self.endpoint)
                self.iteration = eff.at
                self._started = True
            elif kind is Finish:
                return self._with_redis(lambda: self._finish(eff.iterations))  # noqa: B023
            else:  # pragma: no cover - a new effect without a driver is a bug
                raise AssertionError(f"no driver for {eff!r}")

    def _send_update(self, eff: Send) -> None:
        """Send this iteration's parameters to the live targets. A replacement still joining
        is offered them without waiting (no token bounds what it is sent, and it may die
        while joining): a full queue skips it."""
        skip = self.dead - self.joining
        to = live(eff.to, skip) if skip else eff.to
        self._relink_to(to)
        joiners = [j for j in to if j in self.joining]
        unsent: list[int] = []  # declared dead while their queue was full, or joiners' full
        if to:
            frames = encode_update(self.keys.run, self.worker, eff.iteration, self.trainer.params)
            bound = [j for j in to if j not in self.joining]
            if bound:
                unsent += self.send(bound, frames)
            if joiners:
                assert self.outbox is not None
                unsent += self.outbox.offer(joiners, frames)
        self.counters["messages"] += len(to) - len(unsent)
        self.counters["sends_skipped"] += len(self.spec.out_peers) - len(to) + len(unsent)

    # -- dead workers and their replacements (docs/faults.md) -------------------------------------
    def _set_dead(self, dead: frozenset[int], joining: frozenset[int]) -> None:
        """The run's dead set and joining set as just read. A peer seen dead may come back as
        a replacement at another address: its endpoint is looked up before the next send
        (``_relink_to`` looks up joiners' at every send)."""
        # check again: seen dead, or back for good
        self._relink |= (dead - joining) | (self.joining - dead)
        self.dead, self.joining = dead, joining

    def _relink_to(self, peers: Sequence[int]) -> None:
        # a joiner's endpoint is read before every send: one that died while joining may have
        # been followed by another at a new address without this worker seeing a gap
        stale = (self._relink | self.joining).intersection(peers)
        if not stale:
            return
        assert self.outbox is not None
        try:
            found = self.control.endpoints(sorted(stale))
        except (redis.ConnectionError, redis.TimeoutError):
            return  # Redis is away: the endpoints known stay, and are looked up next time
        for j, endpoint in found.items():
            if endpoint is not None and endpoint != self.outbox.endpoints.get(j):
                self.outbox.replace(j, endpoint)
                log(f"{self.who}: sending to worker {j}'s replacement at {endpoint}")
        self._relink -= stale

    def _announce(self, endpoint: str) -> None:
        """A replacement announces itself first: refused unless its id is dead (docs/faults.md)."""
        if self.rejoin:
            why = self.control.begin_rejoin(endpoint, Heartbeat.ttl_ms_for(self.heartbeat_s))
            if why is not None:
                raise RejoinFailed(
                    f"--rejoin: worker {self.worker} of run {self.keys.run} cannot be replaced: "
                    f"{why}"
                )
            self._joined = True
        super()._announce(endpoint)

    def _join(self) -> None:
        """A replacement, announced: wait until an iteration to enter is found among what the
        in-neighbours sent (membership.rejoin_iteration) and commit_rejoin takes it, up to
        --timeout; then take that update's parameters and start there. Whatever goes wrong
        before it is in is this process's failure, not the run's (RejoinFailed)."""
        run = self.keys.run
        try:
            self._find_and_commit()
        except (RejoinFailed, RunStopped):
            raise
        except DeclaredDead:
            raise RejoinFailed(
                f"--rejoin: worker {self.worker} lost its place while joining run {run} (its "
                "heartbeat lapsed, another replacement took the id, or Redis restarted); start "
                "it again"
            ) from None
        except RunFailure as exc:
            raise RejoinFailed(f"--rejoin: {exc}") from None
        except redis.RedisError as exc:
            raise RejoinFailed(
                f"--rejoin: worker {self.worker} lost Redis while joining run {run} ({exc}); "
                "start it again once Redis is back"
            ) from None

    def _find_and_commit(self) -> None:
        s, ctl = self.spec, self.control
        max_ig = s.settings.max_ig
        t0 = time.monotonic()
        self.faults.while_joining()
        while True:
            self._check_threads()
            dead = ctl.dead() - {self.worker}
            ins, outs = live(s.in_peers, dead), live(s.out_peers, dead)
            if len(ins) < s.policy.need:
                raise RejoinFailed(
                    f"--rejoin: worker {self.worker} needs updates from {s.policy.need} "
                    f"in-neighbours, but only {len(ins)} are alive ({', '.join(map(str, ins))})"
                )
            found = ctl.iterations([*ins, *outs])
            iters = {j: it for j, it in found.items() if it is not None}
            with self.cond:  # what arrived so far (payloads by reference)
                assert self._held is not None
                held = {j: dict(its) for j, its in self._held.items() if j in ins}
            k, why = rejoin_iteration(
                {j: its.keys() for j, its in held.items()},
                {j: iters[j] for j in ins if j in iters},
                {m: iters[m] for m in outs if m in iters},
                need=s.policy.need,
                max_ig=max_ig,
            )
            if len(iters) < len(found):  # a restarted Redis: wait for them to put it back
                k, why = None, "a neighbour's counter is not in Redis"
            if k is not None:
                # every neighbour: one that rejoined since ``dead`` was read needs its queues too
                why = ctl.commit_rejoin(k, s.in_peers, s.out_peers, max_ig) or ""
                if not why:
                    assert self.heartbeat is not None
                    self.heartbeat.may_be_dead = False  # live again: a later death is real
                    break
            if time.monotonic() - t0 > self.timeout:
                raise RejoinFailed(
                    f"--rejoin: worker {self.worker} found no iteration to rejoin run "
                    f"{self.keys.run} in within {self.timeout:g} s: {why}"
                )
            with self.cond:
                self.cond.wait(LOOK_S)  # woken by every update that arrives
        self._enter_at(k, held, dead)

    def _enter_at(self, k: int, held: dict[int, dict[int, Any]], dead: frozenset[int]) -> None:
        """Rejoined in iteration ``k``: a mailbox starting there with every held update of k or
        later in it, and the parameters of the lowest-numbered in-neighbour's update of k
        (``held``: what it chose from)."""
        src = min(j for j, its in held.items() if k in its)
        with self.cond:
            assert self._held is not None
            self.box = self.spec.new_mailbox(k)
            for j, updates in self._held.items():
                for it in sorted(updates):
                    if it >= k and self.box.deliver_update(j, it, updates[it]) is Outcome.ACCEPTED:
                        self.counters["received"] += 1
            self._held = None
        self.trainer.adopt(held[src][k])
        self.start_at = k
        self._started = True  # its counter is in Redis again
        self._set_dead(dead, frozenset())
        log(
            f"{self.who}: rejoined run {self.keys.run} in iteration {k} with worker {src}'s "
            "parameters"
        )

    def close(self) -> None:
        """A replacement that did not get in leaves the joining set, so a next one may try
        (its heartbeat stopped first: a last beat must not bring the key back)."""
        if self._joined and not self._started:
            if self.heartbeat is not None:
                self.heartbeat.stop()
            with contextlib.suppress(redis.RedisError):
                self.control.abort_rejoin()
        super().close()

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
        peers it waits for may be waiting for it to put its state back. And is this process
        still the worker (not declared dead, not outdated by a replacement)? Asked before every
        wait for a token, so a process that wakes from a freeze takes none of a replacement's:
        its heartbeat thread may not have looked yet."""
        super()._check_threads()
        if not self._started:
            return
        counter, current = self.control.standing()
        if not counter:
            raise StateLostError("Redis lost this worker's counter")
        if not current:
            raise DeclaredDead(self.control.declared_dead_line())

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
