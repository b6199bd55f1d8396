"""``hopbus train``, ``create``, ``watch``, ``worker``, ``ps``, ``inspect``, ``clean``: the real
cluster."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from hopbus.cli import options as o
from hopbus.cli import render
from hopbus.cli.commands import _emit_json, app
from hopbus.config import OWN_MODEL_FIELDS, TrainConfig, check_setting, env_of
from hopbus.coord.client import DEFAULT_URL, redact, redis_flag
from hopbus.coord.keys import INTERRUPTED, INTERRUPTED_LINE, JOIN_FAILED, RunKeys
from hopbus.errors import ConfigError, DeclaredDead, RejoinFailed, RunFailure, RunStopped, UserError
from hopbus.runtime import interrupts
from hopbus.runtime.address import DEFAULT_BIND, auto_address, resolve_advertise  # noqa: F401 (auto_address: re-exported)

if TYPE_CHECKING:
    from redis import Redis

    from hopbus.cli.live import Display


@contextlib.contextmanager
def _following(as_json: bool) -> Iterator[Display]:
    """The live display of a followed run (on stderr). A run stopped by Ctrl-C or SIGTERM
    still ends with its summary so far on stdout, as summary.json holds it (the table, or
    the object under --json: a script reading stdout gets one however the run ended)."""
    from hopbus.cli.live import Display

    display = Display(Console(stderr=True))
    try:
        with display:
            yield display
    except KeyboardInterrupt:
        launcher = display.launcher
        if launcher is not None and launcher.stopped_summary is not None:
            with contextlib.suppress(OSError):  # the reader went with the Ctrl-C
                if as_json:
                    _emit_json(launcher.stopped_summary)
                else:
                    render.summary(Console(), launcher.stopped_summary)
        raise


def _report(launcher: Any, outcome: Any, as_json: bool, shown: int = 0) -> None:
    """The end of a followed run, for train and watch alike: the notes the display did not
    show (``shown`` it did), the summary, then exit 1 if a node failed, 3 if a Table 1 bound
    was broken or an invariant check failed."""
    s = outcome.summary
    err = Console(stderr=True)
    for note in launcher.notes[shown:]:
        err.print(f"hopbus: {note}", highlight=False, soft_wrap=True, markup=False)
    if as_json:
        _emit_json(s)
    else:
        render.summary(Console(), s)
    logs = launcher.out / "logs"  # none from a watch: the workers' logs stay where they ran
    logs_said = f" (every process's output: {logs})" if outcome.failure and logs.is_dir() else ""
    err.print(
        f"hopbus: results in {launcher.out}{logs_said}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    if outcome.failure:
        raise RunFailure(f"run {launcher.keys.run} failed: {outcome.failure}")
    if s["violations"]:
        v = s["first_violation"]
        err.print(
            f"hopbus: error: Table 1 bound broken {s['violations']} times, first: worker "
            f"{v['ahead']} {v['gap']} ahead of worker {v['behind']} (bound {v['bound']})",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        raise typer.Exit(3)
    checks = s.get("checks") or {}
    broken = [f"{k} {checks[k]}" for k in INVARIANTS if checks.get(k)]
    dropped = [f"{k} {checks[k]}" for k in WIRE_CHECKS if checks.get(k)]
    if dropped:  # updates the inboxes dropped: a rogue or broken sender can cause these
        err.print(
            f"hopbus: warning: dropped on arrival: {', '.join(dropped)}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    if broken:
        queue = s.get("first_token_violation")
        which = ""
        if checks.get("token_invariant_violations") and isinstance(queue, dict):
            which = f"; first TokenQ({queue['from']}->{queue['to']}) " + (
                "is not a list (something else wrote it)"
                if queue["size"] is None
                else f"holds {queue['size']} tokens where Theorem 2 gives {queue['expected']} "
                "(pushed into by something else?)"
            )
        err.print(
            f"hopbus: error: invariant check failed: {', '.join(broken)} (must be 0; "
            f"docs/summary.md){which}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        raise typer.Exit(3)


INVARIANTS = ("token_invariant_violations", "store_bound_exceeded", "progress_out_of_order")
"""The summary's checks that hold whatever a sender does: one broken is a failed run (exit 3)."""
WIRE_CHECKS = ("store_overflow", "duplicates")
"""Checks of what arrived, which an unauthenticated sender can trip (docs/security.md): shown."""

