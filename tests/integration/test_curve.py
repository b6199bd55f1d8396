"""CURVE on the data plane: only holders of the run's keys reach an inbox.

Transport level: a CURVE inbox takes a legitimate outbox's updates and nothing from a plain
PUSH or from a CURVE client with a keypair of its own (even one that knows the server's public
key), and counts those refusals. Cluster level (the issue's must-show): a rogue process without
the keys sends 10,000 well-formed updates to worker 0 of a ``hopbus train --curve`` run; none
reaches the update store and training finishes; the same rogue against the same run without
--curve does get its frames into worker 0's store (proof that the test can fail).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import zmq
from cluster import Collector, clean_env, train_args, wait_for

from hopbus.coord.keys import RunKeys
from hopbus.models import build_model
from hopbus.topology import Topology
from hopbus.transport import (
    DROP_REASONS,
    UNAUTHENTICATED,
    CurveKeys,
    Inbox,
    Outbox,
    Params,
    Validator,
    encode_update,
    layout_of,
)
from hopbus.transport.curve import generate

RUN = "curve-run"
N = 4
DEADLINE_S = 20.0
LOCAL = "tcp://127.0.0.1:*"


def snapshot(k: int) -> Params:
    return {"w": np.full((16, 8), k, dtype=np.float32), "b": np.arange(8, dtype=np.float32) + k}


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> CurveKeys:
    folder = tmp_path_factory.mktemp("keys") / "run"
    generate(folder)
    return CurveKeys.load(folder)


def curve_inbox(ctx: zmq.Context, keys: CurveKeys | None) -> tuple[Inbox, Collector]:
    got = Collector()
    v = Validator(RUN, N, [1], (), layout_of(snapshot(0)), max_iteration=10_000)
    inbox = Inbox(ctx, LOCAL, v, got, hwm=1000, curve=keys)
    inbox.start()
    return inbox, got


def rogue_socket(ctx: zmq.Context, endpoint: str, server_public: bytes | None) -> zmq.Socket:
    """A PUSH without the run's keys: plain, or a CURVE client with a keypair of its own that
    knows the server's public key. Its queue has no bound: a send waits for nothing."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 0)
    if server_public is not None:
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey = server_public
        sock.curve_publickey = public
        sock.curve_secretkey = secret
    sock.connect(endpoint)
    return sock


def test_only_the_runs_keys_reach_a_curve_inbox(ctx, keys):
    inbox, got = curve_inbox(ctx, keys)
    plain = rogue_socket(ctx, inbox.endpoint, None)
    wrong = rogue_socket(ctx, inbox.endpoint, keys.server_public)
    legit = Outbox(ctx, {0: inbox.endpoint}, hwm=8, send_timeout_s=5, curve=keys)
    try:
        for k in range(1000):  # valid updates from an in-neighbour, as far as frames go
            for sock in (plain, wrong):
                # a refused CURVE client has no connection left to queue on: Again
                with contextlib.suppress(zmq.Again):
                    sock.send_multipart(encode_update(RUN, 1, k, snapshot(k)), zmq.NOBLOCK)
        # each rogue connection is refused at its handshake: its frames can never follow
        wait_for(lambda: inbox.drops()[UNAUTHENTICATED] >= 2, DEADLINE_S, "both rogues refused")
        for k in range(5):
            legit.send([0], encode_update(RUN, 1, k, snapshot(k)))
        got.wait_for(lambda ms: len(ms) == 5)
        assert [m.iteration for m in got.messages] == list(range(5))
        np.testing.assert_array_equal(got.messages[4].payload["b"], snapshot(4)["b"])
        assert inbox.received == 5
        assert set(inbox.drops()) == {*DROP_REASONS, UNAUTHENTICATED}
        assert sum(v for r, v in inbox.drops().items() if r != UNAUTHENTICATED) == 0
    finally:
        for s in (plain, wrong):
            s.close(linger=0)
        legit.close(0)
        inbox.close()


