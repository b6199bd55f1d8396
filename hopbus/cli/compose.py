"""``hopbus compose generate``: a docker compose file for a mix of CPU and GPU workers.

The file is printed as JSON, which is valid YAML, so no YAML library is needed; ``docker compose
-f FILE`` reads it as it is. Its paths are relative to the ``compose/`` folder (save it there).
The services are those of compose/docker-compose.yml: ``redis`` (broker/ mounted), ``init``
(``hopbus create``), one worker service per kind with ``deploy.replicas``, ``watch``, and for a
``ps-*`` mode the parameter server (``hopbus ps``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from hopbus.cli import options as o
from hopbus.cli.commands import app
from hopbus.config import TrainConfig, flag_of
from hopbus.modes import Family

compose_app = typer.Typer(
    help="Docker compose files for a cluster of worker containers around one Redis.",
    no_args_is_help=True,
)
app.add_typer(compose_app, name="compose")

REDIS_URL = "redis://hopbus:${REDIS_PASSWORD:?set REDIS_PASSWORD in compose/.env}@redis:6379/0"
INBOX = ["--bind", "tcp://0.0.0.0:5555", "--advertise", "auto"]  # each replica: its own IP
DOCKERFILES = {"cpu": "workers/Dockerfile.cpu", "gpu": "workers/Dockerfile.gpu"}
RESULTS = "/home/hopbus/runs"  # hopbus watch's default --out root in the images


def _image(kind: str) -> dict[str, Any]:
    return {
        "build": {"context": "..", "dockerfile": DOCKERFILES[kind]},
        "image": f"hopbus-worker:{kind}",
        "environment": {"HOPBUS_REDIS": REDIS_URL},  # not on the command line: a password
    }


def redis_service() -> dict[str, Any]:
    """Redis with broker/redis.conf and broker/users.acl: only the hopbus user may log in."""
    conf = "/usr/local/etc/redis"
    ping = 'redis-cli --user hopbus --pass "$$REDIS_PASSWORD" --no-auth-warning ping | grep -q PONG'
    return {
        "image": "redis:7",
        "command": ["redis-server", f"{conf}/redis.conf"],
        "environment": {"REDIS_PASSWORD": "${REDIS_PASSWORD:?set REDIS_PASSWORD in compose/.env}"},
        "volumes": [
            f"../broker/redis.conf:{conf}/redis.conf:ro",
            f"../broker/users.acl:{conf}/users.acl:ro",
        ],
        "healthcheck": {
            "test": ["CMD-SHELL", ping],
            "interval": "2s",
            "timeout": "3s",
            "retries": 30,
        },
    }


def compose_file(
    cpu: int, gpu: int, run: str, create_flags: list[str], *, server: bool = False
) -> dict[str, Any]:
    """The services for ``cpu`` CPU and ``gpu`` GPU worker replicas of run ``run``, recorded
    by the init service with ``create_flags`` (which include --workers cpu+gpu); ``server``
    adds the parameter server a ps-* run needs."""
    healthy = {"redis": {"condition": "service_healthy"}}
    created = {**healthy, "init": {"condition": "service_completed_successfully"}}
    services: dict[str, Any] = {
        "redis": redis_service(),
        "init": {
            **_image("cpu"),
            "entrypoint": ["hopbus", "create"],
            "command": ["--run", run, *create_flags],
            "depends_on": healthy,
            "restart": "no",
        },
    }
    for kind, replicas in (("cpu", cpu), ("gpu", gpu)):
        if replicas == 0:
            continue
        service = {
            **_image(kind),
            "command": ["--run", run, *INBOX],
            "depends_on": created,
            "deploy": {"replicas": replicas},
        }
        if kind == "gpu":
            device = {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
            service["deploy"]["resources"] = {"reservations": {"devices": [device]}}
        services[f"worker-{kind}"] = service
    if server:
        services["ps"] = {
            **_image("cpu"),
            "entrypoint": ["hopbus", "ps"],
            "command": ["--run", run, *INBOX],
            "depends_on": created,
        }
    services["watch"] = {
        **_image("cpu"),
        "entrypoint": ["hopbus", "watch"],
        "command": ["--run", run, "--json"],
        "volumes": [f"results:{RESULTS}"],
        "depends_on": created,
    }
    return {"name": "hopbus", "services": services, "volumes": {"results": {}}}


@compose_app.command("generate")
def generate_cmd(
    cpu: Annotated[int, typer.Option("--cpu", help="CPU worker replicas.", min=0)] = 1,
    gpu: Annotated[int, typer.Option("--gpu", help="GPU worker replicas (NVIDIA).", min=0)] = 0,
    run: Annotated[
        str, typer.Option("--run", "-r", help="Run id the init service records.")
    ] = "hop-1",
    topology: o.TopologyName = None,
    mode: o.ModeOpt = None,
    model: o.Model = None,
    iterations: o.Iterations = None,
) -> None:
    """Print a compose file for CPU and GPU workers: `hopbus compose generate --cpu 4 --gpu 2
    > compose/mix.yml`, then `docker compose -f compose/mix.yml --env-file compose/.env up`.

    The run settings are checked as `hopbus train` checks them, and recorded with --workers
    = CPU + GPU by the init service (`hopbus create`); every worker takes its id on joining.
    A ps-* mode adds the parameter server's service (`hopbus ps`).
    """
    from hopbus.coord.keys import RunKeys
    from hopbus.errors import ConfigError
    from hopbus.runtime.launcher import check_inputs

    if cpu + gpu < 2:
        raise ConfigError(f"--cpu {cpu} --gpu {gpu}: a run needs at least 2 workers")
    RunKeys(run)  # the run id rule
    given = {
        "workers": cpu + gpu,
        "topology": topology,
        "mode": mode,
        "model": model,
        "iterations": iterations,
    }
    cfg, _, _ = check_inputs(o.resolve(None, given, TrainConfig))  # type: ignore[arg-type]
    flags: list[str] = []
    for field, value in given.items():
        if value is not None:
            flags += [flag_of(field), str(getattr(value, "value", value))]
    server = cfg.mode.family is Family.PS
    print(json.dumps(compose_file(cpu, gpu, run, flags, server=server), indent=2))
