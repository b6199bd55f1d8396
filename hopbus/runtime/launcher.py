"""``hopbus train``: a local cluster on one machine.

Starts (or connects to) Redis, records the run, spawns one ``hopbus worker`` process per
worker, follows the progress stream live (metrics.jsonl, gaps, the display), and ends with the
summary. Workers run in their own sessions, so the launcher alone decides when they stop: on
Ctrl-C, on a worker's failure, or at the end. Each worker also asks the kernel to stop it if
the launcher dies, so no process outlives the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import redis

from hopbus import __version__
from hopbus.config import TrainConfig
from hopbus.coord.broker import EmbeddedRedis, _die_with_parent
from hopbus.coord.client import check_url, connect, redact
from hopbus.coord.keys import RunKeys
from hopbus.coord.runs import create_run, set_status
from hopbus.data import load_dataset
from hopbus.errors import ConfigError, RunFailure
from hopbus.heterogeneity import Heterogeneity
from hopbus.modes import Family
from hopbus.protocol.spec import WorkerSpec, plan
from hopbus.runtime.faults import ENV, Faults
from hopbus.runtime.progress import (
    Replay,
    first_start,
    read_entries,
    scheme_summary,
    summarize_run,
    token_invariant_violations,
)
from hopbus.topology import Topology

STOP_GRACE_S = 5.0


def new_run_id(cfg: TrainConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{cfg.mode}-{stamp}-{os.getpid() % 10000:04d}"


def check_inputs(cfg: TrainConfig) -> tuple[TrainConfig, Topology, list[WorkerSpec]]:
    """Everything a worker would refuse, refused here once, before any process starts.
    Returns the config with its worker count, the graph and every Hop worker's spec (none for
    the related schemes, whose settings build_topology checks)."""
    cfg2, topo = cfg.build_topology()
    assert isinstance(cfg2, TrainConfig)
    Faults.for_worker(0)  # a mistyped HOPBUS_FAULTS is refused before anything starts
    specs = plan(cfg2.protocol_settings(), topo) if cfg2.mode.is_hop else []  # warns once
    het = Heterogeneity.from_spec(cfg2.slowdown, topo.n, cfg2.seed).bind(topo.graph, topo.name)
    het.check_mode(cfg2.mode)
    from hopbus.data import shard
    from hopbus.models import build_model

    data = load_dataset(cfg2.data, cfg2.seed)
    shard(data, topo.n - 1, topo.n, cfg2.seed)  # enough examples for every worker
    build_model(cfg2.model, data.n_features, data.n_classes, hidden=cfg2.hidden)
    return cfg2, topo, specs


def write_config_toml(path: Path, cfg: TrainConfig) -> None:
    lines = ["# hopbus train settings of this run: hopbus train --config config.toml"]
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
    popen: subprocess.Popen
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


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith("hopbus: error: "):
            return line[len("hopbus: error: ") :]
    return lines[-1] if lines else ""


def _why(p: Proc) -> str:
    code = p.code
    if code is not None and code < 0:
        return f"{p.name} was killed by {signal.Signals(-code).name}"
    line = _last_line(p.log)
    return line or f"{p.name} exited with status {code} (see {p.log})"


class Launcher:
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
    ) -> None:
        self.cfg = cfg
        self.topo = topo
        self.specs = specs
        self.keys = RunKeys(run)
        self.out = out
        self.redis_url = redis_url
        self.on_update = on_update
        self.broker: EmbeddedRedis | None = None
        self.procs: list[Proc] = []
        self.replay: Replay | None = None
        self.url = ""
        self.t_start = time.time()

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
        env["HOPBUS_REDIS"] = self.url  # not on the command line: it may hold a password
        n = self.topo.n
        if self.cfg.mode.family is Family.PS:  # node N: the parameter server
            self._start(
                ["ps", "--run", self.keys.run], logs / "ps.log", env, n, "the parameter server"
            )
        for i in range(n):
            args = ["worker", "--run", self.keys.run, "--id", str(i)]
            self._start(args, logs / f"worker-{i}.log", env, i, f"worker {i}")

    def _start(self, args: list[str], log: Path, env: dict[str, str], node: int, name: str) -> None:
        with log.open("wb") as fh:
            popen = subprocess.Popen(
                [sys.executable, "-m", "hopbus", *args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the launcher only; it forwards
                preexec_fn=_die_with_parent,  # noqa: PLW1509
            )
        self.procs.append(Proc(node, popen, log, name=name))

    def stop_workers(self) -> None:
        live = [p for p in self.procs if p.popen.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in live:
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()

    def run(self) -> Outcome:
        """The whole run; always stops every process it started before returning or raising."""
        try:
            self._start_broker()
            self.out.mkdir(parents=True, exist_ok=True)
            write_config_toml(self.out / "config.toml", self.cfg)
            self._begin()
            with (self.out / "metrics.jsonl").open("w") as metrics:
                outcome = self._follow(metrics)
            set_status(self.r, self.keys, "failed" if outcome.failure else "finished")
            return outcome
        except KeyboardInterrupt:
            if self.procs or self.broker is not None:  # a watcher leaves the run's status alone
                with contextlib.suppress(Exception):
                    set_status(self.r, self.keys, "stopped")
            raise
        except redis.RedisError as exc:
            raise RunFailure(
                f"run {self.keys.run}: lost Redis at {redact(self.url)}: {exc}"
            ) from None
        finally:
            self.stop_workers()
            if self.broker is not None:
                self.broker.stop()

    def _begin(self) -> None:
        """Record the run and start its processes."""
        create_run(self.r, self.keys, self.cfg.public(), __version__)
        set_status(self.r, self.keys, "running")
        self._spawn()

    def _poll(self) -> tuple[bool, str | None]:
        """(every process is done, the first failure): here, from the processes' exit codes."""
        failure: str | None = None
        for p in self.procs:
            if p.code is None:
                p.code = p.popen.poll()
                if p.code not in (None, 0) and failure is None:
                    failure = _why(p)
        return all(p.code == 0 for p in self.procs), failure

    def _new_replay(self, t0: float) -> Replay:
        setting = self.cfg.gap_setting()
        return Replay(self.topo, setting, t0, self.cfg.target_loss)

    # -- following the run ------------------------------------------------------------------------
    def _feed(
        self, entries: list[tuple[str, dict[str, Any]]], metrics: TextIO, *, t0: float | None = None
    ) -> bool:
        """Replay ``entries`` and write them to metrics.jsonl. Time zero is the first start
        event (or ``t0`` if there is none yet); without either, returns False, feeding nothing."""
        if self.replay is None:
            start = first_start(self.r, self.keys) or t0
            if start is None:
                return False
            self.replay = self._new_replay(start)
        for _, rec in entries:
            metrics.write(json.dumps(self.replay.feed(rec)) + "\n")
        return True

    def _follow(self, metrics: TextIO) -> Outcome:
        cursor = "0-0"
        pending: list[tuple[str, dict[str, Any]]] = []
        while True:
            entries = read_entries(self.r, self.keys.progress, cursor, block_ms=200)
            if entries:
                cursor = entries[-1][0]
                pending.extend(entries)
            if pending and self._feed(pending, metrics):
                pending.clear()
            done, failure = self._poll()
            if self.on_update is not None:
                self.on_update(self)
            if failure is not None or done:
                break
        if failure is None:  # drain what the last workers wrote before exiting
            while entries := read_entries(self.r, self.keys.progress, cursor, count=10_000):
                cursor = entries[-1][0]
                pending.extend(entries)
            self._feed(pending, metrics, t0=self.t_start)
        return Outcome(self._summary(failure), failure)

    def _summary(self, failure: str | None) -> dict[str, Any]:
        if self.replay is None:
            self.replay = self._new_replay(self.t_start)
        raw = self.r.hgetall(self.keys.result)
        results = {int(k): json.loads(v) for k, v in raw.items()}
        server = results.pop(self.topo.n, None)  # the parameter server's, in ps-* runs
        for i in range(self.topo.n):  # a worker that did not finish: its last counters
            if i not in results:
                stats = self.r.hgetall(self.keys.stats(i))
                results_i = {k.decode(): int(v) for k, v in stats.items()}
                if results_i:
                    results[i] = results_i
        finished = failure is None and all("final_accuracy" in r for r in results.values())
        finished = finished and len(results) == self.topo.n
        bounds = [s.store_bound for s in self.specs if s.store_bound is not None]
        token_check = (
            token_invariant_violations(self.r, self.keys, self.topo, self.cfg.max_ig)
            if finished and self.cfg.mode.is_hop
            else 0
        )
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
        summary["scheme"] = scheme_summary(self.cfg.mode, results, server)
        return summary