def test_the_largest_valid_frame_still_fits_once_encrypted(ctx, keys):
    """The inbox's ZMQ_MAXMSGSIZE is the largest valid frame; libzmq checks it against the
    encrypted frame, which is a few bytes longer: without room for them, a model whose
    biggest tensor is that frame could never be received under CURVE."""
    big = {"w": np.ones((512, 512), np.float32)}  # 1 MiB: the largest frame of this layout
    got = Collector()
    v = Validator(RUN, N, [1], (), layout_of(big), max_iteration=10)
    assert v.max_frame_bytes == big["w"].nbytes
    inbox = Inbox(ctx, LOCAL, v, got, hwm=8, curve=keys)
    inbox.start()
    out = Outbox(ctx, {0: inbox.endpoint}, hwm=8, send_timeout_s=5, curve=keys)
    try:
        out.send([0], encode_update(RUN, 1, 3, big))
        got.wait_for(lambda ms: len(ms) == 1)
        np.testing.assert_array_equal(got.messages[0].payload["w"], big["w"])
    finally:
        out.close(0)
        inbox.close()


def test_inboxes_sharing_a_context_each_admit_their_own_key_set(ctx, keys, tmp_path):
    generate(tmp_path / "other")
    other = CurveKeys.load(tmp_path / "other")
    in_a, got_a = curve_inbox(ctx, keys)
    in_b, got_b = curve_inbox(ctx, other)
    plain, plain_got = curve_inbox(ctx, None)  # a plain inbox beside them still takes anyone
    to_a = Outbox(ctx, {0: in_a.endpoint}, hwm=8, send_timeout_s=5, curve=keys)
    b_keys_to_a = Outbox(ctx, {0: in_a.endpoint}, hwm=8, send_timeout_s=5, curve=other)
    to_plain = Outbox(ctx, {0: plain.endpoint}, hwm=8, send_timeout_s=5)
    try:
        b_keys_to_a.send([0], encode_update(RUN, 1, 7, snapshot(7)))
        wait_for(lambda: in_a.drops()[UNAUTHENTICATED] >= 1, DEADLINE_S, "the other set's refusal")
        in_b.close()  # the shared authenticator outlives one of its inboxes
        to_a.send([0], encode_update(RUN, 1, 1, snapshot(1)))
        to_plain.send([0], encode_update(RUN, 1, 2, snapshot(2)))
        got_a.wait_for(lambda ms: len(ms) == 1)
        plain_got.wait_for(lambda ms: len(ms) == 1)
        assert got_a.messages[0].iteration == 1 and not got_b.messages
        assert UNAUTHENTICATED not in plain.drops()
    finally:
        for box in (to_a, b_keys_to_a, to_plain):
            box.close(0)
        for inbox in (in_a, in_b, plain):
            inbox.close()
    ctx.term()  # returns: the authenticator stopped with the last CURVE inbox


# -- the must-show: a rogue process against a training run ----------------------------------------
ROGUE = r"""
import json, sys, numpy as np, zmq
from hopbus.transport import encode_update

endpoint, run, layout = sys.argv[1], sys.argv[2], sys.argv[6]
src, iterations, count = map(int, sys.argv[3:6])
server_public = sys.argv[7].encode() if len(sys.argv) > 7 else None
# a poisoned model in the worker's own layout: every check but the keys passes
params = {name: np.full(shape, 1e3, dtype) for name, dtype, shape in json.loads(layout)}
ctx = zmq.Context()
socks = []
for curve in ([False, True] if server_public else [False]):
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 0)  # no bound: every frame is sent, none waits for a peer
    if curve:  # a CURVE client that knows the server's public key, with a keypair of its own
        s.curve_serverkey = server_public
        s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
    s.connect(endpoint)
    socks.append(s)
refused = 0
for i in range(count):
    frames = encode_update(run, src, i % (iterations + 1), params)
    for s in socks:
        try:  # a refused CURVE client has no connection left to queue on
            s.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            refused += 1
print("sent", count * len(socks), "refused", refused, flush=True)
for s in socks:
    s.close(linger=-1)  # what was queued goes, as far as the inbox lets it
ctx.term()
"""

ITERATIONS = 200
LAYOUT = json.dumps(
    layout_of(build_model("softmax", 64, 10).init_params(0))
)  # softmax on 8x8 digits: worker 0's parameters, as its validator expects them
FLAGS = ["-n", "4", "--topology", "ring-based", "--iterations", str(ITERATIONS)]
FLAGS += ["--iter-time", "0.02", "--eval-every", "0"]