OutDir = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="Results folder: config.toml, metrics.jsonl, summary.json, logs/, tensorboard/. "
        "[default: runs/RUN]",
        show_default=False,
        rich_help_panel=o.PANEL_CLUSTER,
    ),
]

WatchOut = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="Results folder: config.toml, metrics.jsonl, summary.json (the workers' logs stay "
        "where they run). [default: runs/RUN]",
        show_default=False,
        rich_help_panel=o.PANEL_CLUSTER,
    ),
]


Resume = Annotated[
    str | None,
    typer.Option(
        "--resume",
        help="Continue run RUN (its results folder, or a run id meaning runs/RUN) from its "
        "newest complete checkpoint set (--checkpoint-every), with the settings in its "
        "config.toml: every worker restarts in that iteration. Only --redis, --timeout, "
        "--curve (a --curve run's keys) and --json go with it.",
        metavar="RUN",
        show_default=False,
        rich_help_panel=o.PANEL_CLUSTER,
    ),
]


@app.command("train")
def train_cmd(
    workers: o.TrainWorkers = None,
    topology: o.TopologyName = None,
    mode: o.ModeOpt = None,
    backup: o.Backup = None,
    staleness: o.Staleness = None,
    max_ig: o.MaxIg = None,
    skip_max: o.SkipMax = None,
    skip_trigger: o.SkipTrigger = None,
    iterations: o.Iterations = None,
    slowdown: o.Slowdown = None,
    slowdown_scope: o.SlowdownScopeOpt = None,
    message_bytes: o.MessageBytes = None,
    seed: o.Seed = None,
    approach: o.ApproachOpt = None,
    lookahead: o.Lookahead = None,
    group_size: o.GroupSize = None,
    sync_period: o.SyncPeriod = None,
    model: o.Model = None,
    data: o.Data = None,
    data_dir: o.DataDir = None,
    device: o.Device = None,
    hidden: o.Hidden = None,
    batch_size: o.BatchSize = None,
    lr: o.Lr = None,
    momentum: o.Momentum = None,
    weight_decay: o.WeightDecay = None,
    iter_time: o.IterTime = None,
    eval_every: o.EvalEvery = None,
    target_loss: o.TargetLoss = None,
    checkpoint_every: o.CheckpointEvery = None,
    timeout: o.Timeout = None,
    heartbeat: o.HeartbeatOpt = None,
    config: o.ConfigFile = None,
    redis: o.RedisUrl = None,
    curve_dir: o.CurveRun = None,
    run: o.RunId = None,
    out: OutDir = None,
    as_json: o.Json = False,
    resume: Resume = None,
) -> None:
    """Train on a local cluster: one process per worker, ZeroMQ between them, Redis in the
    middle (a private redis-server unless --redis is given). Each process gets its share of
    the cores for numpy's thread pools (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS
    at cores // N, at least 1) unless you set any of them.

    Shows every worker's progress while it runs, then the summary (the same fields as `hopbus
    sim`) and the final test accuracy. Exit status 1 if a worker failed (its reason is
    printed, the others are stopped), 2 for bad input, 3 if a Table 1 bound was broken or an
    invariant check failed, 130 after Ctrl-C or SIGTERM (every process it started is
    stopped).

    With --checkpoint-every K each worker saves its state every K iterations; `hopbus train
    --resume RUN` continues a stopped or killed run from its newest complete checkpoint set
    (see docs/checkpoints.md).
    """
    given = o.run_flags(locals())
    interrupts.install()  # stop the workers and the private Redis as on Ctrl-C
    from hopbus.runtime.launcher import train

    if resume is not None:
        other = {**given, "config": config, "run": run, "out": out}
        _resume_cmd(resume, other, redis=redis, timeout=timeout, as_json=as_json, curve=curve_dir)
        return
    cfg = o.resolve(config, _with_curve(given, curve_dir), TrainConfig)
    assert isinstance(cfg, TrainConfig)
    o.warn_unused(cfg, given)
    with _following(as_json) as display:
        launcher, outcome = train(
            cfg, run=run, out=out, redis_url=redis, on_update=display.update, curve=curve_dir
        )
    _report(launcher, outcome, as_json, display.shown)


