"""One validated RunConfig, from a TOML file, environment variables and CLI flags.

Precedence, lowest first: built-in defaults, ``--config FILE.toml``, ``HOPBUS_*`` environment
variables, command-line flags. Every layer that runs anything (simulator now, cluster later)
takes a RunConfig, so a setting means the same everywhere and is checked in one place.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hopbus import heterogeneity
from hopbus.baselines.spec import SchemeSettings, default_group_size
from hopbus.baselines.spec import check as check_scheme
from hopbus.errors import ConfigError, SlowdownSpecError
from hopbus.heterogeneity import SlowdownScope
from hopbus.models.tf.runtime import DEVICE_HELP, DEVICE_PATTERN
from hopbus.modes import Approach, Mode
from hopbus.protocol.spec import ProtocolSettings
from hopbus.topology import GapSetting, Topology
from hopbus.topology.graphs import SIZED
from hopbus.userfiles import read_text

DEFAULT_WORKERS = 16
MAX_ITERATIONS = 100_000_000  # iteration counters are 32-bit in the gap monitor
MAX_BOUND = 1000
"""The largest --staleness and --max-ig: a worker keeps up to that many updates per neighbour
and Redis holds up to that many tokens per queue, pushed in one atomic step. Workers 1000
iterations apart are not bound by anything in practice (the paper uses 5 to 20)."""
MAX_SECONDS = 1e6  # a simulated Compute or message of more than 11 days is a typo


def _takes_bool(field: Any) -> bool:
    annotation = field.annotation
    return annotation is bool or bool in typing.get_args(annotation)


def _kind(field: Any) -> str:
    args = typing.get_args(field.annotation) or (field.annotation,)
    return "number" if any(a in (int, float) for a in args) else "value of its kind"


class RunConfig(BaseModel):
    """Every setting of a run. Field docs are what ``--help`` shows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int | None = Field(  # checked by the graph builders: at least 2, at most MAX_WORKERS
        None,
        description=f"Number of workers (default {DEFAULT_WORKERS}, or as many as the topology "
        "names for hierarchical:... and file:...).",
    )
    topology: str = Field("ring-based", description="Communication graph.")
    mode: Mode = Field(Mode.STANDARD, description="Recv rule, or a related scheme.")
    backup: int | tuple[int, ...] = Field(
        1,
        description="Backup workers N_buw per worker (backup, hybrid): one value, or one per "
        "worker.",
    )
    staleness: int = Field(
        5, ge=0, le=MAX_BOUND, description="Staleness bound s (staleness, hybrid)."
    )
    max_ig: int = Field(
        5, ge=0, le=MAX_BOUND, description="Token queue bound max_ig; 0 = no token queues."
    )
    skip_max: int = Field(
        0, ge=0, le=MAX_ITERATIONS, description="Most iterations per jump; 0 (or 1) = never jump."
    )
    skip_trigger: int = Field(
        1, ge=0, le=MAX_ITERATIONS, description="Jump only when more than this far behind."
    )
    iterations: int = Field(100, ge=1, le=MAX_ITERATIONS, description="Iterations per worker.")
    slowdown: str = Field("none", description="Heterogeneity: " + heterogeneity.GRAMMAR)
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed of every random draw.")
    approach: Approach = Field(Approach.PARALLEL, description="Where Send sits in an iteration.")
    compute_time: float = Field(
        1.0,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="Simulated seconds of one normal Compute.",
    )
    latency: float = Field(
        0.05,
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="Simulated seconds a message takes.",
    )
    jitter: float = Field(
        0.0,
        ge=0,
        le=1000,
        allow_inf_nan=False,
        description="Each message takes up to (1 + jitter) x latency.",
    )
    lookahead: int = Field(
        15,
        le=MAX_ITERATIONS,
        description="ps-elastic: future iterations per worker ZipLine weighs when it picks the "
        "next barrier (R).",
    )
    group_size: int | None = Field(
        None,
        description="wagma: workers averaged together each iteration (S, a power of two; 1 = "
        "local SGD). Default: the smallest power of two at or above sqrt(workers).",
    )
    sync_period: int = Field(
        10,
        le=MAX_ITERATIONS,
        description="wagma: iterations between blocking global averages (tau).",
    )
    slowdown_scope: SlowdownScope = Field(
        SlowdownScope.COMPUTE,
        description="What a --slowdown factor F stretches: compute (the worker's Compute only; "
        "its messages take their normal time) or iteration (the whole worker: its Compute and "
        "every message it sends in that iteration take F times as long).",
    )
    message_bytes: int | None = Field(
        None,
        description="Bytes each update is charged on links with a bandwidth (--slowdown "
        "link:MS/BW@I-J, machines:...@MS/BW), in the simulator and in a real worker's inbox "
        "alike: a model of that size emulated whatever the real snapshot (VGG-11 on CIFAR-10: "
        "36902440). A number of bytes, or with a unit: 36.9MB, 35MiB. Default: the run's "
        "model's own snapshot.",
    )
    model: str = Field(
        "softmax",
        description="Model: logreg (binary), softmax or mlp (numpy); cnn or vgg11 (TensorFlow, "
        "the tf extra; images: 8x8 digits, 28x28 or 32x32x3 CIFAR-10); or MODULE:FUNCTION "
        "(or path/to/file.py:FUNCTION), your own function returning a compiled Keras model or "
        "a numpy model (docs/api.md).",
    )
    data: str = Field(
        "digits",
        description="Training data: digits | synthetic[:SAMPLES[,FEATURES[,CLASSES]]] | "
        "svmlight:PATH[,TEST_PATH] | cifar10:DIR | cifar10 with --data-dir DIR | MODULE:FUNCTION "
        "(or path/to/file.py:FUNCTION), your own function returning (x_train, y_train, x_test, "
        "y_test).",
    )
    data_dir: str | None = Field(
        None,
        description="Folder of the CIFAR-10 python batches (data_batch_1..5, test_batch) for "
        "--data cifar10; the same as --data cifar10:DIR.",
    )
    hidden: int = Field(64, ge=1, le=100_000, description="Hidden units of the mlp model.")

    @field_validator("backup", mode="before")
    @classmethod
    def _backup_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            items = [x.strip() for x in v.split(",")]
            if not all(re.fullmatch(r"-?[0-9]+", x) for x in items):
                raise ValueError("expected an integer or a comma-separated list of integers")
            values = tuple(int(x) for x in items)
            return values[0] if len(values) == 1 else values
        return v

    @field_validator("slowdown")
    @classmethod
    def _slowdown_parses(cls, v: str) -> str:
        heterogeneity.parse(v)  # raises SlowdownSpecError, reported as is
        return v

    @field_validator("message_bytes", mode="before")
    @classmethod
    def _message_size(cls, v: Any) -> Any:
        return None if v is None else heterogeneity.parse_size(v)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, values: Any) -> Any:
        """``iterations = true`` in a config file is no count (pydantic would take it as 1)."""
        if isinstance(values, dict):
            for name, value in values.items():
                field = cls.model_fields.get(name)
                if isinstance(value, bool) and field is not None and not _takes_bool(field):
                    raise ValueError(f"{name}: expected a {_kind(field)}, got {str(value).lower()}")
        return values

    @model_validator(mode="before")
    @classmethod
    def _data_dir_is_cifar10_folder(cls, values: Any) -> Any:
        """--data cifar10 --data-dir DIR becomes --data cifar10:DIR: one spelling downstream."""
        if (
            isinstance(values, dict)
            and values.get("data_dir") is not None
            and str(values.get("data", "")).strip().lower() == "cifar10"
        ):
            return {**values, "data": f"cifar10:{values['data_dir']}"}
        return values

    @field_validator("data_dir")
    @classmethod
    def _data_dir_with_cifar10(cls, v: str | None, info: ValidationInfo) -> str | None:
        from hopbus.models.custom import SCRIPT

        if info.data.get("model") == SCRIPT:  # a script's run: its data is its own (unused)
            return v
        data = str(info.data.get("data", ""))
        if v is not None and data.strip().lower() != f"cifar10:{v}".lower():
            raise ValueError(f"the CIFAR-10 folder of --data cifar10, not of --data {data}")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        from hopbus.models import ALL_MODELS
        from hopbus.models.custom import SCRIPT, is_callable_spec

        if v not in (*ALL_MODELS, SCRIPT) and not is_callable_spec(v):
            raise ValueError(
                f"unknown model, expected one of {', '.join(ALL_MODELS)} or MODULE:FUNCTION "
                "(your own: a compiled Keras model or a numpy model)"
            )
        return v

    def protocol_settings(self) -> ProtocolSettings:
        """The protocol's knobs, which share their names with these fields."""
        shared = [
            f.name for f in dataclasses.fields(ProtocolSettings) if f.name in RunConfig.model_fields
        ]
        return ProtocolSettings(**{name: getattr(self, name) for name in shared})

    def build_topology(self) -> tuple[RunConfig, Topology]:
        """Build the graph and return the config with ``workers`` filled in from it (and, for
        wagma, ``group_size``). The related schemes ignore ``--topology``: everyone depends on
        everyone (through the parameter server, or the global average), a complete graph."""
        if self.mode.is_hop:
            topo = topology_for(self.topology, self.workers, self.default_workers())
            return self.model_copy(update={"workers": topo.n}), topo
        n = self.workers if self.workers is not None else self.default_workers()
        topo = topology_for("complete", n)
        update: dict[str, Any] = {"workers": topo.n}
        if self.mode is Mode.WAGMA and self.group_size is None:
            update["group_size"] = default_group_size(topo.n)
        cfg = self.model_copy(update=update)
        check_scheme(cfg.scheme_settings())
        return cfg, topo

    def scheme_settings(self) -> SchemeSettings:
        """The related schemes' knobs (``workers`` must be filled in: see build_topology)."""
        assert self.workers is not None, "call build_topology first"
        if self.mode is Mode.PS_BACKUP and not isinstance(self.backup, int):
            raise ConfigError("--backup takes one number with --mode ps-backup (b of the N+b)")
        return SchemeSettings(
            mode=self.mode,
            workers=self.workers,
            iterations=self.iterations,
            backup=self.backup if isinstance(self.backup, int) else 0,
            staleness=self.staleness,
            lookahead=self.lookahead,
            group_size=self.group_size or default_group_size(self.workers),
            sync_period=self.sync_period,
        )

    def gap_setting(self) -> GapSetting:
        """What Table 1 (or the scheme's own bound) depends on, for the gap monitor."""
        if self.mode.is_hop:
            return self.protocol_settings().gap_setting
        return GapSetting(self.mode, staleness=self.staleness, period=self.sync_period)

    @classmethod
    def default_workers(cls) -> int:
        return DEFAULT_WORKERS

    def public(self) -> dict[str, Any]:
        """Every setting, JSON-ready (enums as their strings)."""
        return self.model_dump(mode="json")