class Watcher(Launcher):
    """Follows a run whose processes were started elsewhere (docker compose, other hosts):
    the same replay, metrics.jsonl and summary as ``hopbus train``, but it starts nothing.
    Done when every node has published its result; failed at the first error event or when a
    registered node's heartbeat is gone without a result."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._events = "0-0"
        self._missing: set[int] = set()  # no heartbeat and no result at the previous look

    def _start_broker(self) -> None:
        assert self.redis_url is not None
        self.url = self.redis_url
        self.r = connect(self.url, timeout=min(10.0, self.cfg.timeout))

    def _begin(self) -> None:
        if self.r.hget(self.keys.meta, "status") == b"starting":
            set_status(self.r, self.keys, "running")

    def _poll(self) -> tuple[bool, str | None]:
        from hopbus.runtime.node import names

        n = self.topo.n
        ps = n if self.cfg.mode.family is Family.PS else None  # node N, when the run has one
        for event_id, rec in read_entries(self.r, self.keys.events, self._events, count=10_000):
            self._events = event_id
            if rec.get("kind") == "error":
                who = names([int(rec.get("worker", -1))], ps)
                return False, f"{who}: {rec.get('message', 'failed')}"
        registered = [int(k) for k in self.r.hkeys(self.keys.addr)]
        beating = {i for i in registered if self.r.exists(self.keys.hb(i))}
        done = {int(k) for k in self.r.hkeys(self.keys.result)}
        gone = {i for i in registered if i not in beating and i not in done}
        dead = sorted(gone & self._missing)  # twice in a row: not a node between two steps
        self._missing = gone
        if dead:
            return False, f"{names(dead, ps)}: heartbeat gone without a result (process died?)"
        return len(done) >= n + (ps is not None), None


def _finish(launcher: Launcher) -> Outcome:
    outcome = launcher.run()
    summary = json.dumps(outcome.summary, indent=2, allow_nan=False)
    (launcher.out / "summary.json").write_text(summary + "\n")
    return outcome


def _checked(cfg: TrainConfig) -> tuple[TrainConfig, Topology, list[WorkerSpec]]:
    """check_inputs, showing each of its warnings once."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        checked = check_inputs(cfg)
    for w in seen:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return checked


