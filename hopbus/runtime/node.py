"""What every process of a run does the same way: a Hop worker, a parameter server, a PS
worker, a WAGMA worker.

Each connects to Redis, reads the run's config, binds its inbox, registers its endpoint, keeps a
heartbeat, opens an outbox to the peers it sends to, and, at the end, publishes its result. Every
wait has a deadline (``timeout``) and ends, when it runs out, in one line naming what the node
waited for; a peer whose heartbeat is gone is reported as soon as that is seen. Subclasses only
say what to expect on the wire (``_validator``), whom they send to, and how they train
(``_drive``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
import zmq

from hopbus.config import TrainConfig, check_setting, make_config
from hopbus.coord import read
from hopbus.coord.client import attempts, connect, quick, redis_flag
from hopbus.coord.control import Heartbeat, RunControl, StateLostError, heartbeats
from hopbus.coord.keys import ANOTHER_TYPE, FINISHED, RunKeys, named_keys
from hopbus.coord.runs import (
    RunStateError,
    load_config,
    misplaced,
    recorded_config,
    said_why,
)
from hopbus.errors import ConfigError, DeclaredDead, RunFailure, RunStopped
from hopbus.heterogeneity import Heterogeneity
from hopbus.runtime import env as envvars
from hopbus.runtime.address import advertised
from hopbus.runtime.compute import Trainer
from hopbus.runtime.faults import Faults
from hopbus.runtime.own_code import require_given
from hopbus.runtime.reported import entry_figures, scored
from hopbus.runtime.tensorboard import ScalarWriter, step_scalars
from hopbus.topology import Topology
from hopbus.transport import CurveKeys, Inbox, Message, Outbox, TransportError, Validator
from hopbus.transport.inbox import link_hold, probe_bind
from hopbus.transport.outbox import COPY_BYTES

LOOK_S = 0.5  # a waiting node checks its threads and its peers' heartbeats this often


def log(line: str) -> None:
    """One line on stderr (a worker's log), for what happened but is not an error."""
    print(f"hopbus: {line}", file=sys.stderr, flush=True)


def names(nodes: Sequence[int], ps: int | None = None) -> str:
    """``worker 3``, ``workers 1, 2``, or ``the parameter server`` for node ``ps``."""
    if ps is not None and list(nodes) == [ps]:
        return "the parameter server"
    return ("worker " if len(nodes) == 1 else "workers ") + ", ".join(map(str, nodes))


class Leaving(Exception):  # noqa: N818 - not an error: the node closes under a waiting thread
    """Raised in a thread still waiting in a node that is closing (``Node.leaving``)."""


class redis_failures:  # noqa: N801 - used as a function: ``with redis_failures(who, run):``
    """Redis errors as one line naming the node; the Lua scripts' refusals explained. A class,
    not a generator: the workers enter it around every step."""

    __slots__ = ("run", "url", "who")

    def __init__(self, who: str, run: str, url: str | None = None) -> None:
        self.who, self.run, self.url = who, run, url

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if isinstance(exc, redis.ResponseError):
            if "HOPBUS" not in str(exc):
                hint = (
                    " (in one of hopbus's scripts on the run's keys: do they hold a value "
                    f"hopbus did not write? hopbus inspect --run {self.run}{redis_flag(self.url)})"
                    if read.in_script(exc)
                    else ""
                )
                why = read.refused_because(exc, "")  # a per-run user of another run, an OOM
                raise RunFailure(
                    f"{self.who}: Redis refused a command: {read.refusal(exc)}{self._which(exc)}"
                    f"{hint}{f': {why}' if why else ''}"
                ) from None
            raise RunFailure(
                f"{self.who} of run {self.run}: "
                + str(exc).split("HOPBUS ", 1)[1]
                + " (another process already runs this --id, or the run ended: hopbus clean)"
            ) from None
        if isinstance(exc, redis.RedisError):
            raise RunFailure(f"{self.who} lost Redis: {exc}") from None

    def _which(self, exc: redis.ResponseError) -> str:
        """For a WRONGTYPE refusal, which names no key: ``; KEY (a hash; ...)`` for the keys
        of the run of another type than hopbus keeps, looked up on a client of its own with
        a second's patience (the refusal's own client may be mid-pipeline)."""
        if self.url is None or "WRONGTYPE" not in str(exc):
            return ""
        with contextlib.suppress(Exception):  # a hint: nothing may hide the refusal itself
            found = misplaced(quick(self.url), RunKeys(self.run))
            if found:
                return f"; {named_keys(found)}"
        return ""


_CANNOT_TAKE = "cannot take its place: "
_IS_TAKEN = "is taken: "


def place_taken(who: str, run: str, node: int, why: str) -> RunStateError:
    """The refusal of a process whose place in the run another has or had, or whose keys
    something else wrote (``_why_taken``)."""
    if ANOTHER_TYPE in why:
        return RunStateError(f"{who} of run {run} {_CANNOT_TAKE}{why}")
    return RunStateError(
        f"{who} of run {run} {_IS_TAKEN}{why} (is `hopbus worker --id {node}` running twice?)"
    )


def refused_place(line: str, run: str, node: int) -> bool:
    """Whether a script's last ``hopbus: error:`` line is ``place_taken``'s for worker
    ``node`` of ``run``: it was refused before it took a place, so its failure is not the
    run's (``hopbus worker -- COMMAND`` started at the very instant of a twin passes its own
    check, and only the script's claim tells)."""
    head = f"worker {node} of run {run} "
    return line.startswith((head + _IS_TAKEN, head + _CANNOT_TAKE))


def read_run_config(
    client: redis.Redis, keys: RunKeys, timeout: float
) -> tuple[TrainConfig, Topology]:
    """The run's config as ``hopbus train`` recorded it, with its worker count filled in."""
    cfg = recorded_config(load_config(client, keys, timeout=timeout, say=log), keys)
    with warnings.catch_warnings():  # the launcher shows the run's warnings once
        warnings.simplefilter("ignore")
        cfg, topo = cfg.build_topology()
    assert isinstance(cfg, TrainConfig)
    return cfg, topo


def run_curve(run: str, who: str, required: bool, folder: Path | None) -> CurveKeys | None:
    """The run's CURVE keys when it ``required`` them; one line when a process's --curve
    (``folder``) and the run disagree (a process without keys cannot talk to the others, and
    one with keys that the run does not ask for would be a mistake in the deployment)."""
    if required and folder is None:
        raise ConfigError(
            f"run {run} requires CURVE on its data plane: give {who} the run's key folder with "
            "--curve DIR or HOPBUS_CURVE"
        )
    if folder is not None and not required:
        raise ConfigError(
            f"--curve (HOPBUS_CURVE) given, but run {run} was created without --curve: its "
            "other processes would not understand this one; drop --curve, or create the run "
            "with it"
        )
    return None if folder is None else CurveKeys.load(folder)


def bind_refused(bind: str, exc: TransportError) -> ConfigError:
    return ConfigError(f"--bind {bind!r}: {exc}")


def check_bind(bind: str) -> None:
    """One line if this host cannot bind ``bind`` now, the one a node's inbox would fail with:
    for a process to look at before it takes a worker id from the run."""
    try:
        probe_bind(bind)
    except TransportError as exc:
        raise bind_refused(bind, exc) from None


class Node:
    """Node ``node`` of run ``run``. ``run_loop`` drives it from join to finish."""

    ps_id: int | None = None  # the parameter server's node id, in runs that have one
    rejoin = False  # a replacement for a dead worker: it beats while still in the dead set
    # a small model's messages are received on the main thread while it waits (``pump``):
    # cheaper than a receiver thread's hand-off; False where messages must be answered while
    # the main thread computes (WAGMA's passive members)
    inline_inbox = True
    # whether it builds the run's --model and --data (runtime/own_code.py); not a script's
    imports_code = True

    def __init__(
        self,
        run: str,
        node: int,
        redis_url: str,
        *,
        bind: str = "tcp://127.0.0.1:*",
        advertise: str | None = None,
        timeout: float | None = None,
        client: redis.Redis | None = None,
        device: str | None = None,
        curve: Path | None = None,
        tensorboard: str | Path | None = None,
    ) -> None:
        self.keys = RunKeys(run)
        # where its TensorBoard scalars go (worker-I/ under it): --tensorboard, or none
        self.tensorboard_dir = Path(tensorboard) if tensorboard else None
        self._board: ScalarWriter | None = None  # the related schemes' (progress_fields)
        self._curve_dir = curve  # --curve: the run's key folder; loaded once the config says
        self.curve_keys: CurveKeys | None = None
        self.node = node
        self.redis_url = redis_url
        self.bind = bind
        self.advertise = advertise
        if timeout is not None:  # given to this node alone (hopbus ps/worker --timeout): the
            timeout = check_setting("timeout", timeout)  # run's rule (worker_for's is earlier)
        self._timeout_flag = timeout
        self._device_flag = device  # hopbus worker --device: this worker's, over the run's
        self.timeout = (
            timeout if timeout is not None else TrainConfig.model_fields["timeout"].default
        )
        self.r: redis.Redis | None = client
        self.cond = threading.Condition()
        self.counters: dict[str, int] = {}
        self.ctx: zmq.Context | None = None
        self.inbox: Inbox | None = None
        self.outbox: Outbox | None = None
        self.heartbeat: Heartbeat | None = None
        self.admitted = False  # it took its place in the run (a refused process never does)
        self.leaving = False  # closing: a thread still waiting in it stops at its next look
        self.trainer: Trainer  # set by each kind of node's _setup
        self._unseen: dict[int, float] = {}  # peers seen without a heartbeat, since (monotonic)

    @property
    def heartbeat_s(self) -> float:
        """How long this node's heartbeat lives: the run's --heartbeat, at most --timeout."""
        return min(self.cfg.heartbeat, self.timeout)

    @property
    def who(self) -> str:
        return names([self.node], self.ps_id)

    # -- setting up -------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Redis, the run's config and this node's place in it."""
        if self.r is None:
            self.r = connect(self.redis_url, timeout=self.timeout)
        cfg, topo = read_run_config(self.r, self.keys, self.timeout)
        if self._timeout_flag is None:
            self.timeout = cfg.timeout
        if self._device_flag is not None:
            cfg = make_config({**cfg.model_dump(), "device": self._device_flag}, cls=TrainConfig)
            assert isinstance(cfg, TrainConfig)
        self.cfg, self.topo = cfg, topo
        if self.imports_code:  # before it takes a place, or imports
            require_given(cfg, self.who, self.keys.run)
        self._place()
        self._load_curve()
        self.faults = Faults.for_worker(self.node)
        self.het = Heterogeneity.for_run(cfg.slowdown, cfg.mode, topo.graph, topo.name, cfg.seed)
        self.control = RunControl(self.r, self.keys, self.node, iterations=cfg.iterations)
        self.control.epoch = self.control.broker_id()  # the broker instance it starts in

    def _place(self) -> None:
        """Check (or, for a parameter server, take) this node's id in the run."""
        if not 0 <= self.node < self.topo.n:
            raise ConfigError(
                f"--id {self.node}: run {self.keys.run!r} has workers 0..{self.topo.n - 1}"
            )

    def _load_curve(self) -> None:
        self.curve_keys = run_curve(self.keys.run, self.who, self.cfg.curve, self._curve_dir)

    def _open(
        self,
        validator: Validator,
        on_message: Callable[[Message], None],
        *,
        hwm: int,
        peers: Sequence[int],
        out_hwm: int,
    ) -> None:
        """Bind the inbox, register, start the heartbeat, connect to ``peers``."""
        self.ctx = zmq.Context()
        delay = self._link_delay()
        try:
            self.inbox = Inbox(
                self.ctx,
                self.bind,
                validator,
                on_message,
                hwm=hwm,
                delay=delay,
                curve=self.curve_keys,
                inline=self.inline_inbox
                and delay is None
                and self.curve_keys is None
                and validator.max_tensor_bytes < COPY_BYTES,
            )
        except TransportError as exc:
            raise bind_refused(self.bind, exc) from None
        self.inbox.start()
        self._announce(advertised(self.inbox.endpoint, self.advertise))
        self.outbox = self._outbox(peers, out_hwm)

    def _announce(self, endpoint: str) -> None:
        """Take this node's place in the run (``RunControl.claim``: refused, writing nothing,
        if another process has it) and start the heartbeat: after binding the inbox, or for a
        node that has no inbox (an all-reduce worker, reached through gloo). A replacement's
        place was taken by begin_rejoin (Worker._announce)."""
        self.faults.before_register()
        self.endpoint = endpoint
        if not self.rejoin:
            why = self.control.claim(endpoint, Heartbeat.ttl_ms_for(self.heartbeat_s))
            if why is not None:
                raise place_taken(self.who, self.keys.run, self.node, why)
        self.admitted = True  # from here on, its failures are the run's to hear
        self.heartbeat = Heartbeat(
            self.control, self.heartbeat_s, stats=self.stats, patience_s=self.timeout
        )
        self.heartbeat.may_be_dead = self.rejoin
        self.heartbeat.start()

    def vacant(self) -> bool:
        """Whether this node's place in the run is free (no process holds it, none held it):
        for a process the join counter gave that place, a failure before taking it (its
        model or data not loading) is then the place's own, and the run hears it; a process
        started for a place that is taken, or for no place, writes nothing into the run."""
        if not hasattr(self, "control") or not 0 <= self.node < self.topo.n:
            return False  # the run's config, or this node's place in it, was never read
        try:
            return self.control.taken() is None
        except redis.RedisError:
            return False

    def _link_delay(self) -> Callable[[Message], float] | None:
        """How long the inbox holds each message: the run's emulated links into this node
        (``--slowdown link:...`` / ``machines:...``, ``--slowdown-scope``,
        ``--message-bytes``), None without any."""
        return link_hold(self.het, self.node, self.cfg.slowdown_scope, self.cfg.message_bytes)

    def _outbox(self, peers: Sequence[int], hwm: int) -> Outbox:
        assert self.ctx is not None
        try:
            return Outbox(
                self.ctx,
                self._wait_endpoints(peers),
                hwm=hwm,
                send_timeout_s=self.timeout,
                curve=self.curve_keys,
            )
        except TransportError as exc:  # an endpoint in the registry that is not one
            raise self.bad_endpoint(exc) from None

    def bad_endpoint(self, exc: TransportError) -> RunFailure:
        """The failure for an endpoint ZeroMQ cannot connect to, as read from the run's
        registry (which anything that can write the run's keys can change): one line,
        control characters out."""
        return RunFailure(
            f"{self.who}: {read.text(str(exc), 300)} (read from {self.keys.addr}: a worker's "
            "endpoint?)"
        )

    def _wait_endpoints(self, peers: Sequence[int]) -> dict[int, str]:
        deadline = time.monotonic() + self.timeout
        while True:
            found = self.control.endpoints(peers)
            missing = [j for j, e in found.items() if e is None]
            if not missing:
                return {j: e for j, e in found.items() if e is not None}
            if time.monotonic() >= deadline:
                said = []
                with contextlib.suppress(redis.RedisError):
                    said = self.control.last_words(missing)
                # a peer that said why it failed is not slow: its words, not a longer wait
                why = "".join(f"; the run's events: {w}" for w in said)
                raise RunFailure(
                    f"{self.who} waited {self.timeout:g} s for {names(missing, self.ps_id)} to "
                    f"register an endpoint in {self.keys.addr}; "
                    f"{'it' if len(missing) == 1 else 'they'} never appeared"
                    + (why or " (slow start-up? raise --timeout)")
                )
            self._check_threads()
            time.sleep(0.05)  # polling the registry while peers start

    # -- waiting ----------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        out = dict(self.counters)
        if self.inbox is not None:
            out.update({f"dropped_{k}": v for k, v in self.inbox.drops().items() if v})
        return out

    def _check_threads(self) -> None:
        """While waiting: what the inbox and heartbeat threads found (subclasses add looks
        at Redis)."""
        self._check_flags()

    def _stop_if_leaving(self) -> None:
        """Leaving: this node closes (``leaving``), and a thread still waiting in it stops."""
        if self.leaving:
            raise Leaving(f"{self.who} is leaving")

    def _check_flags(self) -> None:
        """What the inbox and heartbeat threads found, without any I/O: cheap enough for every
        iteration, so that a worker that never waits still stops with the run within a
        heartbeat period."""
        self._stop_if_leaving()
        if self.inbox is not None and self.inbox.error is not None:
            raise self.inbox.error
        hb = self.heartbeat
        if hb is not None and isinstance(hb.error, redis.ResponseError):
            tampered = f"a key of run {self.keys.run} holds what hopbus did not write there"
            raise RunFailure(
                f"{self.who}: Redis refused its heartbeat ({read.refusal(hb.error)}): "
                f"{read.refused_because(hb.error, tampered)}"
            )
        if hb is not None and isinstance(hb.error, redis.RedisError):
            raise RunFailure(f"{self.who} lost Redis: {hb.error}")
        if hb is not None and hb.error is not None:
            raise RunFailure(
                f"{self.who}: its heartbeat failed ({type(hb.error).__name__}: {hb.error})"
            )
        if hb is not None and hb.stopped is not None:
            raise RunStopped(f"{self.who} stopped with the run: {hb.stopped}")
        if hb is not None and hb.declared_dead:
            raise DeclaredDead(self.control.declared_dead_line())

    def _reconnect(self, exc: BaseException) -> None:
        """Redis went away (``exc``): try again with backoff until it answers, or fail after
        --timeout with one line. What it lost is the caller's business."""
        assert self.r is not None
        log(f"{self.who} lost Redis ({exc}); reconnecting for up to {self.timeout:g} s")
        last: BaseException = exc
        for _ in attempts(self.timeout):
            self._stop_if_leaving()  # a thread still at work as the node closes (Session.close)
            try:
                self.r.ping()
                log(f"{self.who} reached Redis again")
                return
            except (redis.ConnectionError, redis.TimeoutError) as again:
                last = again
        raise RunFailure(
            f"{self.who} lost Redis and it did not come back within {self.timeout:g} s "
            f"({last}){self._resume_hint()}"
        ) from None

    @staticmethod
    def _resume_hint() -> str:
        """How to go on after the run is lost, where there is a way: a run of hopbus train
        that keeps checkpoints (its launcher names their folder, inside the results folder)."""
        folder = os.environ.get(envvars.CHECKPOINT_DIR)
        if not folder:
            return ""  # no checkpoints (or a script's run): nothing to resume from
        return f"; resume from its checkpoints: hopbus train --resume {Path(folder).parent}"

    def _check_alive(self, peers: Sequence[int], what: str) -> list[int]:
        """Those of ``peers`` that lost their heartbeat, if the node goes on without them
        (``_lose``); empty if all are alive (or if the node waits for them after all)."""
        if not peers:
            return []
        now = time.monotonic()
        for j, a in self.control.alive(peers).items():
            if a:
                self._unseen.pop(j, None)
            else:
                self._unseen.setdefault(j, now)
        # gone for a whole renewal period (as this node's own heartbeat renews): a live peer
        # puts back a heartbeat someone deleted by then
        period = self.heartbeat.ttl_ms / 3000 if self.heartbeat is not None else 0.0
        dead = [j for j in peers if j in self._unseen and now - self._unseen[j] >= period]
        return dead if dead and self._lose(dead, what) else []

    def _out_of_time(self, since: float, peers: Sequence[int]) -> str | None:
        """None while a wait on ``peers`` begun at ``since`` (monotonic) may go on; once it
        may not, why, as far as being judged tells ("" if no peer was). It goes on past
        --timeout while a peer is being judged: one whose heartbeat is gone already gets the
        renewal period ``_check_alive`` gives it before declaring it dead, and one whose
        heartbeat is running out unrenewed (``read.lapsing``) the time to run out. A frozen
        peer's heartbeat, capped at --timeout, runs out about when a wait on it does, and the
        run failed calling it alive where it could go on without it. Twice --timeout ends
        any wait."""
        spent = time.monotonic() - since
        if spent <= self.timeout:
            return None
        judging = any(j in self._unseen for j in peers) or self._lapsing(peers)
        if not judging:
            return ""
        if spent <= 2 * self.timeout:
            return None
        return (
            "its heartbeat lapsed, but it was not declared dead within twice --timeout: "
            "docs/faults.md"
        )

    def _waited(self, since: float) -> str:
        """How long a wait that ran out lasted, as its line says it: --timeout, or what it
        was when a peer being judged held it longer (``_out_of_time``)."""
        spent = time.monotonic() - since
        return f"{self.timeout:g}" if spent < self.timeout + 1 else f"{spent:.0f}"

    def _lapsing(self, peers: Sequence[int]) -> bool:
        """Whether one of ``peers`` has a heartbeat running out unrenewed (``read.lapsing``,
        by this node's own TTL: the run's)."""
        if self.heartbeat is None:
            return False
        try:
            beats = heartbeats(self.r, self.keys, peers)
        except redis.RedisError:
            return False
        return any(read.lapsing(v, ttl, self.heartbeat.ttl_ms) for v, ttl in beats.values())

    def _lose(self, dead: Sequence[int], what: str, reason: str = "") -> bool:
        """``dead`` lost their heartbeat while this node waited for ``what`` from them. Here
        (no spare capacity): stop the run for every node, naming them, and fail, saying why
        it cannot go on (``reason``) if there is more to it. A Hop worker with backup workers
        may go on instead (Worker._lose)."""
        said = said_why(self.r, self.keys, max(dead) + 1)  # why, if it said (watch's rule)
        told = "; ".join(said[j][1] for j in dead if j in said)
        why = (
            f"{self.who} waited for {what} from {names(dead, self.ps_id)}, whose heartbeat "
            f"({self.keys.hb(dead[0])}) is gone: "
            + (f"it said: {told}" if told else "the process died or lost Redis")
            + (f"; {reason}" if reason else "")
        )
        self.control.stop_run(
            f"{names(dead, self.ps_id)} died (heartbeat gone{f': {told}' if told else ''})"
        )
        raise RunFailure(why)

    def wait_for(
        self,
        ready: Callable[[], bool],
        missing: Callable[[], Sequence[int]],
        what: str,
        *,
        sent_in: int | None = None,
    ) -> float:
        """Wait, holding ``self.cond``, until ``ready()``; the receiver thread notifies on every
        delivery. Every LOOK_S: are this node's threads alive, are ``missing()``'s heartbeats
        there, is the timeout spent. Returns seconds waited. Call with ``self.cond`` held.
        ``sent_in``: the iteration a peer has begun once it has sent what is awaited (a
        timeout then tells a peer still short of it from one whose message did not arrive)."""
        if ready():
            return 0.0
        t0 = time.monotonic()
        next_look = t0 + LOOK_S
        while not ready():
            self.await_delivery(LOOK_S)
            now = time.monotonic()
            if now < next_look:
                continue
            next_look = now + LOOK_S
            self._check_threads()
            late = missing()
            self._check_alive(late, what)
            if now - t0 > self.timeout and not late:  # e.g. a dead set written by hand
                raise RunFailure(
                    f"{self.who} waited {self.timeout:g} s for {what}, which only workers "
                    f"declared dead ({self.keys.dead}) could send: it cannot go on without "
                    "them (docs/faults.md)"
                )
            lapsed = self._out_of_time(t0, late)
            if lapsed is not None:
                why = lapsed or self._why_late(late, sent_in)
                raise RunFailure(f"{self.who} waited {self._waited(t0)} s for {what} from "
                                 f"{names(late, self.ps_id)} ({why})")  # fmt: skip
        return time.monotonic() - t0

    def _why_late(self, late: Sequence[int], sent_in: int | None) -> str:
        """What a wait that timed out most likely met: peers that have not come to the
        iteration in which they send it (their counters say so: a slow step, or a wait of
        their own), emulated links that hold messages longer than --timeout, or peers that
        cannot reach this node's inbox."""
        behind = self._short_of(late, sent_in)
        if behind:
            j, at = behind[0]
            return (
                f"alive; {names([j], self.ps_id)} is still in iteration {at} and has not begun "
                f"iteration {sent_in}: a step slower than --timeout, or a wait of its own; "
                "raise --timeout for slow models"
            )
        held = getattr(self.inbox, "longest_hold", 0.0)
        if held > self.timeout / 2:
            return (
                f"alive; the emulated links (--slowdown link:/machines:) held a message "
                f"{held:.3g} s: raise --timeout above what an iteration takes on them"
            )
        return (
            f"alive, but nothing arrived at this node's inbox, "
            f"{getattr(self, 'endpoint', '?')}: can they reach it? Else raise --timeout for "
            "slow models"
        )

    def _short_of(self, peers: Sequence[int], iteration: int | None) -> list[tuple[int, int]]:
        """Those of ``peers`` whose counter in Redis is below ``iteration``, with it (none
        when that cannot be read)."""
        if iteration is None or not hasattr(self, "control"):
            return []
        try:
            at = self.control.iterations(peers)
        except redis.RedisError:
            return []
        return [(j, c) for j, c in at.items() if c is not None and c < iteration]

    def await_delivery(self, timeout_s: float) -> None:
        """Wait, holding ``self.cond``, up to ``timeout_s`` for the inbox to deliver something:
        an inline inbox receives on this thread, a threaded one notifies ``self.cond``."""
        inbox = self.inbox
        if inbox is not None and inbox.inline:
            inbox.pump(timeout_s)  # delivers here: self.cond is re-entrant
        else:
            self.cond.wait(timeout_s)

    # -- sending and finishing --------------------------------------------------------------------
    def send(self, to: Sequence[int], frames: list, outbox: Outbox | None = None) -> list[int]:
        """Send ``frames`` to every peer in ``to``. A peer whose queue is full is waited for
        like anything else: every LOOK_S, are this node's threads alive, are the full peers'
        heartbeats there (a dead peer never drains its queue; going on without it is
        ``_lose``'s call), is --timeout spent. Returns the peers gone on without (dead: not
        sent to)."""
        box = outbox or self.outbox
        assert box is not None
        t0 = time.monotonic()
        gone: list[int] = []
        try:
            full = box.offer(to, frames, LOOK_S)
            if full:  # rare: shown in the stats (``hopbus inspect``, summary.json)
                self.counters["full_queue_waits"] = self.counters.get("full_queue_waits", 0) + 1
            while full:
                lost: list[int] = []
                # Redis away, or back without the run's state: look next time (the main loop
                # rides that out at its next Redis step; a live peer drains meanwhile)
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, StateLostError):
                    self._check_threads()
                    lost = self._check_alive(full, "room in its queue")
                gone += lost
                full = [j for j in full if j not in lost]
                lapsed = self._out_of_time(t0, full) if full else None
                if lapsed is not None:
                    why = lapsed or (
                        f"its heartbeat alive ({box.why_full()}; raise --timeout for slow models)"
                    )
                    raise RunFailure(
                        f"{self.who}: a send to {names(full, self.ps_id)} at "
                        f"{box.endpoints[full[0]]} stayed blocked for {self._waited(t0)} s, "
                        f"{why}"
                    )
                full = box.offer(full, frames, LOOK_S)
        except TransportError as exc:
            raise RunFailure(f"{self.who}: {exc}") from None
        return gone

    def publish_result(self, result: Mapping[str, Any], **event: Any) -> None:
        """The result for the launcher's summary; the heartbeat becomes 'finished' (no TTL).
        Not from a process declared dead or replaced while it computed its last steps."""
        assert self.r is not None
        self.faults.before_report()
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat.beat()  # the counters' last values
            self.heartbeat = None
        self.control.publish_result(result, FINISHED)  # finished, not dead: no TTL
        self.control.event("finish", **event)
        self.faults.after_report()

    def progress_fields(
        self, start: int, to: int, compute_s: float, wait_s: float, blocked_on: Sequence[int]
    ) -> dict[str, Any]:
        """A progress entry for entering ``to`` from ``start``, from this node's trainer
        (the related schemes' workers; a Hop worker's Session writes its own), and its
        TensorBoard scalars."""
        t = self.trainer
        fields = self.entry_fields(
            start, to, compute_s, wait_s, blocked_on, loss=t.loss, device=t.device,
            evaluate=t.evaluate,
        )  # fmt: skip
        board = self._scalars()
        if board is not None and ("eval_loss" in fields or board.due()):
            step_s = (compute_s + wait_s) / max(1, to - start)
            board.add(to, step_scalars(t.loss, fields, step_s), keep="eval_loss" in fields)
        return fields

    def _scalars(self) -> ScalarWriter | None:
        """This worker's TensorBoard writer, made at its first step (none without a folder)."""
        if self._board is None and self.tensorboard_dir is not None:
            self._board = ScalarWriter(self.tensorboard_dir / f"worker-{self.node}")
        return self._board

    def entry_fields(
        self,
        start: int,
        to: int,
        compute_s: float,
        wait_s: float,
        blocked_on: Sequence[int],
        *,
        loss: float | None,
        device: str,
        evaluate: Callable[[], tuple[float, float]] | None = None,
    ) -> dict[str, Any]:
        """A worker's progress entry for entering ``to`` from ``start`` (the same fields for
        every mode and every model), with ``evaluate()`` (test loss, accuracy) when an
        --eval-every boundary is crossed."""
        fields: dict[str, Any] = {
            "t": time.time(),
            "compute_s": round(compute_s, 6),
            "wait_s": round(wait_s, 6),
            "blocked_on": list(blocked_on),
            "device": device,  # a string: never in the stats hash, whose values are integers
        }
        if loss is not None:
            fields["loss"] = loss
        e = self.cfg.eval_every
        if evaluate is not None and e and to // e > start // e and to < self.cfg.iterations:
            fields.update(entry_figures(evaluate()))
        return fields

    def finish_worker(self, iterations: int, cpu0: float, compute_s: float) -> dict[str, Any]:
        """Evaluate this node's trainer on the whole test set and publish its final report."""
        t = self.trainer
        loss, acc = scored(t.evaluate(full=True))
        result = self.publish_worker_result(
            iterations, cpu0, compute_s, loss=loss, accuracy=acc, device=t.device, params=t.params
        )
        board = self._scalars()
        if board is not None:
            board.add(iterations, {"test/loss": loss, "test/accuracy": acc}, keep=True)
        return result

    def publish_worker_result(
        self,
        iterations: int,
        cpu0: float,
        compute_s: float,
        *,
        loss: float | None,
        accuracy: float | None,
        device: str,
        params: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """A worker's final report (and its parameters' sketch, for the consensus distance)."""
        result = {
            "worker": self.node,
            "iterations": iterations,
            "final_loss": loss,
            "final_accuracy": accuracy,
            "t": time.time(),
            "cpu_s": time.process_time() - cpu0,  # all threads: the driver's own cost
            "compute_s": compute_s,
            "device": device,
            **self.stats(),
        }
        if params is not None:
            from hopbus.consensus import sketch

            values, exact = sketch(params)
            result["sketch_exact"] = exact
            assert self.r is not None
            # another type there: the consensus distance alone is lost (the launcher says
            # so), not the run's result
            with contextlib.suppress(redis.ResponseError):
                self.r.hset(self.keys.sketch, str(self.node), values.tobytes())
        self.publish_result(result, iterations=iterations, final_accuracy=accuracy)
        return result

    def run_loop(self) -> dict[str, Any]:
        """Join, run, report; returns this node's result."""
        try:
            with redis_failures(self.who, self.keys.run, self.redis_url):
                self._connect()
                self._setup()
                return self._drive()
        finally:
            self.close()

    def _setup(self) -> None:
        raise NotImplementedError

    def _drive(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        if self._board is not None:
            self._board.flush()
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self._last_stats(self.heartbeat)
        for box in self._outboxes():
            box.close(linger_s=min(5.0, self.timeout))  # let the last messages leave
        if self.inbox is not None:
            self.inbox.close()
        if self.ctx is not None:
            self.ctx.term()

    def _last_stats(self, heartbeat: Heartbeat) -> None:
        """A node leaving without its final report (the run stopped, or it failed) leaves its
        counters as they are now, for the failed run's summary (the heartbeat wrote them
        only every period: a run stopped within the first leaves zeros); not one declared
        dead, whose place a replacement may hold."""
        if heartbeat.declared_dead:
            return
        # a second's patience: a frozen Redis holds no exit; and a failing stats() (the
        # heartbeat's failure, said already) is not said twice
        with contextlib.suppress(Exception):  # Redis errors included
            self.control.publish_stats(self.stats(), quick(self.redis_url))

    def _outboxes(self) -> list[Outbox]:
        return [self.outbox] if self.outbox is not None else []
