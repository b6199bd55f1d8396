"""What CURVE (``--curve``) costs the data plane: one Outbox -> Inbox pair over TCP on 127.0.0.1,
the same messages with and without CURVE.

Prints one JSON object: per mode, MB/s and milliseconds per message (medians over ``--rounds``
rounds of ``--messages`` messages of ``--mb`` MB each), and ``slowdown`` = plain MB/s / CURVE
MB/s. A fresh key set is made in a temporary folder.

    python benchmarks/curve.py [--mb 4] [--messages 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from hopbus.transport import CurveKeys, Inbox, Message, Outbox, Validator, encode_update, layout_of
from hopbus.transport.curve import generate

RUN = "bench"
WAIT_S = 120.0


def measure(keys: CurveKeys | None, mb: float, messages: int, rounds: int) -> dict[str, float]:
    params = {"w": np.ones(int(mb * 1e6) // 4, np.float32)}
    nbytes = params["w"].nbytes
    ctx = zmq.Context()
    got = threading.Semaphore(0)

    def deliver(msg: Message) -> None:
        got.release()

    v = Validator(RUN, 2, [1], (), layout_of(params), max_iteration=messages)
    inbox = Inbox(ctx, "tcp://127.0.0.1:*", v, deliver, hwm=messages + 2, curve=keys)
    inbox.start()
    out = Outbox(ctx, {0: inbox.endpoint}, hwm=messages + 2, send_timeout_s=WAIT_S, curve=keys)
    try:
        out.send([0], encode_update(RUN, 1, 0, params))  # connected (and handshaken) first
        assert got.acquire(timeout=WAIT_S), "the first message never arrived"
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for k in range(messages):
                out.send([0], encode_update(RUN, 1, k, params))
            for _ in range(messages):
                assert got.acquire(timeout=WAIT_S), "a message never arrived"
            times.append(time.perf_counter() - t0)
    finally:
        out.close(0)
        inbox.close()
        ctx.term()
    t = statistics.median(times)
    return {"mb_per_s": messages * nbytes / 1e6 / t, "ms_per_message": t / messages * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--messages", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        generate(Path(d) / "keys")
        keys = CurveKeys.load(Path(d) / "keys")
        plain = measure(None, a.mb, a.messages, a.rounds)
        curve = measure(keys, a.mb, a.messages, a.rounds)
    print(
        json.dumps(
            {
                "mb": a.mb,
                "messages": a.messages,
                "rounds": a.rounds,
                "plain": plain,
                "curve": curve,
                "slowdown": plain["mb_per_s"] / curve["mb_per_s"],
            }
        )
    )


if __name__ == "__main__":
    main()
