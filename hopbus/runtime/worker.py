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
import socket
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import redis
import zmq

from hopbus.config import TrainConfig, make_config
from hopbus.coord.client import connect
from hopbus.coord.control import Heartbeat, RunControl
from hopbus.coord.keys import RunKeys
from hopbus.coord.runs import load_config
from hopbus.coord.tokens import RedisTokenQueues
from hopbus.errors import ConfigError, RunFailure
from hopbus.heterogeneity import Heterogeneity
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
from hopbus.runtime.faults import Faults
from hopbus.transport import (
    KIND_UPDATE,
    Inbox,
    Message,
    Outbox,
    TransportError,
    Validator,
    encode_ack,
    encode_update,
    hwm_for,
    layout_of,
)

LOOK_S = 0.5  # a waiting worker checks its threads and its neighbours' heartbeats this often
HEARTBEAT_MAX_S = 10.0
FINISHED = "finished"  # the heartbeat key's value once a worker is done (kept without TTL)


def _names(workers: Sequence[int]) -> str:
    return ("worker " if len(workers) == 1 else "workers ") + ", ".join(map(str, workers))


def advertised(bound: str, advertise: str | None) -> str:
    """The endpoint neighbours should connect to: the bound port at ``advertise`` (a host name
    or address), or at this host's name when bound to every interface."""
    parts = urlsplit(bound)
    host, port = parts.hostname or "", parts.port
    if advertise:
        host = advertise
    elif host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"tcp://{host}:{port}"


