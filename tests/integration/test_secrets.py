"""Secrets stay secret: a run against a password-protected Redis (the broker's ACL) with CURVE
keys writes neither the password nor a secret key anywhere a person or a tool reads: the
results folder (config.toml, metrics, summary, logs), the command's output, the run's Redis
keys, ``hopbus inspect``. And rediss:// (TLS) URLs, with redis-py's ssl query parameters,
work wherever a Redis URL is accepted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import zmq
from cluster import acl_broker, clean_env, train_args, wait_for

from hopbus.coord.keys import RunKeys
from hopbus.transport.curve import generate

PASSWORD = "S3cretPW-not-for-logs"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """redis-server with broker/redis.conf and broker/users.acl (cluster.acl_broker)."""
    with acl_broker(tmp_path_factory.mktemp("broker"), PASSWORD) as got:
        yield got


def run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """A command in its own process, its output captured, no HOPBUS_* but ``env``."""
    return subprocess.run(
        args, capture_output=True, text=True, env=clean_env(**env), timeout=120, check=False
    )


def hopbus(*args: str, **env: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "hopbus", *args], **env)


def secret_texts(keys: Path) -> list[str]:
    """The password and both secret keys: what must appear nowhere."""
    found = [PASSWORD]
    for f in keys.glob("*.key_secret"):
        _, secret = zmq.auth.load_certificate(f)
        assert secret is not None
        found.append(secret.decode())
    assert len(found) == 3
    return found


def redis_strings(client: redis.Redis, run: str) -> Iterator[tuple[str, bytes]]:
    """(key, value) for every string a run's Redis keys hold, whatever their type."""
    for key in client.scan_iter(match=f"hop:{{{run}}}:*", count=1000):
        name = key.decode()
        kind = client.type(key).decode()
        if kind == "string":
            yield name, client.get(key) or b""
        elif kind == "hash":
            for k, v in client.hgetall(key).items():
                yield name, k + b"=" + v
        elif kind == "list":
            for v in client.lrange(key, 0, -1):
                yield name, v
        elif kind == "set":
            for v in client.smembers(key):
                yield name, v
        elif kind == "zset":
            for v, _ in client.zrange(key, 0, -1, withscores=True):
                yield name, v
        elif kind == "stream":
            for _, fields in client.xrange(key):
                for k, v in fields.items():
                    yield name, k + b"=" + v
        else:
            raise AssertionError(f"{name}: a {kind} this test does not read")


def test_no_password_or_secret_key_anywhere(broker, tmp_path):
    _, url = broker
    keys = tmp_path / "keys"
    generate(keys)
    secrets = secret_texts(keys)
    out = tmp_path / "run"
    flags = ["-n", "4", "--iterations", "60", "--eval-every", "20", "--curve", str(keys)]
    args, run_id = train_args(url, out, *flags)  # the URL and its password on the command line
    p = run(args)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["finished"]

    files = [f for f in out.rglob("*") if f.is_file()]
    names = {f.relative_to(out).as_posix() for f in files}
    assert {"config.toml", "metrics.jsonl", "summary.json", "logs/worker-0.log"} <= names
    assert "curve = true" in (out / "config.toml").read_text()
    texts = {f"file {f}": f.read_bytes().decode(errors="replace") for f in files}
    texts["stdout"], texts["stderr"] = p.stdout, p.stderr

    client = redis.Redis.from_url(url)
    values = list(redis_strings(client, run_id))
    meta = client.hgetall(RunKeys(run_id).meta)
    client.close()
    assert json.loads(meta[b"config"])["curve"] is True
    assert len(values) > 60  # progress entries, results, stats, addresses: all read
    for key, value in values:
        texts[f"redis {key}"] = value.decode(errors="replace")

    for extra in (["--json"], []):  # hopbus inspect, as JSON and as a table
        shown = hopbus("inspect", "--run", run_id, *extra, HOPBUS_REDIS=url)
        assert shown.returncode == 0, shown.stderr
        texts[f"inspect {extra}"] = shown.stdout + shown.stderr

    leaks = [(where, s[:6] + "...") for where, text in texts.items() for s in secrets if s in text]
    assert not leaks, leaks