def run_with_rogue(
    redis_url: str, tmp_path: Path, curve: Path | None, *extra: str
) -> tuple[subprocess.CompletedProcess, dict, str]:
    """``hopbus train`` (with ``--curve`` if given) while a rogue sends 10,000 updates from
    an in-neighbour of worker 0 to its inbox (and, with CURVE, 10,000 more as a CURVE client
    with a keypair of its own); returns the run, its summary, and what the rogue printed."""
    flags = [*FLAGS, *(["--curve", str(curve)] if curve else []), *extra]
    args, run = train_args(redis_url, tmp_path / "run", *flags)
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    deadline = time.monotonic() + 60
    while (endpoint := client.hget(keys.addr, "0")) is None:  # worker 0 registered its inbox
        assert time.monotonic() < deadline and proc.poll() is None, "worker 0 never registered"
        time.sleep(0.02)  # polling the registry, with a deadline
    client.close()
    src = min(Topology.named("ring-based", 4).in_peers[0])
    rogue_args = [endpoint.decode(), run, str(src), str(ITERATIONS), "10000", LAYOUT]
    if curve is not None:
        rogue_args.append(CurveKeys.load(curve).server_public.decode())
    rogue = subprocess.Popen(
        [sys.executable, "-c", ROGUE, *rogue_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if rogue.poll() is None:
            rogue.kill()
        rogue_out, rogue_err = rogue.communicate(timeout=30)
    p = subprocess.CompletedProcess(args, proc.returncode, out, err)
    assert rogue_out.startswith("sent"), rogue_err
    return p, json.loads(out), rogue_out


def delivered_to_store(worker: dict) -> int:
    """Updates worker 0's store was handed, whatever it did with them."""
    kept = ("received", "duplicates", "stale_dropped", "store_overflow")
    return sum(worker.get(k, 0) for k in kept)


def test_a_rogue_without_the_keys_reaches_no_store_and_training_finishes(redis_url, tmp_path, keys):
    p, s, rogue = run_with_rogue(redis_url, tmp_path, keys.folder)
    assert p.returncode == 0, p.stderr
    assert rogue.split()[:2] == ["sent", "20000"]
    assert s["finished"] and s["violations"] == 0
    assert all(v == 0 for v in s["checks"].values()), s["checks"]
    assert s["final_accuracy"] >= 0.9
    w0 = next(w for w in s["per_worker"] if w["worker"] == 0)
    in_degree = Topology.named("ring-based", 4).in_degree(0)
    # what worker 0's in-neighbours legitimately sent it: one update per iteration each
    assert delivered_to_store(w0) <= in_degree * (ITERATIONS + 1)
    assert w0["received"] <= in_degree * (ITERATIONS + 1)
    # refused handshakes counted (one per attempt: how many depends on libzmq's reconnects)
    assert s["dropped_frames"].get(UNAUTHENTICATED, 0) >= 1
    assert set(s["dropped_frames"]) <= {UNAUTHENTICATED}


def test_control_the_same_rogue_without_curve_gets_into_the_store(redis_url, tmp_path):
    """Without CURVE the forged updates are taken for worker 0's in-neighbour's. They can
    also break the run: worker 0, fed by the rogue, runs further ahead of that neighbour than
    Table 1 sizes its out-neighbours' stores for, and an update they then drop leaves the run
    waiting (a short --timeout ends it). Either way the run ends with its summary."""
    p, s, rogue = run_with_rogue(redis_url, tmp_path, None, "--timeout", "15")
    assert rogue.split()[:2] == ["sent", "10000"]
    assert s["finished"] or "waited" in s["failure"], (s["failure"], p.stderr)
    w0 = s["per_worker"][0]
    assert w0["worker"] == 0
    in_degree = Topology.named("ring-based", 4).in_degree(0)
    assert delivered_to_store(w0) > in_degree * (ITERATIONS + 1), (w0, p.stderr)


# -- every node kind speaks CURVE, and a mismatch is one line -------------------------------------
@pytest.mark.parametrize(
    "flags",
    [
        ["--mode", "notify-ack"],  # acks travel back over the in-neighbours' outboxes
        ["--mode", "ps-bsp", "-n", "3"],  # the parameter server's inbox and outbox
        ["--mode", "wagma", "-n", "4", "--group-size", "2", "--sync-period", "5"],  # responder
    ],
    ids=["notify-ack", "ps-bsp", "wagma"],
)
def test_every_scheme_on_zeromq_trains_with_curve(redis_url, tmp_path, keys, flags):
    """A socket of any node kind left without CURVE could not talk to a CURVE peer: the run
    would time out instead of finishing."""
    args, _ = train_args(
        redis_url, tmp_path / "run", "-k", "40", "--timeout", "20", *flags,
        "--curve", str(keys.folder),
    )  # fmt: skip
    p = subprocess.run(
        args, capture_output=True, text=True, env=clean_env(), timeout=120, check=False
    )
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["finished"] and s["config"]["curve"] is True
    assert not s["dropped_frames"]  # no legitimate peer was ever refused


def hopbus(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hopbus", *args],
        capture_output=True, text=True, env=clean_env(**env), timeout=60, check=False,
    )  # fmt: skip


def one_error_line(p: subprocess.CompletedProcess, code: int = 2) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hopbus: error: "), p.stderr
    return lines[0]


def test_a_node_and_its_run_must_agree_on_curve(redis_url, keys, tmp_path):
    curve_run, plain_run = f"cv{os.getpid()}", f"pl{os.getpid()}"
    p = hopbus("create", "--run", curve_run, "--curve", str(keys.folder), "--redis", redis_url)
    assert p.returncode == 0 and p.stdout.strip() == curve_run, p.stderr
    assert hopbus("create", "--run", plain_run, "--redis", redis_url).returncode == 0
    meta = redis.Redis.from_url(redis_url).hget(RunKeys(curve_run).meta, "config")
    assert json.loads(meta)["curve"] is True and str(keys.folder) not in meta.decode()

    line = one_error_line(hopbus("worker", "--run", curve_run, "--id", "0", "--redis", redis_url))
    assert f"run {curve_run} requires CURVE" in line and "--curve DIR or HOPBUS_CURVE" in line
    line = one_error_line(
        hopbus("worker", "--run", plain_run, "--id", "0", "--redis", redis_url,
               HOPBUS_CURVE=str(keys.folder))
    )  # fmt: skip
    assert f"run {plain_run} was created without --curve" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_error_line(
        hopbus("worker", "--run", curve_run, "--id", "1", "--redis", redis_url,
               "--curve", str(empty))
    )  # fmt: skip
    assert "server.key is missing" in line and "hopbus keys generate" in line


def test_curve_flags_refuse_bad_input_in_one_line(redis_url, keys, tmp_path):
    for cmd in ("create", "train"):
        line = one_error_line(
            hopbus(cmd, "--mode", "allreduce", "--curve", str(keys.folder), "--redis", redis_url)
        )
        assert "--curve cannot protect --mode allreduce" in line and "gloo" in line
        line = one_error_line(hopbus(cmd, "--curve", str(tmp_path / "nope"), "--redis", redis_url))
        assert "does not exist" in line and "hopbus keys generate" in line
    toml = tmp_path / "run.toml"
    toml.write_text("curve = true\nworkers = 2\n")
    line = one_error_line(hopbus("train", "--config", str(toml), "--redis", redis_url))
    assert "requires CURVE" in line and "--curve DIR" in line
    line = one_error_line(hopbus("keys", "generate", str(keys.folder)))
    assert "refusing to overwrite" in line
    p = hopbus("keys", "generate", str(tmp_path / "fresh"))
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in (tmp_path / "fresh").iterdir()) == sorted(
        ["server.key", "server.key_secret", "client.key", "client.key_secret"]
    )
    fresh = CurveKeys.load(tmp_path / "fresh")
    for secret in (fresh.server_secret, fresh.client_secret):
        assert secret.decode() not in p.stdout + p.stderr
    assert "client.key_secret" in p.stdout


def test_resuming_a_curve_run_takes_its_keys_again(redis_url, keys, tmp_path):
    """config.toml records curve = true and no keys: --resume needs --curve DIR again."""
    out = tmp_path / "run"
    args, _ = train_args(
        redis_url, out, "-n", "3", "-k", "30", "--checkpoint-every", "10",
        "--curve", str(keys.folder),
    )  # fmt: skip
    first = subprocess.run(
        args, capture_output=True, text=True, env=clean_env(), timeout=120, check=False
    )
    assert first.returncode == 0, first.stderr
    assert "curve = true" in (out / "config.toml").read_text()
    for record in ("summary.json", "metrics.jsonl"):  # as if killed before its end: a
        (out / record).unlink()  # finished run is refused
    line = one_error_line(hopbus("train", "--resume", str(out), "--redis", redis_url))
    assert "requires CURVE" in line and "--curve DIR" in line
    again = hopbus(
        "train", "--resume", str(out), "--redis", redis_url, "--json",
        HOPBUS_CURVE=str(keys.folder),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    s = json.loads(again.stdout)
    assert s["finished"] and s["resumed_from"] >= 10 and s["config"]["curve"] is True
