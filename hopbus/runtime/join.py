"""Which process ``hopbus worker`` becomes: the run's mode (recorded in Redis) decides; and,
for a worker started without ``--id`` (a compose replica), which id it takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hopbus.coord.client import connect
from hopbus.coord.keys import RunKeys
from hopbus.coord.runs import join_worker
from hopbus.errors import ConfigError, RejoinFailed
from hopbus.modes import Family
from hopbus.runtime.node import Node, check_bind, read_run_config, redis_failures, run_curve
from hopbus.runtime.own_code import require_given


def check_trainer(cfg: Any, run: str, *, script: bool) -> None:
    """A script joins only Hop runs recorded for a script (hopbus launch, hopbus create
    --model script), and such a run is joined by scripts only: one line each, before an id
    is taken."""
    from hopbus.models.custom import SCRIPT, keras_mode_line

    if script and not cfg.mode.is_hop:
        raise ConfigError(keras_mode_line(f"run {run}: a script's model", cfg.mode))
    if script and cfg.model != SCRIPT:  # its --model and --data would be a lie in its results
        raise ConfigError(
            f"run {run} trains --model {cfg.model}, not a script's: start its workers without "
            f"a command (hopbus worker --run {run}), or record a run for your script with "
            "hopbus create --model script (hopbus launch does)"
        )
    if not script and cfg.model == SCRIPT:
        raise ConfigError(
            f"run {run} trains a script's model (hopbus launch): start its workers with the "
            f"script, hopbus worker --run {run} -- COMMAND ARGS..."
        )


def ready_to_join(cfg: Any, run: str, curve: Path | None, bind: str | None) -> None:
    """What a process started without --id checks before it takes an id from the run's join
    counter, each an id given once: its --curve against the run's, and that its --bind is
    free (a second worker on one machine with the same port). One line each; nothing is
    written into the run."""
    run_curve(run, "worker", cfg.curve, curve)
    if bind is not None and cfg.mode.family is not Family.ALLREDUCE:  # gloo binds its own
        check_bind(bind)


def worker_for(
    run: str, worker: int | None, redis_url: str, *, script: bool = False, **kw: Any
) -> Node:
    """Worker ``worker`` of run ``run``, of the class its mode runs: a Hop worker, a
    parameter-server worker, a WAGMA worker or an all-reduce worker. ``worker=None`` takes the
    next id of the run's join counter (RunStateError once all N have joined), so identical
    replicas need no per-container setting. ``script``: for a user's training loop
    (``hopbus.join()``), which runs the Hop modes only; a run made for a script is refused
    without one. Raises UserError as ``Node.run_loop`` does."""
    from hopbus.config import TrainConfig, check_setting
    from hopbus.runtime.allreduce_worker import AllReduceWorker
    from hopbus.runtime.ps_worker import PSWorker
    from hopbus.runtime.wagma_worker import WagmaWorker
    from hopbus.runtime.worker import Worker

    if kw.get("rejoin"):
        if worker is None:
            raise ConfigError("--rejoin: say which dead worker this process replaces with --id")
        if kw.get("resume_from") is not None:
            raise ConfigError("--rejoin and --resume-from do not go together")
    keys = RunKeys(run)
    if kw.get("timeout") is not None:  # given on its own (hopbus.join(), HOPBUS_TIMEOUT)
        kw["timeout"] = check_setting("timeout", kw["timeout"])
    timeout = kw.get("timeout") or TrainConfig.model_fields["timeout"].default
    with redis_failures("worker" if worker is None else f"worker {worker}", run, redis_url):
        client = connect(redis_url, timeout=timeout)
        cfg, topo = read_run_config(client, keys, timeout)
        check_trainer(cfg, run, script=script)
        if not script:  # a script builds its own model: it imports none the run names
            require_given(cfg, "worker" if worker is None else f"worker {worker}", run)
        if worker is None:
            ready_to_join(cfg, run, kw.get("curve"), kw.get("bind"))
            worker = join_worker(client, keys, topo.n, redis_url)
    cls: type[Node] = {
        Family.HOP: Worker,
        Family.PS: PSWorker,
        Family.WAGMA: WagmaWorker,
        Family.ALLREDUCE: AllReduceWorker,
    }[cfg.mode.family]
    # checkpoints and replacements are the Hop worker's alone
    own = {k: kw.pop(k) for k in ("checkpoint_dir", "resume_from", "rejoin") if k in kw}
    if cls is Worker:
        node = Worker(run, worker, redis_url, client=client, **own, **kw)
        node.imports_code = not script
        return node
    if own.get("resume_from") is not None:
        raise ConfigError(
            f"--resume-from: only the Hop modes write checkpoints; run {run} is --mode {cfg.mode}"
        )
    if own.get("rejoin"):
        raise RejoinFailed(
            f"--rejoin: run {run} is --mode {cfg.mode}; only the Hop modes backup and hybrid "
            "take a replacement"
        )
    return cls(run, worker, redis_url, client=client, **kw)
