"""One validated RunConfig, from a TOML file, environment variables and CLI flags.

Precedence, lowest first: built-in defaults, ``--config FILE.toml``, ``HOPBUS_*`` environment
variables, command-line flags. Every layer that runs anything (simulator now, cluster later)
takes a RunConfig, so a setting means the same everywhere and is checked in one place.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hopbus import heterogeneity
from hopbus.errors import ConfigError
from hopbus.modes import Approach, Mode
from hopbus.protocol.spec import ProtocolSettings
from hopbus.topology import Topology
from hopbus.topology.graphs import SIZED
from hopbus.userfiles import read_text

DEFAULT_WORKERS = 16
MAX_ITERATIONS = 100_000_000  # iteration counters are 32-bit in the gap monitor
MAX_SECONDS = 1e6  # a simulated Compute or message of more than 11 days is a typo


class RunConfig(BaseModel):
    """Every setting of a run. Field docs are what ``--help`` shows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int | None = Field(  # checked by the graph builders: at least 2, at most MAX_WORKERS
        None,
        description=f"Number of workers (default {DEFAULT_WORKERS}, or as many as the topology "
        "names for hierarchical:... and file:...).",
    )
    topology: str = Field("ring-based", description="Communication graph.")
    mode: Mode = Field(Mode.STANDARD, description="Recv rule.")
    backup: int | tuple[int, ...] = Field(
        1,
        description="Backup workers N_buw per worker (backup, hybrid): one value, or one per "
        "worker.",
    )
    staleness: int = Field(5, ge=0, description="Staleness bound s (staleness, hybrid).")
    max_ig: int = Field(5, ge=0, description="Token queue bound max_ig; 0 = no token queues.")
    skip_max: int = Field(0, ge=0, description="Most iterations per jump; 0 = never jump.")
    skip_trigger: int = Field(1, ge=0, description="Jump only when more than this far behind.")
    iterations: int = Field(100, ge=1, le=MAX_ITERATIONS, description="Iterations per worker.")
    slowdown: str = Field("none", description="Heterogeneity: " + heterogeneity.GRAMMAR)
    seed: int = Field(0, ge=0, description="Seed of every random draw.")
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

    def protocol_settings(self) -> ProtocolSettings:
        """The protocol's knobs, which share their names with these fields."""
        shared = [
            f.name for f in dataclasses.fields(ProtocolSettings) if f.name in RunConfig.model_fields
        ]
        return ProtocolSettings(**{name: getattr(self, name) for name in shared})

    def build_topology(self) -> tuple[RunConfig, Topology]:
        """Build the graph and return the config with ``workers`` filled in from it."""
        topo = topology_for(self.topology, self.workers)
        return self.model_copy(update={"workers": topo.n}), topo

    def public(self) -> dict[str, Any]:
        """Every setting, JSON-ready (enums as their strings)."""
        return self.model_dump(mode="json")


def topology_for(name: str, workers: int | None) -> Topology:
    """The graph ``--topology name`` names; ``workers`` None means the default for graphs built
    for any size, and the graph's own size for hierarchical:... and files."""
    if workers is None and name.strip() in SIZED:
        workers = DEFAULT_WORKERS
    return Topology.named(name, workers)


def flag_of(field: str) -> str:
    """The command-line flag of a RunConfig field: ``max_ig`` -> ``--max-ig``."""
    return "--" + field.replace("_", "-")


def _explain(exc: ValidationError, from_file: dict[str, str]) -> ConfigError:
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err["loc"] else "config"
    where = from_file.get(field)
    if err["type"] == "extra_forbidden":
        return ConfigError(f"{where or 'config'}: unknown setting {field!r}")
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    msg = msg[0].lower() + msg[1:]
    name = f"{where}: {field}" if where else flag_of(field)
    return ConfigError(f"{name}: {msg} (got {err.get('input')!r})")


def make_config(values: dict[str, Any], from_file: dict[str, str] | None = None) -> RunConfig:
    """Validate ``values``; any problem becomes one ConfigError line naming the flag, or the
    file and key when ``from_file`` (key -> file name) says the value came from a file."""
    try:
        return RunConfig(**values)  # a bad --slowdown raises SlowdownSpecError straight through
    except ValidationError as exc:
        raise _explain(exc, from_file or {}) from None


def load_toml(path: str | Path) -> dict[str, Any]:
    """Settings from a TOML file, keys as field names (``max_ig``) or flag names (``max-ig``)."""
    text = read_text(path, "config file", ConfigError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    return {k.replace("-", "_"): v for k, v in data.items()}
