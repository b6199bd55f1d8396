"""Your own Keras model as Hop workers (hopbus.keras.HopCallback), with the example script a user
would write: a CNN with BatchNorm and Dropout, Adam, built without a seed. Real TensorFlow,
real processes, a real redis-server; skipped, saying why, without TensorFlow (the tf extra)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cluster import (
    clean_env,
    hopbus,
    hopbus_args,
    processes_mentioning,
    script_workers,
    train,
)
from helpers import needs

from hopbus.consensus import distance, sketch

pytestmark = needs("tensorflow", "the Keras tests need TensorFlow: pip install -e '.[tf]'")


ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "keras_cnn.py"
STEPS = 300


def launch(redis_url: str, out: Path, run: str, *flags: str, timeout: float = 300):
    args = hopbus_args("launch", "--redis", redis_url, "--run", run, "--out", str(out), "--json")
    p = subprocess.run(
        [*args, *flags, "--", sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=timeout,
        check=False,
    )
    return p, (json.loads(p.stdout) if p.stdout.strip() else None)


def alone(tmp_path: Path, copies: int) -> tuple[list[float], float]:
    """The script trained alone on all the data for STEPS steps, ``copies`` times, two at a
    time: the test accuracies, and the consensus distance of the copies (no averaging)."""
    accuracies = []
    for first in range(0, copies, 2):  # two at a time: the CI machine has two cores
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(EXAMPLE),
                    "--steps",
                    str(STEPS),
                    "--save",
                    str(tmp_path / f"alone-{i}.npz"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=clean_env(),
            )
            for i in range(first, min(first + 2, copies))
        ]
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            accuracies.append(float(out.split("accuracy")[-1]))
    sketches = {}
    for i in range(copies):
        with np.load(tmp_path / f"alone-{i}.npz") as z:
            sketches[i] = sketch({k: z[k] for k in z.files})[0]
    apart = distance(sketches)
    assert apart is not None
    return accuracies, float(apart["max"])


def test_a_keras_script_in_backup_mode_learns_as_well_as_alone(redis_url, tmp_path):
    p, s = launch(
        redis_url,
        tmp_path / "run",
        f"k{os.getpid()}",
        "-n",
        "4",
        "--mode",
        "backup",
        "--iterations",
        str(STEPS),
    )
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["violations"] == 0
    assert all(v == 0 for v in s["checks"].values()), s["checks"]
    assert s["iterations"]["min"] == STEPS
    accuracies, apart = alone(tmp_path, 4)
    # the same number of steps (each on a quarter of the data) reaches the accuracy alone. The
    # script sets no seed and ends on a constant learning rate, so one run alone lands anywhere
    # in 0.93-0.98 (measured); the median of four is the reference, not a lucky pair
    assert s["final_accuracy"] >= float(np.median(accuracies)) - 0.02, (
        s["final_accuracy"],
        accuracies,
    )
    # and at the end the workers' weights agree: far closer than two runs without averaging
    assert s["consensus_distance"] is not None
    assert s["consensus_distance"] < apart / 10, (s["consensus_distance"], apart)
    # Keras's logs are the run's progress: training loss and accuracy, validation on the test set
    entries = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(e["loss"], float) and isinstance(e["accuracy"], float) for e in entries)
    evals = [e for e in entries if "eval_accuracy" in e]
    assert evals and all(0.0 <= e["eval_accuracy"] <= 1.0 for e in evals)
    assert not processes_mentioning(str(EXAMPLE))


@pytest.mark.parametrize(
    "flags",
    [
        ["--mode", "standard"],
        ["--mode", "notify-ack"],
        ["--mode", "staleness", "--staleness", "3"],
        ["--mode", "hybrid", "--staleness", "3"],
        [
            "--mode",
            "backup",
            "--skip-max",
            "10",
            "--max-ig",
            "10",
            "--slowdown",
            "fixed:4@0",
            "--iter-time",
            "0.01",
        ],
    ],
    ids=["standard", "notify-ack", "staleness", "hybrid", "skipping"],
)
def test_the_keras_script_in_every_hop_mode(redis_url, tmp_path, flags):
    run = f"k{os.getpid()}-{flags[1]}-{len(flags)}"
    # two workers (each a TensorFlow process); three where a worker has backup workers, which
    # takes more in-neighbours than --backup
    n = "3" if flags[1] in ("backup", "hybrid") else "2"
    p, s = launch(redis_url, tmp_path / "run", run, "-n", n, "--iterations", "100", *flags)
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["violations"] == 0
    assert all(v == 0 for v in s["checks"].values()), s["checks"]
    if "--skip-max" in flags:
        assert s["jumps"] >= 1  # the straggler skipped: fewer batches than iterations
    assert s["final_accuracy"] >= 0.6


def test_a_keras_model_from_the_command_line(redis_url, tmp_path):
    """--model and --data MODULE:FUNCTION: hopbus train fits the user's compiled Keras model
    (with its own optimizer: hopbus's SGD flags, given, are said to be unused). Two workers in
    standard mode: the callback's backup mode is the launch tests' above."""
    p, s = train(
        redis_url, tmp_path / "run", "-n", "2", "--iterations", "120", "--model",
        f"{EXAMPLE}:model", "--data", f"{EXAMPLE}:data", "--lr", "1000", "--weight-decay", "0.5",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert (
        f"hopbus: warning: --lr, --weight-decay: --model {EXAMPLE}:model is a Keras model, which "
        "trains with the optimizer it was compiled with" in p.stderr
    ), p.stderr
    assert s["finished"] and s["violations"] == 0 and s["final_accuracy"] >= 0.8
    assert s["consensus_distance"] < 0.1


def test_a_keras_model_is_refused_by_the_modes_that_move_other_bytes(redis_url, tmp_path):
    """A parameter server pushes gradients, not parameters: one line, before any worker."""
    p, s = train(
        redis_url, tmp_path / "run", "-n", "2", "--mode", "ps-bsp", "--iterations", "5",
        "--model", f"{EXAMPLE}:model", "--data", f"{EXAMPLE}:data",
    )  # fmt: skip
    assert p.returncode == 2 and s is None, p.stderr
    *notes, line = p.stderr.strip().splitlines()  # on a busy machine, importing the example
    assert all("still running after" in note for note in notes), notes  # is noted as it goes
    assert line.startswith(f"hopbus: error: --model {EXAMPLE}:model (a Keras model) trains with")
    assert "--mode ps-bsp moves its bytes with a driver of its own" in line


SHORT_FIT = """
import sys, keras, numpy as np, hopbus, hopbus.keras
ctx = hopbus.join()
cases = sys.argv[1].split(",")  # worker I runs case I (one case: every worker), in one run
how = cases[ctx.worker % len(cases)]
x = np.random.default_rng(0).normal(size=(280, 4)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
if how == "dataset":  # 7 batches, not repeated, under a steps_per_epoch of 20
    import tensorflow as tf
    data = tf.data.Dataset.from_tensor_slices((x[:224], y[:224])).batch(32)
    model.fit(data, epochs=2, steps_per_epoch=20, verbose=0,
              callbacks=[hopbus.keras.HopCallback(ctx)])
def slow_rows():  # 7 batches of unknown length, slow enough that tf.data's prefetch thread is
    import time, tensorflow as tf  # in the generator when fit ends
    def rows():
        for row in zip(x[:224], y[:224]):
            time.sleep(0.002)
            yield row
    spec = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((), tf.int32))
    return tf.data.Dataset.from_generator(rows, output_signature=spec).batch(32)
if how == "generator":  # each epoch ends as the batches run out
    model.fit(slow_rows(), epochs=10, verbose=0, callbacks=[hopbus.keras.HopCallback(ctx)])
if how == "fails":  # worker 0's own error in its 4th batch; worker 1 is stopped by it
    class Fail(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if ctx.worker == 0 and batch == 3:
                raise ValueError("the script's own error")
    model.fit(slow_rows(), epochs=10, verbose=0,
              callbacks=[hopbus.keras.HopCallback(ctx), Fail()])
if how == "noval":  # no validation in fit: the script reports its own figures
    model.fit(x, y, batch_size=32, epochs=ctx.epochs(len(x), 32), verbose=0,
              callbacks=[hopbus.keras.HopCallback(ctx)])
    ctx.finish(loss=model.evaluate(x, y, verbose=0), accuracy=0.5)
if how == "valfreq":  # 8 epochs of 7 batches, validated after the 3rd and 6th only
    model.fit(x, y, batch_size=32, epochs=8, verbose=0, validation_split=0.2,
              validation_freq=3, callbacks=[hopbus.keras.HopCallback(ctx)])
if how == "restore":  # keeps the worst epoch's weights, and sets them at fit's end
    keep = keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=1000,
                                         restore_best_weights=True)
    model.fit(x, y, batch_size=32, epochs=8, verbose=0,
              callbacks=[hopbus.keras.HopCallback(ctx), keep])
if how == "resumed":  # as BackupAndRestore resumes it: from epoch 2 of 8
    model.fit(x, y, batch_size=32, epochs=ctx.epochs(len(x), 32), initial_epoch=2, verbose=0,
              callbacks=[hopbus.keras.HopCallback(ctx)])
if how == "early":  # epochs enough, but EarlyStopping ends fit after 2 of them
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10)
    model.fit(x, y, batch_size=32, epochs=ctx.epochs(len(x), 32, validation_split=0.2),
              validation_split=0.2, verbose=0, callbacks=[hopbus.keras.HopCallback(ctx), stop])
    print("after fit")