def _resume_cmd(
    target: str,
    other: dict[str, Any],
    *,
    redis: str | None,
    timeout: float | None,
    as_json: bool,
    curve: Path | None = None,
) -> None:
    """``hopbus train --resume RUN``: the run's own settings, so no other run flag (but the
    key folder of a --curve run, which its config.toml records as curve = true only)."""
    from hopbus.config import env_of, flag_of
    from hopbus.runtime.launcher import check_curve, plan_resume, resume

    extra = [  # typer takes an environment variable for its flag: say which is set
        flag_of(k)
        + (f" ({env_of(k)} is set in the environment)" if env_of(k) in os.environ else "")
        for k, v in other.items()
        if v is not None and k != "timeout"
    ]
    if extra:
        raise ConfigError(
            f"--resume continues a run with the settings in its config.toml: leave out "
            f"{'; '.join(extra)} (only --redis, --timeout, --curve and --json go with it)"
        )
    plan = plan_resume(target, timeout=timeout)
    check_curve(plan.cfg, curve)  # before saying it resumes
    err = Console(stderr=True)
    said = (
        f"hopbus: resuming run {plan.run} from iteration {plan.at} (checkpoint set of "
        f"{plan.workers} workers)"
    )
    with _following(as_json) as display:
        launcher, outcome = resume(
            plan, redis_url=redis, on_update=display.update, curve=curve,
            begins=lambda: err.print(said, highlight=False, soft_wrap=True, markup=False),
        )  # fmt: skip
    _report(launcher, outcome, as_json, display.shown)


def _with_curve(given: dict[str, Any], curve_dir: Path | None) -> dict[str, Any]:
    """``--curve DIR`` records ``curve = true``; without it the config file's value stands."""
    return {**given, "curve": True} if curve_dir is not None else given


def create_cmd(**params: Any) -> None:
    """Record a run in Redis without starting anything: the first step of a cluster whose
    workers are started elsewhere (docker compose's init service).

    Takes hopbus train's run flags and checks them the same way, prints the run id and exits
    0; `hopbus worker --run RUN` processes then join it (each takes the next id), and `hopbus
    watch --run RUN` follows it to its summary. Refuses a run id this Redis already holds.
    """
    given = o.run_flags(params)
    from hopbus.runtime.launcher import record

    cfg = o.resolve(params["config"], _with_curve(given, params["curve_dir"]), TrainConfig)
    assert isinstance(cfg, TrainConfig)
    o.warn_unused(cfg, given)
    url = params["redis"] or DEFAULT_URL
    print(
        record(cfg, run=params["run"], redis_url=url, curve=params["curve_dir"], acl=params["acl"])
    )


AclFile = Annotated[
    Path | None,
    typer.Option(
        "--acl",
        help="Make the run a Redis user of its own, hop-RUN with a random password, that may "
        "touch only hop:{RUN}:* keys, and write the URL that logs in as it to this new file "
        "(mode 0600): give it to the run's workers and hopbus watch as HOPBUS_REDIS. --redis "
        "must then be an ACL administrator's URL. hopbus clean removes the user with the run "
        "(docs/security.md).",
        metavar="FILE",
        show_default=False,
        rich_help_panel=o.PANEL_CLUSTER,
    ),
]

# create takes exactly train's flags but --out, --json and --resume (one list for both), and
# --acl
_TRAIN_PARAMS = inspect.signature(train_cmd, eval_str=True)
create_cmd.__signature__ = _TRAIN_PARAMS.replace(  # type: ignore[attr-defined]
    parameters=[
        *(
            p.replace(annotation=o.CreateModel) if p.name == "model" else p
            for p in _TRAIN_PARAMS.parameters.values()
            if p.name not in ("out", "as_json", "resume")
        ),
        inspect.Parameter("acl", inspect.Parameter.KEYWORD_ONLY, annotation=AclFile, default=None),
    ]
)
app.command("create")(create_cmd)


