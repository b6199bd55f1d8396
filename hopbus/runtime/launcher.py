"""``hopbus train``: a local cluster on one machine.

Starts (or connects to) Redis, records the run, spawns one ``hopbus worker`` process per
worker (forked from one that imported hopbus once: forkserver.py), follows the progress stream
live (metrics.jsonl, gaps, the display), and ends with the summary. Workers run in their own
sessions, so the launcher alone decides when they stop: on Ctrl-C, on a worker's failure, or
at the end. Each worker also asks the kernel to stop it if its parent dies (the fork server,
which asks the same of the launcher), so no process outlives the run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import redis

from hopbus import __version__
from hopbus.config import SGD_FIELDS, TrainConfig, flag_of, load_toml, make_config
from hopbus.coord import read
from hopbus.coord.broker import EmbeddedRedis, _die_with_parent
from hopbus.coord.client import attempts, check_url, connect, quick, redact, redis_flag, scrub
from hopbus.coord.control import Heartbeat, RunControl, broker_id, taken
from hopbus.coord.keys import (
    ANOTHER_TYPE,
    FINISHED,
    INTERRUPTED_LINE,
    JOIN_FAILED,
    RESUMED_FROM,
    SAYS_WHY_GONE,
    RunKeys,
    named_keys,
)
from hopbus.coord.runs import (
    RunStateError,
    clean_run,
    create_run,
    misplaced,
    restore_run,
    run_status,
    said_why,
    set_status,
)
from hopbus.data import load_dataset
from hopbus.errors import ConfigError, RunFailure
from hopbus.heterogeneity import Heterogeneity
from hopbus.jsonout import dumps
from hopbus.models.custom import SCRIPT, keras_mode_line
from hopbus.modes import Family, Mode
from hopbus.protocol.membership import survivable
from hopbus.protocol.spec import WorkerSpec, plan
from hopbus.runtime import env as envvars
from hopbus.runtime import forkserver, interrupts
from hopbus.runtime.checkpoint import FOLDER as CHECKPOINTS
from hopbus.runtime.checkpoint import (
    CheckpointError,
    discard_after,
    newer_than,
    newest_complete,
    run_of,
)
from hopbus.runtime.command import KEPT_CHARS, KEPT_LINES, shown_command
from hopbus.runtime.command import STOP_GRACE_S as SCRIPT_GRACE_S
from hopbus.runtime.faults import ENV, Faults
from hopbus.runtime.last_words import cause, said
from hopbus.runtime.own_code import given_env
from hopbus.runtime.progress import (
    Entry,
    Replay,
    first_start,
    read_all,
    read_entries,
    scheme_summary,
    server_model,
    summarize_run,
    token_invariant_violations,
)
from hopbus.runtime.reaper import leftovers_stopped, stop_marked
from hopbus.summary import run_seconds
from hopbus.topology import Topology
from hopbus.transport.curve import CurveKeys

STOP_GRACE_S = SCRIPT_GRACE_S + 3.0
"""How long a stopped worker gets before SIGKILL: longer than ``hopbus worker``'s own grace for
its script, so that a script ignoring SIGTERM is killed by its worker, not orphaned."""
STEADY_S = 1.0
"""How long Redis must answer every look before a loss starts a new --timeout: a broker (or
something killing its clients) that answers and drops us again and again ends the run once
--timeout has passed since it last held, instead of never."""
FOLLOW_S = 0.1
"""Reads of the progress stream are at least this far apart while entries keep coming. A
read as soon as an entry is there wakes the launcher (and Redis) about once per
worker-iteration, which on a small model costs more CPU than the workers' protocol and, on a
busy machine, slows them; a tenth of a second is still quicker than a display refreshes or a
failure needs noticing. A read that comes back full (``FOLLOW_BATCH``) is followed by the
next at once: the launcher keeps up however fast the workers go."""
SILENT_LOOK_S = 0.5  # how often the launcher looks for its workers' lapsed heartbeats
JOIN_GRACE_S = 30.0
"""A script's copies have --timeout, and at least this long, from their start to enter the run
(``Launcher._never_joined``): Python, NumPy and TensorFlow alone can take tens of seconds to
import on a loaded machine, and a small --timeout (meant for a neighbour's update) must not
end a run whose copies are still importing."""
FOLLOW_BATCH = 1000
"""Progress entries a read takes at most."""


@dataclass
class Outage:
    """The flapping rule, apart from the I/O: an outage starts at the first lost look and
    lasts until looks have gone through for ``steady`` seconds; a run gives up once one
    outage has lasted ``timeout`` seconds, however often Redis answered in between."""

    timeout: float
    steady: float = STEADY_S
    since: float | None = None  # the first loss of this outage
    last_lost: float = 0.0

    def lost(self, now: float) -> tuple[bool, bool]:
        """A look failed at ``now``: (the first loss of an outage, the outage is too long)."""
        first = self.since is None
        self.since = now if self.since is None else self.since
        self.last_lost = now
        return first, now - self.since > self.timeout

    def answered(self, now: float) -> None:
        """A look went through at ``now``: the outage ends once they have for ``steady`` s."""
        if self.since is not None and now - self.last_lost > self.steady:
            self.since = None


TENSORBOARD = "tensorboard"  # the results folder's TensorBoard folder (worker-I/ under it)
LOCK = ".hopbus.lock"  # held by the process writing the results folder (``_holding``)
LOCAL_WORKERS = 256  # the most worker processes hopbus train or launch starts on one machine
HOP_MODES = tuple(m.value for m in Mode if m.is_hop)


def new_run_id(cfg: TrainConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{cfg.mode}-{stamp}-{os.getpid() % 10000:04d}"


def check_curve(cfg: TrainConfig, curve: Path | None) -> None:
    """A run that requires CURVE has a readable key set, and keys go only with such a run:
    refused here as its workers would refuse it, in one line."""
    if curve is None:
        if cfg.curve:
            raise ConfigError(
                "the run requires CURVE on its data plane (curve = true): give its key folder "
                "with --curve DIR or HOPBUS_CURVE (make one with `hopbus keys generate DIR`)"
            )
        return
    if not cfg.curve:
        raise ConfigError(f"--curve {str(curve)!r} was given for a run without curve = true")
    CurveKeys.load(curve)


def check_inputs(
    cfg: TrainConfig, curve: Path | None = None, *, load: bool = True
) -> tuple[TrainConfig, Topology, list[WorkerSpec]]:
    """Everything a worker would refuse, refused here once, before any process starts.
    Returns the config with its worker count, the graph and every Hop worker's spec (none for
    the related schemes, whose settings build_topology checks). ``curve``: the run's CURVE
    key folder, needed when ``cfg.curve``. A run for scripts (``--model script``, hopbus
    launch) has no model or data of hopbus's to check: its scripts bring both. ``load=False``
    leaves out loading the data and building the model (for a run whose code lives where its
    workers run: hopbus compose generate)."""
    check_curve(cfg, curve)
    cfg2, topo = cfg.build_topology()
    assert isinstance(cfg2, TrainConfig)
    script = cfg2.model == SCRIPT
    if script and not cfg2.mode.is_hop:
        raise ConfigError(keras_mode_line("a script's model", cfg2.mode))
    if cfg2.checkpoint_every and not cfg2.mode.is_hop:
        raise ConfigError(
            f"--checkpoint-every: only the Hop modes ({', '.join(HOP_MODES)}) write "
            f"checkpoints, not --mode {cfg2.mode}"
        )
    if cfg2.checkpoint_every and script:
        raise ConfigError(
            "--checkpoint-every: checkpoints are written by hopbus's own models; a script saves "
            "its own state (for Keras: keras.callbacks.BackupAndRestore)"
        )
    Faults.for_worker(0)  # a mistyped HOPBUS_FAULTS is refused before anything starts
    specs = plan(cfg2.protocol_settings(), topo) if cfg2.mode.is_hop else []  # warns once
    Heterogeneity.for_run(cfg2.slowdown, cfg2.mode, topo.graph, topo.name, cfg2.seed)
    if script or not load:
        return cfg2, topo, specs
    if cfg2.mode is Mode.ALLREDUCE:  # here, where its workers would run, not in a compose file
        from hopbus.baselines.allreduce import require_torch

        require_torch()
    from hopbus.data import shard
    from hopbus.models import build_model
    from hopbus.models.custom import check_numpy_model, is_callable_spec, is_keras_model

    # the user's code, run here only to check it: what it leaves running goes with the check
    with leftovers_stopped("the run's --model or --data code, checked here,", SCRIPT_GRACE_S):
        data = load_dataset(cfg2.data, cfg2.seed)
        shard(data, topo.n - 1, topo.n, cfg2.seed)  # enough examples for every worker
        model = build_model(
            cfg2.model, data.n_features, data.n_classes, hidden=cfg2.hidden, device="cpu",
            input_shape=tuple(data.x_train.shape[1:]),
        )  # fmt: skip
        if is_callable_spec(cfg2.model) and not is_keras_model(model):  # as the workers'
            batch = slice(0, cfg2.batch_size)  # loop will call it, the user's data as it is
            x, y = data.x_train[batch], data.y_train[batch]
            check_numpy_model(model, cfg2.model, cfg2.seed, x, y)
    if is_keras_model(model):
        if not cfg2.mode.is_hop:
            raise ConfigError(keras_mode_line(f"--model {cfg2.model} (a Keras model)", cfg2.mode))
        if cfg2.checkpoint_every:
            raise ConfigError(
                f"--checkpoint-every: --model {cfg2.model} is a Keras model; only hopbus's "
                "numpy models and its cnn and vgg11 write checkpoints"
            )
        sgd = [flag_of(f) for f in SGD_FIELDS if f in cfg.model_fields_set]
        if sgd:  # given, and silently unused, they would mislead
            warnings.warn(
                f"{', '.join(sgd)}: --model {cfg2.model} is a Keras model, which trains with "
                "the optimizer it was compiled with; these set hopbus's SGD for its numpy models",
                UserWarning,
                stacklevel=2,
            )
    return cfg2, topo, specs


WATCHED = "# followed by: hopbus watch --run "
"""config.toml's first line in a folder hopbus watch writes: a watch of the same run that was
interrupted before its summary may write there again (``_out_folder``)."""


def write_config_toml(
    path: Path, cfg: TrainConfig, command: list[str] | None = None, *, watched: str | None = None
) -> None:
    """The run's settings as a file that runs it again: ``hopbus train --config`` it, or for
    a script's run (``command``), ``hopbus launch --config`` it with the script. ``watched``:
    the run id, in a folder hopbus watch writes."""
    again = shlex.join(command) if command else "COMMAND ARGS..."
    again = again.replace("\n", " ").replace("\r", " ")  # one comment line, whatever it holds
    lines = [WATCHED + watched] if watched else []
    lines += (
        [
            "# hopbus launch settings of this run (the script makes its own model, data"
            " and optimizer):",
            f"# hopbus launch --config config.toml -- {again}",
        ]
        if cfg.model == SCRIPT
        else ["# hopbus train settings of this run: hopbus train --config config.toml"]
    )
    for k, v in cfg.public().items():
        if v is None:
            continue
        if isinstance(v, bool):
            text = "true" if v else "false"
        elif isinstance(v, int | float):
            text = repr(v)
        elif isinstance(v, list):
            text = "[" + ", ".join(map(str, v)) + "]"
        else:
            text = json.dumps(v)
        lines.append(f"{k} = {text}")
    path.write_text("\n".join(lines) + "\n")


@dataclass
class Proc:
    worker: int
    popen: subprocess.Popen | forkserver.Forked
    log: Path
    code: int | None = None
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"worker {self.worker}"


@dataclass
class Outcome:
    summary: dict[str, Any]
    failure: str | None = None
    interrupted: bool = False
    warnings: list[str] = field(default_factory=list)


class OutputFailed(Exception):  # noqa: N818 (what happened, said as the run's reason)
    """The launcher's own output refused a write: metrics.jsonl (a disk full), or the live
    display (a stderr that refuses writes, a pipe closed by ``| head``). Raised only where it
    writes, so that no other OSError (a process that cannot be started) is taken for one."""


def _unwritable(path: str | Path, exc: OSError) -> OutputFailed:
    """The failure of a write to ``path`` (metrics.jsonl), said with the file's name."""
    return OutputFailed(f"cannot write {path} ({exc.strerror or exc})")