def topology_for(name: str, workers: int | None, default: int = DEFAULT_WORKERS) -> Topology:
    """The graph ``--topology name`` names; ``workers`` None means ``default`` for graphs built
    for any size, and the graph's own size for hierarchical:... and files."""
    if workers is None and name.strip() in SIZED:
        workers = default
    return Topology.named(name, workers)


def flag_of(field: str) -> str:
    """The command-line flag of a RunConfig field: ``max_ig`` -> ``--max-ig``."""
    return "--" + field.replace("_", "-")


def env_of(field: str) -> str:
    """The environment variable of a RunConfig field's flag: ``max_ig`` -> ``HOPBUS_MAX_IG``."""
    return "HOPBUS_" + field.upper()


def _explain(exc: ValidationError, from_file: dict[str, str]) -> ConfigError:
    return _explain_error(exc.errors()[0], from_file)


def _explain_error(err: Any, from_file: dict[str, str]) -> ConfigError:
    field = str(err["loc"][0]) if err["loc"] else "config"
    where = from_file.get(field)
    if err["type"] == "extra_forbidden":
        return ConfigError(f"{where or 'config'}: unknown setting {field!r}")
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    msg = msg[0].lower() + msg[1:]
    if not err["loc"]:  # a rule over the whole settings, whose message names the setting
        named = msg.partition(":")[0]
        src = from_file.get(named)
        if src is not None:
            return ConfigError(f"{src}: {msg}")
        return ConfigError(f"{flag_of(named)}{msg[len(named) :]}" if named != msg else msg)
    name = f"{where}: {field}" if where else flag_of(field)
    return ConfigError(f"{name}: {msg} (got {err.get('input')!r})")


