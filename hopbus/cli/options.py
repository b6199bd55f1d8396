"""The run flags, defined once: ``hopbus sim`` now and ``hopbus train`` later take the same ones.

Every flag defaults to None here, meaning "not given": the RunConfig default (shown in --help)
or the ``--config`` file's value applies. Each flag can also come from ``HOPBUS_<NAME>``.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any

import typer

from hopbus.config import (
    SIM_ONLY,
    TRAIN_ONLY,
    RunConfig,
    TrainConfig,
    check_shadowed,
    env_of,
    flag_of,
    load_toml,
    make_config,
)
from hopbus.heterogeneity import SlowdownScope
from hopbus.modes import HOP_MODES, Approach, Family, Mode
from hopbus.topology import NAMES

PANEL_RUN = "Run"
PANEL_SIM = "Simulation"
PANEL_TRAIN = "Training"
PANEL_CLUSTER = "Cluster"


def _help(field: str, extra: str = "", text: str | None = None, default: str | None = None) -> str:
    """The field's description, ``extra``, and its default (``default``: said otherwise)."""
    info = TrainConfig.model_fields[field]
    shown = default if default is not None else getattr(info.default, "value", info.default)
    text = (info.description or "" if text is None else text) + (f" {extra}" if extra else "")
    return f"{text} [default: {shown}]" if shown is not None else text


def _opt(
    field: str,
    *names: str,
    panel: str = PANEL_RUN,
    extra: str = "",
    text: str | None = None,
    default: str | None = None,
    **kw: Any,
) -> Any:
    """The flag of TrainConfig's ``field``: its description (or ``text``), then ``extra``."""
    return typer.Option(
        flag_of(field),
        *names,
        envvar=env_of(field),
        help=_help(field, extra, text, default),
        show_default=False,
        rich_help_panel=panel,
        **kw,
    )


_TOPOLOGIES = " | ".join(NAMES)

Workers = Annotated[int | None, _opt("workers", "-n")]
TopologyName = Annotated[
    str | None, _opt("topology", "-t", extra=(f"{_TOPOLOGIES}; see `hopbus topology --help`."))
]
_HOP_RULES = (
    "standard: every in-neighbour's update of this iteration (Fig. 4); notify-ack: standard "
    "plus ACKs (Sec. 3.3); backup: all but --backup of them (Fig. 8); staleness: each "
    "neighbour's newest, at most --staleness old (Fig. 9); hybrid: both."
)
_PS_SCHEMES = (
    "ps-bsp, ps-ssp (--staleness), ps-asp, ps-backup (--backup of the --workers), ps-elastic "
    "(--lookahead)"
)


def _mode_opt(modes: tuple[Mode, ...], extra: str, text: str | None = None) -> Any:
    """--mode with the modes a command runs in its help (a refused one still gets the line
    saying where it runs)."""
    return _opt("mode", "-m", metavar="<" + "|".join(modes) + ">", extra=extra, text=text)