def _out_folder(out: Path | None, keys: RunKeys) -> Path:
    out = out if out is not None else Path("runs") / keys.run
    if out.exists() and any(out.iterdir()):
        raise ConfigError(
            f"--out {str(out)!r} already holds a run: choose another --run or --out, or remove it"
        )
    return out


def record(cfg: TrainConfig, *, run: str | None, redis_url: str) -> str:
    """``hopbus create``: check the run as ``hopbus train`` does and record it in Redis,
    starting nothing; workers started elsewhere join it. Returns the run id."""
    cfg, _, _ = _checked(cfg)
    check_url(redis_url)
    keys = RunKeys(run or new_run_id(cfg))
    client = connect(redis_url, timeout=min(10.0, cfg.timeout))
    try:
        create_run(client, keys, cfg.public(), __version__)
    except redis.RedisError as exc:
        raise RunFailure(f"run {keys.run}: Redis at {redact(redis_url)} refused: {exc}") from None
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
    out = _out_folder(out, keys)
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
) -> tuple[Launcher, Outcome]:
    """Check everything, run, write summary.json; raises UserError for bad input."""
    cfg, topo, specs = _checked(cfg)
    if redis_url is not None:
        check_url(redis_url)
    keys = RunKeys(run or new_run_id(cfg))  # validates the id before anything is created
    out = _out_folder(out, keys)
    launcher = Launcher(
        cfg, topo, specs, run=keys.run, out=out, redis_url=redis_url, on_update=on_update
    )
    return launcher, _finish(launcher)


__all__ = ["Launcher", "Outcome", "Watcher", "check_inputs", "record", "train", "watch"]