def check_setting(field: str, value: Any, name: str | None = None) -> Any:
    """One setting given on its own (hopbus worker's --timeout, hopbus.join(timeout=)), checked
    by the rule its field has in a run's settings: one ConfigError line naming it as ``name``
    (default: its flag)."""
    info = TrainConfig.model_fields[field]
    if isinstance(value, bool):  # True is no number of seconds (a run's settings say so too)
        raise ConfigError(f"{name or flag_of(field)}: a number is needed, not {value!r}")
    try:
        return TypeAdapter(typing.Annotated[info.annotation, info]).validate_python(value)
    except ValidationError as exc:
        said = str(_explain_error({**exc.errors()[0], "loc": (field,)}, {}))
        raise ConfigError(said.replace(flag_of(field), name, 1) if name else said) from None


def make_config(
    values: dict[str, Any],
    from_file: dict[str, str] | None = None,
    cls: type[RunConfig] = RunConfig,
) -> RunConfig:
    """Validate ``values`` as a ``cls``; any problem becomes one ConfigError line naming the
    flag, or the file and key when ``from_file`` (key -> file name) says where it came from."""
    try:
        return cls(**values)  # a bad --slowdown raises SlowdownSpecError straight through
    except ValidationError as exc:
        raise _explain(exc, from_file or {}) from None