ModeOpt = Annotated[
    Mode | None,
    _mode_opt(
        tuple(Mode),
        _HOP_RULES + " Related schemes, for comparison: " + _PS_SCHEMES + ", wagma "
        "(--group-size, --sync-period), allreduce: synchronous SGD, gradients summed by a "
        "ring all-reduce (torch.distributed, gloo; needs the bench extra); see docs/schemes.md.",
    ),
]
SimModeOpt = Annotated[
    Mode | None,
    _mode_opt(
        tuple(m for m in Mode if m.is_hop or m.family is Family.PS),
        _HOP_RULES + " The parameter server's schemes, for comparison: " + _PS_SCHEMES
        + ". wagma and allreduce run on the cluster only (hopbus train); see docs/schemes.md.",
    ),
]  # fmt: skip
LaunchModeOpt = Annotated[
    Mode | None,
    _mode_opt(
        HOP_MODES,
        _HOP_RULES + " A script exchanges its parameters, so the related schemes (ps-*, wagma, "
        "allreduce) run with hopbus train only.",
        text="Recv rule.",
    ),
]
Backup = Annotated[
    str | None,
    _opt(
        "backup",
        "-b",
        extra=("Raise with more stragglers; each worker must still wait for one neighbour."),
    ),
]
Staleness = Annotated[int | None, _opt("staleness", "-s")]
MaxIg = Annotated[
    int | None,
    _opt(
        "max_ig",
        extra=(
            "A worker never runs more than this many iterations ahead of an out-neighbour "
            "(Sec. 4.2). Mandatory with backup workers."
        ),
    ),
]
SkipMax = Annotated[
    int | None,
    _opt(
        "skip_max",
        extra=("Lets a worker that is slow every iteration jump ahead (Sec. 5); try 10."),
    ),
]
SkipTrigger = Annotated[int | None, _opt("skip_trigger")]
Iterations = Annotated[int | None, _opt("iterations", "-k")]
Slowdown = Annotated[
    str | None,
    _opt(
        "slowdown",
        extra=(
            "e.g. random:6 (each worker 6x slower with probability 1/n per iteration), "
            "fixed:4@0 (worker 0 4x slower always; below 1 is faster), link:50@0-1 (50 extra "
            "milliseconds per message between workers 0 and 1), link:0.2/1Gbit@0-1 (0.2 ms "
            "plus the message's bytes at 1 Gbit/s), machines:4,4@20/125MB (workers 0-3 on one "
            "machine, 4-7 on another; a message between machines waits 20 ms, plus its bytes "
            "at 125 MB/s, for each message the busier of the two machines' links carries in "
            "an iteration; in hopbus train's ps-* modes the server on a third). "
            "Bandwidths: bit, kbit, Mbit, Gbit (or bps .. Gbps), B, kB, MB, GB per second."
        ),
    ),
]
Seed = Annotated[int | None, _opt("seed")]
SlowdownScopeOpt = Annotated[SlowdownScope | None, _opt("slowdown_scope")]
MessageBytes = Annotated[str | None, _opt("message_bytes", metavar="BYTES")]
ApproachOpt = Annotated[
    Approach | None,
    _opt(
        "approach",
        extra=(
            "parallel overlaps Send with Compute (faster iterations); serial computes, applies, "
            "then sends (fewer iterations to converge)."
        ),
    ),
]
PANEL_SCHEMES = "Related schemes"
Lookahead = Annotated[int | None, _opt("lookahead", panel=PANEL_SCHEMES)]
GroupSize = Annotated[int | None, _opt("group_size", panel=PANEL_SCHEMES)]
SyncPeriod = Annotated[int | None, _opt("sync_period", panel=PANEL_SCHEMES)]
ComputeTime = Annotated[float | None, _opt("compute_time", panel=PANEL_SIM)]
Latency = Annotated[float | None, _opt("latency", panel=PANEL_SIM)]
Jitter = Annotated[float | None, _opt("jitter", panel=PANEL_SIM)]
_SIZE = "In the simulator: only the size of an update, charged on links with a bandwidth."
SimModel = Annotated[
    str | None,
    _opt(
        "model",
        panel=PANEL_SIM,
        text="Model: logreg, softmax, mlp, cnn or vgg11 (hopbus's own; for your own model give "
        "its size with --message-bytes).",
        extra=_SIZE,
    ),
]
SimData = Annotated[str | None, _opt("data", panel=PANEL_SIM, extra=_SIZE)]
SimDataDir = Annotated[str | None, _opt("data_dir", panel=PANEL_SIM)]
SimHidden = Annotated[int | None, _opt("hidden", panel=PANEL_SIM)]
TrainWorkers = Annotated[
    int | None,
    typer.Option(
        "--workers",
        "-n",
        envvar="HOPBUS_WORKERS",
        help="Number of worker processes (default 4, or as many as the topology names for "
        "hierarchical:... and file:...).",
        show_default=False,
        rich_help_panel=PANEL_RUN,
    ),
]
Model = Annotated[str | None, _opt("model", panel=PANEL_TRAIN)]
CreateModel = Annotated[
    str | None,
    _opt(
        "model",
        panel=PANEL_TRAIN,
        extra="Or script: a run whose workers are your own script, each started with hopbus "
        "worker --run R -- COMMAND (hopbus launch records its runs so).",
    ),
]
Data = Annotated[str | None, _opt("data", panel=PANEL_TRAIN)]
DataDir = Annotated[str | None, _opt("data_dir", panel=PANEL_TRAIN)]
Device = Annotated[str | None, _opt("device", panel=PANEL_TRAIN)]
Hidden = Annotated[int | None, _opt("hidden", panel=PANEL_TRAIN)]
BatchSize = Annotated[int | None, _opt("batch_size", panel=PANEL_TRAIN)]
Lr = Annotated[float | None, _opt("lr", panel=PANEL_TRAIN)]
Momentum = Annotated[float | None, _opt("momentum", panel=PANEL_TRAIN)]
WeightDecay = Annotated[float | None, _opt("weight_decay", panel=PANEL_TRAIN)]
IterTime = Annotated[float | None, _opt("iter_time", panel=PANEL_TRAIN)]
LaunchIterTime = Annotated[
    float | None,
    _opt(
        "iter_time",
        panel=PANEL_TRAIN,
        text="Emulated seconds of one batch: your script's step, then a sleep up to this times "
        "the worker's --slowdown factor; 0 = the step's own time (still multiplied by the "
        "slowdown factor).",
    ),
]
EvalEvery = Annotated[int | None, _opt("eval_every", panel=PANEL_TRAIN)]
TargetLoss = Annotated[float | None, _opt("target_loss", panel=PANEL_TRAIN)]
CheckpointEvery = Annotated[int | None, _opt("checkpoint_every", panel=PANEL_TRAIN)]
Timeout = Annotated[float | None, _opt("timeout", panel=PANEL_CLUSTER)]
#: hopbus worker's and ps's: they take the run's --timeout where none is given
NodeTimeout = Annotated[
    float | None,
    _opt("timeout", panel=PANEL_CLUSTER, default="the run's --timeout; 60 until it is read"),
]
HeartbeatOpt = Annotated[float | None, _opt("heartbeat", panel=PANEL_CLUSTER)]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis",
        envvar="HOPBUS_REDIS",
        help="Redis to coordinate through: redis://[user:password@]host:port/db, rediss://... "
        "(TLS) or unix:///path. Prefer the HOPBUS_REDIS variable for URLs with a password: "
        "command lines are visible to other users. [default: train starts a private "
        "redis-server (launch too); create, worker, ps, watch, inspect, top and clean use "
        "redis://127.0.0.1:6379/0]",
        show_default=False,
        rich_help_panel=PANEL_CLUSTER,
    ),
]
RunId = Annotated[
    str | None,
    typer.Option(
        "--run",
        "-r",
        envvar="HOPBUS_RUN",
        help="Run id: names the run's Redis keys (hop:{RUN}:...) and its results folder.",
        show_default=False,
        rich_help_panel=PANEL_CLUSTER,
    ),
]