def test_a_stop_reason_that_holds_the_password_is_scrubbed_in_the_summary(broker, tmp_path):
    """Fault ``secret_in_the_stop_key``: the stop key written by hand with the broker's
    password in it. The run stops saying the reason, with the password as *** on the terminal
    and in summary.json alike."""
    _, url = broker
    args, run_id = train_args(url, tmp_path / "run", "-n", "2", "--topology", "ring",
                              "--iterations", "100000", "--iter-time", "0.02")  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())  # fmt: skip
    client = redis.Redis.from_url(url)
    keys = RunKeys(run_id)
    wait_for(lambda: int(client.get(keys.iter(1)) or 0) >= 5, 120, "the run to start")
    client.set(keys.stop, f"boom {PASSWORD}")
    out, err = proc.communicate(timeout=120)
    client.close()
    assert proc.returncode == 1 and "boom ***" in err, err
    summary = (tmp_path / "run" / "summary.json").read_text()
    assert "boom ***" in summary and PASSWORD not in summary + out + err


def test_a_mistyped_url_never_echoes_its_password():
    """``user:PASSWORD/0`` with the @host forgotten parses as host ``user``, port PASSWORD."""
    for url in (
        f"redis://hopbus:{PASSWORD}/0",
        f"redis://hopbus:{PASSWORD}@127.0.0.1:port/0",
        f"redis://127.0.0.1:1/0?password={PASSWORD}&socket_timeout=x",
        f"rediss://hopbus:{PASSWORD}@127.0.0.1:1/0?ssl_cert_reqs=maybe",
        # fault ``url_query``: settings redis-py takes and fails on later (or that break
        # hopbus: text replies) are refused before any connection
        f"redis://hopbus:{PASSWORD}@127.0.0.1:1/0?decode_responses=1",
        f"redis://127.0.0.1:1/0?password={PASSWORD}&foo=bar",
        "redis://127.0.0.1:1/0?socket_timeout=nan",
        "redis://127.0.0.1:1/0?ssl_cert_reqs=none",
        "redis://127.0.0.1:1/0?single_connection_client=1",
        f"redis://hopbus:{PASSWORD}@127.0.0.1:1/abc",  # a database that is not a number
        f"redis://127.0.0.1:1/0&password={PASSWORD}",  # a query without its ?
        f"redis://127.0.0.1:1/{PASSWORD}",  # the password where the database goes
        f"redis://hopbus:{PASSWORD}@127.0.0.1:1/0?db=1",  # two databases
    ):
        p = hopbus("inspect", "--list", HOPBUS_REDIS=url)
        assert p.returncode == 2, (url, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hopbus: error: --redis "), p.stderr
        assert PASSWORD not in p.stderr


# -- TLS: rediss:// through a TLS-terminating proxy in front of the ACL broker ---------------------
@pytest.fixture(scope="module")
def tls_broker(broker, tmp_path_factory) -> Iterator[tuple[int, Path]]:
    """(port, CA file): a TLS endpoint for the ACL broker, with a self-signed certificate for
    127.0.0.1 (the test's redis-server is built without TLS, so a proxy terminates it)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    target, _ = broker
    loop = asyncio.new_event_loop()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port, cert
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_rediss_urls_with_ssl_parameters_work(tls_broker, tmp_path):
    port, ca = tls_broker
    base = f"rediss://hopbus:{PASSWORD}@127.0.0.1:{port}/0"
    for query in ("?ssl_cert_reqs=none", f"?ssl_ca_certs={ca}"):
        p = hopbus("inspect", "--list", HOPBUS_REDIS=base + query)
        assert p.returncode == 0, (query, p.stderr)
    # a certificate nobody vouches for is refused: verification is on by default
    p = hopbus("inspect", "--list", HOPBUS_REDIS=base)
    assert p.returncode == 1 and "certificate verify failed" in p.stderr.lower(), p.stderr
    assert PASSWORD not in p.stderr and len(p.stderr.strip().splitlines()) == 1

    # a whole run, the launcher and every worker talking to Redis over TLS
    args, _ = train_args(base + f"?ssl_ca_certs={ca}", tmp_path / "run", "-n", "3", "-k", "30")
    p = run(args)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["finished"]
    assert PASSWORD not in p.stdout + p.stderr