def launch_cmd(**params: Any) -> None:
    """Run your own training script as the workers of a Hop run: N copies of COMMAND, each a
    worker (torchrun's and horovodrun's convention).

    hopbus launch -n 4 --mode backup -- python train.py --epochs 3

    Starts a private redis-server (unless --redis), records the run, starts the copies with the
    environment hopbus.join() reads (HOPBUS_RUN, HOPBUS_REDIS, HOPBUS_ID; and, unless you set
    any of them, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS at cores // N, at
    least 1, so that N copies of numpy or PyTorch do not each start a thread per core;
    TensorFlow's pools are left as they are), shows every worker's
    progress, and writes the results folder as hopbus train does: config.toml, metrics.jsonl,
    summary.json, logs/worker-I.log (each copy's stdout and stderr) and tensorboard/. In the
    script: ctx = hopbus.join(), then model.fit(..., callbacks=[hopbus.keras.HopCallback(ctx)])
    for Keras, or ctx.begin() / ctx.end(params) around each step of any loop (docs/api.md).

    The Hop modes only. A copy that crashes, is killed or exits without finishing its part is
    named with its last lines of stderr; the run then stops (backup and hybrid go on without
    it, as with hopbus train). Exit status 1 if a worker failed, 2 for bad input, 3 if a
    Table 1 bound was broken or an invariant check failed, 130 after Ctrl-C or SIGTERM (every
    copy is stopped).
    """
    command = list(params.pop("command") or [])
    given = o.run_flags(params)
    interrupts.install()
    from hopbus.runtime.launcher import train

    curve_dir = params["curve_dir"]
    _warn_own_model_settings(params["config"])
    cfg = o.resolve(
        params["config"], _with_curve(given, curve_dir), TrainConfig, ignore=OWN_MODEL_FIELDS
    )
    assert isinstance(cfg, TrainConfig)
    o.warn_unused(cfg, given)
    with _following(params["as_json"]) as display:
        launcher, outcome = train(
            cfg, run=params["run"], out=params["out"], redis_url=params["redis"],
            on_update=display.update, curve=curve_dir, command=command,
        )  # fmt: skip
    _report(launcher, outcome, params["as_json"], display.shown)


def _warn_own_model_settings(config: Path | None) -> None:
    """hopbus launch takes no --lr (the script has its own): a config file's lr, or a
    HOPBUS_LR in the environment, is said to be ignored too, not taken in silence."""
    import warnings

    from hopbus.config import load_toml
    from hopbus.models.custom import SCRIPT

    found = [
        f"{k} ({config})"
        for k, v in (load_toml(config) if config is not None else {}).items()
        if k in OWN_MODEL_FIELDS and v != SCRIPT
    ]
    found += [env_of(k) for k in OWN_MODEL_FIELDS if os.environ.get(env_of(k))]
    if found:
        warnings.warn(
            f"hopbus launch ignores {', '.join(found)}: settings of hopbus's own models "
            "(hopbus train); your script sets its own, from its arguments after --",
            UserWarning,
            stacklevel=2,
        )


# launch takes train's run flags but those of hopbus's own models (the script has its own),
# the related schemes' and --resume, plus the command
LAUNCH_LEAVES_OUT = (*OWN_MODEL_FIELDS, "lookahead", "group_size", "sync_period", "resume")
LAUNCH_OPTS = {"mode": o.LaunchModeOpt, "iter_time": o.LaunchIterTime}  # said for a script
launch_cmd.__signature__ = _TRAIN_PARAMS.replace(  # type: ignore[attr-defined]
    parameters=[
        *(
            p.replace(annotation=LAUNCH_OPTS[p.name]) if p.name in LAUNCH_OPTS else p
            for p in _TRAIN_PARAMS.parameters.values()
            if p.name not in LAUNCH_LEAVES_OUT
        ),
        inspect.Parameter(
            "command",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Annotated[
                list[str] | None,
                typer.Argument(
                    help="Your training script and its arguments: every flag after COMMAND "
                    "is the script's, as with torchrun (a -- before it is allowed).",
                    metavar="-- COMMAND [ARGS]...",
                    show_default=False,
                ),
            ],
            default=None,
        ),
    ]
)
# the script's own flags follow it: parsing stops at COMMAND, as torchrun's does (with or
# without --), so that `hopbus launch -n 4 python train.py --seed 7` gives --seed to the script
SCRIPT_ARGS = {"allow_interspersed_args": False}
app.command("launch", context_settings=SCRIPT_ARGS)(launch_cmd)