def check_shadowed(
    values: dict[str, Any], shadowed: dict[str, Any], file: str, cls: type[RunConfig]
) -> None:
    """Refuse a config file's setting that is wrong in itself although a flag overrides it
    (``shadowed``: key -> the file's value; ``values``: the settings in force): the file is
    still broken, and the next run without the flag would fail on it. Only the setting's own
    errors count, not a disagreement with the flags that replaced its neighbours."""
    fix = "(a flag overrides it here; fix the file)"
    for key, value in shadowed.items():
        try:
            cls(**{**values, key: value})
        except ValidationError as exc:
            for err in exc.errors():
                whole = not err["loc"] and err["msg"].partition(", ")[2].startswith(f"{key}:")
                if err["loc"][:1] == (key,) or whole:
                    raise ConfigError(f"{_explain_error(err, {key: file})} {fix}") from None
        except SlowdownSpecError as exc:
            raise ConfigError(f"{file}: {key}: {exc} {fix}") from None


_KEY_PART = re.compile(r"""[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*'""")
_KEY_LINE = re.compile(
    rf"""\s*\[{{0,2}}\s*((?:{_KEY_PART.pattern})(?:\s*\.\s*(?:{_KEY_PART.pattern}))*)\s*(?:=|\])"""
)
"""A line that starts with a key (``a.b = 1``) or a table's header (``[a.b]``): group 1 the
key, whose parts ``_KEY_PART`` finds."""
MAX_KEY_PARTS = 16
"""A config key of more dotted parts than this is refused before parsing: 50,000 of them (a 100 kB
file) took tomllib past 6 GB. Settings are plain keys; a line of a multi-line string that
begins like such a key is refused too (no setting holds one)."""


def load_toml(path: str | Path) -> dict[str, Any]:
    """Settings from a TOML file, keys as field names (``max_ig``) or flag names (``max-ig``)."""
    text = read_text(path, "config file", ConfigError)
    for number, line in enumerate(text.splitlines(), 1):
        key = _KEY_LINE.match(line)  # not a comment, nor a value's line
        if key is not None and len(_KEY_PART.findall(key[1])) > MAX_KEY_PARTS:  # tomllib's
            # memory grows with the square of a key's parts
            raise ConfigError(
                f"config file {str(path)!r}, line {number}: a key of more than {MAX_KEY_PARTS} "
                "dotted parts; settings are plain keys (max_ig = 10)"
            )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    except RecursionError:  # arrays nested a thousand deep: no setting looks like that
        raise ConfigError(f"config file {str(path)!r} nests too deeply to be settings") from None
    except ValueError:  # an integer of more digits than Python converts (4300)
        raise ConfigError(
            f"config file {str(path)!r} holds a number of thousands of digits: not a setting"
        ) from None
    settings: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # each setting's key as the file writes it
    for k, v in data.items():
        name = k.replace("-", "_")
        if name in settings:  # max_ig and max-ig: which one was meant?
            raise ConfigError(f"{path}: {name} is set twice (as {spelled[name]!r} and {k!r})")
        settings[name], spelled[name] = v, k
    return settings


DEFAULT_TRAIN_WORKERS = 4  # a real run on one machine: one process per worker
SGD_FIELDS = ("lr", "momentum", "weight_decay")
"""The settings of hopbus's SGD, which its numpy models train with (not a Keras model)."""
OWN_MODEL_FIELDS = ("model", "data", "data_dir", "device", "hidden", "batch_size", *SGD_FIELDS,
                    "eval_every", "checkpoint_every")  # fmt: skip
