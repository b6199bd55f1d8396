"""``hopbus compose generate``: a docker compose file, or a Docker Swarm stack file, for any mix
of workers.

The file is printed as JSON, which is valid YAML, so no YAML library is needed; ``docker compose
-f FILE`` and ``docker stack deploy -c FILE`` read it as it is. Its paths are relative to the
``compose/`` folder (save it there). The services are those of compose/docker-compose.yml:
``redis`` (broker/ as configs), ``init`` (``hopbus create``), the worker services, ``watch``,
and for a ``ps-*`` mode the parameter server (``hopbus ps``). Every hopbus service runs the
image's entrypoint, ``hopbus-entry`` (workers/entrypoint.py), which makes the Redis URL from the
password and, when RUN_ID is empty, gives every run of the stack a fresh run id.

Worker services: ``worker-cpu`` (``--cpu N`` identical replicas), one ``worker-gpu-I`` per GPU
worker, each reserving its own device I (``--gpu N``), and ``worker-NAME`` for each ``--class
NAME:COUNT:CPUS[:MEMORY]``: COUNT replicas, each limited to CPUS cores (a CFS quota) and MEMORY,
so that a slow class is slow because it has less CPU. ``--swarm`` prints the same stack for
``docker stack deploy``: an overlay network, the password as the external secret
``redis_password``, Redis and watch on a manager, GPU workers on nodes labelled
``hopbus.gpu=true`` with one generic ``NVIDIA-GPU`` resource each.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from hopbus.cli import options as o
from hopbus.cli.cluster import _TRAIN_PARAMS
from hopbus.cli.commands import app
from hopbus.config import TrainConfig, flag_of
from hopbus.errors import ConfigError
from hopbus.modes import Family

compose_app = typer.Typer(
    help="Docker compose and Docker Swarm files for a cluster of worker containers around one "
    "Redis.",
    no_args_is_help=True,
)
app.add_typer(compose_app, name="compose")

PASSWORD = "${REDIS_PASSWORD:?set REDIS_PASSWORD in compose/.env}"
INBOX = ["--bind", "tcp://0.0.0.0:5555", "--advertise", "auto"]  # each replica: its own IP
DOCKERFILES = {"cpu": "workers/Dockerfile.cpu", "gpu": "workers/Dockerfile.gpu"}
BASES = {  # the images' base: a setting (compose/.env), for hosts without a public registry
    "cpu": "${BASE_IMAGE:-python:3.11-slim}",
    "gpu": "${GPU_BASE_IMAGE:-tensorflow/tensorflow:2.16.1-gpu}",
}
EXTRAS = {  # hopbus's extras in each image: not tf in the GPU one, whose base has TensorFlow
    # for GPUs (tensorflow-cpu in its venv would hide it)
    "cpu": "${EXTRAS-tf}",
    "gpu": "${GPU_EXTRAS-}",
}
HOME = "/home/hopbus"
RESULTS = f"{HOME}/runs"  # hopbus watch's default --out root in the images
CODE = f"{HOME}/code"  # a user's MODULE:FUNCTION code folder, mounted in the images
REDIS_ETC = "/usr/local/etc/redis"
BROKER_FILES = {  # config name -> file in broker/ (mounted in REDIS_ETC)
    "redis-conf": "redis.conf",
    "redis-acl": "users.acl",
    "redis-start": "start.sh",
    "redis-password": "password.sh",
    "redis-cli": "cli.sh",
}
SECRET = "redis_password"  # a Swarm's password: docker secret create redis_password -
GPU_LABEL = "node.labels.hopbus.gpu == true"
MANAGER = "node.role == manager"
CLASS = re.compile(r"([a-z][a-z0-9]{0,29}):([0-9]+):([0-9]*\.?[0-9]+)(?::([0-9]+[bkmg]?))?")


@dataclass(frozen=True)
class WorkerClass:
    """``--class NAME:COUNT:CPUS[:MEMORY]``: COUNT workers of CPUS cores and MEMORY each."""

    name: str
    count: int
    cpus: float
    memory: str | None = None

    @classmethod
    def parse(cls, spec: str) -> WorkerClass:
        m = CLASS.fullmatch(spec.strip().lower())
        if m is None:
            raise ConfigError(
                f"--class {spec!r}: expected NAME:COUNT:CPUS[:MEMORY], e.g. fast:3:1.0 or "
                "slow:1:0.25:2g (NAME: a lowercase letter, then letters or digits)"
            )
        name, count, cpus, memory = m.group(1), int(m.group(2)), float(m.group(3)), m.group(4)
        if name in ("cpu", "gpu"):
            raise ConfigError(f"--class {spec!r}: {name!r} is taken (--cpu and --gpu)")
        if count < 1:
            raise ConfigError(f"--class {spec!r}: a class has at least 1 worker")
        if not 0.01 <= cpus <= 1024:
            raise ConfigError(f"--class {spec!r}: CPUS is between 0.01 and 1024 cores")
        if memory is not None and not MIN_MEMORY <= _bytes(memory) <= MAX_MEMORY:
            raise ConfigError(  # docker refuses less than 6 MB, and 0 would mean no limit
                f"--class {spec!r}: MEMORY is between 64m and 65536g (a k, m or g suffix, or bytes)"
            )
        return cls(name, count, cpus, memory)


MIN_MEMORY = 64 << 20  # a worker's Python and numpy alone take more
MAX_MEMORY = 64 << 40


def _bytes(memory: str) -> int:
    """``2g`` as bytes (docker's suffixes: b, k, m, g; none is bytes)."""
    scale = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if memory[-1] in scale:
        return int(memory[:-1]) * scale[memory[-1]]
    return int(memory)


def _settings(run: str | None, *, swarm: bool) -> dict[str, str]:
    """The environment every hopbus service gets (workers/entrypoint.py reads it)."""
    env = {"HOPBUS_RUN": "${RUN_ID:-}" if run is None else run}
    if not swarm:  # a Swarm reads the password from the redis_password secret
        env["REDIS_PASSWORD"] = PASSWORD
    return env


def _hopbus(
    kind: str,
    command: str,
    args: list[str],
    *,
    run: str | None,
    swarm: bool,
    code: str | None = None,
    own: dict[str, str] | None = None,
    results: bool = False,
    build: bool = False,
) -> dict[str, Any]:
    """One hopbus service: image, entrypoint, environment, mounts. ``build``: this service
    builds the image (one per image: the others only run it); ``code``: a host folder of the
    user's modules, mounted and importable (--model / --data MODULE:FUNCTION), and ``own``
    the variables that let the service run them (runtime/own_code.py); ``results``: the
    results volume (watch's folder; the workers' TensorBoard scalars)."""
    service: dict[str, Any] = {"image": f"hopbus-worker:{kind}"}
    if not swarm:
        if build:
            service["build"] = {
                "context": "..",
                "dockerfile": DOCKERFILES[kind],
                "args": {"BASE_IMAGE": BASES[kind], "EXTRAS": EXTRAS[kind]},
            }
        service["pull_policy"] = "build" if build else "never"
    service["entrypoint"] = ["hopbus-entry", command]
    service["command"] = args
    env = _settings(run, swarm=swarm)
    volumes: list[Any] = []
    if code is not None:
        env["PYTHONPATH"] = CODE
        env.update(own or {})
        # the long form: a host path with a colon or a space is one path, not a volume spec
        volumes.append({"type": "bind", "source": code, "target": CODE, "read_only": True})
    if results:
        env["HOPBUS_RESULTS"] = RESULTS
        volumes.append(f"results:{RESULTS}")
    service["environment"] = env
    if volumes:
        service["volumes"] = volumes
    if swarm:
        service["secrets"] = [SECRET]
        service["networks"] = ["hop"]
    return service


def redis_service(*, swarm: bool = False) -> dict[str, Any]:
    """Redis with broker/: start.sh hashes the password into the ACL of users.acl (only the
    hopbus user may log in); cli.sh is redis-cli logged in as that user."""
    service: dict[str, Any] = {
        "image": "${REDIS_IMAGE:-redis:7}",
        "entrypoint": ["sh", f"{REDIS_ETC}/start.sh"],
    }
    service["environment"] = {"REDIS_MAXMEMORY": "${REDIS_MAXMEMORY:-}"}  # empty: redis.conf's
    if not swarm:
        service["environment"]["REDIS_PASSWORD"] = PASSWORD
    service["configs"] = [
        {"source": name, "target": f"{REDIS_ETC}/{file}"} for name, file in BROKER_FILES.items()
    ]
    service["healthcheck"] = {
        "test": ["CMD-SHELL", f"sh {REDIS_ETC}/cli.sh ping | grep -q PONG"],
        "interval": "1s",
        "timeout": "3s",
        "retries": 60,
    }
    if swarm:
        service["secrets"] = [SECRET]
        service["networks"] = ["hop"]
        service["deploy"] = {"placement": {"constraints": [MANAGER]}, "endpoint_mode": "dnsrr"}
    return service


def _swarm_deploy(service: dict[str, Any], replicas: int = 1, **more: Any) -> None:
    """A Swarm task runs once (a finished worker is not restarted); names resolve to the
    tasks' own addresses (dnsrr: no virtual IP between the workers)."""
    service["deploy"] = {
        "replicas": replicas,
        "restart_policy": {"condition": "none"},
        "endpoint_mode": "dnsrr",
        **more,
    }


def compose_file(
    cpu: int,
    gpu: int,
    run: str | None,
    create_flags: list[str],
    *,
    classes: tuple[WorkerClass, ...] = (),
    server: bool = False,
    code: str | None = None,
    own: dict[str, str] | None = None,
    swarm: bool = False,
) -> dict[str, Any]:
    """The services for ``cpu`` CPU replicas, ``gpu`` GPU workers and ``classes`` of run
    ``run`` (None: a fresh run id per run of the stack), recorded by the init service with
    ``create_flags`` (which include --workers, the total); ``server`` adds the parameter
    server a ps-* run needs; ``code`` mounts a folder of the user's modules where the run's
    model is built (init, workers, server), whose ``own`` variables name the code they may
    run; ``swarm``: a stack for docker stack deploy."""
    kw: dict[str, Any] = {"run": run, "swarm": swarm}
    healthy = {"redis": {"condition": "service_healthy"}}
    created = {**healthy, "init": {"condition": "service_completed_successfully"}}
    # init has the results volume too: `docker compose cp init:/home/hopbus/runs .` copies
    # every run's results out, whether or not watch's container is still there
    init = _hopbus(
        "cpu", "create", create_flags, code=code, own=own, results=not swarm, build=True, **kw
    )
    services: dict[str, Any] = {"redis": redis_service(swarm=swarm), "init": init}

    def worker(kind: str, **extra: Any) -> dict[str, Any]:
        # TensorBoard scalars into the results volume on one machine; a Swarm's workers are
        # on other machines, where that volume is not
        service = _hopbus(
            kind, "worker", INBOX, code=code, own=own, results=not swarm, **extra, **kw
        )
        if not swarm:
            service["depends_on"] = created
        return service

    if cpu:
        services["worker-cpu"] = worker("cpu")
        if swarm:
            _swarm_deploy(services["worker-cpu"], cpu)
        else:
            services["worker-cpu"]["deploy"] = {"replicas": cpu}
    for c in classes:
        service = worker("cpu")
        if swarm:
            limits = {"cpus": str(c.cpus), **({"memory": c.memory} if c.memory else {})}
            _swarm_deploy(service, c.count, resources={"limits": limits})
        else:
            service["deploy"] = {"replicas": c.count}
            service["cpus"] = c.cpus
            if c.memory:
                service["mem_limit"] = c.memory
        services[f"worker-{c.name}"] = service
    if gpu and swarm:  # one task per GPU: a generic resource each, on labelled nodes
        service = worker("gpu")
        one = {"discrete_resource_spec": {"kind": "NVIDIA-GPU", "value": 1}}
        _swarm_deploy(
            service,
            gpu,
            placement={"constraints": [GPU_LABEL]},
            resources={"reservations": {"generic_resources": [one]}},
        )
        services["worker-gpu"] = service
    elif gpu:  # one service per device: replicas of one service would all get device 0
        for i in range(gpu):
            service = worker("gpu", build=i == 0)
            device = {"driver": "nvidia", "device_ids": [str(i)], "capabilities": ["gpu"]}
            service["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
            services[f"worker-gpu-{i}"] = service
    workers = [name for name in services if name.startswith("worker-")]
    if server:
        services["ps"] = _hopbus("cpu", "ps", INBOX, code=code, own=own, **kw)
        if swarm:
            _swarm_deploy(services["ps"])
        else:
            services["ps"]["depends_on"] = created
    watch = _hopbus("cpu", "watch", ["--json"], results=True, **kw)
    if swarm:  # on a manager: its results volume is where `docker cp` finds it
        _swarm_deploy(watch, placement={"constraints": [MANAGER]})
        _swarm_deploy(init)
    else:
        started = {name: {"condition": "service_started"} for name in workers}
        watch["depends_on"] = {"init": created["init"], **started}
        if server:
            watch["depends_on"]["ps"] = {"condition": "service_started"}
        init["depends_on"] = healthy
        init["restart"] = "no"
    services["watch"] = watch
    configs = {name: {"file": f"../broker/{file}"} for name, file in BROKER_FILES.items()}
    if swarm:
        return {
            "services": services,
            "networks": {"hop": {"driver": "overlay", "attachable": True}},
            # docker secret create redis_password - (REDIS_SECRET names another one)
            "secrets": {SECRET: {"external": True, "name": "${REDIS_SECRET:-redis_password}"}},
            "configs": configs,
            "volumes": {"results": {}},
        }
    return {"name": "hopbus", "services": services, "configs": configs, "volumes": {"results": {}}}


# the run flags init passes to hopbus create: all of create's but those the file decides
# (--workers: the replicas; --run: RUN_ID or --run here) and those naming files or a Redis
# of this host
LEAVES_OUT = ("workers", "run", "redis", "config", "curve_dir")


def generate_cmd(**params: Any) -> None:
    """Print a compose file for any mix of workers, or with --swarm a stack file for Docker
    Swarm (docker stack deploy): `hopbus compose generate --cpu 4 --gpu 2 > compose/mix.yml`,
    then `docker compose -f compose/mix.yml run --build --rm watch`.

    Workers: --cpu N identical replicas; --gpu N GPU workers, each with its own device;
    --class NAME:COUNT:CPUS[:MEMORY] (repeatable) COUNT replicas limited to CPUS cores and
    MEMORY (512m, 2g) each, e.g. --class fast:3:1.0 --class slow:1:0.25. Without --gpu and
    --class, --cpu defaults to 4. The run settings are checked as `hopbus train` checks them,
    and recorded with --workers = the total by the init service (`hopbus create`); every
    worker takes its id on joining. A ps-* mode adds the parameter server's service.
    """
    cpu, gpu, run, code, swarm = (params[k] for k in ("cpu", "gpu", "run", "code", "swarm"))
    classes = tuple(WorkerClass.parse(spec) for spec in params["classes"] or [])
    names = [c.name for c in classes]
    if len(set(names)) < len(names):
        raise ConfigError(f"--class: a class name is given twice ({', '.join(names)})")
    if cpu is None:
        cpu = 0 if gpu or classes else 4
    total = cpu + gpu + sum(c.count for c in classes)
    if total < 2:
        raise ConfigError(f"{total} worker(s) (--cpu, --gpu, --class): a run needs at least 2")
    from hopbus.coord.keys import check_run_id
    from hopbus.models.custom import SCRIPT, is_callable_spec
    from hopbus.runtime.launcher import check_inputs
    from hopbus.runtime.own_code import given_env
    from hopbus.topology.graphs import edge_file

    if run is not None:
        check_run_id(run)
    given = {**o.run_flags(params), "workers": total}
    if given["model"] == SCRIPT:  # its workers would be refused: they run no command
        raise ConfigError(
            "--model script: the stack's workers run hopbus's own worker, not a script; give "
            "your model as --model MODULE:FUNCTION (its file in the --code folder), or start "
            "your script with hopbus worker --run R -- COMMAND in containers of your own"
        )
    topology = given.get("topology")
    if isinstance(topology, str) and edge_file(topology) is not None:  # init would read it
        raise ConfigError(  # in its container, where this host's path is not
            f"--topology {topology!r}: the stack's init container cannot read a file of this "
            "machine: a stack runs the built-in graphs (ring, ring-based, double-ring, "
            "complete, hierarchical:A,B,...)"
        )
    own = any(v is not None and is_callable_spec(v) for v in (given["model"], given["data"]))
    # the model and data are built where the workers run (init's hopbus create checks them):
    # this host needs neither TensorFlow nor the user's modules
    cfg, _, _ = check_inputs(o.resolve(None, given, TrainConfig), load=False)  # type: ignore[arg-type]
    if code is None and own:
        code = "../examples"
    if code is not None and not code.strip():
        raise ConfigError("--code: no folder given (the host folder of your modules)")
    flags: list[str] = []
    for field, value in given.items():
        if value is not None and field not in LEAVES_OUT[1:]:
            flags += [flag_of(field), str(getattr(value, "value", value))]
    server = cfg.mode.family is Family.PS
    out = compose_file(
        cpu, gpu, run, flags, classes=classes, server=server, code=code, own=given_env(cfg),
        swarm=swarm,
    )  # fmt: skip
    print(json.dumps(out, indent=2))


_OWN = [
    inspect.Parameter(
        "cpu",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            int | None,
            typer.Option(
                "--cpu",
                help="CPU worker replicas (no limit). [default: 4, or 0 with --gpu or --class]",
                min=0,
                show_default=False,
            ),
        ],
    ),
    inspect.Parameter(
        "gpu",
        inspect.Parameter.KEYWORD_ONLY,
        default=0,
        annotation=Annotated[
            int, typer.Option("--gpu", help="GPU workers (NVIDIA), one device each.", min=0)
        ],
    ),
    inspect.Parameter(
        "classes",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            list[str] | None,
            typer.Option(
                "--class",
                help="A worker class NAME:COUNT:CPUS[:MEMORY]: COUNT replicas limited to CPUS "
                "cores and MEMORY each (fast:3:1.0, slow:1:0.25:2g). Repeatable.",
                show_default=False,
            ),
        ],
    ),
    inspect.Parameter(
        "run",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            str | None,
            typer.Option(
                "--run",
                "-r",
                help="Run id the init service records. [default: RUN_ID from compose/.env; "
                "empty: a fresh id every time the stack runs]",
                show_default=False,
            ),
        ],
    ),
    inspect.Parameter(
        "code",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            str | None,
            typer.Option(
                "--code",
                help="Host folder of your own modules, for --model / --data MODULE:FUNCTION: "
                "mounted into the containers and importable there (a path relative to "
                "compose/). [default: none; ../examples when --model or --data names a "
                "function]",
                show_default=False,
            ),
        ],
    ),
    inspect.Parameter(
        "swarm",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool,
            typer.Option(
                "--swarm",
                help="A stack file for docker stack deploy (Docker Swarm, across machines): "
                "overlay network, the password as the secret redis_password, GPU workers on "
                "nodes labelled hopbus.gpu=true.",
            ),
        ],
    ),
]
generate_cmd.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        *_OWN,
        *(
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in _TRAIN_PARAMS.parameters.values()
            if p.name in TrainConfig.model_fields and p.name not in LEAVES_OUT
        ),
    ]
)
compose_app.command("generate")(generate_cmd)