@app.command("watch")
def watch_cmd(
    run: Annotated[str, typer.Option("--run", "-r", envvar="HOPBUS_RUN", help="Run id to follow.")],
    redis: o.RedisUrl = None,
    out: WatchOut = None,
    as_json: o.Json = False,
) -> None:
    """Follow a run whose workers were started elsewhere (docker compose, other hosts) to its
    end: the live display, then metrics.jsonl, summary.json and the summary, as `hopbus train`
    writes them. Starts and stops nothing: Ctrl-C stops the watch, not the run, and the same
    watch started again reads the run from its start into the same folder (one that reached
    its summary there is done: a new watch needs another --out). Exit status 1 if
    a node reported an error or its heartbeat vanished, 2 if --out holds other files or no
    run RUN is recorded in Redis within 10 s, 3 if a Table 1 bound was broken or an invariant check
    failed."""
    interrupts.install()
    from hopbus.runtime.launcher import watch

    with _following(as_json) as display:
        launcher, outcome = watch(
            run, out=out, redis_url=redis or DEFAULT_URL, on_update=display.update
        )
    _report(launcher, outcome, as_json, display.shown)


@app.command("worker", context_settings=SCRIPT_ARGS)
def worker_cmd(
    run: Annotated[
        str,
        typer.Option(
            "--run", "-r", envvar="HOPBUS_RUN", help="Run id to join (its config is in Redis)."
        ),
    ],
    worker_id: Annotated[
        int | None,
        typer.Option(
            "--id",
            envvar="HOPBUS_ID",
            help="This worker's id, 0..N-1 [default: the next free one: identical replicas "
            "each take their own].",
            show_default=False,
        ),
    ] = None,
    redis: o.RedisUrl = None,
    bind: o.Bind = DEFAULT_BIND,
    advertise: o.Advertise = None,
    timeout: o.NodeTimeout = None,
    curve: o.CurveNode = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            envvar="HOPBUS_DEVICE",
            help="This worker's device for a TensorFlow model of hopbus's (--model): auto, "
            "cpu, gpu or gpu:N [default: the run's --device]. A CPU and a GPU worker can share "
            "one run. A script (-- COMMAND) places its model itself: it gets this as "
            "HOPBUS_DEVICE, and its progress reports the device Keras uses.",
            show_default=False,
        ),
    ] = None,
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint-dir",
            envvar="HOPBUS_CHECKPOINT_DIR",
            help="Folder of the run's checkpoints, written every --checkpoint-every iterations "
            "(Hop modes) into worker-ID/ [default: runs/RUN/checkpoints under the current "
            "folder]. Give every worker of a run the same folder, or keep each one's on its "
            "own host.",
            show_default=False,
            rich_help_panel=o.PANEL_CLUSTER,
        ),
    ] = None,
    resume_from: Annotated[
        int | None,
        typer.Option(
            "--resume-from",
            envvar="HOPBUS_RESUME_FROM",
            help="Start in this iteration from this worker's checkpoint of it in "
            "--checkpoint-dir; every worker of the run must resume from the same one (hopbus "
            "train --resume sets it).",
            min=0,
            show_default=False,
            rich_help_panel=o.PANEL_CLUSTER,
        ),
    ] = None,
    rejoin: Annotated[
        bool,
        typer.Option(
            "--rejoin",
            envvar="HOPBUS_REJOIN",
            help="Replace worker --id, which the run declared dead (a backup or hybrid run "
            "that went on without it): take the newest parameters an in-neighbour sends and "
            "its iteration, then train to the end with the others. Refused if the worker is "
            "alive; a refused or failed replacement exits 1 and leaves the run as it was.",
            rich_help_panel=o.PANEL_CLUSTER,
        ),
    ] = False,
    tensorboard: Annotated[
        Path | None,
        typer.Option(
            "--tensorboard",
            envvar="HOPBUS_TENSORBOARD",
            help="Folder of the run's TensorBoard scalars: this worker writes worker-ID/ in it "
            "(hopbus train and launch give their results folder's tensorboard/) [default: "
            "none].",
            show_default=False,
            rich_help_panel=o.PANEL_CLUSTER,
        ),
    ] = None,
    model: o.GivenModel = None,
    data: o.GivenData = None,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="Your training script and its arguments (every flag after COMMAND is the "
            "script's; a -- before it is allowed): it runs with the environment hopbus.join() "
            "reads (hopbus launch starts N of these). Without it the worker trains the run's "
            "own --model.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run one worker of a run: the unit a container runs, started N times by `hopbus train`.

    Joins the run recorded in Redis (hopbus train or hopbus create), registers its inbox,
    trains every iteration with its neighbours, reports its final accuracy, and exits 0.
    Without --id it takes the run's next free id (after checking its own --curve, --bind and
    COMMAND: an id is given once); once all N have joined it exits 2.
    --advertise auto advertises this host's own address (a container's IP). If Redis or a
    neighbour cannot be reached within --timeout it prints what it waited for and exits 1.
    With --rejoin --id I it replaces dead worker I of a backup or hybrid run that went on
    without it (docs/faults.md).
    """
    from hopbus.runtime.join import worker_for
    from hopbus.runtime.own_code import give
    from hopbus.runtime.worker import report_failure

    interrupts.install()
    if timeout is not None:  # before a script starts with it (hopbus.join() checks it too)
        env = env_of("timeout")  # typer takes it for the flag: name both where it is set
        check_setting("timeout", timeout, f"--timeout ({env})" if env in os.environ else None)
    give(model, data)
    url = redis or DEFAULT_URL
    w = None
    if command:
        _script_worker(
            run, worker_id, url, command, bind=bind, advertise=advertise, timeout=timeout,
            curve=curve, device=device, rejoin=rejoin, tensorboard=tensorboard,
            checkpoint=checkpoint_dir is not None or resume_from is not None,
        )  # fmt: skip
        return
    try:
        w = worker_for(
            run,
            worker_id,
            url,
            bind=bind,
            advertise=resolve_advertise(advertise, url),
            timeout=timeout,
            device=device,
            curve=curve,
            checkpoint_dir=checkpoint_dir,
            resume_from=resume_from,
            rejoin=rejoin,
            tensorboard=tensorboard,
        )
        result = w.run_loop()
    except UserError as exc:
        quiet = isinstance(exc, RunStopped | RejoinFailed | DeclaredDead)
        # a refused process writes nothing. One that failed before it took the place the
        # run's join counter gave it (its --model did not load here), while it was still
        # free, says so to the run, which fails if no other process takes the place (one
        # with --id may be loading: hopbus watch waits --timeout). With --id it may be a
        # stray beside the real one, still loading: it says so only on its own terminal
        if w is not None and not quiet and w.admitted:
            report_failure(url, run, w.node, str(exc))
        elif w is not None and not quiet and worker_id is None and w.vacant():
            report_failure(url, run, w.node, str(exc), kind=JOIN_FAILED)
        raise
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (docker stop): why it is gone, for watch
        if w is not None and w.admitted:
            report_failure(url, run, w.node, INTERRUPTED_LINE, kind=INTERRUPTED)
        raise
    except SystemExit as exc:  # hopbus's loop exits by returning: the run's own code did it
        who = "worker" if w is None else f"worker {w.node}"
        line = (
            f"{who}: the run's --model or --data code ended the program in training "
            f"(sys.exit({exc.code!r})); it must return or raise"
        )
        if w is not None and w.admitted:
            report_failure(url, run, w.node, line)
        raise RunFailure(line) from None
    print(f"hopbus: worker {w.node} finished {result['iterations']} iterations{_accuracy(result)}")


def _accuracy(result: dict[str, Any]) -> str:
    acc = result.get("final_accuracy")
    return "" if acc is None else f", test accuracy {acc:.4f}"


def _script_worker(
    run: str, worker_id: int | None, url: str, command: list[str], *, checkpoint: bool,
    advertise: str | None, **settings: Any,
) -> None:  # fmt: skip
    """``hopbus worker -- COMMAND``: the script as this worker (hopbus/runtime/command.py)."""
    from hopbus.runtime.command import run_command

    if checkpoint:
        raise ConfigError(
            "--checkpoint-dir and --resume-from are for hopbus's own models; a script saves its "
            "own state (for Keras: keras.callbacks.BackupAndRestore)"
        )
    worker_id = run_command(
        run, worker_id, url, command, advertise=resolve_advertise(advertise, url), **settings
    )
    print(f"hopbus: worker {worker_id} finished its part of run {run} (`{' '.join(command)}`)")


@app.command("ps")
def ps_cmd(
    run: Annotated[
        str,
        typer.Option(
            "--run", "-r", envvar="HOPBUS_RUN", help="Run id to serve (its config is in Redis)."
        ),
    ],
    redis: o.RedisUrl = None,
    bind: o.Bind = DEFAULT_BIND,
    advertise: o.Advertise = None,
    timeout: o.NodeTimeout = None,
    curve: o.CurveNode = None,
    model: o.GivenModel = None,
    data: o.GivenData = None,
) -> None:
    """Run the parameter server of a --mode ps-* run: the service compose runs next to the
    workers, started by `hopbus train` for local runs.

    Holds the parameters, applies the workers' gradients as the run's mode says (ps-bsp, ps-ssp,
    ps-asp, ps-backup, ps-elastic), answers each worker with the new parameters, and exits 0
    when every worker has been told to finish. Node id N of a run of N workers.
    """
    from hopbus.runtime.own_code import give
    from hopbus.runtime.ps_server import ParameterServer
    from hopbus.runtime.worker import report_failure

    interrupts.install()
    give(model, data)
    url = redis or DEFAULT_URL
    ps = ParameterServer(
        run,
        url,
        bind=bind,
        advertise=resolve_advertise(advertise, url),
        timeout=timeout,
        curve=curve,
    )
    try:
        result = ps.run_loop()
    except UserError as exc:
        if ps.admitted and not isinstance(exc, RunStopped):  # a refused server writes nothing
            report_failure(url, run, ps.node, str(exc))
        raise
    print(
        f"hopbus: parameter server applied {result['versions']} updates, test accuracy "
        f"{result['final_accuracy']:.4f}"
    )


@app.command("inspect")
def inspect_cmd(
    run: o.RunId = None,
    redis: o.RedisUrl = None,
    last: Annotated[int, typer.Option("--last", help="Progress entries and events shown.")] = 10,
    list_runs: Annotated[
        bool, typer.Option("--list", help="List the runs this Redis holds.")
    ] = False,
    as_json: o.Json = False,
) -> None:
    """Show a run as Redis holds it: every worker's iteration and state, token queue lengths,
    the iteration gaps against their Table 1 bounds, dropped frames, the latest progress and
    events. Reads Redis only; works while the run goes on and after it ended."""
    from redis import ResponseError

    from hopbus.coord.client import connect
    from hopbus.coord.runs import list_runs as runs_in
    from hopbus.coord.snapshot import snapshot

    if last < 0:
        raise ConfigError(f"--last must be 0 or more (got {last})")
    client = connect(redis or DEFAULT_URL, timeout=5)
    if list_runs or run is None:
        runs = runs_in(client)
        if as_json:
            _emit_json({"runs": runs})
        elif runs:
            print("\n".join(runs))
        elif list_runs:
            print("hopbus: no runs in this Redis", file=sys.stderr)  # an empty list, not an error
        elif run is None:
            raise ConfigError("no runs in this Redis; give --run RUN (or --redis URL)")
        return
    keys = RunKeys(run)
    try:
        snap = snapshot(client, keys, last=last, url=redis)
    except ResponseError as exc:  # WRONGTYPE, say: which key, as Redis's refusal does not say
        raise refused_read(client, keys, exc) from None
    if as_json:
        _emit_json(snap)
    else:
        render.inspect(Console(), snap)


def refused_read(client: Redis, keys: RunKeys, exc: Exception) -> ConfigError:
    """A reader's refusal (inspect, top) in one line: what Redis said and, as a WRONGTYPE
    names no key, which of the run's keys hold another type than hopbus keeps there."""
    from hopbus.coord import read

    if why := read.refused_because(exc, ""):  # not the run's keys: who reads them, or an OOM
        return ConfigError(f"run {keys.run}: Redis refused a read ({read.refusal(exc)}): {why}")
    named = _misplaced(client, keys)
    return ConfigError(
        f"run {keys.run}: Redis refused a read ({read.refusal(exc)})"
        + (f"; {named}" if named else "")
    )