def _write_whole(path: Path, text: str | bytes) -> None:
    """Write ``path`` so that it is never seen half written (a Ctrl-C midway leaves the old
    file or none): a temporary file beside it, renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


RESUMED_MARK = "hopbus: --- resumed from iteration "
"""The line a resumed run's log starts its part with: what came before is the stopped run's."""


LOG_TAIL_BYTES = 1 << 20
"""A failed node's last words are looked for in this much of the end of its log."""


def _last_line(path: Path) -> str:
    """The node's last word in its log: its last error line, else its traceback's exception
    and place, else its last lines (``last_words.cause``; of the resumed part only, in a
    resumed run's log), control characters out."""
    try:
        with path.open("rb") as fh:  # its end only: a script may have written gigabytes
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - LOG_TAIL_BYTES))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    if size > LOG_TAIL_BYTES:
        text = text.partition("\n")[2]  # from the first whole line on
    lines = [x[:KEPT_CHARS] for x in text.splitlines() if x.strip()]
    marks = [i for i, x in enumerate(lines) if x.startswith(RESUMED_MARK)]
    if marks:
        lines = lines[marks[-1] + 1 :]
    last = said(lines)
    if last is None and lines:
        last = cause(lines[-KEPT_LINES:], last=1)
    return read.text(last, 1000) or ""  # a script's words: no escape reaches the terminal


def _why(p: Proc, code: int | None) -> str:
    if isinstance(p.popen, forkserver.Forked) and p.popen.pid in p.popen.server.orphaned:
        return (
            f"{p.name} was stopped with hopbus's fork server (pid {p.popen.server.proc.pid}), "
            f"which started it and {p.popen.server.died()}"
        )
    if code is not None and code < 0:
        return f"{p.name} was killed by {signal.Signals(-code).name}"
    line = _last_line(p.log)
    if not line:
        return f"{p.name} exited with status {code} (see {p.log})"
    return _named(p.name, line)


def _named(name: str, line: str) -> str:
    """``line`` said of node ``name``: as it is if it names it first (``worker 0 waited ...``),
    else after its name (a line of hopbus's API in a script, which names no worker)."""
    if line.startswith((f"{name}:", f"{name} ", f"{name}'s")):
        return line
    return f"{name}: {line}"