Bind = Annotated[
    str,
    typer.Option(
        "--bind",
        envvar="HOPBUS_BIND",
        help="ZeroMQ address of this process's inbox; port * = any free port. Use "
        "tcp://*:PORT with --advertise in containers and on several hosts. With --mode "
        "allreduce, worker 0's rendezvous store listens on this port (the workers need no "
        "inbox).",
        rich_help_panel=PANEL_CLUSTER,
    ),
]
Advertise = Annotated[
    str | None,
    typer.Option(
        "--advertise",
        envvar="HOPBUS_ADVERTISE",
        help="Host name or IPv4 address peers use to reach this process (no tcp://, no port: "
        "the bound port is used), or auto (this host's own address, e.g. a container's IP) "
        "[default: the bound address, or this host's name when bound to *].",
        show_default=False,
        rich_help_panel=PANEL_CLUSTER,
    ),
]
CURVE_HELP = (
    "Folder of the run's ZeroMQ CURVE keys (made by `hopbus keys generate DIR`; every machine "
    "of the run needs a copy). "
)
CurveRun = Annotated[
    Path | None,
    typer.Option(
        "--curve",
        envvar="HOPBUS_CURVE",
        metavar="DIR",
        help=CURVE_HELP + "Encrypts the data plane and admits to a worker's inbox only processes "
        "that hold these keys: the run is recorded as requiring CURVE (the keys and their "
        "folder are never recorded or printed). Not with --mode allreduce (gloo); Redis "
        "traffic needs rediss:// (docs/security.md).",
        show_default=False,
        rich_help_panel=PANEL_CLUSTER,
    ),
]
_OWN_CODE = (
    "Only when the run's {flag} is your own code (MODULE:FUNCTION or FILE.py:FUNCTION): the "
    "same spec, to let this process import and run it. A node never runs code that only the "
    "run's config in Redis names (whoever has the broker's password could change that); "
    "hopbus train gives it to the processes it starts, the compose files from .env."
)