fits = 0
while not ctx.done and (how == "loop" or (how == "once" and fits == 0)):
    # 224 rows train, 56 validate: 7 batches an epoch
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, validation_split=0.2,
              callbacks=[hopbus.keras.HopCallback(ctx)])
    fits += 1
print("fits", fits, "epochs", ctx.epochs(len(x), 32, validation_split=0.2))
if how == "loop":  # and once more after the run is done: its step is undone
    before = model.get_weights()
    model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=[hopbus.keras.HopCallback(ctx)])
    after = model.get_weights()
    print("changed after done", max(float(abs(a - b).max()) for a, b in zip(before, after)))
"""


def short_fit(redis_url: str, tmp_path: Path, *cases: str) -> subprocess.CompletedProcess:
    """SHORT_FIT launched as a 50-iteration run, worker I running ``cases[I]`` (one case: two
    workers running it). Its folder: tmp_path / the cases joined by "-"."""
    script = tmp_path / "short.py"
    script.write_text(SHORT_FIT)
    name, n = "-".join(cases), str(max(2, len(cases)))
    run_id, out = f"short{os.getpid()}{name}", str(tmp_path / name)
    args = hopbus_args("launch", "--redis", redis_url, "--run", run_id, "-n", n,
                       "--iterations", "50", "--out", out)  # fmt: skip
    return subprocess.run([*args, "--", sys.executable, str(script), ",".join(cases)],
                          capture_output=True, text=True, env=clean_env(), timeout=300,
                          check=False)  # fmt: skip


def test_fits_that_end_their_own_way_train_through_and_what_they_leave_unsaid_is_said(
    redis_url, tmp_path
):
    """Five workers of one run, each fit ending its own way; the run finishes, and those whose
    fit left something unsaid say it.

    Fault ``generator`` (worker 0): a tf.data dataset whose length Keras cannot know ends
    each epoch on a batch that Keras begins and never ends (the data ran out inside its
    step). The next epoch's first batch is that step (it failed "begin() twice" at the second
    epoch). Fault ``exit mid-generator``: the run ends fit mid-epoch, with tf.data's prefetch
    thread inside the script's slow generator; the iterator, in a cycle with Keras's, died at
    interpreter shutdown waiting for that thread, which could not take the GIL (the script hung
    at exit after its report: 3 of 3 times).
    Fault ``loop`` (worker 1): a script that fits one epoch at a time until the run is done (a
    new callback each time) trains through, and a fit after that trains nothing.
    Faults in what fit reports: no validation (``noval``, worker 2: the script's own
    ctx.finish counts; the callback had reported none and it failed "finish() was already
    called"); a last validation before the run's end (``valfreq``, worker 3: said, not passed
    off as the end's); a callback that set other weights after the run (``restore``, worker 4:
    EarlyStopping(restore_best_weights=True), even without stopping: said at exit)."""
    cases = ("generator", "loop", "noval", "valfreq", "restore")
    p = short_fit(redis_url, tmp_path, *cases)
    assert p.returncode == 0, p.stderr
    folder = tmp_path / "-".join(cases)
    s = json.loads((folder / "summary.json").read_text())
    assert s["finished"] and s["violations"] == 0 and s["iterations"]["min"] == 50
    log = {case: (folder / "logs" / f"worker-{i}.log").read_text() for i, case in enumerate(cases)}
    # 8 fits of 7 batches; the epochs one fit would need: 50 / 7
    assert "fits 8 epochs 1" in log["loop"], log["loop"]  # the run was done: 0 left, at least 1
    # fault ``fit_after_done``: Keras's one batch of it trained, never averaged
    assert re.search(r"^changed after done 0\.0$", log["loop"], re.M), log["loop"]
    assert "this fit trains nothing" in log["loop"], log["loop"]
    # each validation was the run's evaluation: the final loss is the last one's
    assert s["per_worker"][1]["final_loss"] is not None, s["per_worker"]
    noval = log["noval"]
    assert "fit ran no validation (no validation data, or a validation_freq beyond its " in noval
    assert "epochs): report the final test loss and accuracy with ctx.finish(" in noval
    assert s["per_worker"][2]["final_accuracy"] == 0.5, s["per_worker"]
    valfreq = log["valfreq"]
    assert "fit's last validation came before the run's last iteration (validation_freq)" in valfreq
    assert "or the run's are that validation's" in valfreq
    assert "the model no longer holds the run's final weights" in log["restore"], log["restore"]


def test_a_fit_that_fails_mid_generator_exits(redis_url, tmp_path):
    """Fault ``fails mid-generator``: fit fails (worker 0's own error; worker 1 stopped by the
    run, a RunFailure inside its fit) with tf.data's prefetch thread inside the slow
    generator. The exception that ends the script keeps fit's frame, and so the iterator,
    alive through its traceback: freed only at interpreter shutdown, it hung the exit, and a
    ``hopbus worker`` (one on another machine: nothing stops it) waited for ever."""
    script = tmp_path / "short.py"
    script.write_text(SHORT_FIT)
    run = f"fails{os.getpid()}"
    created = hopbus("create", "--run", run, "-n", "2", "--topology", "ring", "--iterations",
                     "50", "--model", "script", "--redis", redis_url)  # fmt: skip
    assert created.returncode == 0, created.stderr
    command = [sys.executable, str(script), "fails"]
    procs = script_workers(run, command, clean_env(HOPBUS_REDIS=redis_url), range(2), tmp_path)
    try:
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [1, 1], errs
    assert "ValueError: the script's own error" in errs[0], errs[0]
    assert "hopbus: error: " in errs[1] and "worker 0" in errs[1], errs[1]
    assert not processes_mentioning(run)


def test_a_fit_too_short_for_the_run_is_one_line(redis_url, tmp_path):
    """Fault ``short_fit``: one epoch of 7 batches for a run of 50 iterations. The worker
    fails saying how far it got, in the run's own count, and what to give fit; with a dataset
    that runs out before its steps_per_epoch, what to do about the data; stopped by a
    callback (EarlyStopping), that no worker may leave before the run ends; a fit resumed at a
    later epoch (initial_epoch, as BackupAndRestore sets it), blamed on that, not on too few
    epochs."""
    p = short_fit(redis_url, tmp_path, "once")
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "model.fit ended after 7 of 50 iterations (7 batches an epoch), before the run " in last
    assert "epochs=ctx.epochs(len(x_train), batch_size), with validation_split" in last, last
    assert "Traceback" not in p.stderr
    p = short_fit(redis_url, tmp_path, "dataset")  # the data ran out, not too few epochs
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert (
        "model.fit ended after 14 of 50 iterations: its data ran out after 7 batches of an "
        "epoch of 20 (steps_per_epoch): repeat the dataset (dataset.repeat())" in last
    ), last
    p = short_fit(redis_url, tmp_path, "early")  # a callback stopped fit: said at once, not
    assert p.returncode == 1, p.stderr  # at exit after more code ran
    last = p.stderr.strip().splitlines()[-1]
    assert "model.fit was stopped after 14 of 50 iterations by a callback" in last, last
    assert "after fit" not in (tmp_path / "early" / "logs" / "worker-0.log").read_text()
    p = short_fit(redis_url, tmp_path, "resumed")
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "it began at epoch 2 (initial_epoch, as BackupAndRestore sets it when it resumes)" in (
        last
    ), last
    assert "give fit epochs=2 + ctx.epochs(len(x_train), batch_size)" in last, last


LAZY = """
import keras, numpy as np