class Launcher:
    follows_only = False
    """Whether it only follows a run others run (hopbus watch): a Ctrl-C then stops the
    watch, not the run, and writes no summary."""

    def __init__(
        self,
        cfg: TrainConfig,
        topo: Topology,
        specs: list[WorkerSpec],
        *,
        run: str,
        out: Path,
        redis_url: str | None,
        on_update: Callable[[Launcher], None] | None = None,
        resume_from: int | None = None,
        curve: Path | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.command = command  # hopbus launch: every worker runs this script
        self.curve = curve.resolve() if curve is not None else None  # the workers' key folder
        self.resume_from = resume_from  # hopbus train --resume: every worker starts there
        self.t_offset = 0.0  # added to metrics.jsonl's t: a resumed run's time goes on
        self.topo = topo
        self.specs = specs
        self.keys = RunKeys(run)
        self.out = out
        self.redis_url = redis_url
        self.on_update = on_update
        self.broker: EmbeddedRedis | None = None
        self.procs: list[Proc] = []
        self.forkserver: forkserver.ForkServer | None = None  # what forked them, if one did
        self.replay: Replay | None = None
        self.url = ""
        self.t_start = time.time()
        self.lost: dict[int, str] = {}  # workers the run went on without, and why they died
        self.ended_after_report: set[int] = set()  # built-in workers killed once done
        self.rejoined: set[int] = set()  # lost workers a replacement took the place of
        self._incarnations: dict[int, int] = {}  # worker -> its replacement's, as last seen
        self._missing: dict[int, float] = {}  # no heartbeat and no result since (monotonic)
        self.uncounted: set[int] = set()  # said it finished, with a report that does not count
        self._beat_at: float | None = None  # when the launcher's heartbeat is due (monotonic)
        self._claim = f"{os.getpid()}-{secrets.token_hex(6)}"  # its heartbeat's value: whose
        self.notes: list[str] = []  # what the display and the end report tell besides progress
        self.stopped_summary: dict[str, Any] | None = None  # a run stopped by Ctrl-C: so far
        self._stop_by: float | None = None  # when its processes' grace ends, once stopping
        # in its processes' environment: what they leave behind, setsid and orphaned, is found
        self._mark = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.watched: str | None = None  # hopbus watch: the run id, for config.toml
        self._at_end: dict[int, float] = {}  # worker -> first seen in the last iteration
        self._late: set[int] = set()  # workers said to be late with their final report
        self.malformed = 0  # progress entries that did not parse
        self.rejected_reports = 0  # final reports in Redis that do not count (read.result)
        self.broker_gone = False  # Redis did not come back within --timeout: stop asking it
        self.unanswered: Exception | None = None  # a read of _poll's that Redis did not answer
        self.epoch = ""  # the broker instance it reads (Redis's run id): _check_broker
        self._cut = False  # the progress stream was trimmed before this reader began
        self._last_fed: dict[int, tuple[int, int]] = {}  # worker -> its last entry replayed
        self._horizon = (0, 0)  # the newest id under which entries were lost (_loss_horizon)
        self._spawned_at: float | None = None  # when its processes were started (monotonic)
        self._entered = False  # a worker of ours has entered the run (_never_joined)
        self._added = 0  # the progress stream's entries-added at the last look (_loss_horizon)
        self._silent_at = 0.0  # when _silent looks at the heartbeats next (monotonic)
        self._read_upto = (0, 0)  # the newest progress entry id read before this look
        # entries up to this id were read before an outage: the counters that vouch for them
        # were the broker's that went, not those of the one that came back (a stale snapshot)
        self._read_before_outage = (0, 0)

    # -- lifecycle ---------------------------------------------------------------------------------
    def _start_broker(self) -> None:
        if self.redis_url is None:
            self.broker = EmbeddedRedis().start()
            self.url = self.broker.url
        else:
            self.url = self.redis_url
        self.r = connect(self.url, timeout=min(10.0, self.cfg.timeout))

    def _spawn(self) -> None:
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOPBUS_") or k == ENV}
        env[envvars.REDIS] = self.url  # not on the command line: it may hold a password
        env[envvars.LAUNCH] = self._mark  # what they leave behind is found by it
        env[envvars.TENSORBOARD] = str((self.out / TENSORBOARD).resolve())
        if self.curve is not None:
            env[envvars.CURVE] = str(self.curve)  # the keys' folder; the keys stay in it
        if self.cfg.checkpoint_every or self.resume_from is not None:
            env[envvars.CHECKPOINT_DIR] = str((self.out / CHECKPOINTS).resolve())
        if self.resume_from is not None:
            env[envvars.RESUME_FROM] = str(self.resume_from)
        env.update(given_env(self.cfg))  # the user's code it names: theirs to run (own_code)
        n = self.topo.n
        env.update(envvars.thread_share(n, env))  # N copies on this machine's cores
        nodes: list[tuple[list[str], Path, int, str]] = []
        if self.cfg.mode.family is Family.PS:  # node N: the parameter server
            nodes.append(
                (["ps", "--run", self.keys.run], logs / "ps.log", n, "the parameter server")
            )
        script = ["--", *self.command] if self.command else []
        for i in range(n):
            args = ["worker", "--run", self.keys.run, "--id", str(i), *script]
            nodes.append((args, logs / f"worker-{i}.log", i, f"worker {i}"))
        for _, log, _, _ in nodes:
            self._open_log(log)
        forked = None
        if forkserver.wanted(os.environ):
            short = [(a, log, "hop-ps" if i == n else f"hop-w{i}") for a, log, i, _ in nodes]
            self.forkserver, forked = forkserver.ForkServer.launch(env, self.keys.run, short)
            if forked is None:  # (it failed or was stopped: the run goes on all the same)
                why = "could not be started" if self.forkserver is None else "did not answer"
                self.notes.append(
                    f"hopbus's fork server {why}: the workers were started one by one, "
                    "each importing hopbus itself"
                )
        for k, (args, log, node, name) in enumerate(nodes):
            popen = forked[k] if forked is not None else self._start(args, log, env)
            self.procs.append(Proc(node, popen, log, name=name))
        self._spawned_at = time.monotonic()

    def _open_log(self, log: Path) -> None:
        """A node's log: empty, or a resumed run's, going on after what the stopped run
        wrote from a line that says so."""
        with log.open("wb" if self.resume_from is None else "ab") as fh:
            if self.resume_from is not None:
                fh.write(f"{RESUMED_MARK}{self.resume_from} ---\n".encode())

    def _start(self, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        """Start one node as a fresh interpreter, its stdout and stderr going on in ``log``."""
        with log.open("ab") as fh:
            return subprocess.Popen(
                forkserver.command_line(args),
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the launcher only; it forwards
                preexec_fn=_die_with_parent,  # noqa: PLW1509
            )

    def stop_workers(self) -> None:
        """Stop every process it started, and then what they started and left behind (a
        script's own children, forked and forgotten): each worker runs in a session of its
        own, so its process group holds them all; a process that left it (setsid) is stopped
        by its worker, and, should that worker be killed first, found here by the mark in its
        environment (``reaper.marked``)."""
        live = [p for p in self.procs if p.popen.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGTERM)
        if self._stop_by is None:  # one grace for the run: a second call (after a second
            self._stop_by = time.monotonic() + STOP_GRACE_S  # Ctrl-C) does not start it again
        deadline = self._stop_by
        for p in live:
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
        left = _signal_groups([p.popen.pid for p in self.procs], signal.SIGTERM)
        deadline = time.monotonic() + 1.0
        while left and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the leftovers to go: they are no children of ours
            left = _signal_groups(left, 0)
        _signal_groups(left, signal.SIGKILL)
        if self.forkserver is not None:  # it ends once its last node has: collect it
            self.forkserver.close()
        if self.procs or self.forkserver is not None:  # and what left its group (setsid)
            stop_marked(envvars.LAUNCH, self._mark, 1.0)  # below a worker killed with SIGKILL,
            # which would have stopped it, or a node forked as a start was given up

    def run(self) -> Outcome:
        """The whole run; always stops every process it started before returning or raising."""
        ended = False  # its end recorded: a Ctrl-C from here on does not make it "stopped"
        stopped = False  # by Ctrl-C or SIGTERM: its processes' heartbeats go with them
        try:
            self._start_broker()
            self.out.mkdir(parents=True, exist_ok=True)
            self._record()  # first: a run id Redis refuses leaves no file in the folder
            metrics_path = self.out / "metrics.jsonl"
            if self.resume_from is None:
                write_config_toml(
                    self.out / "config.toml", self.cfg, self.command, watched=self.watched
                )
            else:  # the run goes on: its settings stay, its metrics grow from c
                self.t_offset = _keep_until(metrics_path, self.resume_from)
            self._spawn()
            metrics = metrics_path.open("w" if self.resume_from is None else "a")
            try:
                outcome = self._follow(metrics)
            finally:
                try:
                    metrics.close()
                except OSError as exc:  # its last flush: a disk full (after an OutputFailed too)
                    raise _unwritable(metrics_path, exc) from None
            try:
                self._record_end(outcome)
                ended = True
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # Redis is gone: the summary still tells the run's end
            except redis.ResponseError as exc:  # the status key is not what hopbus wrote there
                why = read.refused_because(exc, "did something else write its keys?")
                self.notes.append(
                    f"Redis at {redact(self.url)} refused to record the run's end "
                    f"({read.refusal(exc)}): {why} (summary.json holds it)"
                )
            return outcome
        except KeyboardInterrupt:
            # a watcher leaves the run's status alone, and a recorded end stays
            if (self.procs or self.broker is not None) and not ended:
                status = "finished" if self._finished_as_stopped else "stopped"
                with contextlib.suppress(Exception):  # a second at most, even if Redis froze
                    set_status(quick(self.url), self.keys, status)
                    stopped = True  # its stopped processes' heartbeats go (finished ones stay)
                self._resume_hint()
            elif not ended and self.follows_only:
                self._watch_hint()
            raise
        except redis.ResponseError as exc:  # e.g. a key of the run holding another type
            with contextlib.suppress(redis.RedisError):
                set_status(self.r, self.keys, "failed")
            raise RunFailure(f"run {self.keys.run}: {self._refused(exc)}") from None
        except redis.RedisError as exc:
            raise RunFailure(
                f"run {self.keys.run}: lost Redis at {redact(self.url)}: {exc}"
            ) from None
        except OutputFailed as exc:
            if self.follows_only:  # a watch's output: the run is someone else's, and goes on
                raise RunFailure(f"the watch of run {self.keys.run} stopped: {exc}") from None
            # nobody follows the run any more, so it stops, recorded failed with the reason
            # (it was left "running", then "abandoned", its workers killed)
            with contextlib.suppress(Exception):  # a second at most, even if Redis froze
                client = quick(self.url)
                RunControl(client, self.keys, -1).stop_run(f"its launcher stopped it: {exc}")
                set_status(client, self.keys, "failed")
            raise RunFailure(f"run {self.keys.run} stopped: {exc}") from None
        finally:
            try:
                self.stop_workers()
                if self.broker is None:
                    self._end_beat()
                if stopped and self.broker is None:
                    self._forget_heartbeats()
            finally:  # a second Ctrl-C during the above still stops the private Redis
                if self.broker is not None:
                    self.broker.stop()

    def _forget_heartbeats(self) -> None:
        """After a stop, once its processes have exited: their heartbeats, which would keep
        the run "running" for hopbus inspect and clean until they expire, go too."""
        gone = [self.keys.hb(p.worker) for p in self.procs if p.popen.poll() is not None]
        if gone:
            with contextlib.suppress(Exception):  # a second at most, even if Redis froze
                client = quick(self.url)
                beats = client.mget(gone)  # a finished node's marker stays: its report counts
                stale = [k for k, b in zip(gone, beats, strict=True) if read.text(b) != FINISHED]
                if stale:
                    client.delete(*stale)

    def _refused(self, exc: redis.ResponseError) -> str:
        why = read.refused_because(exc, "did something else write them?")
        return (
            f"Redis at {redact(self.url)} refused a command on the run's keys "
            f"({read.refusal(exc)}): {why}"
        )

    def _record_end(self, outcome: Outcome) -> None:
        """The run's recorded status at its end: this launcher ran it, so it says."""
        set_status(self.r, self.keys, "failed" if outcome.failure else "finished")

    def _record(self) -> None:
        """Record the run in Redis (``_spawn`` then starts its processes)."""
        if self.resume_from is not None:
            self._clear_stale_run()
            discard_after(self.out / CHECKPOINTS, range(self.topo.n), self.resume_from)
        create_run(self.r, self.keys, self.cfg.public(), __version__, self.url)
        if self.resume_from is not None:
            self.r.hset(self.keys.meta, RESUMED_FROM, self.resume_from)
        set_status(self.r, self.keys, "running")
        self._beat()

    def _beat(self) -> None:
        """The launcher's own heartbeat (``keys.launcher``), renewed every third of its TTL:
        the run is running while its workers load their models, before any of them beats
        (for inspect, top and clean, which would have called it abandoned). A watcher runs
        nothing: it has none."""
        now = time.monotonic()
        if self.follows_only or (self._beat_at is not None and now < self._beat_at):
            return
        ttl_ms = Heartbeat.ttl_ms_for(min(self.cfg.heartbeat, self.cfg.timeout))
        self.r.set(self.keys.launcher, self._claim, px=ttl_ms)
        self._beat_at = now + ttl_ms / 3000

    def _end_beat(self) -> None:
        """The launcher's heartbeat goes with it (once it has begun one): the run's keys tell
        its end at once, not after a TTL. A second at most, even if Redis froze."""
        if self._beat_at is not None:
            with contextlib.suppress(Exception):
                quick(self.url).delete(self.keys.launcher)

    def _clear_stale_run(self) -> None:
        """Before a resumed run reuses its id: wait for the stopped run's heartbeats to expire
        (a process of it still alive would write into the same folder: refuse then), and
        delete the keys it left in Redis (none with a private redis-server). The launcher's
        heartbeat is claimed first (SET NX): of two resumes of one run started together, one
        goes on and the other is refused (the second deleted the first's keys while its
        workers loaded, and both failed)."""
        from hopbus.coord.control import heartbeats

        nodes = list(range(self.topo.n + 1))  # + a parameter server's
        deadline = time.monotonic() + self.cfg.heartbeat + 1.0  # the heartbeats' longest TTL
        ttl_ms = Heartbeat.ttl_ms_for(min(self.cfg.heartbeat, self.cfg.timeout))
        while True:
            mine = bool(self.r.set(self.keys.launcher, self._claim, px=ttl_ms, nx=True))
            mine = mine or self.r.get(self.keys.launcher) == self._claim.encode()
            if mine:
                self.r.pexpire(self.keys.launcher, ttl_ms)
            beats = heartbeats(self.r, self.keys, nodes)
            beating = [self.keys.hb(i) for i, beat in beats.items() if read.beating(*beat)]
            if mine and not beating:
                break
            if time.monotonic() >= deadline:
                if not mine:  # its workers beat too: the launcher is the one to name
                    raise RunStateError(
                        f"run {self.keys.run} is held by another launcher in this Redis "
                        f"({self.keys.launcher} keeps beating: a second --resume of it?): "
                        "stop it before resuming the run"
                    )
                self.r.delete(self.keys.launcher)
                raise RunStateError(
                    f"run {self.keys.run} still has live processes in this Redis ({beating[0]} "
                    "keeps beating): stop them before resuming it"
                )
            time.sleep(0.1)  # polling for the stopped run's heartbeats to expire
        clean_run(self.r, self.keys, keep=[self.keys.launcher])
        self._beat_at = time.monotonic() + ttl_ms / 3000

    def _poll(self) -> tuple[bool, str | None]:
        """(every process is done, the first failure): here, from the processes' exit codes.
        A worker that dies mid-run is a failure unless the run can go on without it; the
        exit of one that was declared dead, or whose id a replacement took, is not news.
        While Redis is away (``_broker_lost`` polls too) an exit waits for it to come back."""
        failure: str | None = None
        replaced: set[int] = set()
        try:
            failure = self._sync_membership()  # its neighbours may have noticed first
            reported = set(self._reports()) if self.rejoined else None
            if reported is not None:  # replacements are not our processes: Redis tells
                replaced = self.rejoined & reported
            failure = failure or self._silent(reported) or self._never_joined()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.unanswered = exc  # _follow waits for Redis (_broker_lost) at once
        try:  # a node stopped the run (one it cannot do without died, a model diverged)
            stop = self.r.get(self.keys.stop)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.unanswered, stop = exc, None
        for p in self.procs:
            code = p.popen.poll() if p.code is None else None
            if code is None:
                continue
            try:
                if code != 0 and self._superseded(p.worker):
                    self.notes.append(_why(p, code))  # e.g. it woke from a freeze, dead
                elif code < 0 and not self.command and p.worker in self._reports():
                    # killed once its result was in: a built-in worker had nothing left to do
                    # (one that exits with an error met one; a script's own code after
                    # ctx.finish() may still have work: their failures stay failures)
                    self.ended_after_report.add(p.worker)
                    self.notes.append(
                        f"{_why(p, code)}, after reporting its result: its part of the run "
                        "was complete"
                    )
                elif code != 0 and failure is None and not stop:  # once stopped: the stop's
                    failure = self._lose(p.worker, _why(p, code), gone=True)  # reason, below
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.unanswered = exc
                continue  # look at this exit again once Redis is back
            p.code = code
        if failure is None and stop is not None:
            failure = read.stop_reason(stop)
        ended = self.lost.keys() | self.ended_after_report | replaced
        done = all(p.code == 0 or p.worker in ended for p in self.procs)
        if not done and failure is None and self.unanswered is None:
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                self._note_late({p.worker for p in self.procs if p.code is None})
        return done, failure

    def _silent(self, reported: set[int] | None = None) -> str | None:
        """The failure, if any, once a worker went silent: without a heartbeat and without a
        result for a renewal period (``_lapsed``), though its neighbours did not declare it
        dead. A replacement is not our process: Redis alone tells when it dies once its
        neighbours are done. One of ours may still run yet be frozen, starved of CPU or cut
        off from Redis at the end, when no neighbour waits on it. Either is judged as a
        neighbour would (``_lose``). A worker without a counter has not started, or has not
        put it back after a broker restart: not dead. Looked at every SILENT_LOOK_S at most.
        ``reported``: the workers whose final report is in, where the caller read them now."""
        now = time.monotonic()
        if now < self._silent_at:
            return None
        self._silent_at = now + SILENT_LOOK_S
        running = {p.worker for p in self.procs if p.code is None and p.popen.poll() is None}
        watched = sorted(((running & set(range(self.topo.n))) | self.rejoined) - set(self.lost))
        if not watched:
            return None
        counters = self.r.mget([self.keys.iter(i) for i in watched])
        started = {i for i, c in zip(watched, counters, strict=True) if c is not None}
        failure = None
        said = said_why(self.r, self.keys, self.topo.n) if self._missing else {}
        if reported is None:
            reported = set(self._reports())
        for i in self._lapsed(started, reported, margin=2 * SILENT_LOOK_S):
            whose = "'s replacement" if i in self.rejoined else ""
            still = "" if whose else " (its process is still there: frozen, or cut off)"
            told = f": {said[i][1]}" if i in said else still  # why, if it said (ctx.close)
            why = f"{self._name(i)}{whose}: {self._silence(i)}{told}"
            failure = failure or self._lose(i, why, gone=False)
        return failure

    def _never_joined(self) -> str | None:
        """The failure of a script's run none of whose copies has entered it (registered its
        endpoint, or put up its counter) --timeout, and at least JOIN_GRACE_S, after they were
        started: a script that never calls hopbus.join() and trains, or hangs before it does.
        One copy that never comes is its neighbours' to tell (``Node._wait_endpoints``, after
        --timeout); when none comes, no one waits on anyone, and the run would wait forever."""
        if not self.command or self._entered or self._spawned_at is None:
            return None
        limit = max(self.cfg.timeout, JOIN_GRACE_S)
        if time.monotonic() - self._spawned_at < limit:
            return None
        ours = [p.worker for p in self.procs]
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(self.keys.addr, [str(i) for i in ours])
        pipe.mget([self.keys.iter(i) for i in ours])
        endpoints, counters = pipe.execute()
        if any(v is not None for v in (*endpoints, *counters)):
            self._entered = True
            return None
        return (
            f"no worker entered the run within {limit:g} s of its start: every copy of "
            f"`{self._shown_command()}` is still running without having joined and begun "
            "training (each calls hopbus.join(), then model.fit with "
            "hopbus.keras.HopCallback(ctx), or ctx.start() and ctx.begin()/ctx.end() around its "
            "steps; a slower start-up? raise --timeout)"
        )

    def _shown_command(self) -> str:
        """What its processes run, as a line shows it."""
        return shown_command(self.command or ["hopbus", "worker"])

    def _after_outage(self) -> None:
        """Redis was away, or came back as another instance: heartbeats missing now may be
        the outage's (a worker's next beat puts its key back, or its restore does), so none
        is judged silent before a whole heartbeat TTL has passed."""
        self._missing = {}
        self._silent_at = time.monotonic() + self.cfg.heartbeat + SILENT_LOOK_S

    def _only_lingering(self) -> bool:
        """Whether every process of the run still running belongs to a worker whose final
        report is in (a script that lingers after its part), and none failed: a Ctrl-C then
        stops those processes and ends the run as finished, its results being complete. So
        too when every process has exited 0 (each does once its part is done) and this one
        had not looked yet."""
        codes = [(p.worker, p.popen.poll()) for p in self.procs]
        if any(code not in (None, 0) for _, code in codes):
            return False
        running = {worker for worker, code in codes if code is None}
        if not running:
            return bool(self.procs)
        try:
            return running <= set(self._reports())
        except redis.RedisError:
            return False

    def _stop_lingering(self) -> None:
        from hopbus.runtime.node import names

        running = [p.worker for p in self.procs if p.popen.poll() is None]
        if not running:
            return
        self.stop_workers()
        self.notes.append(
            f"Ctrl-C: stopped the processes of {names(running)}, which had reported "
            "their results; the run is complete"
        )

    def _note_late(self, waiting: set[int], reported: set[int] | None = None) -> None:
        """Of the workers in ``waiting``, those the progress stream saw enter the run's last
        iteration --timeout ago or more: said once each, whether still without a final report
        (``reported``, or read now) or reported with their process still running (a script
        that lingers after its part). A final evaluation, or a script's own work after
        training, may be slow, so the run waits on for them rather than fail; the note says
        so, and that Ctrl-C stops it."""
        views = [] if self.replay is None else self.replay.views
        now = time.monotonic()
        late = []
        for i in sorted(waiting - self._late - set(self.lost)):
            at_end = i < len(views) and views[i].iteration >= self.cfg.iterations
            if at_end and now - self._at_end.setdefault(i, now) >= self.cfg.timeout:
                late.append(i)
        if late and reported is None:
            reported = set(self._reports())
        for i in late:
            self._late.add(i)
            ago = now - self._at_end[i]
            if i in (reported or set()):  # its part is done: what it does now is its own
                self.notes.append(
                    f"{self._name(i)} reported its result, but its process "
                    f"(`{self._shown_command()}`) has not "
                    f"exited {ago:.0f} s after its last iteration: the run's results are "
                    "complete; the run waits for it to exit (Ctrl-C stops it and ends the run "
                    "as finished)"
                )
            else:
                self.notes.append(
                    f"{self._name(i)} entered the run's last iteration {ago:.0f} s ago and has "
                    "not reported its result: a slow final evaluation, or it hangs; the run "
                    "waits for it (Ctrl-C stops it)"
                )

    def _superseded(self, worker: int) -> bool:
        """Whether ``worker``'s id belongs to the dead set or to a replacement by now."""
        return worker in self.lost or worker in self.rejoined or worker in self._incarnations

    def _name(self, node: int) -> str:
        from hopbus.runtime.node import names

        return names([node], self.topo.n if self.cfg.mode.family is Family.PS else None)

    def _lapsed(self, nodes: set[int], finished: set[int], margin: float = 0.0) -> list[int]:
        """Those of ``nodes`` seen without a heartbeat and without a result at every look for
        a whole renewal period (--heartbeat / 3) and at two looks at least: a live node puts
        its heartbeat back within one period, whether a restarted Redis lost it or something
        deleted it. ``finished``: the nodes whose final report counts; one whose heartbeat
        says it finished, but whose report does not count, is as silent as one without a
        heartbeat (it is in ``self.uncounted``): its report disagrees with the run's recorded
        settings or its counter, and it will write no other."""
        from hopbus.coord.control import heartbeats

        now = time.monotonic()
        beats = heartbeats(self.r, self.keys, sorted(nodes - finished))
        gone = {i for i, beat in beats.items() if not read.beating(*beat)}
        self.uncounted = {i for i in gone if not read.gone(*beats[i])}
        seen = {i: self._missing.get(i) for i in gone}
        self._missing = {i: now if t is None else t for i, t in seen.items()}
        period = self.cfg.heartbeat / 3 + margin
        return sorted(i for i, t in seen.items() if t is not None and now - t >= period)

    def _silence(self, i: int) -> str:
        """What ``_lapsed`` found of node ``i``, in words for its loss."""
        if i not in self.uncounted:
            return "heartbeat gone without a result"
        return (
            "it says it finished, but its final report does not count (it disagrees with the "
            "run's recorded iterations, its counter or its incarnation: were the run's keys "
            f"rewritten? hopbus inspect --run {self.keys.run}{redis_flag(self.redis_url)} shows "
            "them)"
        )

    def _sync_membership(self) -> str | None:
        """Follow the run's dead set and incarnations: a worker that entered the dead set died
        (a replacement, or a worker whose neighbours noticed first); a newer incarnation of a
        worker that is out of the dead set is a replacement that took its place (``hopbus
        worker --rejoin``), even if its death came and went between two looks. Returns the
        failure once the dead are more than the mode goes on without: the run is stopped here
        too, since no one else may be left to (every worker dead, or the others done)."""
        dead, incarnations = self._membership()
        for i, n in sorted(incarnations.items()):
            if i not in dead and self._incarnations.get(i) != n:
                self._incarnations[i] = n
                self.lost.pop(i, None)
                self.rejoined.add(i)
                it = read.integer(self.r.get(self.keys.iter(i))) or 0
                self.notes.append(f"{self._name(i)} rejoined in iteration {it} (a replacement)")
        failure = None
        for i in sorted(dead - set(self.lost)):
            self.lost[i] = f"{self._name(i)} was declared dead (the run's dead set holds it)"
            reason = survivable(self.cfg.protocol_settings(), self.topo, set(self.lost))
            if reason is None:
                self.notes.append(f"{self.lost[i]}; the run goes on without it")
                continue
            self.notes.append(self.lost[i])  # the failure says why it stops
            if failure is None:
                control = RunControl(self.r, self.keys, -1, iterations=self.cfg.iterations)
                failure = control.stop_run(f"{self.lost[i]}; {reason}")
        return failure

    def _lose(self, node: int, why: str, *, gone: bool) -> str | None:
        """Node ``node`` is gone (``why``). Returns None if the run goes on without it: a Hop
        worker that had started, within what the mode tolerates (protocol/membership.py);
        otherwise the failure to report, after stopping the run for every node. ``gone``: the
        process is known to have ended (not just its heartbeat)."""
        control = RunControl(self.r, self.keys, -1, iterations=self.cfg.iterations)
        control.epoch = control.broker_id()  # judged as the broker it is now sees the run
        reason: str | None = why
        if self.cfg.mode.is_hop and node < self.topo.n and self.r.exists(self.keys.iter(node)):
            dead = set(self.lost) | {node}
            reason = survivable(self.cfg.protocol_settings(), self.topo, dead)
            if reason is None:
                if not control.declare_dead(node, force=gone):  # beating again, or finished
                    return why if gone else None  # (a watcher looks again later)
                self.lost[node] = why
                self.notes.append(f"{why}; the run goes on without it")
                return None
            reason = f"{why}; {reason}"
        control.stop_run(reason)
        return reason

    def _new_replay(self, t0: float) -> Replay:
        setting = self.cfg.gap_setting()
        if self.resume_from is None:  # a watch: workers started by hand with --resume-from c
            self.resume_from = self._recorded_resume()
        return Replay(
            self.topo, setting, t0, self.cfg.target_loss, start=self.resume_from or 0,
            iterations=self.cfg.iterations, partial=self._cut,
        )  # fmt: skip

    def _recorded_resume(self) -> int | None:
        """The iteration the run's workers resumed from, as the first of them recorded it
        before its start event (builtin.Checkpoints), if it is one within the run (the
        checkpoints they resume from may have been written with another --checkpoint-every
        than the run now has)."""
        return read.integer(self.r.hget(self.keys.meta, RESUMED_FROM), 1, self.cfg.iterations - 1)

    # -- following the run ------------------------------------------------------------------------
    def _feed(self, entries: list[Entry], metrics: TextIO, *, t0: float | None = None) -> bool:
        """Replay ``entries`` and write them to metrics.jsonl. Time zero is the first start
        event (or ``t0`` if there is none yet); without either, returns False, feeding nothing."""
        if self.replay is None:
            start = first_start(self.r, self.keys) or t0
            if start is None:
                return False
            self.replay = self._new_replay(start)
        self.malformed += sum(rec is None for _, rec in entries)
        parsed = [(i, rec) for i, rec in entries if rec is not None]
        horizon = self._loss_horizon() if parsed else (0, 0)
        if horizon > self._horizon:  # entries deleted since the last look: whose, unknown
            self._horizon = horizon
            n = self.topo.n
            self.replay.doubt(w for w in range(n) if self._last_fed.get(w, (0, 0)) < horizon)
        credible = self._credible(parsed)
        with interrupts.deferred():  # what the replay holds, metrics.jsonl holds
            for entry_id, rec in credible:
                at = read.stream_id(entry_id)
                fed = self.replay.feed(rec, lost_before=at <= self._horizon)
                if fed is not None:
                    self._last_fed[rec["worker"]] = at
                    if self.t_offset:  # a resumed run's time goes on from where its file ends
                        fed["t"] = round(fed["t"] + self.t_offset, 6)
                    try:
                        metrics.write(dumps(fed) + "\n")
                    except OSError as exc:  # a disk full
                        raise _unwritable(metrics.name, exc) from None
            try:
                metrics.flush()  # a disk full found here, not as the file closes at the end
            except OSError as exc:
                raise _unwritable(metrics.name, exc) from None
        if entries:
            self._read_upto = max(self._read_upto, read.stream_id(entries[-1][0]))
        return True

    def _loss_horizon(self) -> tuple[int, int]:
        """The newest id of the progress stream under which entries were deleted (XDEL) or
        trimmed away while the stream held newer ones (Redis 7's XINFO STREAM says both), or
        below the first entry of a stream deleted and begun again (its entries-added count
        starts over; or, grown past the old count by the next look, its first entry is newer
        than the last one this reader read): a worker whose last entry read lies below it may
        have lost entries this reader never saw (``Replay.doubt``): no gap with it is judged
        until its next step, and its next entry is taken where it puts it, not refused for the
        steps it skips. (0, 0) where nothing was lost or Redis cannot tell."""
        try:
            info = self.r.xinfo_stream(self.keys.progress)
        except redis.ResponseError:  # no stream, or another type: the reads say so
            return (0, 0)
        deleted = read.stream_id(info.get("max-deleted-entry-id"))
        first = info.get("first-entry")
        first_id = read.stream_id(first[0]) if isinstance(first, list | tuple) and first else (0, 0)
        trimmed = (first_id[0], first_id[1] - 1) if first_id[1] else (first_id[0] - 1, 2**63)
        added = read.integer(info.get("entries-added"))
        length = read.integer(info.get("length"))
        cut = added is not None and length is not None and added > length
        if added is not None:
            cut = cut or added < self._added  # deleted and begun again since the last look
            self._added = added
        # everything read so far is gone: trimmed, or the stream deleted and begun again
        cut = cut or (self._read_upto > (0, 0) and first_id > self._read_upto)
        return max(deleted, trimmed if cut else (0, 0))

    def _credible(
        self, entries: list[tuple[str, dict[str, Any]]]
    ) -> list[tuple[str, dict[str, Any]]]:
        """Those of ``entries`` no further than their worker's counter is now (one MGET): the
        Advance script moves the counter and writes the entry in one step, so an entry ahead
        of its worker's counter was written by something else. Refused entries are counted in
        the replay's ``rejected``. A counter Redis does not hold (a restart being put back)
        decides nothing, nor does any for entries read before an outage: the broker that
        answers now may be another, restored from a stale snapshot, whose counters stand
        behind what the one that went had written (refusing those entries made gaps)."""
        workers = sorted({rec["worker"] for _, rec in entries if 0 <= rec["worker"] < self.topo.n})
        if not workers:
            return entries
        counters = dict(
            zip(workers, self.r.mget([self.keys.iter(w) for w in workers]), strict=True)
        )
        marked = self._marked(entries)
        out = []
        for entry in entries:
            rec = entry[1]
            earlier = read.stream_id(entry[0]) <= self._read_before_outage  # another broker's
            counter = None if earlier else read.integer(counters.get(rec["worker"]))
            forged = (rec.get("dead") or rec.get("rejoin")) and rec["worker"] not in marked
            if forged or (counter is not None and rec["iter"] > counter):
                assert self.replay is not None
                self.replay.rejected += 1
                continue
            out.append(entry)
        return out

    def _marked(self, entries: list[tuple[str, dict[str, Any]]]) -> set[int]:
        """The workers among ``entries``' death and rejoin markers that did die: in the dead
        set now, or replaced since (an incarnation recorded). Only the Lua scripts that
        declare a death or let a replacement in write these markers; one for a worker that
        never died was written by something else, and would fake a gap. One round trip, and
        only when there are markers."""
        named = {rec["worker"] for _, rec in entries if rec.get("dead") or rec.get("rejoin")}
        if not named:
            return set()
        dead, incarnations = self._membership()
        return named & (dead | set(incarnations))

    def _unmarked_deaths(self) -> None:
        """Workers in the run's dead set whose death the replay has not seen: the workers and
        the scripts go on without them from the moment the set holds them, so the replay does
        too (``Replay.declare_dead``), before the entries read with it are judged."""
        if self.replay is None:
            return
        dead, _ = self._membership()
        for i in sorted(dead - self.replay.monitor.gone):  # where the replay has it so far
            self.replay.declare_dead(i, self.replay.views[i].iteration, time.time())

    def _membership(self) -> tuple[set[int], dict[int, int]]:
        """The run's dead set, and its incarnations (worker -> its newest replacement's
        number), in one round trip; malformed members and entries left out."""
        pipe = self.r.pipeline(transaction=False)
        pipe.smembers(self.keys.dead).hgetall(self.keys.incarnation)
        members, incarnations = pipe.execute()
        pairs = (
            (read.integer(k, 0, self.topo.n - 1), read.incarnation_of(v))
            for k, v in incarnations.items()
        )
        return read.ids(members, self.topo.n), {i: n for i, n in pairs if i is not None and n}

    def _follow(self, metrics: TextIO) -> Outcome:
        cursor = "0-0"
        pending: list[Entry] = []
        outage = Outage(self.cfg.timeout)
        last_read, behind = 0.0, False
        try:
            while True:
                interrupts.check()  # a Ctrl-C whose KeyboardInterrupt something swallowed
                pace = last_read + FOLLOW_S - time.monotonic()
                exited = any(p.popen.poll() is not None for p in self.procs)
                if pace > 0 and not behind and not exited:
                    time.sleep(pace)  # pacing the reads (FOLLOW_S); one that exited: look now
                last_read = time.monotonic()
                try:
                    entries = read_entries(
                        self.r, self.keys.progress, cursor, block_ms=200, count=FOLLOW_BATCH
                    )
                    behind = len(entries) == FOLLOW_BATCH  # a full batch: read on at once
                    if entries:
                        cursor = entries[-1][0]
                        pending.extend(entries)
                    if pending:
                        self._unmarked_deaths()  # before the entries that follow a death
                    if pending and self._feed(pending, metrics):
                        pending.clear()
                    done, failure = self._poll()
                    if self.unanswered is not None:  # a read in _poll found Redis away
                        raise self.unanswered
                    self._beat()
                    self._check_broker()
                except redis.ResponseError as exc:  # e.g. the progress stream turned into a string
                    failure = self._refused(exc)
                    with contextlib.suppress(redis.RedisError):  # every node stops with the run
                        RunControl(self.r, self.keys, -1).stop_run(failure)
                    break
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    self.unanswered = None
                    if pending:  # judged by the counters of the broker they were read from
                        self._read_before_outage = read.stream_id(pending[-1][0])
                    first, too_long = outage.lost(time.monotonic())
                    if too_long:  # it answers, then drops us, again
                        failure = (
                            f"Redis at {redact(self.url)} kept dropping the connection for more "
                            f"than {self.cfg.timeout:g} s ({exc})"
                        )
                        break
                    # one note per outage: a broker that keeps dropping us does not flood stderr
                    failure = self._broker_lost(exc, note=first)
                    if failure is not None:
                        break
                    continue
                outage.answered(time.monotonic())
                if self.on_update is not None:
                    try:
                        self.on_update(self)
                    except OSError as exc:
                        raise OutputFailed(f"its output failed ({exc.strerror or exc})") from None
                    except SystemExit:  # rich's answer to a pipe closed (| head): it exits
                        raise OutputFailed("its output failed (its pipe closed)") from None
                if failure is not None or done:
                    break
        except KeyboardInterrupt:
            self.r = quick(self.url)  # from here on: a frozen Redis holds up no stop
            if not self._only_lingering():
                if not self.follows_only:
                    self._summarize_stopped(cursor, pending, metrics)
                raise
            failure = None  # the run is done: its summary is written, as a finished run's
            self._stop_lingering()
        if failure is not None:  # its processes' last counters, before the summary reads them
            self.stop_workers()  # (each leaves them as it goes: Node._last_stats)
            if self.follows_only:
                self._let_them_stop()
        self._catch_up(cursor, pending, metrics)
        summary = self._summary(failure)
        return Outcome(summary, summary.get("failure"))

    def _let_them_stop(self) -> None:
        """A watch of a run that failed: the workers, started elsewhere, learn of the stop
        within a heartbeat period (their heartbeat thread reads the stop key) and may step
        on meanwhile. Their counters are read each period until they stand still (at most
        --timeout), so that the summary counts those steps too: it had them where the watch
        saw the stop (iteration 7 of workers that reached 21)."""
        if self.broker_gone:
            return
        period = min(self.cfg.heartbeat, self.cfg.timeout) / 3 + SILENT_LOOK_S
        deadline = time.monotonic() + self.cfg.timeout
        keys = [self.keys.iter(i) for i in range(self.topo.n)]
        last = None
        with contextlib.suppress(redis.RedisError):
            if not self.r.exists(self.keys.stop):  # a failure no worker hears of: no wait
                return
            while time.monotonic() < deadline:
                now = self.r.mget(keys)
                if now == last:
                    return
                last = now
                time.sleep(period)  # a heartbeat period: every node has read the stop by then

    def _catch_up(self, cursor: str, pending: list[Entry], metrics: TextIO) -> None:
        """Every progress entry up to the end into the replay and metrics.jsonl, a failed or
        stopped run's too: the summary tells it all. Not once Redis is known gone: feeding
        asks it too (the start, the counters), and nothing would answer."""
        if self.broker_gone:
            return
        try:
            while entries := read_entries(self.r, self.keys.progress, cursor, count=10_000):
                cursor = entries[-1][0]
                pending.extend(entries)
            self._feed(pending, metrics, t0=self.t_start)
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            pass  # Redis is gone, or the stream is not one any more: what was read is all

    def _summarize_stopped(self, cursor: str, pending: list[Entry], metrics: TextIO) -> None:
        """A run stopped by Ctrl-C or SIGTERM: its processes stopped, then its summary of
        what was done (the progress up to the stop, the gaps, the iterations reached), for
        ``_finish`` to write as summary.json, ``finished: false``, its failure the stop; or,
        should every final report have come in meanwhile (processes deaf to SIGTERM that
        ended in the grace), the summary of a finished run. Redis is asked with a second's
        patience at most: nothing may hold up the stopping (a second Ctrl-C goes through:
        it is no Exception)."""
        self.stop_workers()
        with contextlib.suppress(Exception):
            try:
                self.r.ping()
            except redis.RedisError:  # frozen or gone: the progress read so far is all
                self.broker_gone = True
            self._catch_up(cursor, pending, metrics)
            server = {self.topo.n} if self.cfg.mode.family is Family.PS else set()
            nodes = (set(range(self.topo.n)) - set(self.lost)) | server
            done = not self.broker_gone and nodes <= set(self._reports())
            self.stopped_summary = self._summary(
                None if done else f"the run was {INTERRUPTED_LINE}"
            )

    @property
    def _finished_as_stopped(self) -> bool:
        """Every final report came in as its processes were stopped (``_summarize_stopped``)."""
        return self.stopped_summary is not None and self.stopped_summary["finished"] is True

    def _watch_hint(self) -> None:
        """After a Ctrl-C that stopped only this process (a watch): what it left going."""
        with contextlib.suppress(Exception):  # a hint: nothing may stop the stopping
            print(
                f"hopbus: the watch stopped, run {self.keys.run} goes on; the same hopbus watch "
                f"follows it again from its start into {self.out}",
                file=sys.stderr,
                flush=True,
            )

    def _resume_hint(self) -> None:
        """After a Ctrl-C that stopped the run: where what it wrote is (its metrics and
        logs so far), and how to go on, where its checkpoints allow."""
        with contextlib.suppress(Exception):  # a hint: nothing may stop the stopping
            if self._finished_as_stopped:
                print(
                    f"hopbus: run {self.keys.run} finished as it was stopped (every worker's "
                    f"final report is in); its results are in {self.out}",
                    file=sys.stderr,
                    flush=True,
                )
                return
            at = newest_complete(self.out / CHECKPOINTS, self.topo.n)
            then = (
                f"; its checkpoints reach iteration {at}: hopbus train --resume {self.out} goes "
                "on from there"
                if at is not None
                else ""
            )
            what = "metrics, summary" if self.stopped_summary is not None else "metrics"
            print(
                f"hopbus: run {self.keys.run} stopped; its {what} and logs so far are in "
                f"{self.out}{then}",
                file=sys.stderr,
                flush=True,
            )

    def _broker_lost(self, exc: BaseException, *, note: bool = True) -> str | None:
        """Redis went away. A private redis-server that died is started again at its address;
        any other is waited for with backoff, up to --timeout. Once it answers, the run's
        record is put back if it was lost (the workers put back their own state). Returns the
        failure if it does not come back or a worker fails meanwhile. ``note``: say so (the
        first loss of an outage; the losses that follow it before Redis holds again do not)."""
        if note:
            self.notes.append(f"lost Redis at {redact(self.url)} ({exc}); waiting for it")
        patient, self.r = self.r, quick(self.url)  # a frozen broker costs a second a call
        deadline = time.monotonic() + self.cfg.timeout
        for _ in attempts(self.cfg.timeout):
            interrupts.check()
            if self.broker is not None and self.broker.died:
                with contextlib.suppress(Exception):
                    self.broker.restart()
            try:
                self.r.ping()
                break
            except redis.AuthenticationError as refused:  # back, with other credentials
                return (
                    f"Redis at {redact(self.url)} answers again but refuses this run's "
                    f"credentials ({read.refusal(refused)}): was it restarted with another "
                    "password or ACL file?"
                )
            except (redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() < deadline:  # its reads may take a second each, too
                    _, failure = self._poll()
                    self.unanswered = None
                    if failure is not None:
                        return failure
        else:
            self.broker_gone = True  # the end-of-run reads are skipped: nothing would answer
            return (
                f"lost Redis at {redact(self.url)} and it did not come back within "
                f"{self.cfg.timeout:g} s"
            )
        self.r = patient
        self.epoch = broker_id(self.r)
        self._put_back(note=note)
        return None

    def _put_back(self, *, note: bool = True) -> None:
        """Redis answers again: the run's record put back if it restarted without it (the
        workers put back their own state), and said."""
        self._after_outage()
        back = "Redis is back"
        if not self.r.exists(self.keys.meta):  # it restarted empty
            restore_run(self.r, self.keys, self.cfg.public(), __version__)
            back += "; the run's record is put back, and each worker puts back its own state"
        if note or not self.notes[-1].startswith("Redis is back"):
            self.notes.append(back)

    def _check_broker(self) -> None:
        """A broker that restarted between two reads (its run id changed, or, where INFO is
        not allowed, the run's record is gone): the client reconnected on its own, so no
        read failed and ``_broker_lost`` never heard of it. Said, and the run's record put
        back, as after an outage that was seen."""
        now = broker_id(self.r)
        restarted = bool(now and self.epoch and now != self.epoch)
        self.epoch = now or self.epoch
        if restarted:
            self.notes.append(f"Redis at {redact(self.url)} restarted (another instance)")
        elif self.r.exists(self.keys.meta):
            return
        else:
            self.notes.append(f"Redis at {redact(self.url)} no longer holds the run's record")
        self._put_back()

    def _reports(self) -> dict[int, dict[str, Any]]:
        """The final reports that count (``read.result``): a worker's agrees with its counter
        and incarnation and says the run's last iteration; the parameter server's (node N) is
        a JSON object. Others (forged, a replaced process's) are left out and counted in
        ``self.rejected_reports``."""
        n = self.topo.n
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self.keys.result)
        pipe.mget([self.keys.iter(i) for i in range(n)])
        pipe.hgetall(self.keys.incarnation)
        pipe.mget([self.keys.hb(i) for i in range(n)])
        raw, counters, incarnations, beats = pipe.execute()
        out: dict[int, dict[str, Any]] = {}
        bad = 0
        for k, v in raw.items():
            i = read.integer(k, 0, n)
            if i == n and self.cfg.mode.family is Family.PS:
                got = read.json_object(v)
            elif i is not None and i < n:
                got = read.result(
                    v, counter=counters[i], incarnation=incarnations.get(str(i).encode()),
                    iterations=self.cfg.iterations, beat=beats[i],
                )  # fmt: skip
            else:
                got = None
            if got is None:
                bad += 1
            else:
                out[i] = got
        self.rejected_reports = bad
        return out

    def _results(self) -> dict[int, dict[str, Any]]:
        """Every node's result that counts; for a worker without one, its last counters."""
        results = self._reports()
        for i in range(self.topo.n):
            if i not in results:
                try:
                    stats = self.r.hgetall(self.keys.stats(i))
                except redis.ResponseError:  # another type there: no counters to show
                    continue
                counters = {}
                for k, v in stats.items():
                    name, value = read.text(k, 64), read.integer(v)
                    if name is not None and value is not None and name not in read.REPORT_FIELDS:
                        counters[name] = value
                if counters:
                    results[i] = counters
        return results

    def _summary(self, failure: str | None) -> dict[str, Any]:
        if failure is not None:  # it may quote what anything wrote into the run's keys
            failure = scrub(failure, self.url)
        if self.replay is None:
            self.replay = self._new_replay(self.t_start)
        try:
            results = {} if self.broker_gone else self._results()
        except redis.ResponseError as exc:  # the reports' hash turned into another type
            results, failure = {}, failure or self._refused(exc)
        except (redis.ConnectionError, redis.TimeoutError):  # Redis never came back: what the
            results = {}  # progress stream showed is all there is to summarize
        server = results.pop(self.topo.n, None)  # the parameter server's, in ps-* runs
        live = [i for i in range(self.topo.n) if i not in self.lost]
        if failure is None and not live:  # never a run finished by no one
            failure = "every worker was declared dead; none is left to finish the run"
        finished = failure is None and all("final_accuracy" in results.get(i, {}) for i in live)
        unreported = [i for i in live if "final_accuracy" not in results.get(i, {})]
        if failure is None and unreported:  # every process ended well: Redis lost the reports
            failure = (
                "every process ended, but Redis holds no final report of "
                f"{', '.join(self._name(i) for i in unreported[:5])}"
                f"{' and others' if len(unreported) > 5 else ''} (did it restart empty after "
                "they finished?); the workers' logs say how they ended"
            )
        bounds = [s.store_bound for s in self.specs if s.store_bound is not None]
        queues: list[dict[str, int | None]] = []  # those that break Theorem 2, at a finish
        try:
            if finished and self.cfg.mode.is_hop:
                queues = token_invariant_violations(
                    self.r, self.keys, self.topo, self.cfg.max_ig, dead=set(self.lost)
                )
            # None: not looked at, in a run that did not finish (its queues mid-flight); 0
            # outside Hop's modes, which have no token queues
            token_check = len(queues) if finished else None
        except redis.ResponseError as exc:  # a token queue turned into another type
            token_check, finished, failure = None, False, self._refused(exc)
        ends = [r["t"] for r in results.values() if "t" in r]
        wall = (max(ends) - self.replay.t0) if ends and finished else time.time() - self.replay.t0
        summary = summarize_run(
            self.cfg.public(),
            self.topo,
            self.replay,
            results,
            wall_s=wall,
            finished=finished,
            runtime_s=time.time() - self.t_start,
            token_check=token_check,
            update_queue_bound=max(bounds) if bounds else None,
            failure=failure,
        )
        wrongtype = failure is not None and "WRONGTYPE" in failure
        named = failure is not None and ANOTHER_TYPE in failure  # by a worker's line already
        not_lists = any(q["size"] is None for q in queues)  # token queues of another type
        if ((wrongtype and not named) or not_lists) and not self.broker_gone:
            found = misplaced(self.r, self.keys)  # the refusal names no key: these are why
            if found:
                self.notes.append(f"run {self.keys.run}: {named_keys(found)}")
        summary["first_token_violation"] = queues[0] if queues else None  # checks: all counts
        summary["scheme"] = scheme_summary(self.cfg.mode, results, server)
        summary.update(server_model(server))
        summary.update(self._consensus(results, live))
        summary["diverged"] = self._diverged(failure)
        refused = {
            "progress_entries": self.replay.rejected + self.malformed,
            "final_reports": self.rejected_reports,
        }
        summary["refused"] = refused
        if any(refused.values()):
            self.notes.append(
                f"refused {refused['progress_entries']} progress entries and "
                f"{refused['final_reports']} final reports found in Redis that no worker of "
                "this run wrote as they stand (malformed, ahead of their worker, or forged)"
            )
        summary["progress_missed"] = self.replay.missed
        if self.replay.missed:
            self.notes.append(
                f"{self.replay.missed} times a worker's progress entries were deleted from the "
                "stream before this reader read them: each time, it was placed where its next "
                "entry put it, no gap judged with it until its next step"
            )
        if self.resume_from is not None:
            summary["resumed_from"] = self.resume_from
            summary["resumed_at_s"] = round(self.t_offset, 6)  # metrics.jsonl's t at the resume
        with contextlib.suppress(redis.RedisError):  # worker 0's x_0: the big key, not needed now
            if not self.broker_gone:
                self.r.delete(self.keys.initial)
        return summary

    def _diverged(self, failure: str | None) -> dict[str, Any] | None:
        """The worker whose model stopped being finite (its ``diverged`` event): ``worker``,
        ``iteration``, ``what``; None if none did. Only the one the run's failure names (the
        worker whose stop won writes the event): a forged event in a run that finished, or
        failed otherwise, is no divergence."""
        if failure is None or self.broker_gone:
            return None
        try:
            for _, rec in read_all(self.r, self.keys.events, events=True):
                if rec is None or rec.get("kind") != "diverged":
                    continue
                said = f"worker {rec.get('worker')} diverged in iteration {rec.get('iteration')}:"
                if said in failure:
                    return {
                        "worker": rec.get("worker"),
                        "iteration": rec.get("iteration"),
                        "what": rec.get("what"),
                    }
        except redis.RedisError:  # gone, or the stream turned into another type: not known
            pass
        return None

    def _consensus(self, results: dict[int, dict[str, Any]], live: list[int]) -> dict[str, Any]:
        """``consensus_distance``: max_i ||x_i - mean|| / ||mean|| over the live workers'
        final parameters, from their sketches (hopbus/consensus.py); null if unknown."""
        from hopbus.consensus import distance

        try:
            raw = {} if self.broker_gone else self.r.hgetall(self.keys.sketch)
        except redis.ResponseError as exc:  # another type there: the distance is not known
            raw = {}
            self.notes.append(
                f"the consensus distance is unknown: Redis refused the workers' sketches in "
                f"{self.keys.sketch} ({read.refusal(exc)}): "
                f"{read.refused_because(exc, 'did something else write its keys?')}"
            )
        except redis.RedisError:  # gone: the distance is not known
            raw = {}
        sketches = {}
        for k, v in raw.items():
            with contextlib.suppress(ValueError):
                i = int(k)
                if i in live and "final_accuracy" in results.get(i, {}):
                    sketches[i] = np.frombuffer(v, dtype=np.float64)
        got = distance(sketches)
        exact = all(results[i].get("sketch_exact", False) for i in sketches) if sketches else None
        return {
            "consensus_distance": None if got is None else got["max"],
            "consensus": None
            if got is None
            else {"per_worker": got["per_worker"], "exact": exact, "workers": len(sketches)},
        }


class Watcher(Launcher):
    """Follows a run whose processes were started elsewhere (docker compose, other hosts):
    the same replay, metrics.jsonl and summary as ``hopbus train``, but it starts nothing.
    Done when every node has published a result that counts; a node whose heartbeat is gone
    without a result is a lost node as for ``hopbus train`` (the run goes on without it where
    the mode can, else it fails), and its error event, if it posted one, says why; failed once
    the run is stopped. It never
    changes a finished run's status, and otherwise records what the run's keys say."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.watched = self.keys.run
        self._events = "0-0"
        self._said: dict[int, str] = {}  # a node's error event: why, once its heartbeat is gone
        # a process that failed before taking its place (JOIN_FAILED): why, and since when
        self._join_failed: dict[int, tuple[str, float]] = {}

    follows_only = True

    def _start_broker(self) -> None:
        assert self.redis_url is not None
        self.url = self.redis_url
        self.r = connect(self.url, timeout=min(10.0, self.cfg.timeout))

    def _record_end(self, outcome: Outcome) -> None:
        """What the run's keys say (``run_status``); a finished run stays finished."""
        if self.r.hget(self.keys.meta, "status") != b"finished":
            status = run_status(self.r, self.keys, self.topo.n, self.cfg.iterations)
            set_status(self.r, self.keys, "failed" if outcome.failure else status)

    def _spawn(self) -> None:
        """A watcher starts nothing: the run's processes are someone else's."""

    def _joining_failed(self, who: int, why: str) -> None:
        """A process the join counter gave place ``who`` failed before taking it (its model
        did not load there): said at once; the run fails only if that place stays empty for
        --timeout (a process started for it with --id may still be loading its model). A
        place another process holds already is not news (nor is a forged event about it)."""
        if who in self._join_failed or taken(self.r, self.keys, who) is not None:
            return
        self._join_failed[who] = (why, time.monotonic())
        self.notes.append(
            f"{self._name(who)}'s process failed before taking its place: {why}; the run fails "
            f"unless a process takes it within --timeout ({self.cfg.timeout:g} s)"
        )

    def _empty_places(self) -> str | None:
        """The failure, once a place whose joining process failed stayed empty for --timeout."""
        for who, (why, since) in list(self._join_failed.items()):
            if taken(self.r, self.keys, who) is not None:
                del self._join_failed[who]  # another process has it: the run goes on
            elif time.monotonic() - since > self.cfg.timeout:
                return (
                    f"{self._name(who)}: {why} (no process took its place within "
                    f"{self.cfg.timeout:g} s)"
                )
        return None

    def _record(self) -> None:
        # the status is left as it is: a watch starts nothing (one that wrote "running" and
        # was stopped before any worker came left a run that never started "abandoned")
        with contextlib.suppress(redis.ResponseError):  # no stream yet
            info = self.r.xinfo_stream(self.keys.progress)
            added = read.integer(info.get("entries-added"))
            self._cut = added is not None and added > (read.integer(info.get("length")) or 0)

    def _poll(self) -> tuple[bool, str | None]:
        """From Redis alone: error events, the stop key, heartbeats, results. While Redis is
        away (``_broker_lost`` polls too) nothing is known: not done, no failure."""
        try:
            return self._look()
        except (redis.ConnectionError, redis.TimeoutError):
            return False, None

    def _look(self) -> tuple[bool, str | None]:
        n = self.topo.n
        ps = n if self.cfg.mode.family is Family.PS else None  # node N, when the run has one
        done = set(self._reports())
        if len(done) == n + (ps is not None):  # finished, whatever was written besides
            return True, None
        events = read_entries(self.r, self.keys.events, self._events, count=10_000, events=True)
        for event_id, rec in events:
            self._events = event_id
            assert rec is not None  # events always parse (leniently)
            who = rec.get("worker")
            kind = rec.get("kind")
            if kind in SAYS_WHY_GONE and who is not None and 0 <= who < n + (ps is not None):
                # anything that can write the stream can write this: it says why a node is
                # gone once its heartbeat is, and never makes a live one gone
                self._said.setdefault(who, _named(self._name(who), rec.get("message") or "failed"))
            elif kind == JOIN_FAILED and who is not None and 0 <= who < n:
                self._joining_failed(who, rec.get("message") or "failed")
        failure = self._empty_places()
        if failure is not None:
            return False, failure
        stop = self.r.get(self.keys.stop)
        if stop is not None:
            return False, read.stop_reason(stop)
        registered = read.ids(self.r.hkeys(self.keys.addr), n + 1)
        for i in self._lapsed((registered | set(self._said)) - set(self.lost), done):
            why = self._said.get(i) or f"{self._name(i)}: {self._silence(i)}"
            failure = self._lose(i, why, gone=False)
            if failure is not None:
                return False, failure
        failure = self._sync_membership()  # declared by its neighbours, or replaced
        if failure is not None:
            return False, failure
        self._note_late(set(range(n)) - done, done)
        return len(done) + len(self.lost) >= n + (ps is not None), None


def _signal_groups(groups: list[int], sig: int) -> list[int]:
    """Send ``sig`` to each process group; the groups that still had a process."""
    alive = []
    for group in groups:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            continue
        alive.append(group)
    return alive


def _finish(launcher: Launcher, begins: Callable[[], None] | None = None) -> Outcome:
    """Run, holding the results folder, and write summary.json; ``begins()`` first, once the
    folder is this process's (what the run's start says)."""
    with _holding(launcher.out):
        if begins is not None:
            begins()
        try:
            outcome = launcher.run()
        except KeyboardInterrupt:  # a run stopped here: what it did, said as for any end
            if launcher.stopped_summary is not None:
                summary = dumps(launcher.stopped_summary, indent=2)
                _write_whole(launcher.out / "summary.json", summary + "\n")
            raise
        summary = dumps(outcome.summary, indent=2)
        _write_whole(launcher.out / "summary.json", summary + "\n")
    return outcome


@contextlib.contextmanager
def _holding(out: Path) -> Iterator[None]:
    """The results folder for this process alone while it writes there: a second launcher
    aimed at it (a --resume of a run still going, a second watch of it) is refused before it
    starts anything, rather than interleave its metrics, logs and checkpoints with the
    first's. An flock on ``out/LOCK``, which holds the pid for the refusal's line: it goes
    with the process however that ends (kill -9 too), and the file with a process that ends
    normally. On a file system without locks the run goes on unguarded."""
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {str(out)!r}: cannot make it ({exc.strerror or exc})") from None
    path = out / LOCK
    fd, locked = _lock(out, path), False
    try:
        for _ in range(3):  # a file its holder removed as we opened it: lock the new one
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 16).decode(errors="replace").strip()
                pid = f" (pid {holder})" if holder.isascii() and holder.isdigit() else ""
                raise ConfigError(
                    f"{out} is being written by another hopbus process{pid}, whose run is "
                    "still going: wait for it to end, or stop it first"
                ) from None
            except OSError:
                break  # no locks here (ENOLCK): unguarded
            try:
                locked = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                locked = False
            if locked:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                break
            os.close(fd)
            fd = _lock(out, path)
        yield
    finally:
        if locked:
            with contextlib.suppress(OSError):
                os.unlink(path)  # before letting go: nobody can lock a file that is gone
        os.close(fd)
        if made:  # a run refused before it wrote anything (its id taken) leaves no folder
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty


def _lock(out: Path, path: Path) -> int:
    """The lock file of ``_holding``, opened (made if new): a regular file of its own, as the
    pid is written into it; never one reached through a link, symbolic or hard, nor a FIFO
    or a device."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise ConfigError(f"--out {str(out)!r} is not writable ({exc.strerror})") from None
        raise ConfigError(
            f"--out {str(out)!r}: cannot open its {LOCK} ({exc.strerror}): move it away"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise ConfigError(
            f"--out {str(out)!r}: its {LOCK} is not a file of its own (a link, or another kind "
            "of file): move it away"
        )
    return fd


def _checked(
    cfg: TrainConfig, curve: Path | None = None
) -> tuple[TrainConfig, Topology, list[WorkerSpec]]:
    """check_inputs, showing each of its warnings once."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        checked = check_inputs(cfg, curve)
    for w in seen:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return checked


def _keep_until(path: Path, at: int) -> float:
    """Before a resumed run appends to metrics.jsonl: keep the entries up to iteration ``at``
    and drop those of the abandoned continuation beyond it (as its checkpoints are), so
    that the file holds one timeline. Returns the last kept ``t``, from which the resumed
    entries' time goes on. Lines that are not entries of an iteration are kept."""
    _drop_partial_line(path)
    try:
        lines = path.read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return 0.0
    kept: list[bytes] = []
    last_t = 0.0
    for line in lines:
        try:
            e = json.loads(line)
        except (ValueError, RecursionError):
            e = None
        it = e.get("iter") if isinstance(e, dict) else None
        if type(it) is int and it > at:
            continue
        t = run_seconds(e.get("t")) if isinstance(e, dict) else None
        if t is not None:
            last_t = max(last_t, t)  # seconds since the run began: junk is passed over
        kept.append(line)
    if len(kept) < len(lines):
        _write_whole(path, b"".join(kept))
    return last_t


def _drop_partial_line(path: Path) -> None:
    """A killed launcher may leave metrics.jsonl ending in half a line: cut it off before
    appending, so that every line stays one JSON object."""
    try:
        fh = path.open("rb+")
    except FileNotFoundError:
        return
    with fh:
        end = pos = fh.seek(0, os.SEEK_END)
        while pos > 0:
            step = min(1 << 16, pos)
            fh.seek(pos - step)
            chunk = fh.read(step)
            if pos == end and chunk.endswith(b"\n"):
                return
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                fh.truncate(pos - step + cut + 1)
                return
            pos -= step
        fh.truncate(0)


def _out_folder(out: Path | None, keys: RunKeys, *, watch: bool = False) -> Path:
    """The results folder: new, or empty, or holding only the run's TensorBoard scalars (the
    workers of a run followed by hopbus watch may have started writing them there) and the
    lock of a launcher that stopped before writing anything (``_holding``). For
    ``watch``, also one that holds the workers' checkpoints (their default --checkpoint-dir
    is in its default --out), or one where a watch of the same run was interrupted before its
    summary: it reads the run's stream from the start again and rewrites every file."""
    out = out if out is not None else Path("runs") / keys.run
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is not a folder: choose another --out")
    theirs = (TENSORBOARD, CHECKPOINTS) if watch else (TENSORBOARD,)  # the workers write them
    for name in theirs:
        folder = out / name
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise ConfigError(f"--out {str(out)!r}: its {name} is not a folder of its own")
    if out.exists() and any(p.name not in (*theirs, LOCK) for p in out.iterdir()):
        if watch and _watched_before(out, keys.run):
            return out
        choose = "another --out" if watch else "another --run or --out"
        what = "files"
        if (out / "summary.json").is_file():  # a watch of a run whose results are there
            what = "a run's results (its summary.json: the run ended)"
        raise ConfigError(f"--out {str(out)!r} already holds {what}: choose {choose}, or remove it")
    return out


def _watched_before(out: Path, run: str) -> bool:
    """Whether ``out`` holds an interrupted hopbus watch of ``run``: its config.toml says so,
    no summary.json, and nothing but what a watch writes."""
    ours = {"config.toml", "metrics.jsonl", TENSORBOARD, CHECKPOINTS, LOCK}
    if not all(p.name in ours for p in out.iterdir()):
        return False
    config = out / "config.toml"
    try:
        with config.open() as fh:
            first = fh.readline(200).rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return False
    return not config.is_symlink() and first == WATCHED + run


def record(
    cfg: TrainConfig,
    *,
    run: str | None,
    redis_url: str,
    curve: Path | None = None,
    acl: Path | None = None,
) -> str:
    """``hopbus create``: check the run as ``hopbus train`` does and record it in Redis,
    starting nothing; workers started elsewhere join it. Returns the run id. ``acl``: make the
    run a Redis user of its own (coord/acl.py) and write its URL to that file."""
    cfg, _, _ = _checked(cfg, curve)
    check_url(redis_url)
    keys = RunKeys(run if run is not None else new_run_id(cfg))
    client = connect(redis_url, timeout=min(10.0, cfg.timeout))
    from hopbus.coord.acl import create_user, delete_user, open_secret, write_secret

    secret = open_secret(acl) if acl is not None else None  # a bad path: nothing to undo
    made = False
    try:
        create_run(client, keys, cfg.public(), __version__, redis_url)
        made = True
        if secret is not None:
            write_secret(secret, create_user(client, keys, redis_url))
            secret = None
    except redis.ResponseError as exc:  # a refusal: a per-run user of another run, say
        why = read.refused_because(exc, "did something else write the run's keys?")
        raise RunFailure(
            f"run {keys.run}: Redis at {redact(redis_url)} refused: {read.refusal(exc)}: {why}"
        ) from None
    except redis.RedisError as exc:
        raise RunFailure(f"run {keys.run}: Redis at {redact(redis_url)} refused: {exc}") from None
    finally:
        if secret is not None:  # the run's user was not made: no half-made run is left
            os.close(secret)
            with contextlib.suppress(OSError):
                os.unlink(acl)  # type: ignore[arg-type]
            if made:
                with contextlib.suppress(redis.RedisError):
                    delete_user(client, keys)
                    clean_run(client, keys)
    return keys.run


def watch(
    run: str,
    *,
    out: Path | None,
    redis_url: str,
    on_update: Callable[[Launcher], None] | None = None,
) -> tuple[Launcher, Outcome]:
    """``hopbus watch``: follow a recorded run to its end and write its results folder."""
    from hopbus.runtime.node import read_run_config

    check_url(redis_url)
    keys = RunKeys(run)
    out = _out_folder(out, keys, watch=True)
    client = connect(redis_url, timeout=10.0)
    cfg, topo = read_run_config(client, keys, timeout=10.0)
    client.close()
    with warnings.catch_warnings():  # the run's warnings were shown by hopbus create
        warnings.simplefilter("ignore")
        specs = plan(cfg.protocol_settings(), topo) if cfg.mode.is_hop else []
    watcher = Watcher(
        cfg, topo, specs, run=keys.run, out=out, redis_url=redis_url, on_update=on_update
    )
    return watcher, _finish(watcher)


def train(
    cfg: TrainConfig,
    *,
    run: str | None,
    out: Path | None,
    redis_url: str | None,
    on_update: Callable[[Launcher], None] | None = None,
    curve: Path | None = None,
    command: list[str] | None = None,
) -> tuple[Launcher, Outcome]:
    """Check everything, run, write summary.json; raises UserError for bad input. ``curve``:
    the run's CURVE key folder (needed with ``cfg.curve``), handed to every process.
    ``command``: hopbus launch's script, run by every worker (``cfg.model`` is then
    ``script``); without it every worker trains the run's own ``--model``."""
    if command is None and cfg.model == SCRIPT:  # e.g. a launch run's config.toml
        raise ConfigError(
            "--model script: these settings are a script's run (hopbus launch); run them with "
            f"{LAUNCH_USAGE.replace('-n 4 [run flags]', '--config FILE')}"
        )
    if command is not None:
        if not command:
            raise ConfigError(f"hopbus launch: give the command to run after --: {LAUNCH_USAGE}")
        if command[0].startswith("-") and shutil.which(command[0]) is None:
            raise ConfigError(
                f"hopbus launch: the command after -- begins with {command[0][:40]!r}: "
                f"hopbus launch's own flags go before the --, the command after it ({LAUNCH_USAGE})"
            )
        if shutil.which(command[0]) is None:  # before any process or key exists
            script = command[0].endswith(".py") and Path(command[0]).is_file()
            raise ConfigError(
                f"hopbus launch: cannot run {command[0][:200]!r}: "
                + (
                    f"a Python script: put the interpreter first, `-- python {command[0][:200]}`"
                    if script
                    else f"no such program on PATH, nor an executable file ({LAUNCH_USAGE})"
                )
            )
        cfg = make_config({**cfg.model_dump(), "model": SCRIPT, "data": SCRIPT}, cls=TrainConfig)
        assert isinstance(cfg, TrainConfig)
    with warnings.catch_warnings():  # the size first: before any data is loaded for it
        warnings.simplefilter("ignore")
        size = cfg.build_topology()[1].n
    if size > LOCAL_WORKERS:
        raise ConfigError(
            f"--workers {size}: hopbus {'launch' if command else 'train'} starts one process "
            f"per worker on this machine (some 100 MB each), more than {LOCAL_WORKERS} is not "
            "what one machine runs; simulate it (hopbus sim), or spread the workers over "
            "machines: hopbus create, then hopbus worker on each"
        )
    cfg, topo, specs = _checked(cfg, curve)
    if redis_url is not None:
        check_url(redis_url)
    keys = RunKeys(run if run is not None else new_run_id(cfg))  # checked before anything starts
    out = _out_folder(out, keys)
    launcher = Launcher(
        cfg,
        topo,
        specs,
        run=keys.run,
        out=out,
        redis_url=redis_url,
        on_update=on_update,
        curve=curve,
        command=command,
    )
    return launcher, _finish(launcher)


LAUNCH_USAGE = "hopbus launch -n 4 [run flags] -- python train.py ARGS..."


@dataclass(frozen=True)
class ResumePlan:
    """What ``hopbus train --resume`` continues: the run's results folder, id and settings,
    and the iteration of its newest complete checkpoint set."""

    folder: Path
    run: str
    cfg: TrainConfig
    at: int
    workers: int


def _resume_folder(target: str) -> Path:
    folder = Path(target)
    if folder.is_dir():
        return folder
    alt = Path("runs") / target
    if alt.is_dir():
        return alt
    nor = "" if alt == folder else f" (nor {alt})"
    raise ConfigError(f"--resume {target!r}: no such results folder{nor}")


def _finished(folder: Path, workers: int, iterations: int) -> bool:
    """Whether the results folder records a finished run: its summary.json says so, or (a
    Ctrl-C between the workers' end and the summary) metrics.jsonl has every worker entering
    the last iteration. Unreadable files record nothing."""
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError, RecursionError):
        summary = None
    if isinstance(summary, dict) and summary.get("finished") is True:
        return True
    done: set[int] = set()
    with contextlib.suppress(OSError), (folder / "metrics.jsonl").open("rb") as lines:
        for line in lines:
            with contextlib.suppress(ValueError, RecursionError):
                e = json.loads(line)
                if not isinstance(e, dict):
                    continue
                w, it = e.get("worker"), e.get("iter")
                if type(w) is int and type(it) is int and it >= iterations:
                    done.add(w)
    return workers > 0 and done >= set(range(workers))