class Worker:
    """Worker ``worker`` of run ``run``. ``run_loop`` drives it from join to finish."""

    def __init__(
        self,
        run: str,
        worker: int,
        redis_url: str,
        *,
        bind: str = "tcp://127.0.0.1:*",
        advertise: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.keys = RunKeys(run)
        self.worker = worker
        self.redis_url = redis_url
        self.bind = bind
        self.advertise = advertise
        self._timeout_flag = timeout
        self.timeout = (
            timeout if timeout is not None else TrainConfig.model_fields["timeout"].default
        )
        self.cond = threading.Condition()
        self.counters = {"messages": 0, "sends_skipped": 0, "acks": 0, "received": 0}
        self.ctx: zmq.Context | None = None
        self.inbox: Inbox | None = None
        self.outbox: Outbox | None = None
        self.heartbeat: Heartbeat | None = None
        self._floor: int | None = None  # to publish with the next Advance
        self._floors: dict[int, int] | None = None  # out-neighbours' floors, read at Advance

    # -- setting up -------------------------------------------------------------------------------
    def _setup(self) -> None:
        self.faults = Faults.for_worker(self.worker)
        self.r = connect(self.redis_url, timeout=self.timeout)
        raw = load_config(self.r, self.keys, timeout=self.timeout)
        cfg = make_config(raw, cls=TrainConfig)
        assert isinstance(cfg, TrainConfig)
        if self._timeout_flag is None:
            self.timeout = cfg.timeout
        cfg, topo = cfg.build_topology()
        assert isinstance(cfg, TrainConfig)
        self.cfg = cfg
        if not 0 <= self.worker < topo.n:
            raise ConfigError(
                f"--id {self.worker}: run {self.keys.run!r} has workers 0..{topo.n - 1}"
            )
        with warnings.catch_warnings():  # the launcher shows the run's warnings once
            warnings.simplefilter("ignore")
            specs = plan(cfg.protocol_settings(), topo)
        self.spec: WorkerSpec = specs[self.worker]
        self.box = self.spec.new_mailbox()
        het = Heterogeneity.from_spec(cfg.slowdown, topo.n, cfg.seed)
        het.check_links(topo.graph.has_edge, topo.name)
        self.trainer = Trainer(cfg, self.worker, het)
        self.control = RunControl(self.r, self.keys, self.worker)
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
        self.ctx = zmq.Context()
        try:
            self.inbox = Inbox(
                self.ctx,
                self.bind,
                validator,
                self._deliver,
                hwm=hwm_for(s.store_slots, acks=self.acks),
            )
        except TransportError as exc:
            raise ConfigError(f"--bind {self.bind!r}: {exc}") from None
        self.inbox.start()
        self.faults.before_register()
        self.endpoint = advertised(self.inbox.endpoint, self.advertise)
        self.control.register(self.endpoint)
        self.heartbeat = Heartbeat(
            self.control, min(HEARTBEAT_MAX_S, self.timeout), stats=self.stats
        ).start()
        peers = sorted(set(s.out_peers) | (set(s.in_peers) if self.acks else set()))
        self.outbox = Outbox(
            self.ctx,
            self._wait_endpoints(peers),
            hwm=hwm_for(s.store_slots),
            send_timeout_s=self.timeout,
        )

    def _wait_endpoints(self, peers: Sequence[int]) -> dict[int, str]:
        deadline = time.monotonic() + self.timeout
        while True:
            found = self.control.endpoints(peers)
            missing = [j for j, e in found.items() if e is None]
            if not missing:
                return {j: e for j, e in found.items() if e is not None}
            if time.monotonic() >= deadline:
                raise RunFailure(
                    f"worker {self.worker} waited {self.timeout:g} s for {_names(missing)} to "
                    f"register an endpoint in {self.keys.addr}; they never appeared (slow "
                    "start-up? raise --timeout)"
                )
            self._check_threads()
            time.sleep(0.05)  # polling the registry while neighbours start

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
        store = self.box.updates
        out = dict(self.counters)
        out.update(
            stale_dropped=store.stale_dropped,
            duplicates=store.duplicates,
            store_overflow=store.overflow,
            max_update_queue=store.peak,
        )
        if self.inbox is not None:
            out.update({f"dropped_{k}": v for k, v in self.inbox.drops().items() if v})
        return out

    def _check_threads(self) -> None:
        if self.inbox is not None and self.inbox.error is not None:
            raise self.inbox.error
        if self.heartbeat is not None and self.heartbeat.error is not None:
            raise RunFailure(f"worker {self.worker} lost Redis: {self.heartbeat.error}")

    def _check_alive(self, peers: Sequence[int], what: str) -> None:
        alive = self.control.alive(peers)
        dead = [j for j, a in alive.items() if not a]
        if dead:
            raise RunFailure(
                f"worker {self.worker} waited for {what} from {_names(dead)}, whose heartbeat "
                f"({self.keys.hb(dead[0])}) is gone: the process died or lost Redis"
            )

    # -- performing effects -----------------------------------------------------------------------
    def _recv(self, req: Requirement) -> tuple[list[Update], float, tuple[int, ...]]:
        box = self.box
        with self.cond:
            if req.ready(box):
                return req.take(box), 0.0, ()
            on = req.missing(box)
            t0 = time.monotonic()
            next_look = t0 + LOOK_S
            while not req.ready(box):
                self.cond.wait(LOOK_S)
                now = time.monotonic()
                if now < next_look:
                    continue
                next_look = now + LOOK_S
                self._check_threads()
                missing = req.missing(box)
                what = "ACKs" if isinstance(req, AcksFrom) else "updates"
                self._check_alive(missing, f"{what} of iteration {req.iteration}")
                if now - t0 > self.timeout:
                    raise RunFailure(
                        f"worker {self.worker} waited {self.timeout:g} s in iteration "
                        f"{req.iteration} for {what} from {_names(missing)} (alive, but "
                        "nothing arrived; raise --timeout for slow models)"
                    )
            return req.take(box), time.monotonic() - t0, on

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

    def run_loop(self) -> dict[str, Any]:
        """Join, train every iteration, report; returns this worker's result."""
        try:
            self._setup()
            return self._drive()
        except redis.ResponseError as exc:
            if "HOPBUS" not in str(exc):
                raise RunFailure(f"worker {self.worker}: Redis refused a command: {exc}") from None
            raise RunFailure(
                f"worker {self.worker} of run {self.keys.run}: "
                + str(exc).split("HOPBUS ", 1)[1]
                + " (another process already runs this --id, or the run ended: hopbus clean)"
            ) from None
        except redis.RedisError as exc:
            raise RunFailure(f"worker {self.worker} lost Redis: {exc}") from None
        finally:
            self.close()

    def _drive(self) -> dict[str, Any]:
        s, t, ctl = self.spec, self.trainer, self.control
        assert self.outbox is not None
        cfg = self.cfg
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
                    self._send(eff.to, frames)
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
                fields: dict[str, Any] = {
                    "t": 0.0,
                    "loss": t.loss,
                    "compute_s": round(compute_s, 6),
                    "wait_s": round(wait_s, 6),
                    "blocked_on": list(blocked_on),
                }
                e = cfg.eval_every
                if e and eff.to // e > eff.start // e and eff.to < cfg.iterations:
                    fields["eval_loss"], fields["eval_accuracy"] = t.evaluate()
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
                    self._send(eff.to, encode_ack(self.keys.run, self.worker, eff.iteration))
                self.counters["acks"] += len(eff.to)
            elif kind is Start:
                ctl.start(eff.put_to, eff.count)
                ctl.event("start", endpoint=self.endpoint)
            elif kind is Finish:
                return self._finish(eff.iterations)
            else:  # pragma: no cover - a new effect without a driver is a bug
                raise AssertionError(f"no driver for {eff!r}")

    def _send(self, to: Sequence[int], frames: list) -> None:
        assert self.outbox is not None
        try:
            self.outbox.send(to, frames)
        except TransportError as exc:
            raise RunFailure(f"worker {self.worker}: {exc}") from None

    def _finish(self, iterations: int) -> dict[str, Any]:
        if self._floor is not None:
            self.control.publish_floor(self._floor)
        loss, acc = self.trainer.evaluate(full=True)
        result = {
            "worker": self.worker,
            "iterations": iterations,
            "final_loss": loss,
            "final_accuracy": acc,
            "t": time.time(),
            "cpu_s": time.process_time() - self._cpu0,  # all threads: the driver's own cost
            "compute_s": self._compute_total,
            **self.stats(),
        }
        self.control.publish_result(result)
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat.beat()
            self.heartbeat = None
        self.r.set(self.keys.hb(self.worker), FINISHED)  # finished, not dead: no TTL
        self.control.event("finish", iterations=iterations, final_accuracy=acc)
        return result

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.outbox is not None:
            self.outbox.close(linger_s=min(5.0, self.timeout))  # let the last updates leave
        if self.inbox is not None:
            self.inbox.close()
        if self.ctx is not None:
            self.ctx.term()


def report_failure(redis_url: str, run: str, worker: int, message: str) -> None:
    """Best effort: put a worker's failure on the run's events stream for ``hopbus inspect``."""
    with contextlib.suppress(redis.RedisError, ConfigError, OSError):
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=1, socket_timeout=1)
        keys = RunKeys(run)
        if client.exists(keys.meta):  # never create keys for a run that does not exist
            RunControl(client, keys, worker).event("error", message=message)
        client.close()


__all__ = ["Worker", "advertised", "report_failure"]