def _given(flag: str, var: str) -> Any:
    """The option of ``hopbus worker`` and ``ps`` that names the run's own code they may run
    (runtime/own_code.py)."""
    return typer.Option(
        flag,
        envvar=var,
        metavar="SPEC",
        help=_OWN_CODE.format(flag=flag),
        show_default=False,
        rich_help_panel=PANEL_CLUSTER,
    )


GivenModel = Annotated[str | None, _given("--model", "HOPBUS_MODEL")]
GivenData = Annotated[str | None, _given("--data", "HOPBUS_DATA")]
CurveNode = Annotated[
    Path | None,
    typer.Option(
        "--curve",
        envvar="HOPBUS_CURVE",
        metavar="DIR",
        help=CURVE_HELP + "Needed, and only accepted, when the run was created with --curve.",
        show_default=False,
        rich_help_panel=PANEL_CLUSTER,
    ),
]
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar="HOPBUS_CONFIG",
        rich_help_panel=PANEL_RUN,
        help="TOML file of settings (keys as the flags, e.g. max_ig = 10); flags override it.",
    ),
]
Json = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON summary object on stdout instead of the table."),
]


def run_flags(params: dict[str, Any]) -> dict[str, Any]:
    """The run flags among a command's parameters (call with ``locals()`` first thing), keyed
    by config field, None where not given."""
    return {k: v for k, v in params.items() if k in TrainConfig.model_fields}


def resolve(
    config_file: Path | None,
    given: dict[str, Any],
    cls: type[RunConfig] = RunConfig,
    ignore: Collection[str] = (),
) -> RunConfig:
    """Defaults < config file < environment/flags. ``given`` maps field names to flag values,
    None where the flag was not given. A file may hold settings of both ``hopbus sim`` and
    ``hopbus train`` (train writes its config.toml that way); each takes its own. ``ignore``:
    the file's settings the command has no use for (hopbus launch: those of hopbus's own
    models), dropped unread (the caller says so)."""
    values: dict[str, Any] = {}
    from_file: dict[str, str] = {}
    if config_file is not None:
        other = {*(TRAIN_ONLY if cls is RunConfig else SIM_ONLY), *ignore}
        values.update({k: v for k, v in load_toml(config_file).items() if k not in other})
        from_file = dict.fromkeys(values, str(config_file))
    shadowed = {k: values[k] for k, v in given.items() if v is not None and k in values}
    for key, value in given.items():
        if value is not None:
            values[key] = value
            from_file.pop(key, None)
    cfg = make_config(values, from_file, cls)
    if shadowed:
        check_shadowed(values, shadowed, str(config_file), cls)
    return cfg


