"""The deployment folders hold together: every compose service runs a real hopbus command
with real flags through the images' entrypoint, every mix ``hopbus compose generate`` prints
is what docker compose (and docker stack) accept, and the broker's start script and the
entrypoint agree on any password: both are run here for real, with a real redis-server and
real workers, without Docker."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml
from engine import unavailable
from test_cli import hopbus

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
ENTRY = ROOT / "workers" / "entrypoint.py"

#: the mixes whose generated files must pass ``docker compose config`` (item: every mix)
MIXES = [
    [],
    ["--cpu", "2", "--gpu", "1", "--mode", "backup"],
    ["--gpu", "3"],
    ["--class", "fast:3:1.0", "--class", "slow:1:0.25"],
    ["--class", "big:2:2:4g", "--cpu", "1", "--gpu", "1", "--run", "exp-1"],
    ["--cpu", "3", "--mode", "ps-bsp"],
    ["--cpu", "2", "--model", "keras_cnn:model", "--data", "keras_cnn:data"],
    ["--swarm"],
    ["--swarm", "--cpu", "2", "--gpu", "2", "--class", "slow:1:0.5:1g", "--mode", "ps-ssp"],
]


@functools.cache
def _help(command: str) -> str:
    p = hopbus(*command.split(), "--help", env={"COLUMNS": "200"})
    assert p.returncode == 0, (command, p.stderr)
    return p.stdout


@functools.cache
def _generated(*args: str) -> dict:
    p = hopbus("compose", "generate", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _entrypoint(dockerfile: str) -> list[str]:
    text = (ROOT / dockerfile).read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("ENTRYPOINT")]
    return yaml.safe_load(line.split(None, 1)[1])  # the exec form is a JSON list


def _check_services(compose: dict, *, swarm: bool = False) -> None:
    services = compose["services"]
    assert {"redis", "init", "watch"} <= set(services)
    assert any(name.startswith("worker-") for name in services)
    for name, svc in services.items():
        if name == "redis":
            continue
        program, command = svc["entrypoint"]
        assert program == "hopbus-entry", name
        text = _help(command)
        for flag in (a for a in svc["command"] if a.startswith("-")):
            assert re.search(rf"{re.escape(flag)}\b", text), (name, command, flag)
        assert "--run" not in svc["command"] and "--redis" not in svc["command"]
        env = svc["environment"]
        assert "HOPBUS_REDIS" not in env  # made by the entrypoint, the password URL-encoded
        assert ("REDIS_PASSWORD" in env) is not swarm  # a Swarm's is a secret
        if swarm:
            assert svc["secrets"] == ["redis_password"] and svc["networks"] == ["hop"]
    assert services["init"]["entrypoint"] == ["hopbus-entry", "create"]
    assert services["watch"]["entrypoint"] == ["hopbus-entry", "watch"]
    for name, svc in services.items():
        if name.startswith("worker-"):
            assert svc["entrypoint"] == ["hopbus-entry", "worker"]
            assert "--id" not in svc["command"]  # replicas take their ids on joining
            if not swarm:
                assert svc["depends_on"]["init"]["condition"] == "service_completed_successfully"
                assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
                assert services["watch"]["depends_on"][name]["condition"] == "service_started"
    if not swarm:  # each image is built once, by one service; the others only run it
        builders: dict[str, list[str]] = {}
        for name, svc in services.items():
            if "build" in svc:
                builders.setdefault(svc["image"], []).append(name)
                assert svc["pull_policy"] == "build"
            elif name != "redis":
                assert svc["pull_policy"] == "never", name
        images = {svc["image"] for name, svc in services.items() if name != "redis"}
        assert {image: len(names) for image, names in builders.items()} == dict.fromkeys(images, 1)
    redis_svc = services["redis"]
    targets = {c["target"].rsplit("/", 1)[1] for c in redis_svc["configs"]}
    assert targets == {"redis.conf", "users.acl", "start.sh", "password.sh", "cli.sh"}
    assert redis_svc["entrypoint"] == ["sh", "/usr/local/etc/redis/start.sh"]
    for conf in compose["configs"].values():
        assert (COMPOSE.parent / conf["file"]).is_file(), conf


def _init_flag(compose: dict, flag: str) -> str:
    init = compose["services"]["init"]["command"]
    return init[init.index(flag) + 1]


def test_the_compose_file_runs_real_commands():
    compose = yaml.safe_load(COMPOSE.read_text())
    _check_services(compose)
    services = compose["services"]
    assert services["ps"]["profiles"] == ["ps"]
    assert services["worker-cpu"]["deploy"]["replicas"] == "${WORKERS:-4}"
    assert _init_flag(compose, "--workers") == "${WORKERS:-4}"  # one setting for both
    env = (ROOT / "compose" / ".env.example").read_text()
    for name in ("REDIS_PASSWORD", "RUN_ID", "WORKERS", "TOPOLOGY", "MODE", "MODEL", "ITERATIONS"):
        assert re.search(rf"^{name}=", env, re.M), name
    for name in ("BASE_IMAGE", "REDIS_IMAGE", "EXTRAS"):
        assert re.search(rf"^#? ?{name}=", env, re.M), name


def test_generate_mixes_cpu_and_gpu_workers_one_device_each():
    compose = _generated("--cpu", "2", "--gpu", "3", "--mode", "backup")
    _check_services(compose)
    services = compose["services"]
    assert services["worker-cpu"]["deploy"]["replicas"] == 2
    devices = [
        services[f"worker-gpu-{i}"]["deploy"]["resources"]["reservations"]["devices"]
        for i in range(3)
    ]
    assert [d[0]["device_ids"] for d in devices] == [["0"], ["1"], ["2"]]
    assert all(d[0]["driver"] == "nvidia" and d[0]["capabilities"] == ["gpu"] for d in devices)
    assert _init_flag(compose, "--workers") == "5"
    # the GPU image keeps its base's TensorFlow for GPUs: no tensorflow-cpu (the tf extra) over it
    extras = {s["image"]: s["build"]["args"]["EXTRAS"] for s in services.values() if "build" in s}
    assert extras == {"hopbus-worker:cpu": "${EXTRAS-tf}", "hopbus-worker:gpu": "${GPU_EXTRAS-}"}
    assert _init_flag(compose, "--mode") == "backup"
    # the broker is one definition: the generated file's is the hand-written file's
    assert services["redis"] == yaml.safe_load(COMPOSE.read_text())["services"]["redis"]
    assert compose["configs"] == yaml.safe_load(COMPOSE.read_text())["configs"]


def test_a_code_folder_with_a_colon_is_one_path():
    """Fault ``colon_in_code_path``: the volume was written 'HOST:/home/hopbus/code:ro', so a
    host folder 'my: code' made a spec docker splits at its colons; the long form keeps it."""
    compose = _generated("--cpu", "2", "--model", "m:model", "--code", "my: code")
    (volume,) = [v for v in compose["services"]["init"]["volumes"] if isinstance(v, dict)]
    assert volume == {"type": "bind", "source": "my: code", "target": "/home/hopbus/code",
                      "read_only": True}  # fmt: skip


def test_worker_classes_get_their_cpu_quota_and_memory():
    compose = _generated("--class", "fast:3:1.0", "--class", "slow:1:0.25:2g")
    _check_services(compose)
    services = compose["services"]
    assert "worker-cpu" not in services  # --cpu is 0 once classes are given
    fast, slow = services["worker-fast"], services["worker-slow"]
    assert (fast["deploy"]["replicas"], fast["cpus"], "mem_limit" in fast) == (3, 1.0, False)
    assert (slow["deploy"]["replicas"], slow["cpus"], slow["mem_limit"]) == (1, 0.25, "2g")
    assert _init_flag(compose, "--workers") == "4"
    swarm = _generated("--swarm", "--class", "slow:1:0.25:2g", "--cpu", "1")
    limits = swarm["services"]["worker-slow"]["deploy"]["resources"]["limits"]
    assert limits == {"cpus": "0.25", "memory": "2g"}


def test_the_swarm_stack():
    compose = _generated("--swarm", "--cpu", "4", "--gpu", "2", "--mode", "backup")
    _check_services(compose, swarm=True)
    services = compose["services"]
    assert compose["networks"]["hop"]["driver"] == "overlay"
    assert compose["secrets"]["redis_password"]["external"] is True
    assert "build" not in json.dumps(compose)  # docker stack deploy builds nothing
    gpu = services["worker-gpu"]["deploy"]
    assert gpu["replicas"] == 2
    assert gpu["placement"]["constraints"] == ["node.labels.hopbus.gpu == true"]
    (one,) = gpu["resources"]["reservations"]["generic_resources"]
    assert one["discrete_resource_spec"] == {"kind": "NVIDIA-GPU", "value": 1}
    for name in ("redis", "watch"):  # watch's results volume is where docker cp finds it
        assert services[name]["deploy"]["placement"]["constraints"] == ["node.role == manager"]
    for name, svc in services.items():
        if name != "redis":
            assert svc["deploy"]["restart_policy"] == {"condition": "none"}, name


def test_a_parameter_server_run_gets_its_server():
    ps = _generated("--cpu", "3", "--mode", "ps-bsp")
    assert ps["services"]["ps"]["entrypoint"] == ["hopbus-entry", "ps"]
    assert ps["services"]["watch"]["depends_on"]["ps"] == {"condition": "service_started"}
    assert "ps" not in _generated("--cpu", "2")["services"]  # a Hop run has none
    static = yaml.safe_load(COMPOSE.read_text())["services"]["ps"]
    assert static["profiles"] == ["ps"] and static["entrypoint"] == ["hopbus-entry", "ps"]


def test_a_run_id_given_is_written_into_the_file():
    env = _generated("--cpu", "2", "--run", "exp-1")["services"]["init"]["environment"]
    assert env["HOPBUS_RUN"] == "exp-1"
    assert _generated("--cpu", "2")["services"]["init"]["environment"]["HOPBUS_RUN"] == (
        "${RUN_ID:-}"
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cpu", "2", "--model", "resnet"], "unknown model"),
        (["--cpu", "1"], "at least 2"),
        (["--class", "slow:1:0.25"], "at least 2"),
        (["--class", "slow-1:0.25"], "NAME:COUNT:CPUS"),
        (["--class", "cpu:2:1"], "is taken"),
        (["--class", "a:2:1", "--class", "a:1:1"], "given twice"),
        (["--class", "a:2:0"], "between 0.01"),
        # faults ``memory_docker_refuses`` (0 is no limit, 1b less than docker takes) and
        # ``empty_code_folder`` (a volume of ':/home/hopbus/code:ro')
        (["--class", "a:2:1:0"], "MEMORY is between 64m"),
        (["--class", "a:2:1:1b"], "MEMORY is between 64m"),
        (["--cpu", "2", "--code", ""], "--code: no folder given"),
        # fault ``stack_file_topology``: init was told a path of this host, not mounted there
        (["--cpu", "3", "--topology", "file:graph.txt"], "a stack runs the built-in graphs"),
        (["--cpu", "2", "--run", "no/slash"], "run id"),
        (["--cpu", "2", "--model", "script"], "the stack's workers run hopbus's own worker"),
    ],
)
def test_generate_refuses_bad_input_in_one_line(args, says):
    p = hopbus("compose", "generate", *args)
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_worker_images_run_hopbus_worker_through_the_entrypoint(kind):
    assert _entrypoint(f"workers/Dockerfile.{kind}") == ["hopbus-entry", "worker"]
    text = (ROOT / f"workers/Dockerfile.{kind}").read_text()
    assert re.search(r"^ARG BASE_IMAGE=", text, re.M)  # no public registry needed
    assert "COPY workers/entrypoint.py /usr/local/bin/hopbus-entry" in text


def test_broker_requires_a_password():
    acl = [x.split() for x in (ROOT / "broker" / "users.acl").read_text().splitlines()]
    acl = [x for x in acl if x and not x[0].startswith("#")]
    assert ["user", "default", "off"] in acl
    (hopbus_user,) = [x for x in acl if x[:2] == ["user", "hopbus"]]
    assert "on" in hopbus_user and "~hop:*" in hopbus_user
    assert "nopass" not in hopbus_user  # the password is added, hashed, by start.sh
    assert not any(t.startswith((">", "#")) for t in hopbus_user)  # and kept nowhere in git
    conf = (ROOT / "broker" / "redis.conf").read_text()
    assert re.search(r"^protected-mode yes$", conf, re.M)
    assert re.search(r"^maxmemory-policy noeviction$", conf, re.M)
    assert re.search(r"^maxmemory 1gb$", conf, re.M)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def broker(tmp_path, request):
    """broker/start.sh as the redis service runs it, with this machine's redis-server, on a
    free port of 127.0.0.1, and a password a URL must encode (more environment: indirect
    parametrization with a dict)."""
    from hopbus.coord.broker import find_redis_server

    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum (coreutils) for broker/start.sh")
    password = "p@ss w/rd:#%?&+ é"
    server = find_redis_server()
    bin_dir = tmp_path / "bin"  # start.sh runs `redis-server` from PATH
    bin_dir.mkdir()
    (bin_dir / "redis-server").symlink_to(server)
    port = _free_port()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "REDIS_ETC": str(ROOT / "broker"),
        "REDIS_PASSWORD": password,
        **getattr(request, "param", {}),
    }
    proc = subprocess.Popen(
        ["sh", str(ROOT / "broker" / "start.sh"), "--port", str(port), "--bind", "127.0.0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "start.sh's redis-server never listened"
            time.sleep(0.05)
    client_env = {k: v for k, v in env.items() if not k.startswith("HOPBUS_")}
    client_env.update(REDIS_HOST="127.0.0.1", REDIS_PORT=str(port))
    yield client_env, port, password
    proc.terminate()
    proc.wait(timeout=10)


def test_any_password_is_set_once_and_works(broker):
    env, port, password = broker
    anonymous = redis.Redis(port=port)
    with pytest.raises(redis.AuthenticationError):  # the default user is off
        anonymous.ping()
    good = redis.Redis(port=port, username="hopbus", password=password)
    assert good.ping()
    with pytest.raises(redis.ResponseError, match="no permissions"):  # only hop:* keys
        good.set("elsewhere", 1)
    # the entrypoint's URL, made from the same REDIS_PASSWORD, URL-encoded
    sys.path.insert(0, str(ENTRY.parent))
    try:
        import entrypoint
    finally:
        sys.path.pop(0)
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        url = entrypoint.redis_url()
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert password not in url
    assert redis.Redis.from_url(url).ping()


@pytest.mark.parametrize("broker", [{"REDIS_MAXMEMORY": "2mb"}], indirect=True)
def test_the_broker_refuses_writes_beyond_its_memory_bound(broker):
    """A credential fills the broker up to REDIS_MAXMEMORY, not the host; nothing is evicted."""
    _, port, password = broker
    client = redis.Redis(port=port, username="hopbus", password=password)
    client.set("hop:first", b"kept")
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for i in range(10_000):  # 100 MB if nothing stopped it
            client.set(f"hop:filler:{i}", b"x" * 10_000)
    assert 0 < i < 1000
    assert client.get("hop:first") == b"kept"


def test_the_entrypoint_runs_a_stack_of_processes(broker, tmp_path):
    """init, two workers and watch as the containers run them (hopbus-entry COMMAND), with no
    run id given: init records a fresh one, the others take it from Redis; twice, so the
    second stack run gets its own run and results folder."""
    env, _, _ = broker
    env = {**env, "HOPBUS_RESULTS": str(tmp_path / "runs")}
    runs = []
    for _ in range(2):
        create = subprocess.run(
            [sys.executable, str(ENTRY), "create", "-n", "2", "--iterations", "30"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert create.returncode == 0, create.stderr
        run = create.stdout.strip().splitlines()[-1]
        command = [sys.executable, str(ENTRY), "worker"]
        workers = [
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)
        ]
        watch = subprocess.run(
            [sys.executable, str(ENTRY), "watch", "--json"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        for w in workers:
            _, err = w.communicate(timeout=60)
            assert w.returncode == 0, err
        assert watch.returncode == 0, watch.stderr
        assert json.loads(watch.stdout)["finished"]
        folder = tmp_path / "runs" / run
        assert json.loads((folder / "summary.json").read_text())["violations"] == 0
        assert sorted(p.name for p in (folder / "tensorboard").iterdir()) == [
            "worker-0",
            "worker-1",
        ]
        runs.append(run)
    assert runs[0] != runs[1]


def test_the_entrypoint_says_what_is_missing_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOPBUS_", "REDIS_"))}
    p = subprocess.run(
        [sys.executable, str(ENTRY), "worker"],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "hopbus-entry: error: no Redis password: set REDIS_PASSWORD (compose/.env) or a "
        "redis_password secret"
    )
    missing = tmp_path / "nothing"
    p = subprocess.run(
        [sys.executable, str(ENTRY), "worker"],
        env={**env, "REDIS_PASSWORD_FILE": str(missing)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert p.returncode == 2 and "No such file" in p.stderr and "Traceback" not in p.stderr


def _docker_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    p = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    return p.returncode == 0


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: " ".join(m) or "default")
def test_docker_compose_accepts_every_mix(tmp_path, mix):
    if not _docker_compose():
        unavailable("`docker compose version` fails here")
    env = {**os.environ, "REDIS_PASSWORD": "x"}
    generated = tmp_path / "generated.yml"
    generated.write_text(hopbus("compose", "generate", *mix).stdout)
    files = [generated] + ([COMPOSE] if not mix else [])
    for f in files:
        p = subprocess.run(
            ["docker", "compose", "-f", str(f), "--project-directory", str(COMPOSE.parent),
             "config", "--quiet"],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        assert p.returncode == 0, (f, p.stderr)
    if "--swarm" in mix:  # what docker stack deploy reads, where this CLI has it
        p = subprocess.run(
            ["docker", "stack", "config", "-c", str(generated)],
            capture_output=True, text=True, env=env, check=False, cwd=COMPOSE.parent,
        )  # fmt: skip
        cannot = ("unknown command", "Cannot connect to the Docker daemon")  # an older CLI;
        assert p.returncode == 0 or any(x in p.stderr for x in cannot), p.stderr  # no engine


def test_advertise_auto_uses_the_route_to_redis_when_the_host_name_is_loopback():
    from hopbus.cli.cluster import auto_address

    def route(host: str) -> str:
        return {"10.0.0.5": "10.0.0.7", "redis": "172.18.0.4"}[host]

    assert auto_address("172.18.0.3", "redis", route) == "172.18.0.3"  # a container's own IP
    assert auto_address("127.0.1.1", "10.0.0.5", route) == "10.0.0.7"  # Debian's hosts line
    assert auto_address("127.0.1.1", "redis", route) == "172.18.0.4"
    assert auto_address("127.0.0.1", "127.0.0.1", route) == "127.0.0.1"  # all on one machine
    assert auto_address("127.0.1.1", "localhost", route) == "127.0.1.1"