def _misplaced(client: Redis, keys: RunKeys) -> str:
    """``keys that hold another type ...: KEY (a hash; ...), ...`` for a refusal's line, or
    '' when no key of the run is of another type (the refusal came from elsewhere)."""
    from hopbus.coord.keys import named_keys
    from hopbus.coord.runs import misplaced

    found = misplaced(client, keys)
    return named_keys(found) if found else ""


@app.command("clean")
def clean_cmd(
    run: Annotated[
        str, typer.Option("--run", "-r", envvar="HOPBUS_RUN", help="Run id whose keys to delete.")
    ],
    redis: o.RedisUrl = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Also delete a run that is still running: it is stopped first (its workers "
            "exit 1, saying so), then its keys go once their heartbeats have lapsed.",
        ),
    ] = False,
) -> None:
    """Delete every Redis key of a run that no process runs any more (hop:{RUN}:*): finished,
    failed, stopped or abandoned (started, but nothing beats: a killed launcher's)."""
    from redis import ResponseError

    from hopbus.coord import read
    from hopbus.coord.client import connect
    from hopbus.coord.runs import clean_run, status_of

    client = connect(redis or DEFAULT_URL, timeout=5)
    keys = RunKeys(run)
    try:
        status = status_of(client, keys)  # what its keys say: a run nobody runs any more is not
    except ResponseError as exc:
        if read.refused_because(exc, ""):  # a user without the right: --force too
            raise refused_read(client, keys, exc) from None
        if not force:  # a key of the run of another type (WRONGTYPE): its status unknown
            which = _misplaced(client, keys) or "a key of another type than hopbus writes there"
            raise ConfigError(
                f"run {run} has {which}, so whether it runs is unknown: pass --force to delete "
                "its keys anyway"
            ) from None
        status = "unknown"
    if status == "running" and not force:  # "starting": created, and no worker came yet
        raise ConfigError(
            f"run {run} is {status} (a node's heartbeat, or its launcher's, is alive): stop it "
            "first, or pass --force to delete its keys under its workers"
        )
    if status == "running":  # --force: stopped first, or its workers would put it back
        from hopbus.coord import read
        from hopbus.coord.runs import stop_for_removal

        cfg = read.json_object(client.hget(keys.meta, "config")) or {}
        beat = read.number(cfg.get("heartbeat"))  # as recorded: forged, NaN, huge...
        patience = (min(beat, 120.0) if beat is not None and 0 < beat < 1e9 else 10.0) + 1.0
        print(
            f"hopbus: stopping run {run} first; waiting up to {patience:g} s for its nodes' "
            "heartbeats to lapse",
            file=sys.stderr,
        )
        if left := stop_for_removal(client, keys, patience):
            print(
                f"hopbus: warning: {left} node(s) of run {run} still beat; their keys may come "
                "back",
                file=sys.stderr,
            )
    n = clean_run(client, keys)
    from hopbus.coord.acl import delete_user, user_of

    user = delete_user(client, keys)
    if n == 0 and not user:  # a mistyped id would otherwise pass for a cleaned run
        raise ConfigError(
            f"run {run} has no keys in Redis at {redact(redis or DEFAULT_URL)}: nothing to "
            f"remove (hopbus inspect --list{redis_flag(redis)} lists its runs)"
        )
    gone = f" and its Redis user {user_of(run)}" if user else ""
    print(f"hopbus: removed {n} key{'s' if n != 1 else ''} of run {run}{gone}")
    if user is None and client.connection_pool.connection_kwargs.get("username") == user_of(run):
        print(
            f"hopbus: note: the run's Redis user {user_of(run)} stays (this URL logs in as it, "
            "and a user cannot remove itself): remove it with an ACL administrator's URL, "
            f"hopbus clean --run {run} --redis ADMIN_URL",
            file=sys.stderr,
        )
