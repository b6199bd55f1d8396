"""What hopbus's data plane costs over raw pyzmq, sending one snapshot to several peers.

Prints one JSON object. Each round sends one parameter snapshot (``--mb`` MiB of float32 in four
arrays) from one sender to ``--peers`` receivers over TCP on 127.0.0.1, and ends when every
receiver has the whole message:

* hopbus: ``encode_update`` + ``Outbox.send`` -> ``Inbox`` (receiver thread, ``Validator``
  rebuilding the arrays, callback);
* raw: one PUSH per peer, ``send_multipart(buffers, copy=False)`` -> a PULL per receiver in its
  own thread, ``recv_multipart(copy=False)``, no header, no validation.

The goal is hopbus at 0.8 of raw's throughput or better (``ratio``, from the two medians, and
``meets_goal``). On a shared machine the medians drift with other load, so two steadier views
come along: ``ratio_paired``, the median over rounds of raw time / hopbus time within the same
round (both paths run back to back), and ``ratio_best``, fastest raw round / fastest hopbus round.

    python benchmarks/transport.py [--rounds 30] [--mb 64] [--peers 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np
import zmq

from hopbus.transport import Inbox, Message, Outbox, Validator, encode_update, layout_of

GOAL = 0.8
LOCAL = "tcp://127.0.0.1:*"
RUN = "bench"
HWM = 4
WAIT_S = 60.0
METHOD = (
    "one process; the sender in the main thread, each receiver in its own thread with its own "
    "zmq.Context (own I/O thread), as separate worker processes would have; TCP over 127.0.0.1. "
    "Both paths share the same contexts and the same HWM, and their rounds alternate (ABAB, "
    "order swapped every round) so machine noise hits both alike. A round is timed from before "
    "encoding to the moment the last receiver holds the full message (for hopbus: arrays rebuilt "
    "and validated, callback run). Throughput counts peers x snapshot bytes per round, GB = 1e9 "
    "bytes. Threads rather than processes: libzmq's I/O threads move the bytes outside the GIL, "
    "and the Python work per message (one header, a few frombuffer calls) is microseconds."
)


def snapshot(mb: int) -> dict[str, np.ndarray]:
    """Four float32 arrays totalling ``mb`` MiB."""
    n = mb * 2**20 // 4 // 4
    rng = np.random.default_rng(0)
    return {f"layer{i}": rng.standard_normal(n, dtype=np.float32) for i in range(4)}


class Arrivals:
    """Counts messages per round across receiver threads; the sender waits on it."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}
        self._cond = threading.Condition()

    def arrived(self, rnd: int) -> None:
        with self._cond:
            self._count[rnd] = self._count.get(rnd, 0) + 1
            self._cond.notify_all()

    def wait(self, rnd: int, peers: int) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._count.get(rnd, 0) >= peers, WAIT_S):
                raise SystemExit(f"round {rnd}: only {self._count.get(rnd, 0)} of {peers} arrived")


class HopbusPath:
    def __init__(self, sctx: zmq.Context, rctxs: list[zmq.Context], params: dict) -> None:
        self.params = params
        self.arrivals = Arrivals()
        peers = range(1, len(rctxs) + 1)
        self.peers = list(peers)
        self.inboxes = []
        for ctx in rctxs:
            v = Validator(RUN, len(rctxs) + 1, [0], [], layout_of(params), 10**9)
            inbox = Inbox(ctx, LOCAL, v, self._on_message, hwm=HWM)
            inbox.start()
            self.inboxes.append(inbox)
        endpoints = {p: box.endpoint for p, box in zip(peers, self.inboxes, strict=True)}
        self.outbox = Outbox(sctx, endpoints, hwm=HWM, send_timeout_s=WAIT_S)

    def _on_message(self, msg: Message) -> None:
        assert msg.payload is not None and len(msg.payload) == len(self.params)
        self.arrivals.arrived(msg.iteration)

    def round(self, rnd: int) -> float:
        start = time.perf_counter()
        self.outbox.send(self.peers, encode_update(RUN, 0, rnd, self.params))
        self.arrivals.wait(rnd, len(self.peers))
        return time.perf_counter() - start

    def close(self) -> None:
        self.outbox.close(0)
        for box in self.inboxes:
            box.close()
            box.check()


