"""What HopCallback costs a Keras model per batch: VGG-11 on 32x32 batches of 32, on the CPU.

Two measurements in one run:

* alone: ``model.fit`` in this process, no callback: the median time of one batch (a step);
* with Hop: ``hopbus launch -n 4 --topology complete`` of the same fit with
  ``hopbus.keras.HopCallback``, each worker timing every batch and the time spent inside the
  callback (wall and CPU of fit's own thread), of which how much was waiting for neighbours or
  tokens, and the CPU time of the reduce that runs in a thread beside Keras's compute.

The goal (at most 20% of ``step_alone_s``) is on ``callback_cpu_s``: the CPU time fit's own
thread spends inside the callback, its own work. On a machine with fewer cores than the four
workers' threads, wall-clock time inside the callback also counts the moments the thread was
ready but another process had the core; that figure (``callback_own_s``: time in the callback
minus time blocked on neighbours or tokens) is printed beside it, with ``own_wall_vs_step``,
and so is the reduce thread's CPU time, which runs beside Keras's compute (hidden where a core
is free, not on 2 cores shared by 4 workers). The floor is one numpy pass over the bytes the
reduce must read (x_k and three neighbours' snapshots). Prints one JSON object. Run from the
repository root:

    python benchmarks/keras_overhead.py [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

GOAL = 0.20
WARMUP = 5  # batches left out: tracing and the first exchanges
BATCH = 32
DEGREE = 3  # the complete graph of 4


def vgg11():
    import keras

    from hopbus.models.tf.nets import network

    model = network(keras, "vgg11", (32, 32, 3), 10)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def data(steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = steps * BATCH
    return rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, n)


def timing_callback(base: type) -> type:
    """``base`` (a Keras callback class) with every batch timed."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            self.starts: list[float] = []
            self.wall: list[float] = []
            self.cpu: list[float] = []
            self.waits: list[float] = []

        def on_train_batch_begin(self, batch, logs=None) -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            self.starts.append(t0)
            super().on_train_batch_begin(batch, logs)
            self._w, self._c = time.perf_counter() - t0, time.thread_time() - c0

        def on_train_batch_end(self, batch, logs=None) -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            super().on_train_batch_end(batch, logs)
            self.wall.append(self._w + time.perf_counter() - t0)
            self.cpu.append(self._c + time.thread_time() - c0)
            session = getattr(getattr(self, "ctx", None), "session", None)
            self.waits.append(session.last_wait_s if session is not None else 0.0)

    return Timed


def worker(out: Path) -> None:
    """One worker of the launched run: fit with the timed HopCallback, then its figures."""
    import keras

    import hopbus
    from hopbus.keras import HopCallback

    ctx = hopbus.join()
    x, y = data(ctx.iterations)
    callback = timing_callback(HopCallback)(ctx)
    vgg11().fit(x, y, batch_size=BATCH, epochs=1, callbacks=[callback], verbose=0)
    steps = np.diff(callback.starts)[WARMUP:]
    keep = slice(WARMUP, None)
    figures = {
        "step_s": float(np.median(steps)),
        "callback_s": float(np.median(callback.wall[keep])),
        "callback_cpu_s": float(np.median(callback.cpu[keep])),
        "waiting_s": float(np.median(callback.waits[keep])),
        "callback_own_s": float(np.median(np.subtract(callback.wall, callback.waits)[keep])),
        "reduce_thread_cpu_s": ctx.session.overlap_cpu_s / max(1, len(callback.wall)),
    }
    (out / f"worker-{ctx.worker}.json").write_text(json.dumps(figures))
    del keras


def alone(steps: int) -> float:
    import keras

    x, y = data(steps + WARMUP)
    callback = timing_callback(keras.callbacks.Callback)()
    vgg11().fit(x, y, batch_size=BATCH, epochs=1, callbacks=[callback], verbose=0)
    return float(np.median(np.diff(callback.starts)[WARMUP:]))


def floor(params: int) -> float:
    """One numpy pass over what the reduce reads: x_k and DEGREE neighbours' snapshots."""
    big = np.ones((DEGREE + 1) * params, np.float32)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        big.sum()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="batches measured per run")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    step_alone = alone(args.steps)
    params = sum(int(np.prod(w.shape)) for w in vgg11().weights)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cmd = [
            sys.executable, "-m", "hopbus", "launch", "-n", "4", "--topology", "complete",
            "--iterations", str(args.steps + WARMUP), "--timeout", "300", "--out",
            str(out / "run"), "--json", "--", sys.executable, __file__, "--worker", str(out),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"hopbus launch failed ({done.returncode}): {done.stderr[-2000:]}")
        summary = json.loads(done.stdout)
        workers = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    med = {k: statistics.median(w[k] for w in workers) for k in workers[0]}
    print(
        json.dumps(
            {
                "model": "vgg11",
                "parameters": params,
                "snapshot_mb": round(params * 4 / 2**20, 1),
                "batch": BATCH,
                "workers": 4,
                "topology": "complete",
                "steps_measured": args.steps,
                "step_alone_s": round(step_alone, 4),
                "step_with_callback_s": round(med["step_s"], 4),
                "callback_s": round(med["callback_s"], 4),
                "callback_waiting_s": round(med["waiting_s"], 4),
                "callback_own_s": round(med["callback_own_s"], 4),
                "callback_cpu_s": round(med["callback_cpu_s"], 4),
                "reduce_thread_cpu_s": round(med["reduce_thread_cpu_s"], 4),
                "floor_s": round(floor(params), 4),
                "cpu_vs_step": round(med["callback_cpu_s"] / step_alone, 3),
                "own_wall_vs_step": round(med["callback_own_s"] / step_alone, 3),
                "goal": GOAL,
                "meets_goal": med["callback_cpu_s"] / step_alone <= GOAL,
                "violations": summary["violations"],
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