"""The settings of hopbus's own models and data, which a script's run (hopbus launch) has no
use for: the script makes its model, data and optimizer itself."""


class TrainConfig(RunConfig):
    """A real run: the protocol settings plus the model, the data and the runtime's knobs.

    ``compute_time``, ``latency`` and ``jitter`` are the simulator's and do not apply here;
    ``iter_time`` is how a real run emulates compute time instead.
    """

    device: str = Field(
        "auto",
        description="Where a worker runs a TensorFlow model: auto (a GPU if TensorFlow sees one), "
        "cpu, gpu or gpu:N; hopbus worker --device overrides it per worker. The numpy models "
        "always run on the CPU.",
    )
    batch_size: int = Field(32, ge=1, le=1_000_000, description="Minibatch size per worker.")
    lr: float = Field(0.1, gt=0, le=1e6, allow_inf_nan=False, description="Learning rate.")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (paper: 0.9).")
    weight_decay: float = Field(
        1e-4, ge=0, le=1, description="L2 weight decay (paper: 1e-4 VGG, 1e-7 SVM)."
    )
    iter_time: float = Field(
        0.0,
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="Emulated seconds of one Compute: the real gradient, then sleep up to this "
        "times the worker's --slowdown factor; 0 = real compute time (still multiplied by the "
        "slowdown factor).",
    )
    eval_every: int = Field(
        20,
        ge=0,
        le=MAX_ITERATIONS,
        description="Evaluate each worker's model on the test set every this many iterations "
        "(0 = only at the end); needed for --target-loss.",
    )
    target_loss: float | None = Field(
        None,
        allow_inf_nan=False,
        description="Report time_to_target: when the workers' mean test loss first reaches this.",
    )
    checkpoint_every: int = Field(
        0,
        ge=0,
        le=MAX_ITERATIONS,
        description="Write each worker's parameters, optimizer state and iteration every this "
        "many iterations (Hop modes), under the results folder's checkpoints/; a killed run "
        "then loses at most this many iterations (hopbus train --resume RUN). 0 = never. Use "
        "it for long runs; each costs one file write per worker.",
    )
    timeout: float = Field(
        60.0,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="Seconds a worker waits for Redis, a neighbour's endpoint, update or token "
        "before it gives up and says what it waited for. Raise it for slow models.",
    )
    curve: bool = Field(
        False,
        description="The run requires ZeroMQ CURVE encryption and authentication on its data "
        "plane: every worker and parameter server must be given the run's key folder (hopbus "
        "keys generate). Only this flag is recorded, never the keys or their folder.",
    )
    heartbeat: float = Field(
        10.0,
        ge=1,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="Seconds a worker's heartbeat lives in Redis (it is renewed three times as "
        "often): a worker silent this long counts as dead. Lower it to go on sooner after a "
        "crash; raise it on overloaded machines whose processes may stall that long. Capped "
        "at --timeout.",
    )

    @classmethod
    def default_workers(cls) -> int:
        return DEFAULT_TRAIN_WORKERS

    def public(self) -> dict[str, Any]:
        """Every setting a real run uses: the simulator's time model left out, and in a
        script's run (hopbus launch) the settings of hopbus's own models, which it has no use
        for, but its ``model`` and ``data``, which say that it is one (its record in Redis,
        config.toml, the summary's ``config``)."""
        from hopbus.models.custom import SCRIPT

        if self.model != SCRIPT:
            return {k: v for k, v in super().public().items() if k not in SIM_ONLY}
        unused = set(OWN_MODEL_FIELDS) - {"model", "data"}
        kept = {k: v for k, v in super().public().items() if k not in {*SIM_ONLY, *unused}}
        return {**kept, "data": SCRIPT}  # its data is the script's (create took --data's default)

    @field_validator("device")
    @classmethod
    def _device_spelling(cls, v: str) -> str:
        if not re.fullmatch(DEVICE_PATTERN, v):
            raise ValueError(DEVICE_HELP)
        return v

    @field_validator("curve")
    @classmethod
    def _curve_covers_the_mode(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("mode") is Mode.ALLREDUCE:
            raise ConfigError(
                "--curve cannot protect --mode allreduce: its gradients travel over gloo, not "
                "ZeroMQ (see docs/security.md); run it on a trusted network without --curve"
            )
        return v


SIM_ONLY = ("compute_time", "latency", "jitter")
TRAIN_ONLY = tuple(f for f in TrainConfig.model_fields if f not in RunConfig.model_fields)