class RawPath:
    def __init__(self, sctx: zmq.Context, rctxs: list[zmq.Context], params: dict) -> None:
        self.buffers = [memoryview(a.reshape(-1).view(np.uint8)) for a in params.values()]
        self.arrivals = Arrivals()
        self.stop = threading.Event()
        self.threads = []
        self.pushes = []
        for ctx in rctxs:
            pull = ctx.socket(zmq.PULL)
            pull.setsockopt(zmq.RCVHWM, HWM)
            pull.bind(LOCAL)
            push = sctx.socket(zmq.PUSH)
            push.setsockopt(zmq.SNDHWM, HWM)
            push.connect(pull.getsockopt_string(zmq.LAST_ENDPOINT))
            self.pushes.append(push)
            t = threading.Thread(target=self._receive, args=(pull,), daemon=True)
            t.start()
            self.threads.append(t)
        self.round_no = 0

    def _receive(self, pull: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(pull, zmq.POLLIN)
        rnd = 0
        while not self.stop.is_set():
            if poller.poll(100):
                pull.recv_multipart(copy=False)
                self.arrivals.arrived(rnd)
                rnd += 1
        pull.close(linger=0)

    def round(self, rnd: int) -> float:
        start = time.perf_counter()
        for push in self.pushes:
            push.send_multipart(self.buffers, copy=False)
        self.arrivals.wait(rnd, len(self.pushes))
        return time.perf_counter() - start

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        for push in self.pushes:
            push.close(linger=0)


def summarize(times: list[float], nbytes: int) -> dict:
    median = statistics.median(times)
    return {
        "s_per_round_median": round(median, 5),
        "s_per_round_min": round(min(times), 5),
        "gb_per_s": round(nbytes / median / 1e9, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per path")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds per path first")
    ap.add_argument("--mb", type=int, default=64, help="snapshot size in MiB")
    ap.add_argument("--peers", type=int, default=3, help="receivers")
    args = ap.parse_args()

    params = snapshot(args.mb)
    snapshot_bytes = sum(a.nbytes for a in params.values())
    sctx = zmq.Context()
    rctxs = [zmq.Context() for _ in range(args.peers)]
    hop = HopbusPath(sctx, rctxs, params)
    raw = RawPath(sctx, rctxs, params)
    times: dict[str, list[float]] = {"hopbus": [], "raw": []}
    paths: dict[str, Callable[[int], float]] = {"hopbus": hop.round, "raw": raw.round}
    wall = time.perf_counter()
    try:
        for rnd in range(args.warmup + args.rounds):
            order = ["hopbus", "raw"] if rnd % 2 == 0 else ["raw", "hopbus"]
            for name in order:
                took = paths[name](rnd)
                if rnd >= args.warmup:
                    times[name].append(took)
    finally:
        hop.close()
        raw.close()
        sctx.destroy(linger=0)
        for ctx in rctxs:
            ctx.destroy(linger=0)

    total = snapshot_bytes * args.peers
    hopbus, rawr = summarize(times["hopbus"], total), summarize(times["raw"], total)
    ratio = round(hopbus["gb_per_s"] / rawr["gb_per_s"], 3)
    paired = statistics.median(r / h for h, r in zip(times["hopbus"], times["raw"], strict=True))
    best = min(times["raw"]) / min(times["hopbus"])
    print(
        json.dumps(
            {
                "benchmark": "transport",
                "snapshot_mib": args.mb,
                "tensors": len(params),
                "peers": args.peers,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "hopbus": hopbus,
                "raw": rawr,
                "ratio": ratio,
                "ratio_paired": round(paired, 3),
                "ratio_best": round(best, 3),
                "goal": GOAL,
                "meets_goal": ratio >= GOAL,
                "method": METHOD,
                "cpus": os.cpu_count(),
                "zmq": zmq.zmq_version(),
                "pyzmq": zmq.__version__,
                "wall_s": round(time.perf_counter() - wall, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
