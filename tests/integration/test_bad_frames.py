"""Hostile or broken input on the data plane: a live worker in a training run receives 1,200
bad frames (one kind a NaN in an otherwise valid update); every one is dropped and counted under
its reason, and the run still trains."""

from __future__ import annotations

import json
import subprocess
import time

import msgpack
import numpy as np
import redis
import zmq
from cluster import clean_env, train_args

from hopbus.coord.keys import RunKeys

LAYOUT = [["W", "float32", [64, 10]], ["b", "float32", [10]]]  # softmax on digits


def _update(run: str, src: int, tensors=LAYOUT, sizes=(64 * 10 * 4, 10 * 4)) -> list[bytes]:
    header = {"v": 1, "run": run, "src": src, "iter": 3, "kind": "update", "tensors": tensors}
    return [msgpack.packb(header), *(np.zeros(n, np.uint8).tobytes() for n in sizes)]


def _nan_update(run: str, src: int) -> list[bytes]:
    header = {"v": 1, "run": run, "src": src, "iter": 3, "kind": "update", "tensors": LAYOUT}
    w = np.zeros((64, 10), np.float32)
    w[5, 5] = np.nan
    return [msgpack.packb(header), w.tobytes(), np.zeros(10, np.float32).tobytes()]


def test_thousand_bad_frames_are_counted_and_training_finishes(redis_url, tmp_path):
    flags = ["-n", "8", "--topology", "ring-based", "--iterations", "300", "--iter-time", "0.01"]
    args, run = train_args(redis_url, tmp_path / "run", *flags)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    deadline = time.monotonic() + 60
    while (endpoint := client.hget(keys.addr, "0")) is None:  # worker 0 registered its inbox
        assert time.monotonic() < deadline and proc.poll() is None, "worker 0 never registered"
        time.sleep(0.02)
    bad = {
        "wrong_run": _update("someone-else", 1),
        "unknown_sender": _update(run, 99),
        "wrong_length": _update(run, 1, sizes=(64 * 10 * 4 - 4, 10 * 4)),
        "garbage": [b"\xc1 not msgpack", b"x"],
        "not_neighbour": _update(run, 2),  # worker 0 receives from 1, 4 and 7 only
        "non_finite": _nan_update(run, 1),  # a valid update from a neighbour, but NaN
    }
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(endpoint.decode())
    for _ in range(200):
        for frames in bad.values():
            push.send_multipart(frames)
    push.close(linger=10_000)
    ctx.term()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    s = json.loads(out)
    assert s["dropped_frames"] == dict.fromkeys(bad, 200)
    assert s["final_accuracy"] >= 0.9
    assert s["violations"] == 0 and s["finished"]
    assert all(v == 0 for v in s["checks"].values())