def _check_writable(folder: Path, target: str) -> None:
    """Before anything runs: can the resumed run write its results where they go, and only
    there? Found at the end, a run would train to the last iteration and then lose its
    summary; a link or a special file (a FIFO) in their place would be written through or
    hang the resume. The checkpoint and TensorBoard folders too: a run resumed through a
    linked checkpoints/ took another run's checkpoints, pruned them and wrote its own there."""
    logs = folder / "logs"
    files = [folder / n for n in ("summary.json", "metrics.jsonl", "config.toml")]
    dirs = [logs, folder / CHECKPOINTS, folder / TENSORBOARD]
    for d in dirs[:]:
        if d.is_dir() and not d.is_symlink():  # and what the run writes inside them
            if d == logs:
                files += sorted(logs.glob("*.log"))
            else:
                dirs += sorted(d.glob("worker-*"))
    for path in [*files, *dirs]:
        wanted = "a folder" if path in dirs else "a regular file"
        kind_ok = path.is_dir() if path in dirs else path.is_file()
        if path.is_symlink() or (os.path.lexists(path) and not kind_ok):
            raise ConfigError(
                f"--resume {target!r}: {path} is not {wanted} (a link, or another kind of "
                "file): the run writes its results there; move it away"
            )
        if os.path.lexists(path) and not os.access(path, os.W_OK):
            raise ConfigError(
                f"--resume {target!r}: {path} is not writable: the run writes its results there"
            )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--resume {target!r}: {folder} is not writable: the run's results go there"
        )