def warn_unused(cfg: RunConfig, given: dict[str, Any]) -> None:
    """Say so when a flag was given that the chosen mode ignores."""
    m, hop = cfg.mode, cfg.mode.is_hop
    unused = {
        "backup": not (m.uses_backup or m is Mode.PS_BACKUP),
        "staleness": not (m.uses_staleness or m is Mode.PS_SSP),
        "skip_trigger": hop and cfg.skip_max < 2,
        "topology": not hop,
        "max_ig": not hop,
        "skip_max": not hop,
        "approach": not hop,
        "lookahead": m is not Mode.PS_ELASTIC,
        "group_size": m is not Mode.WAGMA,
        "sync_period": m is not Mode.WAGMA,
    }
    from hopbus.heterogeneity import FixedSlowdown, RandomSlowdown, parse
    from hopbus.models.tf import TF_MODELS

    parts = parse(cfg.slowdown)
    if given.get("message_bytes") is not None and not any(
        getattr(p, "s_per_byte", 0) for p in parts
    ):
        warnings.warn(
            "--message-bytes has no effect without a bandwidth in --slowdown "
            "(link:MS/BW@I-J or machines:A,B,..@MS/BW): only bandwidths charge bytes",
            UserWarning,
            stacklevel=2,
        )
    if given.get("slowdown_scope") == "iteration" and not any(
        isinstance(p, RandomSlowdown | FixedSlowdown) for p in parts
    ):
        warnings.warn(
            "--slowdown-scope iteration has no effect without a random:... or fixed:... part "
            "in --slowdown: nobody is slowed",
            UserWarning,
            stacklevel=2,
        )
    if hop and cfg.skip_max == 1 and "skip_max" in cfg.model_fields_set:
        warnings.warn(
            "--skip-max 1 never jumps: a jump moves 2 iterations or more (1 is a plain step), "
            "so skipping takes --skip-max 2 or more",
            UserWarning,
            stacklevel=2,
        )
    beat, wait = getattr(cfg, "heartbeat", None), getattr(cfg, "timeout", None)
    chosen = "heartbeat" in cfg.model_fields_set  # by a flag, the environment or a file
    if chosen and beat is not None and wait is not None and beat > wait:
        warnings.warn(
            f"--heartbeat {beat:g} is longer than --timeout {wait:g}: a worker's heartbeat "
            f"lives {wait:g} s (capped at --timeout), so one silent that long counts as dead",
            UserWarning,
            stacklevel=2,
        )
    from hopbus.config import OWN_MODEL_FIELDS
    from hopbus.models.custom import SCRIPT

    if getattr(cfg, "model", None) == SCRIPT:  # hopbus create --model script: launch's run
        refused = ("model", "checkpoint_every")  # checkpoints: refused, saying why
        chosen_own = {  # by a flag, the environment or a config file (not launch's record)
            f for f in cfg.model_fields_set if getattr(cfg, f) != SCRIPT
        } | {f for f, v in given.items() if v is not None}
        own = [flag_of(f) for f in OWN_MODEL_FIELDS if f not in refused and f in chosen_own]
        if own:
            warnings.warn(
                f"{', '.join(own)} {'has' if len(own) == 1 else 'have'} no effect with --model "
                "script: settings of hopbus's own models; the script sets its own",
                UserWarning,
                stacklevel=2,
            )
    elif given.get("device") not in (None, "auto") and cfg.model not in TF_MODELS:
        warnings.warn(
            f"--device has no effect with --model {cfg.model}: the numpy models run on the CPU",
            UserWarning,
            stacklevel=2,
        )
    for field, ignored in unused.items():
        if ignored and given.get(field) is not None:
            why = (
                "without --skip-max 2 or more"
                if field == "skip_trigger" and hop
                else f"with --mode {cfg.mode}"
            )
            warnings.warn(f"{flag_of(field)} has no effect {why}", UserWarning, stacklevel=2)