class Net(keras.Model):  # subclassed: build() makes none of its layers' weights
    def __init__(self):
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)

    def call(self, x):
        return self.out(self.hidden(x))

def model():
    m = Net()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    m.compile("adam", loss, metrics=["accuracy"])
    return m

def data():
    x = np.random.default_rng(0).normal(size=(400, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    return x[:320], y[:320], x[320:], y[320:]

if __name__ == "__main__":
    import hopbus, hopbus.keras
    x, y, _, _ = data()
    m = model()
    m.build((None, 4))  # what a user tries first: marks it built, makes no weights
    m.fit(x, y, batch_size=32, epochs=5, verbose=0,
          callbacks=[hopbus.keras.HopCallback(hopbus.join())])
"""


def test_a_keras_model_without_an_input_layer(redis_url, tmp_path):
    """A subclassed model has no weights until fit's first batch (nor after its build(),
    which builds none of its layers). From --model, hopbus builds it for the data's shape
    and trains it; in a script, whose data hopbus does not see, the worker stops with one
    line saying what to add (not that the model has nothing to train)."""
    lazy = tmp_path / "lazy.py"
    lazy.write_text(LAZY)
    p, s = train(
        redis_url, tmp_path / "run", "-n", "2", "--iterations", "20", "--eval-every", "0",
        "--model", f"{lazy}:model", "--data", f"{lazy}:data",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["violations"] == 0
    assert "build()" not in p.stderr  # built by a call, without Keras's warning about build()
    args = hopbus_args("launch", "--redis", redis_url, "--run", f"lazy{os.getpid()}", "-n", "2",
                       "--iterations", "20", "--out", str(tmp_path / "script"))  # fmt: skip
    p = subprocess.run([*args, "--", sys.executable, str(lazy)], capture_output=True,
                       text=True, env=clean_env(), timeout=300, check=False)  # fmt: skip
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "the model is not built yet" in last and "model(x_train[:1])" in last, last
    assert "Traceback" not in p.stderr
