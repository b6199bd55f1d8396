"""One Hop worker's node: the I/O behind each of the protocol's effects.

The protocol (``worker_loop``) is driven by ``hopbus.runtime.session.Session``, the one driver for
real processes, whatever trains the model: the built-in models, a Keras model through
``hopbus.keras.HopCallback``, or any loop through ``hopbus.join()``. This node performs what the
effects ask with ZeroMQ and Redis and decides nothing the protocol decides:

| effect | performed with |
| --- | --- |
| Start | Lua: SET iter 0 (or the resumed iteration), RPUSH the initial tokens |
| PublishFloor / ReadFloors | SET / MGET ``floor:I`` |
| Send, SendAcks | encode once, PUSH the same frames to every target (zero-copy) |
| Recv | wait on the mailbox the inbox thread fills, until the requirement is ready |
| ReadTokenCounts | LLEN of each TokenQ(j->self), pipelined |
| Advance | BLPOP the tokens queue by queue, then Lua: INCRBY, XADD progress, RPUSH tokens |

Compute, Reduce and Apply touch only parameters: the session does them.

Before iteration 0 every worker starts from worker 0's parameters (``share_start``), whatever
seed each process used, and a worker whose model has another layout stops there with one line.

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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis

from hopbus.coord import read
from hopbus.coord.client import quick, scrub
from hopbus.coord.control import Heartbeat, RunControl, StateLostError
from hopbus.coord.keys import RunKeys
from hopbus.coord.tokens import RedisTokenQueues
from hopbus.errors import ConfigError, DeclaredDead, RejoinFailed, RunFailure, RunStopped
from hopbus.modes import Approach, Mode
from hopbus.protocol.effects import Advance, Send
from hopbus.protocol.membership import live, rejoin_iteration, survivable
from hopbus.protocol.requirements import AcksFrom, Requirement
from hopbus.protocol.spec import WorkerSpec, plan
from hopbus.protocol.store import Outcome, Update
from hopbus.runtime.initial import differs, publish_initial, read_initial
from hopbus.runtime.node import LOOK_S, Node, advertised, log
from hopbus.transport import (
    KIND_UPDATE,
    Layout,
    Message,
    Params,
    TransportError,
    Validator,
    encode_update,
    hwm_for,
)

T = TypeVar("T")


class Worker(Node):
    """Hop worker ``node`` of run ``run``: the effects of ``worker_loop`` over ZeroMQ and Redis.
    ``run_loop`` trains the run's own model (``hopbus worker``); ``hopbus.join()`` hands the
    node to any other training loop."""

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
        # where the built-in models' checkpoints go, and the iteration to resume from
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.resume_from = resume_from
        self.start_at = 0
        self.counters = {"messages": 0, "sends_skipped": 0, "acks": 0, "received": 0}
        self._floor: int | None = None  # to publish with the next Advance
        self._floors: dict[int, int] | None = None  # out-neighbours' floors, read at Advance
        self.dead: frozenset[int] = frozenset()  # the run's dead workers, as last read
        self.joining: frozenset[int] = frozenset()  # dead ones whose replacement is joining
        self._relink: set[int] = set()  # peers seen dead: check their endpoint before sending
        self._incarnations: dict[int, int] = {}  # neighbours' incarnations, as last read
        self._neighbours: tuple[int, ...] = ()  # whom it sends to (updates, ACKs): setup
        self._look_before_send = False  # incarnations read before each send too: setup
        self._parallel = True  # Send right after Advance (Hop's order), not after the step
        # a replacement, until it rejoins: in-neighbour -> iteration -> payload of what it sent
        self._held: dict[int, dict[int, Any]] | None = {} if rejoin else None
        self.rejoined_with: Params | None = None  # a replacement's first parameters
        self.iteration = 0  # the iteration this worker is in (entered), for _restore
        self._rebuild: set[int] = set()  # owners whose TokenQ(j->self) awaits a rebuild
        self._grace_until = 0.0  # after a restore: peers not back yet are not dead
        self._restored_at = 0.0  # when it last put its state back (monotonic)
        self._started = False  # once its counter is in Redis (Start)
        self._newest_from: dict[int, int] = {}  # in-neighbour -> newest iteration it sent
        self._put_to: tuple[int, ...] = ()  # the workers that take this one's tokens (Start)

    def run_loop(self) -> dict[str, Any]:
        """Train the run's own model (``--model``) to the end: the same path as any user's
        loop (hopbus/runtime/builtin.py)."""
        from hopbus.runtime.builtin import train_builtin

        return train_builtin(self)

    # -- setting up -------------------------------------------------------------------------------
    def setup(self, layout: Layout) -> None:
        """Plan this worker's protocol, bind its inbox for updates of ``layout``, register,
        start the heartbeat and connect to its peers (after ``_connect``)."""
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
        self.layout = layout
        self.box = self.spec.new_mailbox(self.start_at)
        self.tokens = RedisTokenQueues(self.r, self.keys)
        self.acks = cfg.mode is Mode.NOTIFY_ACK
        s = self.spec
        validator = Validator(
            self.keys.run,
            topo.n,
            update_from=s.in_peers,
            ack_from=s.out_peers if self.acks else (),
            layout=layout,
            max_iteration=cfg.iterations,
        )
        peers = sorted(set(s.out_peers) | (set(s.in_peers) if self.acks else set()))
        self._neighbours = tuple(peers)  # a replacement among them is looked up (Advance)
        self._parallel = cfg.protocol_settings().approach is Approach.PARALLEL
        self._look_before_send = not self._parallel and cfg.mode.uses_backup  # (replacements)
        self._open(
            validator,
            self._deliver,
            hwm=hwm_for(s.store_slots, acks=self.acks),
            peers=peers,
            out_hwm=hwm_for(s.store_slots),
        )

    def share_start(self, params: Params) -> Params:
        """The parameters every worker starts from: worker 0's, which it publishes; every other
        worker waits for them (up to --timeout) and refuses them, naming the first tensor that
        differs, if its own model has another layout (hopbus/runtime/initial.py)."""
        if self.worker == 0:
            publish_initial(self.r, self.keys, params)
            return params
        t0 = time.monotonic()
        while True:
            found = read_initial(self.r, self.keys, self.layout, self.topo.n)
            if found is not None:
                theirs, arrays = found
                if arrays is None:
                    raise ConfigError(
                        f"worker {self.worker}'s model differs from worker 0's: "
                        f"{differs(self.layout, theirs)}; every worker of a run must build the "
                        "same model"
                    )
                return arrays
            self._check_threads()
            if time.monotonic() - t0 > self.timeout:
                raise RunFailure(
                    f"worker {self.worker} waited {self.timeout:g} s for worker 0's initial "
                    f"parameters ({self.keys.initial}); they never appeared (slow start-up? "
                    "raise --timeout)"
                )
            time.sleep(0.05)  # polling for worker 0, which publishes once it is set up

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
                if msg.iteration > self._newest_from.get(msg.src, -1):
                    self._newest_from[msg.src] = msg.iteration
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
        if self.control.floors_refused:
            out["floors_refused"] = self.control.floors_refused
        return out

    def behind(self, iteration: int) -> int | None:
        """How many iterations this worker, in ``iteration``, is behind its slowest live
        in-neighbour, as the updates received so far tell (negative: ahead of it; None before
        every one has sent something)."""
        with self.cond:
            seen = [self._newest_from.get(j) for j in live(self.spec.in_peers, self.dead)]
        known = [it for it in seen if it is not None]
        return min(known) - iteration if known and len(known) == len(seen) else None

    # -- performing effects -----------------------------------------------------------------------
    def recv(self, req: Requirement) -> tuple[list[Update], float, tuple[int, ...]]:
        """Wait until ``req`` is ready: (what it takes, seconds waited, whom it waited on)."""
        box = self.box
        what = "ACKs" if isinstance(req, AcksFrom) else "updates"
        # the iteration a peer has begun once it has sent an update that counts: the oldest
        # that does (bounded staleness: k - s), or the one after it in serial order (which
        # sends after the step); an ACK is sent on receipt, in no iteration of the sender's
        sent_in = None
        if not isinstance(req, AcksFrom):
            sent_in = getattr(req, "oldest", req.iteration) + (0 if self._parallel else 1)
        with self.cond:
            on = () if req.ready(box) else tuple(live(req.missing(box), self.dead))
            waited = self.wait_for(
                lambda: req.ready(box),
                lambda: live(req.missing(box), self.dead),
                f"{what} of iteration {req.iteration}",
                sent_in=sent_in,
            )
            return req.take(box), waited, on

    def missing(self, req: Requirement) -> tuple[int, ...]:
        """The live workers ``req`` still waits for, as of now."""
        with self.cond:
            return () if req.ready(self.box) else tuple(live(req.missing(self.box), self.dead))

    def advance(self, eff: Advance, fields: dict[str, Any]) -> None:
        """Enter ``eff.to``: one Lua call when the tokens are there; otherwise wait for the
        short queue's next token (BLPOP, looking around every LOOK_S) and try again. Time spent
        waiting for tokens is added to the progress entry's ``wait_s``. A dead owner's queue no
        longer binds (protocol/membership.py): the Lua call skips it once it is declared."""
        self._check_flags()  # the run stopped, or this process declared dead: go no further
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
                    floors_of=floors_of, neighbours=self._neighbours,
                )  # fmt: skip
                self._set_dead(dead, self.control.joining)
                self._note_incarnations(self.control.incarnations)
            if owner is None:
                self._floor = None
                self._floors = self.control.floors if floors_of else None
                self.iteration = eff.to
                return
            fields["blocked_on"] = [owner]
            t0 = time.monotonic()
            while True:
                self._check_threads()  # before taking any token
                if owner in self._rebuild:  # after a restore: its counter is not back yet
                    if self._rebuild_tokens() is None:
                        break  # rebuilt: try again, having taken nothing
                    self._check_rebuild_wait(owner)
                    time.sleep(0.05)  # polling for the owner to put its counter back
                elif self.tokens.pop_one(owner, self.worker, LOOK_S):
                    need[owner] -= 1
                    break
                spent = time.monotonic() - t0
                if self._check_alive([owner], f"a token to enter iteration {eff.to}"):
                    break  # declared dead: its queue no longer binds
                self._check_queue(owner, eff, need[owner])
                lapsed = self._out_of_time(t0, [owner])
                if lapsed is not None:
                    why = lapsed or (
                        "alive, but it did not advance; raise --timeout for slow models"
                    )
                    raise RunFailure(
                        f"worker {self.worker} waited {spent:.0f} s for a token from worker "
                        f"{owner} to enter iteration {eff.to} ({why})"
                    )
            waited = time.monotonic() - t0

    def _check_queue(self, owner: int, eff: Advance, need: int) -> None:
        """While waiting for a token from ``owner``: does TokenQ(owner->self) hold what the
        invariant says (Theorem 2: Iter(owner) - Iter(self) + max_ig, less what this wait took
        already)? Fewer means something deleted or changed it: waiting would only end in a
        timeout that blames the wrong thing. Read in one transaction, so never mid-Advance."""
        if owner in self.dead or owner in self._rebuild:
            return
        key = self.keys.tok(owner, self.worker)
        pipe = self.r.pipeline(transaction=True)
        pipe.llen(key).get(self.keys.iter(owner))
        size, theirs = pipe.execute(raise_on_error=False)
        their_iter = read.integer(theirs)
        if not isinstance(size, int) or their_iter is None:
            return  # another type there, or its counter not back yet: others report those
        taken = eff.count - need
        expected = their_iter - eff.start + self.spec.settings.max_ig - taken
        if size < expected:
            raise RunFailure(
                f"worker {self.worker}: {key} holds {size} tokens where worker {owner}'s "
                f"counter ({their_iter}) says {expected}: something other than this run's "
                "workers deleted or changed it (docs/faults.md)"
            )

    def read_floors(self, of: Sequence[int]) -> dict[int, int]:
        """The out-neighbours' floors: as the last Advance read them back, or from Redis."""
        cached, self._floors = self._floors, None
        if cached is None:
            cached = self.control.read_floors(of)
        return cached

    def token_counts(self, of: Sequence[int]) -> dict[int, int]:
        return self.tokens.sizes(live(of, self.dead), self.worker)

    def start(self, put_to: Sequence[int], count: int, at: int) -> None:
        """Start in iteration ``at`` (a replacement's commit_rejoin did it already)."""
        self._put_to = tuple(put_to)
        if not self.rejoin:
            self.control.start(put_to, count, at=at)
            self.control.event("start", endpoint=self.endpoint)
        self.iteration = at
        self._started = True

    def publish_result(self, result: Mapping[str, Any], **event: Any) -> None:
        if self.faults.leak_token and self._put_to:  # HOPBUS_FAULTS: a broken token rule
            self.tokens.put(self.worker, self._put_to[0])
        super().publish_result(result, **event)

    def send_update(self, eff: Send, params: Params) -> None:
        """Send this iteration's parameters to the live targets. A replacement still joining
        is offered them without waiting (no token bounds what it is sent, and it may die
        while joining): a full queue skips it."""
        skip = self.dead - self.joining
        to = live(eff.to, skip) if skip else eff.to
        if self._look_before_send:
            # serial order sends after the step: a replacement may have come in since the
            # Advance read the incarnations (parallel order sends right after it); with Redis
            # away, the next Advance reads them
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                self._note_incarnations(self.control.incarnations_of(to))
        self._relink_to(to)
        joiners = [j for j in to if j in self.joining]
        unsent: list[int] = []  # declared dead while their queue was full, or joiners' full
        if to:
            frames = encode_update(self.keys.run, self.worker, eff.iteration, params)
            bound = [j for j in to if j not in self.joining]
            if bound:
                unsent += self.send(bound, frames)
            if joiners:
                assert self.outbox is not None
                unsent += self.outbox.offer(joiners, frames)
        self.counters["messages"] += len(to) - len(unsent)
        self.counters["sends_skipped"] += len(self.spec.out_peers) - len(to) + len(unsent)

    def _lose(self, dead: Sequence[int], what: str) -> bool:
        """Neighbours ``dead`` lost their heartbeat while this worker waited for ``what``:
        declare them dead and go on without them if the protocol can (membership.survivable);
        otherwise stop the whole run, naming them. Right after a restarted Redis, a peer that
        has not put its state back yet is not dead: wait for it (up to --timeout). (Whether
        Redis lost this worker's own counter was checked just before, by _check_threads.)"""
        declared, unjudged = [], []
        for j in dead:
            if self.control.declare_dead(j):
                declared.append(j)
            elif self.control.unjudged:
                unjudged.append(j)
        if not declared and time.monotonic() < self._grace_until:
            return False
        # past any grace, a peer whose state this broker never got back (not restored after a
        # restart, or its mark rewritten by something else) is judged by its heartbeat alone,
        # gone a whole renewal period by now: it was otherwise waited on forever
        declared += [j for j in unjudged if self.control.declare_dead(j, force=True)]
        self._set_dead(self.control.dead(), self.joining)
        reason = survivable(self.spec.settings, self.topo, self.dead)
        if reason is None:
            return True
        return super()._lose(dead, what, reason)

    # -- dead workers and their replacements (docs/faults.md) -------------------------------------
    def _set_dead(self, dead: frozenset[int], joining: frozenset[int]) -> None:
        """The run's dead set and joining set as just read. A peer seen dead may come back as
        a replacement at another address: its endpoint is looked up before the next send
        (``_relink_to`` looks up joiners' at every send)."""
        # check again: seen dead, or back for good
        self._relink |= (dead - joining) | (self.joining - dead)
        self.dead, self.joining = dead, joining

    def _note_incarnations(self, found: dict[int, int]) -> None:
        """The neighbours' incarnations as an Advance just read them: one that changed is a
        replacement at another address, even if this worker never saw that id dead (it was
        busy, or waiting on something else, from the death to the replacement's commit)."""
        for j, n in found.items():
            if self._incarnations.get(j, 0) != n:
                self._relink.add(j)
                self._incarnations[j] = n
                log(
                    f"{self.who}: worker {j} is a new process (replacement {n}): its address is "
                    "looked up before the next send to it"
                )

    def _check_alive(self, peers: Sequence[int], what: str) -> list[int]:
        """Those of ``peers`` gone, as Node._check_alive judges, and first those the run's dead
        set holds: declared dead by anyone, a worker is gone whatever its heartbeat key says
        (a replacement beats under the id from its announcement on, before its commit has
        rebuilt the token queues; waiting on such a queue would wait for a token that neither
        the dead process nor the replacement will put)."""
        unknown = [j for j in peers if j not in self.dead]
        if unknown:
            dead = self.control.dead()
            if dead.intersection(unknown):
                self._set_dead(dead, self.joining)
                return [j for j in unknown if j in dead]
        return super()._check_alive(peers, what)

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
                try:
                    self.outbox.replace(j, endpoint)
                except TransportError as exc:
                    raise self.bad_endpoint(exc) from None
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

    def join_as_replacement(self) -> Params:
        """A replacement, announced: wait until an iteration to enter is found among what the
        in-neighbours sent (membership.rejoin_iteration) and commit_rejoin takes it, up to
        --timeout; then start there with that update's parameters (returned). Whatever goes
        wrong before it is in is this process's failure, not the run's (RejoinFailed)."""
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
        assert self.rejoined_with is not None
        return self.rejoined_with

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
                why = ctl.commit_rejoin(k, s.in_peers, s.out_peers, max_ig, self.topo.n) or ""
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
                self.await_delivery(LOOK_S)  # woken by every update that arrives
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
        self.rejoined_with = held[src][k]
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
    def with_redis(self, op: Callable[[], T], advancing: Advance | None = None) -> T | None:
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
            if self._restored(advancing):
                return None

    def _restored(self, advancing: Advance | None) -> bool:
        """``_restore``, riding out a Redis that goes away again meanwhile (it is safe to do
        twice: a second look finds what the first one put back)."""
        while True:
            try:
                return self._restore(advancing)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._reconnect(exc)

    def _check_threads(self) -> None:
        """Also, while waiting: has a restarted Redis lost this worker's counter? Then the
        peers it waits for may be waiting for it to put its state back. And is this process
        still the worker (not declared dead, not outdated by a replacement)? Asked before every
        wait for a token, so a process that wakes from a freeze takes none of a replacement's:
        its heartbeat thread may not have looked yet."""
        super()._check_threads()
        if not self._started:
            return
        if self.heartbeat is not None and self.heartbeat.restarted:
            raise StateLostError("Redis restarted (another instance): its state is stale")
        counter, current = self.control.standing()
        if not counter:
            raise StateLostError("Redis lost this worker's counter")
        if not current:
            raise DeclaredDead(self.control.declared_dead_line())

    def _restore(self, advancing: Advance | None) -> bool:
        """After reconnecting: whether ``advancing`` went through; and if Redis lost this
        worker's state (a restart without persistence) or holds an older one (a restart from a
        snapshot: another broker instance, its counters behind), put it back: counter,
        heartbeat, endpoint, the run's config, the dead it knows, marked as in this broker; the
        token queues it takes from are rebuilt from the invariant once each owner has put its
        state back in this broker too (its mark)."""
        ctl = self.control
        broker = ctl.broker_id()
        restarted = broker != ctl.epoch  # whatever it holds of the run is not this worker's
        own = read.integer(self.r.get(self.keys.iter(self.worker)))
        if not restarted and advancing is not None and own == advancing.to:
            self.iteration = advancing.to
            return True
        if not restarted and own == self.iteration:
            return False  # a broken connection, nothing lost
        ctl.epoch = broker  # from now on, state is trusted only if put back in this one
        if self.heartbeat is not None:
            self.heartbeat.restarted = False
        self.control.restore(
            self.iteration,
            heartbeat_ms=self.heartbeat.ttl_ms if self.heartbeat else 1000,
            endpoint=self.endpoint,
            config=json.dumps(self.cfg.public()),
            dead=sorted(self.dead),
        )
        if self.spec.settings.max_ig > 0:
            self._rebuild = set(live(self.spec.out_peers, self.dead))
        self._restored_at = time.monotonic()
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

    def _check_rebuild_wait(self, owner: int) -> None:
        """Waiting for ``owner`` to put its counter back after Redis restarted without it:
        up to --timeout since the restore, however often the wait is looked at. An owner that
        had ended before the restart never comes back (its final report went with the
        broker's memory): the run fails, saying so, rather than wait forever."""
        if time.monotonic() - self._restored_at > self.timeout:
            raise RunFailure(
                f"worker {self.worker} waited {self.timeout:g} s for worker {owner} to put its "
                "state back in Redis, which restarted without the run's keys; it never did (it "
                "may have ended before the restart: its final report went with the broker's "
                "memory; a broker that persists its data, appendonly yes, keeps it)"
            )

    def publish_floor(self, floor: int) -> None:
        """The floor a PublishFloor left for an Advance that never came (the last one)."""
        self.control.publish_floor(floor)


def report_failure(
    redis_url: str, run: str, worker: int, message: str, kind: str = "error"
) -> None:
    """Best effort: put a worker's failure on the run's events stream for ``hopbus inspect``
    (scrubbed of secrets: ``coord.client.scrub``); ``kind``: ``error``, or ``JOIN_FAILED``
    for one before it took its place."""
    with contextlib.suppress(redis.RedisError, ConfigError, OSError, ValueError):
        client = quick(redis_url)
        keys = RunKeys(run)
        if client.exists(keys.meta):  # never create keys for a run that does not exist
            RunControl(client, keys, worker).event(kind, message=scrub(message, redis_url))
        client.close()


__all__ = ["Worker", "advertised", "report_failure"]