def plan_resume(target: str, *, timeout: float | None = None) -> ResumePlan:
    """``--resume RUN`` (a results folder, or a run id: runs/RUN): the run's settings from its
    config.toml (``timeout`` may override its --timeout), and its newest complete set."""
    folder = _resume_folder(target)
    _check_writable(folder, target)  # first: config.toml is read through no link either
    path = folder / "config.toml"
    if not path.is_file():
        raise ConfigError(
            f"--resume {target!r}: {folder} has no config.toml: not a hopbus train results folder"
        )
    values = load_toml(path)
    from_file = dict.fromkeys(values, str(path))
    if timeout is not None:
        values["timeout"] = timeout
        from_file.pop("timeout", None)
    cfg = make_config(values, from_file, TrainConfig)
    assert isinstance(cfg, TrainConfig)
    with warnings.catch_warnings():  # shown once, by check_inputs, when the run starts
        warnings.simplefilter("ignore")
        _, topo = cfg.build_topology()
    if _finished(folder, topo.n, cfg.iterations):
        raise ConfigError(
            f"--resume {target!r}: the run in {folder} finished (its summary.json or "
            "metrics.jsonl says so): nothing to resume; start a new run with hopbus train"
        )
    if cfg.model == SCRIPT:  # hopbus launch refuses --checkpoint-every: none to resume from
        raise ConfigError(
            f"--resume {target!r}: {folder} holds a script's run (hopbus launch), whose state "
            "the script saves itself (for Keras: keras.callbacks.BackupAndRestore): launch it "
            "again"
        )
    folder_ck = folder / CHECKPOINTS
    skipped: list[str] = []
    at = newest_complete(folder_ck, topo.n, skipped, full=True)
    for why in skipped:  # newer sets it passed over: said, not silently ignored
        warnings.warn(f"--resume skips a newer checkpoint set: {why}", UserWarning, stacklevel=2)
    if at is None:
        why = "" if cfg.checkpoint_every else " (the run was started without --checkpoint-every)"
        raise ConfigError(f"no complete checkpoint set in {folder_ck}: nothing to resume{why}")
    named = {run_of(folder_ck, i, at) for i in range(topo.n)}
    if len(named) > 1:  # the run whose keys a resume clears and takes over: one, or none
        raise ConfigError(
            f"--resume {target!r}: the checkpoints of iteration {at} in {folder_ck} name "
            f"different runs ({', '.join(sorted(map(repr, named)))[:200]}): not one run's set"
        )
    run = RunKeys(named.pop()).run  # validated as a run id
    try:
        newer_than(folder_ck, range(topo.n), at)  # what the resume removes: files, all of them
    except CheckpointError as exc:
        raise ConfigError(f"--resume {target!r}: {exc}") from None
    return ResumePlan(folder, run, cfg, at, topo.n)


def resume(
    plan: ResumePlan,
    *,
    redis_url: str | None,
    on_update: Callable[[Launcher], None] | None = None,
    curve: Path | None = None,
    begins: Callable[[], None] | None = None,
) -> tuple[Launcher, Outcome]:
    """``hopbus train --resume``: the run again, under the same id and folder, every worker
    starting from its checkpoint of ``plan.at``; metrics.jsonl grows, summary.json is
    replaced (with ``resumed_from``). The results folder is reused on purpose. ``curve``:
    the key folder of a run with curve = true. ``begins()``: once the folder is taken."""
    cfg, topo, specs = _checked(plan.cfg, curve)
    if redis_url is not None:
        check_url(redis_url)
    launcher = Launcher(
        cfg,
        topo,
        specs,
        run=plan.run,
        out=plan.folder,
        redis_url=redis_url,
        on_update=on_update,
        resume_from=plan.at,
        curve=curve,
    )
    return launcher, _finish(launcher, begins)


__all__ = [
    "Launcher",
    "Outcome",
    "ResumePlan",
    "Watcher",
    "check_curve",
    "check_inputs",
    "plan_resume",
    "record",
    "resume",
    "train",
    "watch",
]
